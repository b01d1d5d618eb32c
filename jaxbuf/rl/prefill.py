"""Filling a buffer from vmapped environments and a policy, in one jitted call.

Environments are pure functions in gymnax's interface, for ONE environment
(they are vmapped here):

- `reset(key) -> (obs, env_state)`;
- `step(key, env_state, action) -> (obs, env_state, reward, terminated,
  truncated, info)`, resetting by itself when an episode ends, with the true
  last observation in `info["final_observation"]` (what gymnax returns).

`jaxbuf.envs.gymnax_env(env, params)` makes both from a gymnax environment, with a
uniform random policy from its action space.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Layout
from jaxbuf.core.records import PyTree


class Environment(NamedTuple):
    """One environment's pure functions, and a default policy.

    Examples:
      >>> import gymnax, jaxbuf
      >>> env = jaxbuf.envs.gymnax_env(*gymnax.make("CartPole-v1"))
      >>> sorted(env._fields)
      ['random_policy', 'reset', 'step']
    """

    reset: Callable[[jax.Array], tuple[Any, Any]]
    step: Callable[..., tuple]
    random_policy: Callable[[jax.Array, Any], Any]


def gymnax_env(env: Any, params: Any) -> Environment:
    """The `Environment` of a gymnax environment with its parameters; its
    `random_policy(key, obs)` samples the action space uniformly.

    Examples:
      >>> import gymnax, jax, jaxbuf
      >>> env = jaxbuf.envs.gymnax_env(*gymnax.make("CartPole-v1"))
      >>> obs, env_state = env.reset(jax.random.key(0))
      >>> obs.shape, int(env.random_policy(jax.random.key(1), obs)) in (0, 1)
      ((4,), True)
    """
    space = env.action_space(params)

    def standard(fn: Callable) -> Callable:
        # gymnax mixes Python floats and int32 arrays: trace it under standard
        # promotion, so it also runs where a user set `jax_numpy_dtype_promotion`.
        def run(*args):
            with jax.numpy_dtype_promotion("standard"):
                return fn(*args)

        return run

    return Environment(
        reset=standard(lambda key: env.reset(key, params)),
        step=standard(lambda key, state, action: env.step(key, state, action, params)),
        random_policy=standard(lambda key, obs: space.sample(key)),
    )


def record_step(buffer: Any) -> Callable[..., PyTree]:
    """What one step becomes for `buffer`: the dict of `obs`, `action`, `reward`,
    `terminated`, `truncated` and `next_obs` (the true next observation; a transition
    buffer reads it as its `Transition`), with `done` (either flag) for a buffer that
    takes a `done_fn` (trajectory, episode: its configuration has `done_fn` or `done_key`)."""
    with_done = {"done_key", "done_fn"} & set(buffer.config)

    def record(obs, action, reward, terminated, truncated, next_obs):
        step = {"obs": obs, "action": action, "reward": reward, "terminated": terminated,
                "truncated": truncated, "next_obs": next_obs}  # fmt: skip
        return step | ({"done": terminated | truncated} if with_done else {})

    return record


def prefill(
    buffer: Any,
    state: Any,
    key: jax.Array,
    env: Environment,
    num_steps: int,
    *,
    num_envs: int | None = None,
    policy: Callable[[jax.Array, Any], Any] | None = None,
    record: Callable[..., PyTree] | None = None,
) -> Any:
    """Steps `num_envs` environments `num_steps` times and adds every step.

    One `lax.scan`: jit the call (and donate `state`) to compile it once. Keys:
    `key` splits into the resets' keys and one key per step, which splits into
    the policy's and the environments' keys, so equal keys give equal states.

    Args:
      buffer: any sampled buffer (replay, trajectory, transition, episode).
      state: its state; the steps are added to it.
      key: a PRNG key.
      env: the environment (see the module docstring, `gymnax_env`).
      num_steps: steps per environment.
      num_envs: environments; the buffer's `num_envs` by default (required for a
        replay buffer, which gets `num_envs` items per step).
      policy: `policy(key, obs) -> action` for one environment; `env`'s random
        policy by default.
      record: `record(obs, action, reward, terminated, truncated, next_obs)` for
        one environment's step -> what the buffer stores; `record_step(buffer)`
        by default. `next_obs` is the true next observation, the final one at
        an episode end.

    Returns:
      The state with `num_envs * num_steps` steps added.

    Examples:
      >>> import gymnax, jax, jax.numpy as jnp, jaxbuf
      >>> env = jaxbuf.envs.gymnax_env(*gymnax.make("CartPole-v1"))
      >>> buffer = jaxbuf.make_transition_buffer(4, 100, 8, n_step=3)
      >>> obs = jnp.zeros(4)
      >>> example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
      ...                             jnp.bool_(False), obs)
      >>> state = jaxbuf.envs.prefill(buffer, buffer.init(example), jax.random.key(0), env, 50)
      >>> int(state.size), bool(buffer.can_sample(state))
      (50, True)
    """
    if not isinstance(getattr(buffer, "layout", None), Layout):
        raise TypeError(f"prefill fills a sampled buffer, got {type(buffer).__name__}.")
    num_steps = _validation.check_int("num_steps", num_steps)
    num_envs = buffer.config.get("num_envs") if num_envs is None else num_envs
    per_env = buffer.add_step is not None  # a time line per environment
    if per_env and num_envs != buffer.config.num_envs:
        raise ValueError(f"num_envs={num_envs} differs from the buffer's {buffer.config.num_envs}.")
    num_envs = _validation.check_int("num_envs", num_envs)
    policy = env.random_policy if policy is None else policy
    record = record_step(buffer) if record is None else record
    add = buffer.add_step if per_env else buffer.add
    reset_key, run_key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

    def one_step(carry, step_key):
        state, obs, env_state = carry
        act_key, env_key = jax.random.split(step_key)
        action = jax.vmap(policy)(jax.random.split(act_key, num_envs), obs)
        new_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step)(
            jax.random.split(env_key, num_envs), env_state, action
        )
        data = jax.vmap(record)(obs, action, reward, terminated, truncated,
                                info["final_observation"])  # fmt: skip
        return (add(state, data), new_obs, env_state), None

    carry = (state, obs, env_state)
    (state, _, _), _ = jax.lax.scan(one_step, carry, jax.random.split(run_key, num_steps))
    return state
