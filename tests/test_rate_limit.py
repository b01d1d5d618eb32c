"""The rate limiter against a Python model of Reverb's `RateLimiter` rules."""

import fractions
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf


class ReverbModel:
    """Reverb's `rate_limiter.cc` rules, with exact fractions for the ratio."""

    def __init__(self, spi, min_size, error_buffer):
        self.spi = fractions.Fraction(spi).limit_denominator(1000)
        if isinstance(error_buffer, tuple):
            self.low, self.high = (fractions.Fraction(x) for x in error_buffer)
        else:
            offset, error = self.spi * min_size, fractions.Fraction(error_buffer)
            self.low, self.high = offset - error, offset + error
        self.min_size, self.inserts, self.samples, self.deletes = min_size, 0, 0, 0

    def can_insert(self, n):
        if self.inserts + n - self.deletes <= self.min_size:
            return True
        return (self.inserts + n) * self.spi - self.samples <= self.high

    def can_sample(self, n):
        if self.inserts - self.deletes < self.min_size:
            return False
        return self.inserts * self.spi - self.samples - n >= self.low


# The last three have limits between two credits (q * min_diff, q * max_diff not integers):
# there the bounds must round toward the allowed side.
CASES = [(1.0, 1, 2.0), (0.25, 4, 3.5), (4.0, 10, 8.0), (1.5, 3, (-2.0, 10.0)), (1 / 3, 5, 2.0),
         (8.0, 2, 20.0), (0.1, 50, 2.0), (1.0, 1, 2.7), (0.5, 2, (-1.3, 2.6)),
         (3.0, 1, 4.25)]  # fmt: skip


@pytest.mark.parametrize("spi, min_size, error_buffer", CASES)
def test_decisions_match_reverbs_rules_over_random_operations(spi, min_size, error_buffer):
    limiter = jaxbuf.sample_to_insert_ratio(spi, min_size, error_buffer)
    can_insert, can_sample = jax.jit(limiter.can_insert), jax.jit(limiter.can_sample)
    inserted, sampled, deleted = (jax.jit(f) for f in (limiter.inserted, limiter.sampled,
                                                       limiter.deleted))  # fmt: skip
    model, state = ReverbModel(spi, min_size, error_buffer), limiter.init()
    rng = np.random.default_rng(min_size)
    blocked = {"insert": 0, "sample": 0}
    for _ in range(600):
        n = int(rng.integers(1, 6))
        assert bool(can_insert(state, n)) == model.can_insert(n)
        assert bool(can_sample(state, n)) == model.can_sample(n)
        action = rng.choice(["insert", "sample", "delete"], p=[0.45, 0.5, 0.05])
        if action == "insert" and model.can_insert(n):
            state, model.inserts = inserted(state, n), model.inserts + n
        elif action == "sample" and model.can_sample(n):
            state, model.samples = sampled(state, n), model.samples + n
        elif action == "delete" and model.inserts - model.deletes >= n:
            state, model.deletes = deleted(state, n), model.deletes + n
        elif action != "delete":
            blocked[action] += 1
    assert blocked["insert"] and blocked["sample"]  # both limits were reached


def test_the_limiter_paces_a_jitted_loop_at_the_ratio():
    """Actors insert 4 items per step when allowed; the learner samples batches of
    8 when allowed: 2 samples per insert settle in."""
    limiter = jaxbuf.sample_to_insert_ratio(2.0, min_size_to_sample=16, error_buffer=16.0)

    def step(carry, _):
        state, inserts, samples = carry
        go = limiter.can_insert(state, 4)
        state = jax.lax.cond(go, lambda s: limiter.inserted(s, 4), lambda s: s, state)
        take = limiter.can_sample(state, 8)
        state = jax.lax.cond(take, lambda s: limiter.sampled(s, 8), lambda s: s, state)
        return (
            state,
            inserts + 4 * go.astype(jnp.int32),
            samples + 8 * take.astype(jnp.int32),
        ), None

    zero = jnp.zeros((), jnp.int32)
    (state, inserts, samples), _ = jax.jit(
        lambda: jax.lax.scan(step, (limiter.init(), zero, zero), None, length=1000)
    )()
    assert abs(int(samples) / (int(inserts) - 16) - 2.0) < 0.05
    assert int(state.size) == int(inserts)


