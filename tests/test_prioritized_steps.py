"""Prioritized sequences and n-step transitions against NumPy histories."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import env_time, prioritized_trajectory, prioritized_transition
from test_trajectory import EXAMPLE, History, make_steps
from test_transition import EXAMPLE as TRANSITION
from test_transition import Environments
from test_transition import Reference as TransitionReference

from jaxbuf.core.sumtree import tree as _sumtree


class Priorities:
    """Priorities keyed by (env, first step number); a start gets the maximum
    priority when it becomes valid."""

    def __init__(self, alpha):
        self.alpha, self.max_priority, self.rejected = alpha, 1.0, 0
        self.by_start = {}

    def refresh(self, valid):
        """`valid`: the set of (env, step number) valid now."""
        self.by_start = {
            start: self.by_start.get(start, self.max_priority) for start in sorted(valid)
        }

    def set(self, starts, priorities):
        for start, p in zip(starts, priorities, strict=True):
            if start in self.by_start and np.isfinite(p) and p >= 0:
                self.by_start[start] = p
                self.max_priority = max(self.max_priority, p)
            else:
                self.rejected += 1


def check_leaves(state, capacity, slot_of, priorities):
    num_slots = jax.tree.leaves(state.experience)[0].shape[0] * capacity
    leaves = np.asarray(_sumtree.leaves(state.sampler.tree, jnp.arange(num_slots)))
    expected = np.zeros(num_slots)
    for start, p in priorities.by_start.items():
        expected[slot_of(start)] = p**priorities.alpha if p > 0 else 0.0
    np.testing.assert_allclose(leaves, expected, rtol=1e-6)
    assert int(state.sampler.rejected) == priorities.rejected


@pytest.mark.parametrize("period, length", [(1, 1), (1, 4), (3, 6)])
def test_sequences_follow_priorities_and_never_straddle_the_write_position(period, length):
    num_envs, capacity, batch, alpha = 3, 12, 64, 0.8
    buffer = prioritized_trajectory(
        num_envs, capacity, batch, length, period=period, priority_exponent=alpha,
        done_fn=lambda s: s["done"],
    )  # fmt: skip
    add = jax.jit(buffer.add, donate_argnums=0)
    set_priorities, sample = jax.jit(buffer.set_priorities), jax.jit(buffer.sample)
    state, history, reference = buffer.init(EXAMPLE), History(num_envs, capacity), Priorities(alpha)
    rng = np.random.default_rng(period * 10 + length)
    total = 0
    for call in range(40):
        steps = make_steps(num_envs, int(rng.choice([1, 3, 7, 12])), total, rng)  # few shapes
        total += steps["t"].shape[1]
        state = add(state, steps)
        history.add(steps)
        oldest = total - min(total, capacity)
        starts = history.valid_starts(period, length)  # time index -> offset
        reference.refresh({(e, oldest + o) for e in range(num_envs) for o in starts.values()})

        def slot_of(start):
            return start[0] * capacity + start[1] % capacity

        check_leaves(state, capacity, slot_of, reference)
        if not starts:
            assert not buffer.can_sample(state)
            continue
        got = jax.device_get(sample(state, jax.random.key(call), importance_exponent=0.5))
        assert got.valid.all()
        for i in range(batch):
            env, time = divmod(int(got.indices[i]), capacity)
            assert time in starts and got.indices[i] == env * capacity + time
            window = history.sequence(env, starts[time], length)
            np.testing.assert_array_equal(got.experience["t"][i], window["t"])
        # Set priorities for the drawn starts and a few stale or invalid slots.
        extra = rng.integers(0, num_envs * capacity, 6)
        indices = np.concatenate([got.indices[:10], extra]).astype(np.int32)
        values = rng.choice([0.0, 0.5, 2.0, 9.0, -1.0, np.nan], len(indices)).astype(np.float32)
        state = set_priorities(state, jnp.asarray(indices), jnp.asarray(values))
        by_slot = {slot_of(start): start for start in reference.by_start}
        reference.set([by_slot.get(int(i), ("stale", int(i))) for i in indices], values)
        check_leaves(state, capacity, slot_of, reference)


def test_transitions_follow_priorities_and_match_naive_n_step_targets():
    num_envs, capacity, batch, n, discount = 3, 12, 128, 3, 0.9
    buffer = prioritized_transition(
        num_envs,
        capacity,
        batch,
        n_step=n,
        discount=discount,
        priority_exponent=1.0,
        min_episode_length=1,
    )
    add, sample = jax.jit(buffer.add, donate_argnums=0), jax.jit(buffer.sample)
    set_priorities = jax.jit(buffer.set_priorities)
    state = buffer.init(TRANSITION)
    rng = np.random.default_rng(5)
    envs = Environments(num_envs, 0.3, rng)
    history = TransitionReference(num_envs, capacity, n, discount, capacity)
    reference = Priorities(1.0)
    for call in range(30):
        rows, steps = envs.steps(int(rng.choice([1, 3, 7, 12])))  # few shapes to compile
        state = add(state, steps)
        for env, row in enumerate(rows):
            history.history[env].extend(row)
        allowed = {(e, s) for e in range(num_envs) for s in history.allowed(e)}
        reference.refresh(allowed)
        check_leaves(state, capacity, lambda s: s[0] * capacity + s[1] % capacity, reference)
        if not allowed:
            continue
        got = jax.device_get(sample(state, jax.random.key(call)))
        assert got.valid.all()
        t, (env_indices, time_indices) = got.experience, env_time(got, capacity)
        starts = [history.number(e, s) for e, s in zip(env_indices, time_indices, strict=True)]
        for i, (env, start) in enumerate(zip(env_indices.tolist(), starts, strict=True)):
            assert (env, start) in allowed
            _, ret, disc, following, length = history.target(env, start)
            np.testing.assert_allclose(t.reward[i], ret, rtol=1e-5, atol=1e-6)
            assert t.discount[i] == pytest.approx(disc) and got.length[i] == length
            assert t.next_obs["id"][i] == following["id"]
        probability = {
            s: p / sum(reference.by_start.values()) for s, p in reference.by_start.items()
        }
        expected = [probability[(e, s)] for e, s in zip(env_indices.tolist(), starts, strict=True)]
        np.testing.assert_allclose(got.probabilities, expected, rtol=1e-5)
        values = rng.uniform(0, 5, 8).astype(np.float32)
        state = set_priorities(state, jnp.asarray(got.indices[:8]), jnp.asarray(values))
        reference.set(list(zip(env_indices[:8].tolist(), starts[:8], strict=True)), values)


def test_transitions_whose_final_observation_is_lost_come_back_invalid():
    buffer = prioritized_transition(2, 12, 256, n_step=2, min_episode_length=6)
    state = buffer.init(TRANSITION)
    rng = np.random.default_rng(0)
    envs = Environments(2, 0.6, rng)  # episodes far shorter than 6 steps
    add = jax.jit(buffer.add)
    for _ in range(6):
        state = add(state, envs.steps(8)[1])
    assert np.asarray(state.side.stale).any()
    got = jax.device_get(jax.jit(buffer.sample)(state, jax.random.key(0)))
    env_indices, time_indices = env_time(got, 12)
    offsets = (time_indices - (int(state.position) - int(state.size))) % 12
    fresh = offsets >= np.asarray(state.side.stale)[env_indices]
    np.testing.assert_array_equal(got.valid, fresh)
    assert (~got.valid).any() and got.valid.any()
    assert (got.weights[~got.valid] == 0).all()


def test_add_step_vmap_and_errors():
    buffer = prioritized_trajectory(2, 8, 4, 3)
    steps = make_steps(2, 5, 0, np.random.default_rng(0))
    whole = buffer.add(buffer.init(EXAMPLE), steps)
    stepwise = buffer.init(EXAMPLE)
    add_step = jax.jit(chex.assert_max_traces(buffer.add_step, n=1), donate_argnums=0)
    for t in range(5):
        stepwise = add_step(stepwise, jax.tree.map(lambda x, t=t: x[:, t], steps))
    chex.assert_trees_all_equal(stepwise, whole)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), steps, steps)
    examples = jax.tree.map(lambda x: x[:, 0, 0], stacked)
    states = jax.vmap(buffer.add)(jax.vmap(buffer.init)(examples), stacked)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[1], states), whole)
    with pytest.raises(ValueError, match=re.escape("steps['done'] has num_envs=3")):
        jax.jit(buffer.add)(whole, make_steps(3, 2, 0, np.random.default_rng(1)))
    with pytest.raises(TypeError, match=re.escape("priorities must be floating point")):
        jax.jit(buffer.set_priorities)(whole, jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match=re.escape("priority_exponent must be in [0, 1]")):
        prioritized_transition(2, 8, 4, priority_exponent=-0.1)
    with pytest.raises(ValueError, match=re.escape("period=3 does not divide steps_per_env=8")):
        prioritized_trajectory(2, 8, 4, 2, period=3)
