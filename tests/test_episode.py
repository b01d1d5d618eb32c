"""Whole-episode sampling against a NumPy history of every environment."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import add_size, rejects_and_keeps_state
from scipy import stats

import jaxbuf

EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros(2), "done": jnp.bool_(False)}


def done_fn(step):
    return step["done"]


class Episodes:
    """Every step of every environment; the complete episodes a buffer should hold."""

    def __init__(self, num_envs, capacity, max_records):
        self.steps = [{} for _ in range(num_envs)]  # per environment, {name: [steps, ...]}
        self.capacity, self.k = capacity, max_records
        self.fresh = 0

    def make(self, length, done_probability, rng):
        num_envs = len(self.steps)
        ids = self.fresh + 1 + np.arange(num_envs * length, dtype=np.int32)
        self.fresh += num_envs * length
        steps = {
            "id": ids.reshape(num_envs, length),
            "obs": rng.normal(size=(num_envs, length, 2)).astype(np.float32),
            "done": rng.random((num_envs, length)) < done_probability,
        }
        for env, history in enumerate(self.steps):
            for k, v in steps.items():
                history[k] = np.concatenate([history[k], v[env]]) if k in history else v[env]
        return steps

    def complete(self, env):
        """(first step number, length) of every complete, recorded, stored episode."""
        done = self.steps[env].get("done", np.zeros(0, bool))
        oldest = len(done) - min(len(done), self.capacity)
        ends = np.flatnonzero(done).tolist()
        previous = [-1, *ends][: len(ends)]
        episodes = [(prev + 1, end - prev) for prev, end in zip(previous, ends, strict=True)]
        return [e for e in episodes[-self.k :] if e[0] >= oldest]

    def episode(self, env, first, max_length):
        return {k: v[first : first + max_length] for k, v in self.steps[env].items()}


@pytest.mark.parametrize(
    "capacity, max_length, min_episode_length, done_probability, platform_path",
    [(12, 12, 1, 0.3, "cpu path"), (12, 5, 1, 0.15, "cpu path"), (16, 6, 3, 0.4, "cpu path"),
     (9, 3, 1, 0.6, "cpu path"), (12, 12, 1, 0.3, "accelerator path"),
     (16, 6, 3, 0.4, "accelerator path")],
    indirect=["platform_path"],
)  # fmt: skip
def test_episodes_are_complete_stored_and_padded_at_every_wrap(
    capacity, max_length, min_episode_length, done_probability, platform_path
):
    num_envs, batch = 3, 256
    buffer = jaxbuf.make_episode_buffer(
        num_envs, capacity, batch, max_length, done_fn=done_fn,
        min_episode_length=min_episode_length,
    )  # fmt: skip
    add, sample = jax.jit(buffer.add, donate_argnums=0), jax.jit(buffer.sample)
    state = buffer.init(EXAMPLE)
    rng = np.random.default_rng(capacity * 10 + max_length)
    records = -(-capacity // buffer.config.min_episode_length)
    history = Episodes(num_envs, capacity, records)
    saw_cut = False
    for call in range(40):
        state = add(state, history.make(add_size(rng, capacity), done_probability, rng))
        complete = [history.complete(env) for env in range(num_envs)]
        np.testing.assert_array_equal(state.side.size, [len(c) for c in complete])
        assert bool(buffer.can_sample(state)) == any(complete)
        if not any(complete):
            continue
        got = jax.device_get(sample(state, jax.random.key(call)))
        first_steps = np.asarray(state.side.first_step)  # read in Python: one transfer
        assert got.valid.all()
        seen = set()
        # each row's episode, zero-padded past its shown steps: compared whole per column
        expected = {name: np.zeros_like(column) for name, column in got.experience.items()}
        shown = np.minimum(got.length, max_length)
        for i in range(batch):
            env, slot = divmod(int(got.indices[i]), records)
            first, length = int(first_steps[env, slot]), int(got.length[i])
            assert (first, length) in complete[env], (call, env, first, length)
            seen.add((env, first))
            for name, steps in history.episode(env, first, int(shown[i])).items():
                expected[name][i, : shown[i]] = steps
        saw_cut |= bool((got.length > max_length).any())
        np.testing.assert_array_equal(got.mask, np.arange(max_length) < shown[:, None])
        for name, column in got.experience.items():
            np.testing.assert_array_equal(column, expected[name], err_msg=f"{name}, call {call}")
        assert seen == {(env, e[0]) for env in range(num_envs) for e in complete[env]}
    assert saw_cut == (max_length < capacity)


def test_each_complete_episode_is_equally_likely_whatever_its_length():
    buffer = jaxbuf.make_episode_buffer(2, 64, 4096, 64, done_fn=done_fn)
    ends = np.zeros((2, 60), bool)
    ends[0, [0, 20, 21, 59]] = True  # lengths 1, 20, 1, 38
    ends[1, [9, 10, 49]] = True  # lengths 10, 1, 39
    steps = {
        "id": np.zeros((2, 60), np.int32),
        "obs": np.zeros((2, 60, 2), np.float32),
        "done": ends,
    }
    state = buffer.add(buffer.init(EXAMPLE), steps)
    got = jax.device_get(jax.jit(buffer.sample)(state, jax.random.key(7)))
    pairs = got.indices[:, None]
    _, counts = np.unique(np.array(pairs), axis=0, return_counts=True)
    assert len(counts) == 7
    assert stats.chisquare(counts).pvalue > 1e-3


def test_unfinished_and_overwritten_episodes_are_never_sampled():
    buffer = jaxbuf.make_episode_buffer(1, 8, 16, 8, done_fn=done_fn)
    step = lambda done: {  # noqa: E731
        "id": np.zeros((1, len(done)), np.int32),
        "obs": np.zeros((1, len(done), 2), np.float32),
        "done": np.array([done]),
    }
    state = buffer.add(buffer.init(EXAMPLE), step([False] * 5))
    assert not buffer.can_sample(state)  # one open episode only
    assert not jax.jit(buffer.sample)(state, jax.random.key(0)).valid.any()
    state = buffer.add(state, step([False, True]))  # an episode of 7 steps
    assert int(state.side.size[0]) == 1 and bool(buffer.can_sample(state))
    state = buffer.add(state, step([False, False]))  # its first step is overwritten
    assert int(state.side.size[0]) == 0 and not buffer.can_sample(state)


def test_vmap_add_step_and_no_retracing():
    buffer = jaxbuf.make_episode_buffer(2, 10, 8, 4, done_fn=done_fn)
    history = Episodes(2, 10, 10)
    rng = np.random.default_rng(3)
    chunks = [history.make(7, 0.3, rng) for _ in range(3)]
    examples = jax.tree.map(lambda x: jnp.zeros((3, *x.shape), x.dtype), EXAMPLE)
    states = jax.vmap(buffer.init)(examples)
    states = jax.jit(jax.vmap(buffer.add))(states, jax.tree.map(lambda *x: jnp.stack(x), *chunks))
    keys = jax.random.split(jax.random.key(1), 3)
    batches = jax.device_get(jax.jit(jax.vmap(buffer.sample))(states, keys))
    add_step = jax.jit(chex.assert_max_traces(buffer.add_step, n=1), donate_argnums=0)
    for i, chunk in enumerate(chunks):
        whole = buffer.add(buffer.init(EXAMPLE), chunk)
        stepwise = buffer.init(EXAMPLE)
        for t in range(7):
            stepwise = add_step(stepwise, jax.tree.map(lambda x, t=t: x[:, t], chunk))
        chex.assert_trees_all_equal(stepwise, whole)
        one = jax.device_get(buffer.sample(whole, keys[i]))
        chex.assert_trees_all_equal(jax.tree.map(lambda x, i=i: x[i], batches), one)


def test_donated_add_is_in_place():
    buffer = jaxbuf.make_episode_buffer(4, 32, 8, 8, done_fn=done_fn)
    add = jax.jit(buffer.add, donate_argnums=0)
    steps = Episodes(4, 32, 32).make(1, 0.3, np.random.default_rng(0))
    state = buffer.init(EXAMPLE)
    text = add.lower(state, steps).as_text()
    assert text.count("tf.aliasing_output") == len(jax.tree.leaves(state))
    old = state
    state = add(state, steps)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_length": 9}, ValueError, "max_length must be in [1, 8]"),
        ({"min_episode_length": 0}, ValueError, "min_episode_length must be in [1, 8]"),
        ({"min_episodes": 17, "min_episode_length": 4}, ValueError, "min_episodes=17 exceeds"),
        ({"done_fn": "done"}, TypeError, "done_fn must be callable, got str"),
    ],
)
def test_configuration_errors(kwargs, error, match):
    options = {"max_length": 4, "done_fn": done_fn} | kwargs
    with pytest.raises(error, match=re.escape(match)):
        jaxbuf.make_episode_buffer(8, 8, 4, **options)


@pytest.mark.parametrize("wrap", ["eager", "jit", "vmap"])
@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda s: s | {"obs": s["obs"].astype(np.float16)}, TypeError,
         "steps['obs'] has dtype float16; expected float32"),
        (lambda s: {"obs": s["obs"], "done": s["done"]}, ValueError, "missing leaves ['id']"),
        (lambda s: s | {"id": s["id"][:, :1]}, ValueError, "steps['id'] has T=1"),
        (lambda s: s | {"done": s["done"].astype(np.int32)}, TypeError,
         "steps['done'] has dtype int32; expected bool"),
    ],
)  # fmt: skip
def test_add_errors_name_the_leaf_and_leave_the_state_intact(wrap, change, error, match):
    buffer = jaxbuf.make_episode_buffer(2, 8, 4, 4, done_fn=done_fn)
    steps = Episodes(2, 8, 8).make(3, 0.3, np.random.default_rng(2))
    state = buffer.add(buffer.init(EXAMPLE), steps)
    bad = change(steps)
    rejects_and_keeps_state(wrap, buffer.add, state, bad, error=error, match=match)


def test_done_fn_must_return_a_bool_per_step():
    buffer = jaxbuf.make_episode_buffer(2, 8, 4, 4, done_fn=lambda step: step["obs"])
    steps = Episodes(2, 8, 8).make(3, 0.3, np.random.default_rng(2))
    with pytest.raises(TypeError, match=re.escape("done_fn must return a bool scalar per step")):
        jax.jit(buffer.add)(buffer.init(EXAMPLE), steps)
