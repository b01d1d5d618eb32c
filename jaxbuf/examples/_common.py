"""Pieces shared by the example agents."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def make_evaluate(
    greedy_action: Callable[[Any, jax.Array], jax.Array], env, env_params, num_envs: int
):
    """A jitted `evaluate(params, key)`: the mean return of `greedy_action` over one
    episode in each of `num_envs` environments.

    Args:
      greedy_action: `(params, obs [num_envs, ...]) -> actions [num_envs]`.
      env: a gymnax environment.
      env_params: its parameters.
      num_envs: episodes to average over.
    """
    max_steps = int(env_params.max_steps_in_episode)
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def evaluate(params: Any, key: jax.Array) -> jax.Array:
        reset_key, key = jax.random.split(key)
        obs, state = reset(jax.random.split(reset_key, num_envs), env_params)

        def body(carry, step_key):
            obs, state, total, alive = carry
            obs, state, reward, terminated, truncated, _ = step_env(
                jax.random.split(step_key, num_envs), state, greedy_action(params, obs), env_params
            )
            total = total + reward * alive
            return (obs, state, total, alive & ~(terminated | truncated)), None

        carry = (obs, state, jnp.zeros(num_envs), jnp.ones(num_envs, bool))
        (_, _, total, _), _ = jax.lax.scan(body, carry, jax.random.split(key, max_steps))
        return total.mean()

    return jax.jit(evaluate)


def checksum(batch: Any) -> jax.Array:
    """float32 sum of every leaf of a sampled batch: what a learner whose update is
    replaced by a no-op returns, so the sample is still computed (benchmarks set
    `config["update"] = False` to measure the buffer's share of a training step)."""
    leaves = jax.tree.leaves(batch)
    return sum((jnp.sum(x.astype(jnp.float32)) for x in leaves), jnp.zeros((), jnp.float32))


def jitted_chunks(iteration: Callable, length: int) -> Callable:
    """A jitted, donated `train_chunk(runner) -> (runner, mean loss)`: `length` steps of
    `iteration(runner, _) -> (runner, loss)` in one `lax.scan`."""

    def train_chunk(runner):
        runner, losses = jax.lax.scan(iteration, runner, length=length)
        return runner, jnp.mean(losses)

    return jax.jit(train_chunk, donate_argnums=0)


def evaluate_and_report(
    greedy_action, env, env_params, params, seed: int, start: float, episodes: int
) -> float:
    """Evaluates the greedy policy on `episodes` fresh episodes, prints and returns the score."""
    evaluate = make_evaluate(greedy_action, env, env_params, episodes)
    score = float(evaluate(params, jax.random.key(seed + 1)))
    print(
        f"seed {seed}: greedy evaluation return {score:.1f} (mean over {episodes} "
        f"episodes), trained in {time.perf_counter() - start:.1f}s"
    )
    return score


def command_line(main: Callable[..., object], doc: str, **options: dict) -> None:
    """Runs a demo's `main(seed, quiet, *extra)` with `--seed`, `--quiet` and `options`.

    `options` maps each extra flag's name (`feed_forward` gives `--feed-forward`) to its
    `argparse` keywords; the flags' values follow `seed` and `quiet`, in the order given.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    for name, keywords in options.items():
        parser.add_argument("--" + name.replace("_", "-"), **keywords)
    args = parser.parse_args()
    main(args.seed, args.quiet, *(getattr(args, name) for name in options))
