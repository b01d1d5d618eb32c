"""The rate limiter against a Python model of Reverb's `RateLimiter` rules, as Reverb's
code computes them (int64 counts, doubles)."""

import fractions
import itertools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import jaxbuf


class ReverbModel:
    """Reverb's rules as its code computes them: the limits as `rate_limiters.py`
    computes them in Python floats; the counts as int64 (Python ints); and
    `rate_limiter.cc`'s diffs in C++ doubles, left to right, each count converted
    to a double (Python's int-float arithmetic does the same)."""

    def __init__(self, spi, min_size, error_buffer, inserts=0, samples=0, deletes=0):
        if isinstance(error_buffer, tuple):
            self.low, self.high = (float(x) for x in error_buffer)
        else:
            offset = spi * min_size
            self.low, self.high = offset - error_buffer, offset + error_buffer
        self.spi, self.min_size = spi, min_size
        self.inserts, self.samples, self.deletes = inserts, samples, deletes

    def can_insert(self, n):
        if self.inserts + n - self.deletes <= self.min_size:
            return True
        return (n + self.inserts) * self.spi - self.samples <= self.high

    def can_sample(self, n):
        if self.inserts - self.deletes < self.min_size:
            return False
        return self.inserts * self.spi - self.samples - n >= self.low


def state_of(inserts, samples, deletes):
    """A limiter state holding the given counts (Python ints below 2**64)."""
    words = [np.array([c & 0xFFFFFFFF, c >> 32], np.uint32) for c in (inserts, samples, deletes)]
    return jaxbuf.types.RateLimiterState(*words)


# 1/3 and 0.1 are not doubles, so their diffs round; the last three have limits that fall
# between two diffs a loop can reach.
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
    assert int(state.counts()["inserts"]) == int(inserts)


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


def test_counts_are_64_bit_and_saturate_instead_of_wrapping():
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, (-1e30, 1e30))
    state = limiter.inserted(state_of(2**32 - 2, 2**32 + 5, 0), 3)  # the low word wraps
    assert {k: int(v) for k, v in state.counts().items()} == {
        "inserts": 2**32 + 1, "samples": 2**32 + 5, "deletes": 0}  # fmt: skip
    assert bool(limiter.can_sample(state, 2**31 - 1))  # diff = -4: min_diff -1e30 is far
    state = limiter.sampled(limiter.inserted(state_of(2**63 - 9, 2**63 - 2, 0), 2**31 - 1), 5)
    assert int(state.counts()["inserts"]) == int(state.counts()["samples"]) == 2**63 - 1
    state = limiter.deleted(state, 2**31 - 1, where=jnp.bool_(False))
    assert int(state.counts()["deletes"]) == 0


# Ratios from the smallest subnormal to 1e300; counts small, near 2**31, 2**32 and 2**53
# (where a count stops being exact as a double), and up to 2**63.
RATIOS = st.one_of(
    st.floats(5e-324, 1e-3), st.floats(1e-3, 1e3), st.floats(1e3, 1e300),
    st.sampled_from([0.0004, 0.1, 0.3, 1 / 3, 0.7, 1.1, 1.5, 2.0, 5e-324]),  # typed ones
)  # fmt: skip
COUNTS = st.one_of(
    st.integers(0, 4096), *(st.integers(c - 64, c + 64) for c in (2**31, 2**32, 2**53)),
    st.integers(0, 2**63 - 2**32),
)  # fmt: skip


@st.composite
def configurations(draw):
    """`(samples_per_insert, min_size_to_sample, error_buffer)`: a number or a pair."""
    spi, min_size = draw(RATIOS), draw(st.one_of(st.integers(1, 64), st.integers(1, 2**20)))
    # whole buffers make limits a typed ratio's diffs hit exactly, but for rounding
    width = 2 * max(1.0, spi) * draw(st.one_of(st.integers(1, 64).map(float), st.floats(1.01, 1e6)))
    if draw(st.booleans()):
        return spi, min_size, width / 2
    low = spi * min_size - draw(st.floats(0.0, 1.0)) * width
    return spi, min_size, (low, low + width)


