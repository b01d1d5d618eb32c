"""DQN on gymnax CartPole-v1 with a jaxbuf replay buffer, the whole loop jitted.

Run with `python -m jaxbuf.examples.dqn_cartpole [--seed N] [--quiet]`.

Environments are vmapped; every iteration steps all of them, adds their
transitions to the (donated) replay buffer, and takes one DQN gradient step
(the PureJaxRL/CleanRL recipe) on a uniformly sampled batch. Time-limit
truncations are bootstrapped from the true final observation (gymnax's
`info["final_observation"]`), not treated as terminations. Training runs as
`lax.scan` chunks, printing progress between them; the final greedy policy is
evaluated on fresh episodes.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import optax

import jaxbuf
from jaxbuf.examples._common import checksum, command_line, evaluate_and_report, jitted_chunks

CONFIG = dict(
    num_envs=10,
    hidden=(120, 84),
    total_timesteps=500_000,
    buffer_capacity=10_000,
    batch_size=128,
    learning_starts=10_000,  # transitions stored before learning starts
    learning_rate=2.5e-4,
    discount=0.99,
    epsilon_start=1.0,
    epsilon_end=0.05,
    epsilon_fraction=0.5,  # of training, over which epsilon anneals linearly
    target_update_every=500,  # environment steps (all environments together)
    num_chunks=20,
    eval_envs=64,
)


class QNetwork(nn.Module):
    num_actions: int
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


class Runner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer_state: Any  # the state of the agent's buffer
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array  # [num_envs] return of the running episodes
    last_returns: jax.Array  # [num_envs] return of each environment's last episode
    step: jax.Array  # int32 iteration counter
    key: jax.Array


def epsilon_greedy(network, runner: Runner, epsilon, keys, num_actions: int) -> jax.Array:
    """int32 `[num_envs]` actions: greedy, or uniform with probability `epsilon`."""
    act_key, explore_key = keys
    greedy = jnp.argmax(network.apply(runner.params, runner.obs), axis=1)
    random_actions = jax.random.randint(act_key, greedy.shape, 0, num_actions)
    explore = jax.random.uniform(explore_key, greedy.shape) < epsilon
    return jnp.where(explore, random_actions, greedy).astype(jnp.int32)


def after_step(runner: Runner, config: dict, moved: dict, reward, done, learn, ready, key):
    """Records a step of every environment (`moved`: the runner's new buffer_state,
    env_state, obs and key), learns if `ready`, and syncs the target network."""
    episode_return = runner.episode_return + reward
    runner = runner._replace(
        **moved,
        episode_return=jnp.where(done, 0.0, episode_return),
        last_returns=jnp.where(done, episode_return, runner.last_returns),
        step=runner.step + 1,
    )
    runner, loss = jax.lax.cond(
        ready, learn, lambda r, _: (r, jnp.zeros((), jnp.float32)), runner, key
    )
    timesteps = runner.step * config["num_envs"]
    sync = timesteps % config["target_update_every"] < config["num_envs"]
    target = jax.tree.map(lambda t, p: jnp.where(sync, p, t), runner.target_params, runner.params)
    return runner._replace(target_params=target), loss


def make_train(config: dict, env, env_params, buffer: Any = None):
    """`init(key) -> Runner`, a jitted donated `train_chunk(runner)`, and the network.

    `buffer` replaces the replay buffer by one with the same functions (`init`,
    `add`, `sample`, `can_sample`), e.g. another library's behind an adapter.
    """
    num_actions = env.action_space(env_params).n
    network = QNetwork(num_actions, tuple(config["hidden"]))
    num_iterations = config["total_timesteps"] // config["num_envs"]
    optimizer = optax.adam(config["learning_rate"])
    buffer = buffer or jaxbuf.make_replay_buffer(
        config["buffer_capacity"], config["batch_size"], min_size=config["learning_starts"]
    )
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def epsilon(step: jax.Array) -> jax.Array:
        anneal = config["epsilon_fraction"] * num_iterations
        frac = jnp.minimum(step.astype(jnp.float32) / anneal, 1.0)
        return config["epsilon_start"] + frac * (config["epsilon_end"] - config["epsilon_start"])

    def init(key: jax.Array) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(env_key, config["num_envs"]), env_params)
        params = network.init(net_key, obs[0])
        example = jaxbuf.envs.example_from_space(
            {
                "obs": env.observation_space(env_params),
                "action": env.action_space(env_params),
                "reward": jnp.float32(0),
                "next_obs": env.observation_space(env_params),
                "terminated": jnp.bool_(False),
            }
        )
        # Distinct buffers for every field: the runner is donated as a whole.
        zeros = lambda: jnp.zeros(config["num_envs"], jnp.float32)  # noqa: E731
        return Runner(
            params, jax.tree.map(jnp.copy, params), optimizer.init(params),
            buffer.init(example), env_state, obs, zeros(), zeros(),
            jnp.zeros((), jnp.int32), key,
        )  # fmt: skip

    def loss_fn(params, target_params, batch):
        q = network.apply(params, batch["obs"])
        q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
        next_q = jnp.max(network.apply(target_params, batch["next_obs"]), axis=1)
        # Bootstrap unless the episode terminated; a time-limit truncation
        # bootstraps from the true final observation stored as next_obs.
        not_terminated = 1.0 - batch["terminated"].astype(jnp.float32)
        target = batch["reward"] + config["discount"] * not_terminated * next_q
        return jnp.mean((q_taken - jax.lax.stop_gradient(target)) ** 2)

    def learn(runner: Runner, key: jax.Array) -> tuple[Runner, jax.Array]:
        batch = buffer.sample(runner.buffer_state, key).experience
        if not config.get("update", True):  # benchmarks: the buffer's share alone
            return runner, checksum(batch)
        loss, grads = jax.value_and_grad(loss_fn)(runner.params, runner.target_params, batch)
        updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
        params = optax.apply_updates(runner.params, updates)
        return runner._replace(params=params, opt_state=opt_state), loss

    def iteration(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, act_key, explore_key, step_key, learn_key = jax.random.split(runner.key, 5)
        action = epsilon_greedy(
            network, runner, epsilon(runner.step), (act_key, explore_key), num_actions
        )
        step_keys = jax.random.split(step_key, config["num_envs"])
        obs, env_state, reward, terminated, truncated, info = step_env(
            step_keys, runner.env_state, action, env_params
        )
        transition = {
            "obs": runner.obs,
            "action": action,
            "reward": reward.astype(jnp.float32),
            "next_obs": info["final_observation"],  # the true next observation
            "terminated": terminated,
        }
        buffer_state = buffer.add(runner.buffer_state, transition)
        moved = dict(buffer_state=buffer_state, env_state=env_state, obs=obs, key=key)
        ready = buffer.can_sample(buffer_state)
        return after_step(
            runner, config, moved, reward, terminated | truncated, learn, ready, learn_key
        )

    return init, jitted_chunks(iteration, num_iterations // config["num_chunks"]), network


def main(seed: int = 0, quiet: bool = False) -> float:
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, network = make_train(CONFIG, env, env_params)
    runner = init(jax.random.key(seed))
    start = time.perf_counter()
    for _ in range(CONFIG["num_chunks"]):
        runner, loss = train_chunk(runner)
        if not quiet:
            timesteps = int(runner.step) * CONFIG["num_envs"]
            print(
                f"[{time.perf_counter() - start:6.1f}s] timesteps {timesteps:>7d}"
                f"  buffer {int(runner.buffer_state.size):>6d}"
                f"  episode return {float(runner.last_returns.mean()):6.1f}"
                f"  loss {float(loss):.4f}",
                flush=True,
            )

    def greedy(params, obs):
        return jnp.argmax(network.apply(params, obs), axis=1)

    return evaluate_and_report(
        greedy, env, env_params, runner.params, seed, start, CONFIG["eval_envs"]
    )


if __name__ == "__main__":
    command_line(main, __doc__)
