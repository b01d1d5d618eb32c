"""n-step DQN on gymnax CartPole-v1, with uniform or prioritized transitions.

Run with `python -m jaxbuf.examples.dqn_nstep [--seed N] [--quiet]` (both variants).

The same agent as `dqn_cartpole`, but each environment step goes into a
`make_transition_buffer` (observations stored once, n-step returns computed at
sample time, truncations bootstrapped from the true final observation) or its
prioritized twin (`sampler=jaxbuf.prioritized()`). With priorities, the loss
is weighted by the importance weights, beta anneals from 0.4 to 1 inside the
jitted loop, and the new priorities are the absolute TD errors.
"""

from __future__ import annotations

import time
from typing import Any

import gymnax
import jax
import jax.numpy as jnp
import optax

import jaxbuf
from jaxbuf.examples._common import checksum, command_line, evaluate_and_report, jitted_chunks
from jaxbuf.examples.dqn_cartpole import QNetwork, Runner, after_step, epsilon_greedy

CONFIG = dict(
    num_envs=10,
    hidden=(120, 84),
    total_timesteps=100_000,
    steps_per_env=1_000,  # buffer capacity: 10 environments x 1,000 steps
    batch_size=128,
    n_step=3,
    learning_starts=1_000,  # steps per environment before learning starts
    learning_rate=2.5e-4,
    discount=0.99,
    epsilon_start=1.0,
    epsilon_end=0.05,
    epsilon_fraction=0.5,
    target_update_every=500,
    priority_exponent=0.6,
    importance_start=0.4,
    importance_end=1.0,
    priority_floor=1e-3,  # added to |TD error|, so no transition is never drawn again
    num_chunks=20,
    eval_envs=64,
)


def make_buffer(config: dict, prioritized: bool):
    """The transition buffer of the agent, uniform or prioritized."""
    args = (config["num_envs"], config["steps_per_env"], config["batch_size"])
    sampler = (
        jaxbuf.prioritized(priority_exponent=config["priority_exponent"])
        if prioritized
        else jaxbuf.uniform()
    )
    return jaxbuf.make_transition_buffer(
        *args, n_step=config["n_step"], discount=config["discount"],
        min_size=config["learning_starts"], sampler=sampler,
        min_episode_length=1,  # CartPole's first episodes may average under 10 steps
    )  # fmt: skip