def turning_point(holds, top=2**63 - 1):
    """The least count in [0, top] where `holds` (monotone: false, then true) is true
    (`top` if none)."""
    low, high = 0, top
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low


def turns(model, inserts, n):
    """The counts of samples where, after `inserts` inserts, Reverb's doubles turn a
    decision: the first where `can_sample(n)` fails, the first where `can_insert(n)`
    holds again (ignoring the size rules)."""

    def sample_fails(samples):
        return not inserts * model.spi - samples - n >= model.low

    def insert_holds(samples):
        return (n + inserts) * model.spi - samples <= model.high

    return turning_point(sample_fails), turning_point(insert_holds)


@st.composite
def counts_near_a_limit(draw, model):
    """`(inserts, samples, deletes, n)` with `samples` often within one of where Reverb's
    double arithmetic turns a decision (found by bisection), and the size often within
    three of `min_size_to_sample`."""
    # min_size + 7500 k inserts: a typed ratio's credit since the first sample is whole,
    # and a whole error buffer puts a limit exactly on it, unless the doubles round
    aligned = st.integers(0, 2**40).map(lambda k: model.min_size + 7500 * k)
    inserts = draw(st.one_of(COUNTS, aligned))
    n = draw(st.one_of(st.integers(1, 8), st.integers(1, 2**31 - 1)))
    near_min = st.integers(model.min_size - 3, model.min_size + 3)
    size = draw(st.one_of(st.integers(0, inserts), near_min))
    turn = draw(st.sampled_from([*turns(model, inserts, n), draw(COUNTS)]))
    samples = min(max(turn + draw(st.integers(-1, 1)), 0), 2**63 - 1)
    return inserts, samples, min(max(inserts - size, 0), inserts), n


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(configurations(), st.data())
def test_every_decision_is_reverbs_for_any_ratio_and_count(configuration, data):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a range below the first samples warns
            limiter = jaxbuf.sample_to_insert_ratio(*configuration)
    except ValueError:  # a range that overflows the doubles
        assume(False)
    model = ReverbModel(*configuration)
    assert (limiter.config.min_diff, limiter.config.max_diff) == (model.low, model.high)
    model.inserts, model.samples, model.deletes, n = data.draw(counts_near_a_limit(model))
    state = state_of(model.inserts, model.samples, model.deletes)
    assert bool(limiter.can_insert(state, n)) == model.can_insert(n)
    assert bool(limiter.can_sample(state, n)) == model.can_sample(n)


def test_where_rounding_decides_the_limiter_decides_as_reverb():
    """Typed ratios, whole error buffers, and samples at the counts where each decision
    turns: there exact arithmetic on the same doubles disagrees with Reverb's double
    arithmetic dozens of times, and the limiter sides with Reverb every time."""
    disagreements = {"sample": 0, "insert": 0}
    for spi, min_size, error_buffer in itertools.product(
        (0.1, 0.3, 0.7, 1.1, 1 / 3, 0.0004), (1, 5, 50), (3.0, 7.0)
    ):
        limiter = jaxbuf.sample_to_insert_ratio(spi, min_size, error_buffer)
        for inserts, n in itertools.product(range(min_size, min_size + 40), (1, 3)):
            model = ReverbModel(spi, min_size, error_buffer, inserts)
            for samples in {t + d for t in turns(model, inserts, n) for d in (-1, 0)} - {-1}:
                model.samples, state = samples, state_of(inserts, samples, 0)
                sample, insert = model.can_sample(n), model.can_insert(n)
                assert bool(limiter.can_sample(state, n)) == sample
                assert bool(limiter.can_insert(state, n)) == insert
                credit = fractions.Fraction(inserts) * fractions.Fraction(spi) - samples
                disagreements["sample"] += (credit - n >= fractions.Fraction(model.low)) != sample
                exact = credit + n * fractions.Fraction(spi) <= fractions.Fraction(model.high)
                disagreements["insert"] += (exact or inserts + n <= min_size) != insert
    assert disagreements["sample"] >= 20 and disagreements["insert"] >= 20, disagreements


