"""Prefill from a policy against a Python loop over the same environment and keys."""

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

ENVS, STEPS = 3, 40


def environment():
    env, params = gymnax.make("CartPole-v1")
    return jaxbuf.envs.gymnax_env(env, params.replace(max_steps_in_episode=15))  # truncations


def buffer_of(kind):
    if kind == "replay":
        return jaxbuf.make_replay_buffer(256, 8)
    if kind == "trajectory":
        return jaxbuf.make_trajectory_buffer(ENVS, 64, 4, 3, done_fn=lambda s: s["done"])
    if kind == "transition":
        return jaxbuf.make_transition_buffer(ENVS, 64, 4, n_step=2)
    return jaxbuf.make_episode_buffer(ENVS, 64, 4, 16, done_fn=lambda s: s["done"])


def python_loop(buffer, state, key, env, kind):
    """What prefill promises, one Python step at a time with the same keys."""
    record = jaxbuf.rl.prefill.record_step(buffer)
    reset_key, run_key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, ENVS))
    ends = 0
    for step_key in jax.random.split(run_key, STEPS):
        act_key, env_key = jax.random.split(step_key)
        action = jax.vmap(env.random_policy)(jax.random.split(act_key, ENVS), obs)
        new_obs, env_state, reward, term, trunc, info = jax.vmap(env.step)(
            jax.random.split(env_key, ENVS), env_state, action
        )
        data = jax.vmap(record)(obs, action, reward, term, trunc, info["final_observation"])
        state = buffer.add(state, data) if kind == "replay" else buffer.add_step(state, data)
        ends += int((term | trunc).sum())
        obs = new_obs
    return state, ends


@pytest.mark.parametrize("kind", ["replay", "trajectory", "transition", "episode"])
def test_prefill_equals_a_python_loop_over_the_same_environment(kind):
    env, buffer = environment(), buffer_of(kind)
    obs = jnp.zeros(4)
    no = jnp.bool_(False)
    example = jaxbuf.rl.prefill.record_step(buffer)(obs, jnp.int32(0), jnp.float32(0), no, no, obs)
    state = buffer.init(example)
    key = jax.random.key(7)
    filled = jax.jit(lambda s, k: jaxbuf.envs.prefill(buffer, s, k, env, STEPS, num_envs=ENVS),
                     donate_argnums=0)(buffer.init(example), key)  # fmt: skip
    looped, ends = python_loop(buffer, state, key, env, kind)
    assert ends > 0  # episodes ended (truncations at 15 steps included)
    jax.tree.map(same, jax.device_get(filled), jax.device_get(looped))


def same(got, want):
    """Equal; floats within a few ulps (the jitted scan fuses the physics)."""
    if np.issubdtype(np.asarray(got).dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_true_final_observations_are_recorded_at_truncations():
    env, buffer = environment(), buffer_of("replay")
    obs = jnp.zeros(4)
    no = jnp.bool_(False)
    example = jaxbuf.rl.prefill.record_step(buffer)(obs, jnp.int32(0), jnp.float32(0), no, no, obs)
    state = jaxbuf.envs.prefill(
        buffer, buffer.init(example), jax.random.key(0), env, 40, num_envs=2
    )
    items = jaxbuf.io.stored_items(state)
    truncated = items["truncated"]
    assert truncated.any()
    # Within an episode next_obs is the following step's obs; at an end it is not
    # the reset observation the environment returned (CartPole resets near 0).
    following = items["obs"][2:]  # two environments per step
    inside = ~(items["terminated"] | truncated)[:-2]
    np.testing.assert_allclose(items["next_obs"][:-2][inside], following[inside])
    assert np.abs(items["next_obs"][truncated]).max() > 0.05


def test_bad_arguments_are_named():
    env = environment()
    with pytest.raises(ValueError, match="num_envs=2 differs from the buffer's 3"):
        jaxbuf.envs.prefill(buffer_of("transition"), None, jax.random.key(0), env, 5, num_envs=2)
    with pytest.raises(TypeError, match="num_envs must be an integer"):
        jaxbuf.envs.prefill(buffer_of("replay"), None, jax.random.key(0), env, 5)
    with pytest.raises(TypeError, match="prefill fills a sampled buffer"):
        jaxbuf.envs.prefill(jaxbuf.make_queue(8, 2, 2), None, jax.random.key(0), env, 5)
