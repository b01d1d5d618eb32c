"""The trajectory buffer against a NumPy history of every environment."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import add_size
from scipy import stats

import jaxbuf

EXAMPLE = {"t": jnp.int32(0), "env": jnp.int32(0), "obs": jnp.zeros(2), "done": jnp.bool_(False)}


class History:
    """Every step each environment ever added, and what a buffer of `capacity` keeps."""

    def __init__(self, num_envs: int, capacity: int):
        self.steps = [[] for _ in range(num_envs)]
        self.capacity = capacity

    def add(self, steps: dict) -> None:
        for env, history in enumerate(self.steps):
            for t in range(steps["t"].shape[1]):
                history.append({k: np.asarray(v[env, t]) for k, v in steps.items()})

    def valid_starts(self, period: int, length: int) -> dict[int, int]:
        """Storage time index -> chronological offset of every allowed sequence start."""
        total = len(self.steps[0])
        size = min(total, self.capacity)
        starts = {}
        for offset in range(size - length + 1):
            index = (total - size + offset) % self.capacity
            if index % period == 0:
                starts[index] = offset
        return starts

    def sequence(self, env: int, offset: int, length: int) -> dict:
        total = len(self.steps[env])
        size = min(total, self.capacity)
        window = self.steps[env][total - size + offset : total - size + offset + length]
        return {k: np.stack([step[k] for step in window]) for k in window[0]}


def make_steps(num_envs, length, start, rng):
    t = np.arange(start, start + length, dtype=np.int32)
    return {
        "t": np.tile(t, (num_envs, 1)),
        "env": np.repeat(np.arange(num_envs, dtype=np.int32)[:, None], length, axis=1),
        "obs": rng.normal(size=(num_envs, length, 2)).astype(np.float32),
        "done": rng.random((num_envs, length)) < 0.2,
    }


@pytest.mark.parametrize("period, length", [(1, 1), (1, 4), (3, 6), (4, 12)])
def test_sequences_are_consecutive_stored_steps_at_every_wrap(period, length):
    num_envs, capacity = 3, 12
    buffer = jaxbuf.make_trajectory_buffer(
        num_envs, capacity, 64, length, period=period, done_fn=lambda s: s["done"]
    )
    add, sample = jax.jit(buffer.add, donate_argnums=0), jax.jit(buffer.sample)
    state, history = buffer.init(EXAMPLE), History(num_envs, capacity)
    rng = np.random.default_rng(period * 100 + length)
    total = 0
    for call in range(40):
        steps = make_steps(num_envs, add_size(rng, capacity), total, rng)
        total += steps["t"].shape[1]
        state = add(state, steps)
        history.add(steps)
        starts = history.valid_starts(period, length)
        assert bool(buffer.can_sample(state)) == (
            len(starts) > 0 and min(total, capacity) >= length
        )
        if not starts:
            continue
        batch = jax.device_get(sample(state, jax.random.key(call)))
        assert batch.valid.all()
        for i in range(64):
            env, start = divmod(int(batch.indices[i]), capacity)
            assert start in starts, (start, starts)
            expected = history.sequence(env, starts[start], length)
            chex.assert_trees_all_equal(
                jax.tree.map(lambda x, i=i: x[i], batch.experience), expected
            )
            done = expected["done"]
            np.testing.assert_array_equal(
                batch.mask[i], [not done[:t].any() for t in range(length)]
            )


def test_starts_are_uniform_over_environments_and_allowed_starts():
    buffer = jaxbuf.make_trajectory_buffer(4, 20, 32, 5, period=2)
    rng = np.random.default_rng(0)
    state = buffer.add(
        buffer.add(buffer.init(EXAMPLE), make_steps(4, 20, 0, rng)), make_steps(4, 7, 20, rng)
    )
    history = History(4, 20)
    history.add(make_steps(4, 27, 0, rng))
    allowed = sorted(history.valid_starts(2, 5))
    keys = jax.random.split(jax.random.key(1), 800)
    batch = jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0)))(state, keys)
    pairs = np.asarray(batch.indices)
    cells = [env * 20 + start for env in range(4) for start in allowed]
    counts = np.bincount(pairs.ravel(), minlength=80)
    assert counts.sum() == counts[cells].sum()  # nothing outside the allowed starts
    assert stats.chisquare(counts[cells]).pvalue > 1e-3


def test_add_step_equals_add_of_one_step_and_sampling_below_min_size_is_flagged():
    buffer = jaxbuf.make_trajectory_buffer(2, 8, 4, 3, min_size=5)
    rng = np.random.default_rng(2)
    steps = make_steps(2, 1, 0, rng)
    one = buffer.add_step(buffer.init(EXAMPLE), jax.tree.map(lambda x: x[:, 0], steps))
    chex.assert_trees_all_equal(one, buffer.add(buffer.init(EXAMPLE), steps))
    state = buffer.add(one, make_steps(2, 3, 1, rng))
    assert int(state.size) == 4 and not bool(buffer.can_sample(state))
    assert not jax.device_get(buffer.sample(state, jax.random.key(0)).valid).any()
    empty = buffer.sample(buffer.init(EXAMPLE), jax.random.key(0))
    assert not jax.device_get(empty.valid).any() and empty.mask is None


def test_adds_are_in_place_and_never_retrace():
    buffer = jaxbuf.make_trajectory_buffer(4, 64, 16, 8)
    add = jax.jit(chex.assert_max_traces(buffer.add, n=1), donate_argnums=0)
    sample = jax.jit(chex.assert_max_traces(buffer.sample, n=1))
    state = buffer.init(EXAMPLE)
    rng = np.random.default_rng(0)
    for call in range(20):
        old = jax.tree.leaves(state)
        state = add(state, make_steps(4, 5, 5 * call, rng))
        assert all(leaf.is_deleted() for leaf in old)
        sample(state, jax.random.key(call))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(sequence_length=13), ValueError, "sequence_length=13 exceeds steps_per_env=12"),
        (dict(period=5), ValueError, "period=5 does not divide steps_per_env=12"),
        (
            dict(min_size=2),
            ValueError,
            "min_size=2 must be in [sequence_length, steps_per_env] = [4, 12]",
        ),
        (dict(num_envs=0), ValueError, "num_envs must be in [1,"),
        (dict(done_fn="done"), TypeError, "done_fn must be callable, got str"),
    ],
)
def test_bad_configuration_is_named(kwargs, error, message):
    arguments = dict(num_envs=2, steps_per_env=12, sample_batch_size=4, sequence_length=4) | kwargs
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.make_trajectory_buffer(**arguments)


def test_bad_steps_are_named(variant):
    buffer = jaxbuf.make_trajectory_buffer(2, 12, 4, 4, done_fn=lambda s: s["t"])
    state = buffer.init(EXAMPLE)
    rng = np.random.default_rng(0)
    with pytest.raises(
        ValueError, match=re.escape("steps['done'] has num_envs=3 (shape (3, 2)), but it must be 2")
    ):
        variant(buffer.add)(state, make_steps(3, 2, 0, rng))
    with pytest.raises(
        ValueError,
        match=re.escape("steps holds T=13 steps per environment, more than steps_per_env=12"),
    ):
        variant(buffer.add)(state, make_steps(2, 13, 0, rng))
    with pytest.raises(
        ValueError, match=re.escape("step['done'] has shape (2, 1); expected (num_envs,)")
    ):
        variant(buffer.add_step)(state, make_steps(2, 1, 0, rng))
    state = buffer.add(state, make_steps(2, 6, 0, rng))
    with pytest.raises(
        TypeError, match="done_fn must return a bool scalar per step, got dtype int32"
    ):
        variant(buffer.sample)(state, jax.random.key(0))
