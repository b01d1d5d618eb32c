"""The rollout buffer: storage, GAE against NumPy, overflow, minibatches, errors."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import np_gae

import jaxbuf

T, N = 12, 3
EXAMPLE = {
    "obs": np.zeros(2, np.float32),
    "id": np.int32(0),
    "reward": np.float32(0),
    "value": np.float32(0),
    "final_value": np.float32(0),
    "terminated": np.bool_(False),
    "truncated": np.bool_(False),
}


def random_steps(seed: int, steps: int = T) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        terminated = rng.random(N) < 0.15
        out.append(
            {
                "obs": rng.normal(size=(N, 2)).astype(np.float32),
                "id": (t * N + np.arange(N)).astype(np.int32),
                "reward": rng.normal(size=N).astype(np.float32),
                "value": rng.normal(size=N).astype(np.float32),
                "final_value": rng.normal(size=N).astype(np.float32),
                "terminated": terminated,
                "truncated": (rng.random(N) < 0.15) & ~terminated,
            }
        )
    return out


def reference_advantages(steps: list[dict], last_value: np.ndarray, gamma: float, lam: float):
    """The bootstrap built step by step: next step's value, final value, or last value."""
    stack = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    size = len(steps)
    next_values = np.empty((size, N), np.float32)
    for t in range(size):
        following = stack["value"][t + 1] if t + 1 < size else last_value
        next_values[t] = np.where(stack["truncated"][t], stack["final_value"][t], following)
    cut = stack["truncated"].copy()
    cut[-1] = True
    shape = (size, N)
    return np_gae(
        stack["reward"], stack["value"], next_values, stack["terminated"], cut,
        np.full(shape, gamma, np.float32), np.full(shape, lam, np.float32),
    )  # fmt: skip


def filled(buffer, steps):
    add = jax.jit(buffer.add, donate_argnums=0)
    state = buffer.init(EXAMPLE)
    for step in steps:
        state = add(state, step)
    return state


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_finish_matches_numpy_gae_with_truncation_bootstraps(method, variant):
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.97, gae_lambda=0.9, method=method)
    steps = random_steps(0)
    state = filled(buffer, steps)
    assert int(state.size) == T and int(state.dropped) == 0
    last_value = np.random.default_rng(9).normal(size=N).astype(np.float32)
    state = variant(buffer.finish)(state, last_value)
    advantages, returns = reference_advantages(steps, last_value, 0.97, 0.9)
    np.testing.assert_allclose(state.advantages, advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state.returns, returns, rtol=1e-5, atol=1e-5)
    stored = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    chex.assert_trees_all_equal(jax.device_get(state.experience), stored)


def test_a_partial_rollout_after_clear_ignores_stale_steps():
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.9, gae_lambda=0.8)
    state = buffer.clear(filled(buffer, random_steps(1)))  # old data stays in storage
    fresh = random_steps(2, steps=5)
    for step in fresh:
        state = buffer.add(state, step)
    last_value = np.ones(N, np.float32)
    state = buffer.finish(state, last_value)
    advantages, returns = reference_advantages(fresh, last_value, 0.9, 0.8)
    np.testing.assert_allclose(state.advantages[:5], advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state.returns[:5], returns, rtol=1e-5, atol=1e-5)
    assert not np.asarray(state.advantages[5:]).any() and not np.asarray(state.returns[5:]).any()
    batch = buffer.minibatches(state, jax.random.key(0), num_minibatches=4)
    assert int(batch.valid.sum()) == 5 * N
    assert set(np.asarray(batch.experience["id"])[np.asarray(batch.valid)].tolist()) == set(
        range(5 * N)
    )


def test_adding_to_a_full_rollout_stores_nothing_and_counts_it():
    buffer = jaxbuf.make_rollout_buffer(4, N, discount=0.9, gae_lambda=0.9)
    steps = random_steps(3, steps=7)
    state = filled(buffer, steps)
    assert int(state.size) == 4 and int(state.dropped) == 3
    kept = {k: np.stack([s[k] for s in steps[:4]]) for k in steps[0]}
    chex.assert_trees_all_equal(jax.device_get(state.experience), kept)
    state = buffer.clear(state)
    assert int(state.size) == 0 and int(state.dropped) == 0