def test_a_tiny_ratio_is_not_rounded_away():
    """The issue's case: after 100,000 inserts at 0.0004 samples per insert, Reverb
    allows 41 samples (0.0004 was once rounded to 0, allowing 2)."""
    limiter = jaxbuf.sample_to_insert_ratio(0.0004, 1, 2.0)
    state, allowed = limiter.inserted(limiter.init(), 100_000), 0
    while bool(limiter.can_sample(state, 1)):
        state, allowed = limiter.sampled(state, 1), allowed + 1
    assert allowed == 41


def test_decisions_under_vmap_are_each_states():
    limiter = jaxbuf.sample_to_insert_ratio(1 / 3, 5, 2.0)
    counts = [(26, 6, 2), (30, 6, 0), (2**32 + 7, 1431655767, 0), (4, 0, 0)]
    batched = jax.tree.map(lambda *x: np.stack(x), *(state_of(*c) for c in counts))
    got = jax.vmap(limiter.can_sample, in_axes=(0, None))(batched, 3)
    expected = [ReverbModel(1 / 3, 5, 2.0, *c).can_sample(3) for c in counts]
    assert got.tolist() == expected and any(expected) and not all(expected)


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
        ((1e300, 10**9, 1e300), ValueError, "gives the range [inf, inf], outside the doubles"),
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
    expected = "num_inserts must be an integer scalar in [0, 2**31 - 1], got -1"
    with pytest.raises(ValueError, match=re.escape(expected)):
        limiter.can_insert(limiter.init(), -1)
    with pytest.raises(ValueError, match=re.escape("n must be an integer scalar in [0, 2**31")):
        limiter.sampled(limiter.init(), 1.5)
    with pytest.raises(ValueError, match=re.escape("got 2147483648")):
        limiter.inserted(limiter.init(), 2**31)


def test_the_state_can_be_donated():
    """Each count is its own buffer, so a jitted step may donate the state."""
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, 2.0)
    step = jax.jit(lambda s: limiter.sampled(limiter.inserted(s, 2), 1), donate_argnums=0)
    state = step(step(limiter.init()))
    assert {k: int(v) for k, v in state.counts().items()} == {
        "inserts": 4, "samples": 2, "deletes": 0}  # fmt: skip


def test_the_state_saves_and_restores(tmp_path):
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, 2.0)
    state = limiter.sampled(limiter.inserted(limiter.init(), 3), 2)
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "limiter", state), limiter.init())
    assert {k: int(v) for k, v in restored.counts().items()} == {
        "inserts": 3, "samples": 2, "deletes": 0}  # fmt: skip


@pytest.mark.parametrize("spi, min_size, error_buffer", [CASES[1], CASES[4], CASES[8]])
def test_batches_allowed_is_how_many_batches_reverb_would_draw_in_a_row(
    spi, min_size, error_buffer
):
    limiter = jaxbuf.sample_to_insert_ratio(spi, min_size, error_buffer)
    allowed = jax.jit(jaxbuf.batches_allowed, static_argnums=(0, 3))
    rng = np.random.default_rng(min_size)
    seen = set()
    for _ in range(60):
        inserts = int(rng.integers(0, 400))
        deletes = int(rng.integers(0, inserts + 1)) if rng.random() < 0.2 else 0
        samples = max(int(inserts * spi) - int(rng.integers(-20, 60)), 0)
        batch = int(rng.integers(1, 9))
        model = ReverbModel(spi, min_size, error_buffer, inserts, samples, deletes)
        # the reference: draw batch after batch while Reverb allows, as a learner would
        expected = 0
        while expected < 8 and model.can_sample(batch):
            model.samples += batch
            expected += 1
        got = int(allowed(limiter, state_of(inserts, samples, deletes), batch, 8))
        assert got == expected, (inserts, samples, deletes, batch)
        seen.add(expected)
    assert {0, 8} <= seen and len(seen) > 3  # none, the cap, and some between


def test_batches_allowed_names_a_bad_cap():
    limiter = jaxbuf.sample_to_insert_ratio(1.0, 1, 2.0)
    with pytest.raises(ValueError, match="most"):
        jaxbuf.batches_allowed(limiter, limiter.init(), 4, 0)
    with pytest.raises(TypeError, match="most must be an integer"):
        jaxbuf.batches_allowed(limiter, limiter.init(), 4, 2.5)
