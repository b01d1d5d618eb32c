"""DQN with hindsight goal relabeling on the bit-flipping task of the HER paper.

Run with `python -m jaxbuf.examples.her_bitflip [--bits 25] [--seed N] [--no-her]`.

The task (Andrychowicz et al., 2017, section 3.1), written in JAX: the state is
`n` bits, the goal another `n` bits, action `i` flips bit `i`, the reward is -1
until the state equals the goal (then 0, and the episode ends), and an episode
lasts at most `n` steps. A random policy almost never reaches a goal with
n = 25, so plain DQN sees only rewards of -1 and learns nothing. With
`goals=jaxbuf.hindsight(...)` the transition buffer replays 80% of the sampled
transitions with a goal achieved later in the same episode (`"future"`), whose
reward and termination it recomputes, and DQN learns to reach any goal.

The whole loop is jitted: each cycle steps the vmapped environments for `n`
steps, adds them to the (donated) buffer, and takes a number of double-DQN
updates; progress is printed between chunks of cycles, and the greedy policy
is evaluated on fresh episodes at the end.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxbuf
from jaxbuf.examples._common import command_line, jitted_chunks

CONFIG = dict(
    num_envs=16,  # episodes per cycle, as in the paper
    hidden=256,
    buffer_capacity=2**14,  # steps per environment
    batch_size=128,
    updates_per_cycle=16,
    learning_rate=1e-3,
    discount=0.98,
    epsilon=0.2,  # random actions while training
    polyak=0.95,  # target network: polyak * target + (1 - polyak) * online, per cycle
    her_ratio=0.8,  # the paper's k = 4 future goals per real one
    cycles=1600,
    num_chunks=16,
    eval_envs=256,
)


class BitFlip(NamedTuple):
    """The environment's state: the bits, the goal and the step within the episode."""

    bits: jax.Array  # bool [n]
    goal: jax.Array  # bool [n]
    t: jax.Array  # int32 scalar


def reward_fn(achieved: jax.Array, desired: jax.Array) -> jax.Array:
    """-1 until the bits equal the goal, then 0 (the paper's `-[s != g]`)."""
    return jnp.where(jnp.all(achieved == desired), 0.0, -1.0).astype(jnp.float32)


def success(reward: jax.Array) -> jax.Array:
    return reward == 0


def observe(env: BitFlip) -> dict:
    return {"achieved_goal": env.bits, "desired_goal": env.goal}


def reset(key: jax.Array, n: int) -> BitFlip:
    """Random bits and a random goal that differs from them."""
    bits_key, flip_key = jax.random.split(key)
    bits = jax.random.bernoulli(bits_key, 0.5, (n,))
    flip = jax.random.bernoulli(flip_key, 0.5, (n,))
    flip = flip.at[0].set(flip[0] | ~jnp.any(flip))
    return BitFlip(bits, bits ^ flip, jnp.zeros((), jnp.int32))


def step(env: BitFlip, action: jax.Array, key: jax.Array, n: int):
    """One step with automatic reset: `(env, obs, reward, terminated, truncated,
    final_obs)`, where `obs` is the reset observation after an episode end and
    `final_obs` the observation the step reached."""
    bits = env.bits.at[action].set(~env.bits[action])
    moved = BitFlip(bits, env.goal, env.t + 1)
    reward = reward_fn(bits, env.goal)
    terminated = success(reward)
    truncated = ~terminated & (moved.t >= n)
    fresh = reset(key, n)
    after = jax.tree.map(lambda a, b: jnp.where(terminated | truncated, a, b), fresh, moved)
    return after, observe(after), reward, terminated, truncated, observe(moved)


class QNetwork(nn.Module):
    num_actions: int
    hidden: int

    @nn.compact
    def __call__(self, obs: dict) -> jax.Array:
        x = jnp.concatenate([obs["achieved_goal"], obs["desired_goal"]], axis=-1)
        x = nn.relu(nn.Dense(self.hidden)(x.astype(jnp.float32)))
        return nn.Dense(self.num_actions)(x)


class Runner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer_state: Any
    envs: BitFlip
    successes: jax.Array  # float32: episodes that reached their goal, this cycle
    episodes: jax.Array  # float32: episodes that ended, this cycle
    key: jax.Array


def make_buffer(n: int, config: dict, her: bool) -> jaxbuf.Buffer:
    goals = jaxbuf.hindsight(
        reward_fn, ratio=config["her_ratio"], strategy="future", terminal_fn=success
    )
    return jaxbuf.make_transition_buffer(
        config["num_envs"], config["buffer_capacity"], config["batch_size"],
        discount=config["discount"], min_size=n + 1, goals=goals if her else None,
        min_episode_length=1,  # episodes as short as the bits flipped
    )  # fmt: skip


