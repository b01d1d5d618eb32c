"""Recurrent Q-learning (R2D2-style) on CartPole without velocities, with a trajectory buffer.

Run with `python -m jaxbuf.examples.rdqn_cartpole [--seed N] [--prioritized] [--feed-forward]`.

The task is gymnax CartPole-v1 with the two velocities removed from the
observation (cart position and pole angle only), so one observation does not
tell where the pole is going: the agent must remember. As in R2D2 (Kapturowski
et al., 2019) the trajectory buffer stores, with every step, the recurrent
state the actor had before it, and samples windows of `burn_in + length + 1`
steps: the stored state starts the unroll, the first `burn_in` steps only
refresh it (no gradient), and double Q-learning targets are taken on the rest.
Windows may cross episode ends: the unroll resets the state at every episode's
first step, no target bootstraps across a termination, and a step cut by the
time limit (whose next observation is the next episode's) is left out of the
loss. With `--prioritized`, sequences are drawn by priority
`0.9 max|delta| + 0.1 mean|delta|` (R2D2's mixture), with importance weights.
`--feed-forward` swaps the recurrent core for a dense layer: the same agent
without memory, for comparison.

The whole loop is jitted: each iteration steps the vmapped environments once
and adds the step to the (donated) buffer; every `train_every` iterations one
update runs on a sampled batch of windows. Q-learning on CartPole is known to
collapse after it has solved the task (once the buffer holds only long
episodes), so, as Stable-Baselines3's `EvalCallback` keeps a `best_model`,
the greedy policy is checked on 32 episodes after every chunk and the best
parameters are kept; the reported score is a separate evaluation of those (and
of the last parameters) on fresh episodes.
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
from jaxbuf.examples._common import checksum, command_line, jitted_chunks

CONFIG = dict(
    num_envs=16,
    hidden=128,
    burn_in=8,
    length=24,  # steps per window that get a loss (plus n_step to bootstrap from)
    n_step=3,
    buffer_capacity=12_000,  # steps per environment (a multiple of the period)
    batch_size=32,
    learning_starts=2_000,  # steps (all environments) before learning starts
    train_every=2,  # iterations (each steps every environment once) per update
    learning_rate=5e-4,
    discount=0.99,
    epsilon_start=1.0,
    epsilon_end=0.02,
    epsilon_fraction=0.4,
    polyak=0.995,  # target network: polyak * target + (1 - polyak) * online, per update
    total_timesteps=500_000,
    num_chunks=20,
    eval_envs=32,
    priority_exponent=0.6,
    importance_exponent=0.4,
)
VISIBLE = jnp.array([0, 2])  # cart position and pole angle; the velocities are hidden


class QNetwork(nn.Module):
    """`(carry, obs [.., 2], first [..]) -> (carry, q [.., 2])`: one step; the carry
    is reset where `first` is true (an episode's first step)."""

    hidden: int
    recurrent: bool = True

    @nn.compact
    def __call__(self, carry, obs, first):
        carry = jnp.where(first[..., None], jnp.zeros_like(carry), carry)
        x = nn.relu(nn.Dense(self.hidden)(obs))
        if self.recurrent:
            carry, x = nn.GRUCell(self.hidden)(carry, x)
        else:
            x = nn.relu(nn.Dense(self.hidden)(x))
        return carry, nn.Dense(2)(x)


class Runner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer_state: Any
    env_state: Any
    obs: jax.Array  # [num_envs, 2]
    first: jax.Array  # [num_envs] bool: obs starts an episode
    carry: jax.Array  # [num_envs, hidden], the recurrent state before obs
    episode_return: jax.Array
    last_returns: jax.Array
    step: jax.Array
    key: jax.Array


def make_train(config: dict, env, env_params, prioritized: bool, recurrent: bool,
               buffer: Any = None):  # fmt: skip
    """`init(key) -> Runner`, a jitted donated `train_chunk(runner)`, and the network;
    `buffer` replaces the trajectory buffer by one with the same functions."""
    network = QNetwork(config["hidden"], recurrent)
    num_updates = config["total_timesteps"] // (config["num_envs"] * config["train_every"])
    learning_rate = optax.linear_schedule(config["learning_rate"], 0.0, num_updates)
    optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(learning_rate))
    burn_in, length, num_envs = config["burn_in"], config["length"], config["num_envs"]
    n_step, discount = config["n_step"], config["discount"]
    sampler = (jaxbuf.prioritized(config["priority_exponent"]) if prioritized
               else jaxbuf.uniform())  # fmt: skip
    buffer = buffer or jaxbuf.make_trajectory_buffer(
        num_envs, config["buffer_capacity"], config["batch_size"], burn_in + length + n_step,
        period=length // 2, sampler=sampler,
    )  # fmt: skip
    environment = jaxbuf.envs.gymnax_env(env, env_params)
    num_iterations = config["total_timesteps"] // num_envs
    warmup = config["learning_starts"] // num_envs

    def init(key: jax.Array) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(environment.reset)(jax.random.split(env_key, num_envs))
        obs = obs[:, VISIBLE]
        carry = jnp.zeros((num_envs, config["hidden"]), jnp.float32)
        first = jnp.ones(num_envs, bool)
        params = network.init(net_key, carry, obs, first)
        example = {"obs": obs[0], "action": jnp.int32(0), "reward": jnp.float32(0),
                   "terminated": jnp.bool_(False), "truncated": jnp.bool_(False),
                   "first": jnp.bool_(False), "carry": carry[0]}  # fmt: skip
        zeros = lambda: jnp.zeros(num_envs, jnp.float32)  # noqa: E731  (distinct: donated)
        return Runner(params, jax.tree.map(jnp.copy, params), optimizer.init(params),
                      buffer.init(example), env_state, obs, first, carry, zeros(), zeros(),
                      jnp.zeros((), jnp.int32), key)  # fmt: skip

    def unroll(params, window: dict) -> jax.Array:
        """Q-values `[B, length + n_step, 2]` after the burn-in, from the stored state."""

        def one(carry, inputs):
            obs, first = inputs
            return network.apply(params, carry, obs, first)

        time_major = (jnp.swapaxes(window["obs"], 0, 1), jnp.swapaxes(window["first"], 0, 1))
        carry = window["carry"][:, 0]
        burn = jax.tree.map(lambda x: x[:burn_in], time_major)
        carry, _ = jax.lax.scan(one, carry, burn)
        carry = jax.lax.stop_gradient(carry)
        rest = jax.tree.map(lambda x: x[burn_in:], time_major)
        _, q = jax.lax.scan(one, carry, rest)
        return jnp.swapaxes(q, 0, 1)

    def targets(steps: dict, q: jax.Array, q_target: jax.Array):
        """n-step double-Q targets `[B, length]` and which steps have one: the sum
        stops at an episode end; a termination does not bootstrap, and a step
        whose n steps reach a time limit first has no target (the window holds
        the next episode's observation there, not the final one)."""
        alive = jnp.ones(q.shape[:2], jnp.float32)[:, :length]
        total, keep = jnp.zeros_like(alive), jnp.ones_like(alive)
        for j in range(n_step):
            at = lambda x, j=j: x[:, j : j + length]  # noqa: E731
            total = total + alive * discount**j * at(steps["reward"])
            keep = keep - alive * at(steps["truncated"]).astype(jnp.float32)
            done = (at(steps["terminated"]) | at(steps["truncated"])).astype(jnp.float32)
            alive = alive * (1.0 - done)
        best = jnp.argmax(q[:, n_step:], axis=2)
        bootstrap = jnp.take_along_axis(q_target[:, n_step:], best[..., None], axis=2)[..., 0]
        return total + alive * discount**n_step * bootstrap, keep

    def loss_fn(params, target_params, window: dict, weights: jax.Array):
        steps = jax.tree.map(lambda x: x[:, burn_in:], window)  # length + n_step steps
        q, q_target = unroll(params, window), unroll(target_params, window)
        taken = jnp.take_along_axis(q[:, :length], steps["action"][:, :length, None], axis=2)
        target, keep = targets(steps, q, q_target)
        delta = taken[..., 0] - jax.lax.stop_gradient(target)
        count = jnp.maximum(keep.sum(axis=1), 1.0)
        per_window = jnp.sum(keep * optax.huber_loss(delta), axis=1) / count
        magnitude = jnp.abs(delta) * keep
        priority = 0.9 * magnitude.max(axis=1) + 0.1 * magnitude.sum(axis=1) / count
        return jnp.mean(weights * per_window), priority

    def learn(runner: Runner, key: jax.Array) -> tuple[Runner, jax.Array]:
        options = {"importance_exponent": config["importance_exponent"]} if prioritized else {}
        batch = buffer.sample(runner.buffer_state, key, **options)
        weights = batch.weights if prioritized else batch.valid.astype(jnp.float32)
        if not config.get("update", True):  # benchmarks: the buffer's share alone
            return runner, checksum(batch.experience)
        (loss, priority), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            runner.params, runner.target_params, batch.experience, weights
        )
        updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
        runner = runner._replace(params=optax.apply_updates(runner.params, updates),
                                 opt_state=opt_state)  # fmt: skip
        if prioritized:
            state = buffer.set_priorities(runner.buffer_state, batch.indices, priority + 1e-3)
            runner = runner._replace(buffer_state=state)
        tau = config["polyak"]
        target = jax.tree.map(lambda t, p: tau * t + (1 - tau) * p, runner.target_params,
                              runner.params)  # fmt: skip
        return runner._replace(target_params=target), loss

    def epsilon(step: jax.Array) -> jax.Array:
        anneal = config["epsilon_fraction"] * num_iterations
        fraction = jnp.minimum(step.astype(jnp.float32) / anneal, 1.0)
        start, end = config["epsilon_start"], config["epsilon_end"]
        return start + fraction * (end - start)

    def iteration(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, explore_key, random_key, step_key, learn_key = jax.random.split(runner.key, 5)
        carry, q = network.apply(runner.params, runner.carry, runner.obs, runner.first)
        greedy = jnp.argmax(q, axis=1).astype(jnp.int32)
        random_action = jax.random.randint(random_key, greedy.shape, 0, 2, jnp.int32)
        explore = jax.random.uniform(explore_key, greedy.shape) < epsilon(runner.step)
        action = jnp.where(explore, random_action, greedy)
        obs, env_state, reward, terminated, truncated, _ = jax.vmap(environment.step)(
            jax.random.split(step_key, num_envs), runner.env_state, action
        )
        reward = reward.astype(jnp.float32)
        step = {"obs": runner.obs, "action": action, "reward": reward, "terminated": terminated,
                "truncated": truncated, "first": runner.first, "carry": runner.carry}  # fmt: skip
        done = terminated | truncated
        episode_return = runner.episode_return + reward
        runner = runner._replace(
            buffer_state=buffer.add_step(runner.buffer_state, step), env_state=env_state,
            obs=obs[:, VISIBLE], first=done, carry=carry,
            episode_return=jnp.where(done, 0.0, episode_return),
            last_returns=jnp.where(done, episode_return, runner.last_returns),
            step=runner.step + 1, key=key,
        )  # fmt: skip
        ready = ((runner.step >= warmup) & (runner.step % config["train_every"] == 0)
                 & buffer.can_sample(runner.buffer_state))  # fmt: skip
        return jax.lax.cond(ready, learn, lambda r, _: (r, jnp.zeros((), jnp.float32)), runner,
                            learn_key)  # fmt: skip

    chunk = jitted_chunks(iteration, num_iterations // config["num_chunks"])
    return init, chunk, network


def make_evaluate(network: QNetwork, env, env_params, episodes: int):
    """A jitted `evaluate(params, key)`: the mean return of the greedy recurrent
    policy over `episodes` fresh episodes (at most 500 each)."""
    environment = jaxbuf.envs.gymnax_env(env, env_params)
    steps = int(env_params.max_steps_in_episode)

    def body(loop, step_key):
        params, obs, state, carry, first, total, alive = loop
        carry, q = network.apply(params, carry, obs[:, VISIBLE], first)
        action = jnp.argmax(q, axis=1).astype(jnp.int32)
        obs, state, reward, terminated, truncated, _ = jax.vmap(environment.step)(
            jax.random.split(step_key, episodes), state, action
        )
        total = total + reward.astype(jnp.float32) * alive
        return (params, obs, state, carry, jnp.zeros_like(first), total,
                alive & ~(terminated | truncated)), None  # fmt: skip

    def evaluate(params: Any, key: jax.Array) -> jax.Array:
        reset_key, key = jax.random.split(key)
        obs, state = jax.vmap(environment.reset)(jax.random.split(reset_key, episodes))
        carry = jnp.zeros((episodes, network.hidden), jnp.float32)
        alive = jnp.ones(episodes, bool)
        loop = (params, obs, state, carry, alive, jnp.zeros(episodes), alive)
        (*_, total, _), _ = jax.lax.scan(body, loop, jax.random.split(key, steps))
        return total.mean()

    return jax.jit(evaluate)


def main(seed: int = 0, quiet: bool = False, prioritized: bool = False, recurrent: bool = True,
         config: dict | None = None) -> tuple[float, float]:  # fmt: skip
    """Trains one agent; returns the mean greedy returns over fresh episodes of the
    last parameters and of the selected ones (see the module docstring)."""
    config = {**CONFIG, **(config or {})}
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, network = make_train(config, env, env_params, prioritized, recurrent)
    evaluate = make_evaluate(network, env, env_params, config["eval_envs"])
    runner = init(jax.random.key(seed))
    best, best_params = -1.0, None
    start = time.perf_counter()
    for chunk in range(config["num_chunks"]):
        runner, loss = train_chunk(runner)
        check = float(evaluate(runner.params, jax.random.fold_in(jax.random.key(seed), chunk)))
        if check >= best:  # later parameters win ties
            best, best_params = check, jax.tree.map(jnp.copy, runner.params)
        if not quiet:
            print(f"[{time.perf_counter() - start:6.1f}s] timesteps "
                  f"{int(runner.step) * config['num_envs']:>7d}  episode return "
                  f"{float(runner.last_returns.mean()):6.1f}  greedy check {check:6.1f}  "
                  f"loss {float(loss):.4f}", flush=True)  # fmt: skip
    final_key = jax.random.key(seed + 10_000)  # episodes neither check has seen
    last, selected = (float(evaluate(p, final_key)) for p in (runner.params, best_params))
    kind = "recurrent" if recurrent else "feed-forward"
    print(f"seed {seed} ({kind}{', prioritized' if prioritized else ''}): greedy evaluation "
          f"return {selected:.1f} for the selected parameters, {last:.1f} for the last (mean "
          f"over {config['eval_envs']} fresh episodes), trained in "
          f"{time.perf_counter() - start:.1f}s")  # fmt: skip
    return last, selected


if __name__ == "__main__":
    command_line(
        lambda seed, quiet, prioritized, feed_forward: main(
            seed, quiet, prioritized, recurrent=not feed_forward
        ),
        __doc__,
        prioritized={"action": "store_true", "help": "prioritized sequences"},
        feed_forward={"action": "store_true", "help": "no memory, for comparison"},
    )