def test_minibatches_are_a_normalized_permutation_of_the_rollout():
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.99, gae_lambda=0.95)
    state = buffer.finish(filled(buffer, random_steps(4)), np.zeros(N, np.float32))
    batch = jax.jit(buffer.minibatches, static_argnums=2)(state, jax.random.key(1), 6)
    chex.assert_shape(batch.experience["obs"], (6, T * N // 6, 2))
    chex.assert_shape([batch.advantages, batch.returns, batch.valid], (6, T * N // 6))
    ids = np.asarray(batch.experience["id"]).ravel()
    assert sorted(ids.tolist()) == list(range(T * N))  # every step exactly once
    assert ids.tolist() != list(range(T * N))  # shuffled
    t, env = ids // N, ids % N
    np.testing.assert_array_equal(
        np.asarray(batch.returns).ravel(), np.asarray(state.returns)[t, env]
    )
    advantages = np.asarray(state.advantages)[t, env]
    expected = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    np.testing.assert_allclose(np.asarray(batch.advantages).ravel(), expected, rtol=1e-4, atol=1e-5)
    other = buffer.minibatches(state, jax.random.key(2), 6)
    assert not np.array_equal(other.experience["id"], batch.experience["id"])
    raw = jaxbuf.make_rollout_buffer(
        T, N, discount=0.99, gae_lambda=0.95, normalize_advantages=False
    )
    unnormalized = raw.minibatches(state, jax.random.key(1), 6)
    np.testing.assert_allclose(np.asarray(unnormalized.advantages).ravel(), advantages)


def test_a_whole_ppo_style_update_runs_in_one_jit_without_retracing():
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.99, gae_lambda=0.95)
    steps = jax.tree.map(lambda *x: np.stack(x), *random_steps(5))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def update(state, steps, key):
        state = buffer.clear(state)
        state, _ = jax.lax.scan(lambda s, step: (buffer.add(s, step), None), state, steps)
        state = buffer.finish(state, jnp.zeros(N))

        def epoch(total, epoch_key):
            batch = buffer.minibatches(state, epoch_key, 4)
            inner = jax.lax.scan(lambda acc, mb: (acc + mb.returns.sum(), None), total, batch)
            return inner[0], None

        total, _ = jax.lax.scan(epoch, jnp.float32(0), jax.random.split(key, 3))
        return state, total

    state = buffer.init(EXAMPLE)
    for seed in range(3):
        state, total = update(state, steps, jax.random.key(seed))
        np.testing.assert_allclose(total, 3 * np.asarray(state.returns).sum(), rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_steps=0), ValueError, "num_steps must be in [1,"),
        (dict(num_envs=2.0), TypeError, "num_envs must be an integer"),
        (dict(discount=1.5), ValueError, "discount must be in [0, 1], got 1.5"),
        (dict(gae_lambda="0.9"), TypeError, "gae_lambda must be a number in [0, 1], got '0.9'"),
        (dict(normalize_advantages=1), TypeError, "normalize_advantages must be a bool"),
        (dict(method="fast"), ValueError, "method must be one of ('auto', 'scan', 'associative')"),
    ],
)
def test_bad_configuration_is_named(kwargs, error, message):
    arguments = dict(num_steps=4, num_envs=2, discount=0.99, gae_lambda=0.95) | kwargs
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.make_rollout_buffer(
            arguments.pop("num_steps"), arguments.pop("num_envs"), **arguments
        )


def test_bad_steps_and_calls_are_named(variant):
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.99, gae_lambda=0.95)
    with pytest.raises(ValueError, match=re.escape("example_step lacks ['final_value']")):
        buffer.init({k: v for k, v in EXAMPLE.items() if k != "final_value"})
    with pytest.raises(
        TypeError, match=re.escape("example_step['truncated'] must be a bool scalar")
    ):
        buffer.init(EXAMPLE | {"truncated": np.float32(0)})
    with pytest.raises(TypeError, match=re.escape("example_step['reward'] must be a float scalar")):
        buffer.init(EXAMPLE | {"reward": np.zeros(2, np.float32)})
    with pytest.raises(TypeError, match="example_step must be a dict"):
        buffer.init([np.float32(0)])
    state = buffer.init(EXAMPLE)
    step = random_steps(6)[0]
    with pytest.raises(
        ValueError, match=re.escape("step['obs'] has shape (3, 3); expected (num_envs, 2)")
    ):
        variant(buffer.add)(state, step | {"obs": np.zeros((N, 3), np.float32)})
    with pytest.raises(
        ValueError, match=re.escape("step['value'] has num_envs=2 (shape (2,)), but it must be 3")
    ):
        variant(buffer.add)(state, step | {"value": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=re.escape("last_value has shape (2,); expected (3,)")):
        variant(buffer.finish)(state, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=re.escape("= 36 is not divisible by num_minibatches=5")):
        buffer.minibatches(state, jax.random.key(0), 5)


def test_advantage_normalization_of_a_partial_rollout_uses_only_its_valid_steps():
    buffer = jaxbuf.make_rollout_buffer(T, N, discount=0.99, gae_lambda=0.95)
    state = buffer.clear(buffer.finish(filled(buffer, random_steps(5)), np.zeros(N, np.float32)))
    for step in random_steps(6, steps=5):
        step = dict(step, reward=np.float32(10) * step["reward"] + np.float32(3))
        state = buffer.add(state, step)
    state = buffer.finish(state, np.ones(N, np.float32))
    batch = buffer.minibatches(state, jax.random.key(2), num_minibatches=3)
    valid = np.asarray(batch.valid)
    advantages = np.asarray(batch.advantages)[valid]
    assert valid.sum() == 5 * N
    np.testing.assert_allclose(advantages.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(advantages.std(), 1.0, rtol=1e-4)
    assert not np.asarray(batch.advantages)[~valid].any()