def make_train(n: int, config: dict, her: bool):
    """`(init, train_chunk, network)` for `n` bits, with or without relabeling."""
    network = QNetwork(n, config["hidden"])
    optimizer = optax.adam(config["learning_rate"])
    buffer = make_buffer(n, config, her)
    num_envs = config["num_envs"]
    lowest = -1.0 / (1.0 - config["discount"])  # returns lie in [lowest, 0]

    def init(key: jax.Array) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        envs = jax.vmap(reset, in_axes=(0, None))(jax.random.split(env_key, num_envs), n)
        example_obs = observe(jax.tree.map(lambda x: x[0], envs))
        params = network.init(net_key, example_obs)
        example = jaxbuf.Transition(example_obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                    jnp.bool_(False), example_obs)  # fmt: skip
        zero = lambda: jnp.zeros((), jnp.float32)  # noqa: E731  (distinct, as donated)
        return Runner(params, jax.tree.map(jnp.copy, params), optimizer.init(params),
                      buffer.init(example), envs, zero(), zero(), key)  # fmt: skip

    def act(runner: Runner, key: jax.Array) -> tuple[Runner, jaxbuf.Transition]:
        explore_key, random_key, reset_key = jax.random.split(key, 3)
        obs = jax.vmap(observe)(runner.envs)
        greedy = jnp.argmax(network.apply(runner.params, obs), axis=1).astype(jnp.int32)
        random_action = jax.random.randint(random_key, greedy.shape, 0, n, jnp.int32)
        explore = jax.random.uniform(explore_key, greedy.shape) < config["epsilon"]
        action = jnp.where(explore, random_action, greedy)
        envs, _, reward, terminated, truncated, final = jax.vmap(step, in_axes=(0, 0, 0, None))(
            runner.envs, action, jax.random.split(reset_key, num_envs), n
        )
        runner = runner._replace(
            envs=envs,
            successes=runner.successes + terminated.sum(dtype=jnp.int32).astype(jnp.float32),
            episodes=runner.episodes + (terminated | truncated).sum(dtype=jnp.int32).astype(
                jnp.float32),
        )  # fmt: skip
        return runner, jaxbuf.Transition(obs, action, reward, terminated, truncated, final)

    def loss_fn(params, target_params, batch: jaxbuf.Transition):
        q = network.apply(params, batch.obs)
        q_taken = jnp.take_along_axis(q, batch.action[:, None], axis=1)[:, 0]
        next_action = jnp.argmax(network.apply(params, batch.next_obs), axis=1)
        next_q = jnp.take_along_axis(
            network.apply(target_params, batch.next_obs), next_action[:, None], axis=1
        )[:, 0]
        target = jnp.clip(batch.reward + batch.discount * next_q, lowest, 0.0)
        return jnp.mean((q_taken - jax.lax.stop_gradient(target)) ** 2)

    def update(runner: Runner, key: jax.Array) -> tuple[Runner, jax.Array]:
        batch = buffer.sample(runner.buffer_state, key).experience
        loss, grads = jax.value_and_grad(loss_fn)(runner.params, runner.target_params, batch)
        updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
        params = optax.apply_updates(runner.params, updates)
        return runner._replace(params=params, opt_state=opt_state), loss

    def cycle(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, act_key, learn_key = jax.random.split(runner.key, 3)
        zero = jnp.zeros((), jnp.float32)
        runner = runner._replace(key=key, successes=zero, episodes=zero)
        runner, steps = jax.lax.scan(act, runner, jax.random.split(act_key, n))
        steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)  # [num_envs, n, ...]
        runner = runner._replace(buffer_state=buffer.add(runner.buffer_state, steps))
        keys = jax.random.split(learn_key, config["updates_per_cycle"])
        runner, losses = jax.lax.scan(update, runner, keys)
        tau = config["polyak"]
        target = jax.tree.map(lambda t, p: tau * t + (1 - tau) * p, runner.target_params,
                              runner.params)  # fmt: skip
        return runner._replace(target_params=target), losses.mean()

    chunk = jitted_chunks(cycle, config["cycles"] // config["num_chunks"])
    return init, chunk, network


def evaluate(network: QNetwork, params: Any, n: int, episodes: int, key: jax.Array) -> float:
    """The fraction of `episodes` fresh episodes in which the greedy policy reaches
    its goal within `n` steps."""

    def run(key):
        def body(carry, _):
            env, done = carry
            action = jnp.argmax(network.apply(params, observe(env))).astype(jnp.int32)
            bits = env.bits.at[action].set(~env.bits[action])
            moved = BitFlip(jnp.where(done, env.bits, bits), env.goal, env.t + 1)
            return (moved, done | jnp.all(moved.bits == moved.goal)), None

        (_, reached), _ = jax.lax.scan(body, (reset(key, n), jnp.bool_(False)), length=n)
        return reached

    reached = jax.jit(jax.vmap(run))(jax.random.split(key, episodes))
    return float(reached.mean())


def main(seed: int = 0, bits: int = 25, her: bool = True, quiet: bool = False,
         config: dict | None = None) -> float:  # fmt: skip
    """Trains one agent and returns the greedy success rate over fresh episodes."""
    config = {**CONFIG, **(config or {})}
    init, train_chunk, network = make_train(bits, config, her)
    runner = init(jax.random.key(seed))
    start = time.perf_counter()
    per_chunk = config["cycles"] // config["num_chunks"]
    for chunk in range(config["num_chunks"]):
        runner, loss = train_chunk(runner)
        if not quiet:
            rate = float(runner.successes) / max(float(runner.episodes), 1.0)
            print(f"[{time.perf_counter() - start:6.1f}s] cycle {(chunk + 1) * per_chunk:>5d}"
                  f"  episodes {(chunk + 1) * per_chunk * config['num_envs']:>6d}"
                  f"  success (last cycle, exploring) {rate:4.2f}  loss {float(loss):.4f}",
                  flush=True)  # fmt: skip
    score = evaluate(network, runner.params, bits, config["eval_envs"], jax.random.key(seed + 1))
    label = "with" if her else "without"
    print(
        f"seed {seed}, {bits} bits, {label} relabeling: greedy success rate {score:.2f} over "
        f"{config['eval_envs']} episodes, trained in {time.perf_counter() - start:.1f}s"
    )
    return score


if __name__ == "__main__":
    command_line(
        lambda seed, quiet, bits, cycles, no_her: main(
            seed, bits, not no_her, quiet, {"cycles": cycles}
        ),
        __doc__,
        bits={"type": int, "default": 25},
        cycles={"type": int, "default": CONFIG["cycles"]},
        no_her={"action": "store_true", "help": "plain DQN, no relabeling"},
    )