def test_branch_free_gating_equals_gating_by_cond():
    """A loop gated by masked writes (`where=`) and gated counts ends in the state that the
    same loop gated by `lax.cond` ends in, bit for bit, and learns from the same batches."""
    limiter = jaxbuf.sample_to_insert_ratio(3.0, min_size_to_sample=8, error_buffer=12.0)
    buffer = jaxbuf.make_replay_buffer(20, 4, sampler=jaxbuf.prioritized())

    def by_cond(carry, key):
        state, limits = carry
        items = jax.random.normal(key, (3,))
        state, limits = jax.lax.cond(
            limiter.can_insert(limits, 3),
            lambda: (buffer.add(state, items), limiter.inserted(limits, 3)),
            lambda: (state, limits),
        )
        learn = limiter.can_sample(limits, 4)
        batch = buffer.sample(state, key)
        limits = jax.lax.cond(learn, lambda: limiter.sampled(limits, 4), lambda: limits)
        return (state, limits), jnp.where(learn, batch.experience, 0.0)

    def by_mask(carry, key):
        state, limits = carry
        items = jax.random.normal(key, (3,))
        allowed = limiter.can_insert(limits, 3)
        state = buffer.add(state, items, where=allowed)
        limits = limiter.inserted(limits, 3, where=allowed)
        learn = limiter.can_sample(limits, 4)
        batch = buffer.sample(state, key)
        limits = limiter.sampled(limits, 4, where=learn)
        return (state, limits), jnp.where(learn, batch.experience, 0.0)

    keys = jax.random.split(jax.random.key(3), 300)
    results = []
    for body in (by_cond, by_mask):
        start = (buffer.init(jnp.float32(0)), limiter.init())
        results.append(jax.jit(lambda s, b=body: jax.lax.scan(b, s, keys))(start))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), strict=True):
        np.testing.assert_array_equal(a, b)
    (_, limits), learned = results[1]
    assert 0 < int((learned != 0).any(axis=1).sum()) < 300  # both gates were shut at times
    expected = "where must be a bool scalar (whether to count), got int32[]"
    with pytest.raises(TypeError, match=re.escape(expected)):
        limiter.inserted(limits, 3, where=jnp.int32(1))


def test_counts_saturate_instead_of_wrapping():
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, (-1e30, 1e30))
    state = limiter.init()
    for _ in range(1100):
        state = limiter.inserted(state, jaxbuf._rate_limit.MAX_COUNT)
    assert int(state.size) == 2**31 - 1 and int(state.credit) == 2**31 - 1
    assert bool(limiter.can_sample(state, 1))  # a saturated credit stays positive
    for _ in range(2200):
        state = limiter.sampled(state, jaxbuf._rate_limit.MAX_COUNT)
    assert int(state.credit) == -(2**31 - 1)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((0.0, 1, 2.0), ValueError, "samples_per_insert must be positive"),
        ((float("inf"), 1, 2.0), ValueError, "samples_per_insert must be positive and finite"),
        ((-1.0, 1, 2.0), ValueError, "samples_per_insert must be positive and finite, got -1.0"),
        ((1.0, 1, float("inf")), ValueError, "error_buffer must be finite, got inf"),
        ((1.0, 1, (-float("inf"), 5.0)), ValueError, "error_buffer[0] must be finite, got -inf"),
        ((1.0, 1, -3.0), ValueError, "error_buffer must be at least 0, got -3.0"),
        ((1.0, 0, 2.0), ValueError, "min_size_to_sample must be in [1,"),
        ((2.0, 1, 1.0), ValueError, "narrower than 2 * max(1, samples_per_insert) = 4.0"),
        ((1.0, 1, (5.0, 10.0)), ValueError, "error_buffer's range starts at 5.0, above"),
        ((1.0, 1, "2"), TypeError, "error_buffer must be a number"),
        ((float("nan"), 1, 2.0), ValueError, "samples_per_insert must be a number, got nan"),
    ],
)
def test_bad_configuration_is_named(args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.sample_to_insert_ratio(*args)


def test_a_range_below_the_first_samples_warns_of_a_stall():
    with pytest.warns(UserWarning, match="stops inserting for good"):
        jaxbuf.sample_to_insert_ratio(1.0, 10, (-5.0, 5.0))


def test_bad_counts_are_named():
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, 2.0)
    with pytest.raises(ValueError, match="num_inserts must be a non-negative integer scalar"):
        limiter.can_insert(limiter.init(), -1)
    with pytest.raises(ValueError, match="n must be a non-negative integer scalar"):
        limiter.sampled(limiter.init(), 1.5)


def test_the_state_saves_and_restores(tmp_path):
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, 2.0)
    state = limiter.sampled(limiter.inserted(limiter.init(), 3), 2)
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "limiter", state), limiter.init())
    assert int(restored.size) == 3 and int(restored.credit) == int(state.credit)