def make_train(config: dict, env, env_params, prioritized: bool, buffer: Any = None):
    """`init(key) -> Runner`, a jitted donated `train_chunk(runner)`, and the network;
    `buffer` replaces the transition buffer by one with the same functions."""
    num_actions = env.action_space(env_params).n
    network = QNetwork(num_actions, tuple(config["hidden"]))
    num_iterations = config["total_timesteps"] // config["num_envs"]
    optimizer = optax.adam(config["learning_rate"])
    buffer = buffer or make_buffer(config, prioritized)
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def progress(step: jax.Array, fraction: float) -> jax.Array:
        return jnp.minimum(step.astype(jnp.float32) / (fraction * num_iterations), 1.0)

    def init(key: jax.Array) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(env_key, config["num_envs"]), env_params)
        params = network.init(net_key, obs[0])
        example = jaxbuf.Transition(
            obs=obs[0], action=jnp.int32(0), reward=jnp.float32(0),
            terminated=jnp.bool_(False), truncated=jnp.bool_(False), next_obs=obs[0],
        )  # fmt: skip
        zeros = lambda: jnp.zeros(config["num_envs"], jnp.float32)  # noqa: E731
        return Runner(
            params, jax.tree.map(jnp.copy, params), optimizer.init(params),
            buffer.init(example), env_state, obs, zeros(), zeros(),
            jnp.zeros((), jnp.int32), key,
        )  # fmt: skip

    def td_errors(params, target_params, batch: jaxbuf.Transition) -> jax.Array:
        q = network.apply(params, batch.obs)
        q_taken = jnp.take_along_axis(q, batch.action[:, None], axis=1)[:, 0]
        next_q = jnp.max(network.apply(target_params, batch.next_obs), axis=1)
        # discount is gamma^k, or 0 where the episode terminated within the n steps
        target = batch.reward + batch.discount * next_q
        return q_taken - jax.lax.stop_gradient(target)

    def learn(runner: Runner, key: jax.Array) -> tuple[Runner, jax.Array]:
        if prioritized:
            beta = config["importance_start"] + progress(runner.step, 1.0) * (
                config["importance_end"] - config["importance_start"]
            )  # a traced value: annealed inside the jitted loop
            drawn = buffer.sample(runner.buffer_state, key, importance_exponent=beta)
            batch, weights = drawn.experience, drawn.weights
        else:
            batch = buffer.sample(runner.buffer_state, key).experience
            weights = jnp.ones(config["batch_size"])

        def loss_fn(params):
            errors = td_errors(params, runner.target_params, batch)
            return jnp.mean(weights * errors**2), errors

        if config.get("update", True):
            (loss, errors), grads = jax.value_and_grad(loss_fn, has_aux=True)(runner.params)
            updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
            runner = runner._replace(
                params=optax.apply_updates(runner.params, updates), opt_state=opt_state
            )
        else:  # benchmarks: the buffer's share alone
            loss, errors = checksum(batch), jnp.zeros(config["batch_size"])
        if prioritized:
            new = jnp.abs(errors) + config["priority_floor"]
            state = buffer.set_priorities(runner.buffer_state, drawn.indices, new)
            runner = runner._replace(buffer_state=state)
        return runner, loss

    def iteration(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, act_key, explore_key, step_key, learn_key = jax.random.split(runner.key, 5)
        epsilon = config["epsilon_start"] + progress(runner.step, config["epsilon_fraction"]) * (
            config["epsilon_end"] - config["epsilon_start"]
        )
        action = epsilon_greedy(network, runner, epsilon, (act_key, explore_key), num_actions)
        obs, env_state, reward, terminated, truncated, info = step_env(
            jax.random.split(step_key, config["num_envs"]), runner.env_state, action, env_params
        )
        step = jaxbuf.Transition(
            obs=runner.obs, action=action, reward=reward.astype(jnp.float32),
            terminated=terminated, truncated=truncated,
            next_obs=info["final_observation"],  # read only where an episode ended
        )  # fmt: skip
        buffer_state = buffer.add_step(runner.buffer_state, step)
        moved = dict(buffer_state=buffer_state, env_state=env_state, obs=obs, key=key)
        ready = buffer.can_sample(buffer_state)
        return after_step(
            runner, config, moved, reward, terminated | truncated, learn, ready, learn_key
        )

    return init, jitted_chunks(iteration, num_iterations // config["num_chunks"]), network


def train(seed: int, prioritized: bool, config: dict = CONFIG, quiet: bool = False):
    """Trains one agent; returns `(timesteps, mean episode returns)` per chunk and params."""
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, network = make_train(config, env, env_params, prioritized)
    runner = init(jax.random.key(seed))
    curve, start = [], time.perf_counter()
    for _ in range(config["num_chunks"]):
        runner, loss = train_chunk(runner)
        timesteps = int(runner.step) * config["num_envs"]
        curve.append((timesteps, float(runner.last_returns.mean())))
        if not quiet:
            print(
                f"[{time.perf_counter() - start:6.1f}s] timesteps {timesteps:>7d}"
                f"  episode return {curve[-1][1]:6.1f}  loss {float(loss):.4f}",
                flush=True,
            )
    return curve, runner.params, network


def main(seed: int = 0, quiet: bool = False) -> float:
    env, env_params = gymnax.make("CartPole-v1")
    scores = []
    for prioritized in (False, True):
        print(f"== {'prioritized' if prioritized else 'uniform'} 3-step replay ==", flush=True)
        start = time.perf_counter()
        _, params, network = train(seed, prioritized, quiet=quiet)

        def greedy(params, obs, network=network):
            return jnp.argmax(network.apply(params, obs), axis=1)

        scores.append(
            evaluate_and_report(greedy, env, env_params, params, seed, start, CONFIG["eval_envs"])
        )
    return min(scores)


if __name__ == "__main__":
    command_line(main, __doc__)
