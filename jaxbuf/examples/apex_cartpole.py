"""Ape-X DQN on Gymnasium's CartPole-v1: actor processes on a Ray cluster, one learner.

Run with `python -m jaxbuf.examples.apex_cartpole [--actors 2] [--seed N] [--quiet]`
(install `jaxbuf[ray,demo,torch]`: Ray, gymnax and optax, Gymnasium). Without a cluster
address (`RAY_ADDRESS`) it starts a local one.

Each actor process steps its own Gymnasium environments with a NumPy copy of the
network (no JAX there), forms n-step transitions itself (a truncated episode bootstraps
from its true final observation, a terminated one does not) with their initial
priorities, |TD error| under its copy, and sends them with a `jaxbuf.ray.Writer`. The
learner writes them into a prioritized replay buffer through `jaxbuf.ray.Ingest`, whose
rate limiter keeps the one-process agent's samples per inserted step (`dqn_nstep`: a
batch of 128 per 10 environment steps), learns as `dqn_nstep` does (importance weights,
beta annealed, new priorities |TD error|), and publishes its parameters every few updates.
Exploration follows `dqn_nstep` in every actor (epsilon from 1 to 0.05 over the first half
of its steps) rather than Ape-X's fixed per-actor epsilons, so that the two agents compare.
"""

from __future__ import annotations

import collections
import functools
import time
import uuid
from typing import Any

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxbuf
from jaxbuf.examples._common import command_line, evaluate_and_report
from jaxbuf.examples.dqn_cartpole import QNetwork
from jaxbuf.ray import Ingest, Writer

CONFIG = dict(
    hidden=(120, 84),
    total_timesteps=100_000,  # over all actors
    envs_per_actor=4,
    batch_size=128,
    n_step=3,
    discount=0.99,
    capacity=10_000,  # transitions: dqn_nstep's 10 environments x 1,000 steps
    learning_starts=10_000,  # transitions stored before learning starts
    samples_per_insert=12.8,  # dqn_nstep: 128 drawn per 10 steps
    learning_rate=2.5e-4,
    epsilon_start=1.0,
    epsilon_end=0.05,
    epsilon_fraction=0.5,
    target_update_every=50,  # updates (dqn_nstep: 500 steps of 10 environments)
    publish_every=20,  # updates between parameters sent to the actors
    priority_exponent=0.6,
    importance_start=0.4,
    importance_end=1.0,
    priority_floor=1e-3,
    block_size=32,  # transitions per block sent
    window=4,  # blocks in flight per actor
    eval_envs=64,
)


def q_values(params: Any, obs: np.ndarray) -> np.ndarray:
    """`QNetwork` in NumPy (an actor's copy): float32 `[B, actions]` for obs `[B, 4]`."""
    layers = params["params"]
    x = obs
    for i in range(len(layers)):
        x = x @ layers[f"Dense_{i}"]["kernel"] + layers[f"Dense_{i}"]["bias"]
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


class NStep:
    """One environment's n-step transitions: `(obs, action, return, discount, next_obs)`
    with discount gamma^k, or 0 where the episode terminated within the k steps."""

    def __init__(self, n: int, discount: float) -> None:
        self.n, self.gamma, self.recent = n, discount, collections.deque()

    def step(self, obs, action, reward, next_obs, terminated: bool, truncated: bool) -> list:
        self.recent.append((obs, action, reward))
        if terminated or truncated:
            out = [self._emit(next_obs, terminated) for _ in range(len(self.recent))]
            return out
        return [self._emit(next_obs, False)] if len(self.recent) == self.n else []

    def _emit(self, next_obs, terminated: bool) -> dict:
        rewards = [r for _, _, r in self.recent]
        obs, action, _ = self.recent.popleft()
        total = sum(self.gamma**i * r for i, r in enumerate(rewards))
        return {"obs": obs, "action": np.int32(action), "reward": np.float32(total),
                "discount": np.float32(0.0 if terminated else self.gamma ** len(rewards)),
                "next_obs": next_obs}  # fmt: skip


class Acting:
    """An actor's environments and policy: Gymnasium's CartPole-v1 stepped in NumPy, the
    network's NumPy copy, n-step transitions with their initial priorities."""

    def __init__(self, index: int, config: dict, seed: int) -> None:
        import gymnasium as gym

        self.config = config
        self.envs = [gym.make("CartPole-v1") for _ in range(config["envs_per_actor"])]
        self.obs = np.stack([env.reset(seed=seed * 1000 + index * 100 + i)[0]
                             for i, env in enumerate(self.envs)]).astype(np.float32)  # fmt: skip
        self.nsteps = [NStep(config["n_step"], config["discount"]) for _ in self.envs]
        self.rng = np.random.default_rng([seed, index])
        self.returns, self._running = [], np.zeros(len(self.envs))

    def step(self, params: Any, epsilon: float) -> tuple[list, np.ndarray]:
        """One step of every environment: the transitions completed, and their priorities."""
        actions = self._act(params, epsilon)
        transitions = []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            obs = obs.astype(np.float32)
            # a copy: the row of `self.obs` is overwritten below, the transition keeps it
            transitions += self.nsteps[i].step(self.obs[i].copy(), actions[i], float(reward), obs,
                                               terminated, truncated)  # fmt: skip
            self._running[i] += reward
            if terminated or truncated:
                self.returns.append(self._running[i])
                self._running[i] = 0.0
                obs = env.reset()[0].astype(np.float32)
            self.obs[i] = obs
        return transitions, self._priorities(params, transitions)

    def epsilon(self, done: int, steps: int) -> float:
        """`dqn_nstep`'s schedule, over this actor's `steps`."""
        c = self.config
        frac = min(done / (c["epsilon_fraction"] * steps), 1.0)
        return c["epsilon_start"] + frac * (c["epsilon_end"] - c["epsilon_start"])

    def _act(self, params: Any, epsilon: float) -> np.ndarray:
        explore = self.rng.random(len(self.envs)) < epsilon
        random_actions = self.rng.integers(0, 2, len(self.envs))
        if params is None:
            return random_actions
        return np.where(explore, random_actions, q_values(params, self.obs).argmax(axis=1))

    def _priorities(self, params: Any, transitions: list) -> np.ndarray:
        if not transitions:
            return np.zeros(0, np.float32)
        if params is None:
            return np.ones(len(transitions), np.float32)
        stacked = {k: np.stack([t[k] for t in transitions]) for k in transitions[0]}
        q = q_values(params, stacked["obs"])[np.arange(len(transitions)), stacked["action"]]
        next_q = q_values(params, stacked["next_obs"]).max(axis=1)
        target = stacked["reward"] + stacked["discount"] * next_q
        return (np.abs(target - q) + self.config["priority_floor"]).astype(np.float32)


class Actor:
    """An actor process (a Ray actor made by `train`): `Acting`, whose transitions a
    `jaxbuf.ray.Writer` sends, with the parameters the learner last published."""

    def __init__(self, inbox: str, index: int, config: dict, seed: int, namespace: str) -> None:
        self.acting = Acting(index, config, seed)
        self.writer = Writer(inbox, f"actor-{index}", block_size=config["block_size"],
                             window=config["window"], namespace=namespace)  # fmt: skip

    def run(self, steps: int) -> dict:
        """Steps every environment until `steps` transitions are sent; returns counts."""
        start, done, iteration, params = time.perf_counter(), 0, 0, None
        while done < steps:
            if iteration % 10 == 0 or params is None:
                params = self.writer.params()
            transitions, priorities = self.acting.step(params, self.acting.epsilon(done, steps))
            for transition, priority in zip(transitions, priorities, strict=True):
                self.writer.append(transition, priority=priority)
            done += len(self.acting.envs)
            iteration += 1
        self.writer.flush()
        self.writer.wait(timeout=120)
        return {"steps": self.writer.written_steps, "seconds": time.perf_counter() - start,
                "returns": self.acting.returns[-20:]}  # fmt: skip


def make_update(config: dict, network: QNetwork, buffer: Any, optimizer: Any):
    """A jitted `update(learner, buffer_state, key, beta) -> (learner, buffer_state, loss)`:
    one prioritized batch, one Adam step, the batch's new priorities (as `dqn_nstep`)."""

    def loss_fn(params, target_params, batch, weights):
        q = network.apply(params, batch["obs"])
        q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
        next_q = jnp.max(network.apply(target_params, batch["next_obs"]), axis=1)
        errors = q_taken - jax.lax.stop_gradient(batch["reward"] + batch["discount"] * next_q)
        return jnp.mean(weights * errors**2), errors

    def update(learner: dict, buffer_state: Any, key: jax.Array, beta: jax.Array):
        drawn = buffer.sample(buffer_state, key, importance_exponent=beta)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, errors), grads = grad_fn(learner["params"], learner["target"], drawn.experience,
                                        drawn.weights)  # fmt: skip
        updates, opt_state = optimizer.update(grads, learner["opt"], learner["params"])
        learner = {**learner, "params": optax.apply_updates(learner["params"], updates),
                   "opt": opt_state}  # fmt: skip
        priorities = jnp.abs(errors) + config["priority_floor"]
        return learner, buffer.set_priorities(buffer_state, drawn.indices, priorities), loss

    return jax.jit(update, donate_argnums=(0, 1))


def make_buffer(config: dict) -> tuple[Any, Any, dict]:
    """The learner's prioritized replay buffer, its rate limiter, and one transition."""
    buffer = jaxbuf.make_replay_buffer(
        config["capacity"], config["batch_size"], min_size=config["batch_size"],
        sampler=jaxbuf.prioritized(priority_exponent=config["priority_exponent"]),
    )  # fmt: skip
    limiter = jaxbuf.sample_to_insert_ratio(
        config["samples_per_insert"], min_size_to_sample=config["learning_starts"],
        error_buffer=config["batch_size"] * 8.0,
    )  # fmt: skip
    example = {"obs": np.zeros(4, np.float32), "action": np.int32(0), "reward": np.float32(0),
               "discount": np.float32(0), "next_obs": np.zeros(4, np.float32)}  # fmt: skip
    return buffer, limiter, example


def make_ingest(config: dict, inbox: str) -> Ingest:
    """The learner's buffer and limiter behind `Ingest`, fed by the inbox `inbox`."""
    buffer, limiter, example = make_buffer(config)
    return Ingest(buffer, buffer.init(example), inbox=inbox, limiter=limiter,
                  capacity=8 * config["window"])  # fmt: skip


def learn(config: dict, ingest: Ingest, runs: list, network: QNetwork, learner: dict,
          quiet: bool) -> tuple[dict, dict]:  # fmt: skip
    """Updates while the limiter allows, publishing parameters, until the actors are done
    and no more sample is allowed. Returns the learner and its counts."""
    import ray

    optimizer = optax.adam(config["learning_rate"])
    update = make_update(config, network, ingest.buffer, optimizer)
    total = int(config["total_timesteps"] * config["samples_per_insert"] / config["batch_size"])
    key, updates, start = jax.random.key(config["seed"]), 0, time.perf_counter()
    while updates < total:
        if not ingest.can_sample():
            actors_done = not ray.wait(runs, num_returns=len(runs), timeout=0)[1]
            if not ingest.poll(timeout=0.5) and actors_done and not ingest.can_sample():
                break  # every step the actors sent is written, and no sample is allowed
            continue
        key, draw = jax.random.split(key)
        beta = config["importance_start"] + min(updates / total, 1.0) * (
            config["importance_end"] - config["importance_start"])  # fmt: skip
        learner, ingest.state, loss = update(learner, ingest.state, draw, jnp.float32(beta))
        ingest.sampled(config["batch_size"])
        updates += 1
        if updates % config["target_update_every"] == 0:
            learner["target"] = jax.tree.map(jnp.copy, learner["params"])
        if updates % config["publish_every"] == 0:
            ingest.publish(learner["params"])
            ingest.poll(timeout=0.0)
        if not quiet and updates % 1000 == 0:
            steps = sum(e.steps for e in ingest.ledger.entries.values())
            print(f"[{time.perf_counter() - start:6.1f}s] updates {updates:>6d}  steps written "
                  f"{steps:>7d}  loss {float(loss):.4f}", flush=True)  # fmt: skip
    seconds = time.perf_counter() - start
    steps = sum(e.steps for e in ingest.ledger.entries.values())
    return learner, {"updates": updates, "steps": steps, "seconds": seconds}


def train(seed: int = 0, actors: int = 2, config: dict = CONFIG, quiet: bool = False):
    """Starts Ray (or joins `RAY_ADDRESS`), the learner's inbox and `actors` actor
    processes; trains; returns the parameters, the network and the counts."""
    import ray

    config = {**config, "seed": seed}
    if not ray.is_initialized():
        ray.init(num_cpus=max(actors, 1) + 1, include_dashboard=False, logging_level="ERROR")
    namespace, inbox = ray.get_runtime_context().namespace, f"apex-{uuid.uuid4().hex[:8]}"
    ingest = make_ingest(config, inbox)
    network = QNetwork(2, tuple(config["hidden"]))
    params = network.init(jax.random.key(seed), jnp.zeros(4))
    learner = {"params": params, "target": jax.tree.map(jnp.copy, params),
               "opt": optax.adam(config["learning_rate"]).init(params)}  # fmt: skip
    ingest.publish(params)
    remote = ray.remote(num_cpus=1)(Actor)
    handles = [remote.remote(inbox, i, config, seed, namespace) for i in range(actors)]
    runs = [h.run.remote(config["total_timesteps"] // actors) for h in handles]
    learner, counts = learn(config, ingest, runs, network, learner, quiet)
    counts["actors"] = ray.get(runs)
    ingest.close()
    for handle in handles:
        ray.kill(handle)
    return learner["params"], network, counts


def train_one_process(seed: int = 0, config: dict = CONFIG, quiet: bool = False):
    """The same agent in one process, for comparison: one `Acting` (the environments of
    one actor) and the learner take turns, as the limiter allows; the same buffer,
    limiter and update, blocks of `block_size` written by one jitted call each."""
    config = {**config, "seed": seed}
    acting, (buffer, limiter, example) = Acting(0, config, seed), make_buffer(config)
    network = QNetwork(2, tuple(config["hidden"]))
    params = network.init(jax.random.key(seed), jnp.zeros(4))
    learner = {"params": params, "target": jax.tree.map(jnp.copy, params),
               "opt": optax.adam(config["learning_rate"]).init(params)}  # fmt: skip
    update = make_update(config, network, buffer, optax.adam(config["learning_rate"]))
    write = jax.jit(functools.partial(_write_block, buffer, limiter), donate_argnums=(0, 1))
    can_insert, can_sample = jax.jit(limiter.can_insert), jax.jit(limiter.can_sample)
    sampled = jax.jit(limiter.sampled)
    total = int(config["total_timesteps"] * config["samples_per_insert"] / config["batch_size"])
    state, limits, key = buffer.init(example), limiter.init(), jax.random.key(seed)
    pending, done, updates, start = [], 0, 0, time.perf_counter()
    host_params = jax.device_get(params)
    while updates < total and (done < config["total_timesteps"] or pending):
        size = config["block_size"]
        if len(pending) >= size and bool(can_insert(limits, size)):
            block = {k: np.stack([t[k] for t, _ in pending[:size]]) for k in pending[0][0]}
            priorities = np.array([p for _, p in pending[:size]], np.float32)
            state, limits = write(state, limits, block, priorities)
            pending = pending[size:]
        elif bool(can_sample(limits, config["batch_size"])):
            key, draw = jax.random.split(key)
            beta = config["importance_start"] + min(updates / total, 1.0) * (
                config["importance_end"] - config["importance_start"])  # fmt: skip
            learner, state, _ = update(learner, state, draw, jnp.float32(beta))
            limits = sampled(limits, config["batch_size"])
            updates += 1
            if updates % config["target_update_every"] == 0:
                learner["target"] = jax.tree.map(jnp.copy, learner["params"])
            if updates % config["publish_every"] == 0:
                host_params = jax.device_get(learner["params"])
        elif done < config["total_timesteps"]:
            epsilon = acting.epsilon(done, config["total_timesteps"])
            transitions, priorities = acting.step(host_params, epsilon)
            pending += list(zip(transitions, priorities, strict=True))
            done += len(acting.envs)
        else:
            break
    steps = int(limits.counts()["inserts"])
    counts = {"updates": updates, "steps": steps, "seconds": time.perf_counter() - start}
    return learner["params"], network, counts


def _write_block(buffer: Any, limiter: Any, state: Any, limits: Any, block: Any, priorities: Any):
    """A block into the prioritized ring with its priorities, counted by the limiter."""
    capacity = jax.tree.leaves(state.experience)[0].shape[0]
    rows = (state.position + jnp.arange(priorities.shape[0], dtype=jnp.int32)) % capacity
    state = buffer.set_priorities(buffer.add(state, block), rows, priorities)
    return state, limiter.inserted(limits, priorities.shape[0])


def main(seed: int = 0, quiet: bool = False, actors: int = 2) -> float:
    start = time.perf_counter()
    if actors == 0:
        params, network, counts = train_one_process(seed, quiet=quiet)
    else:
        params, network, counts = train(seed, actors, quiet=quiet)
    if not quiet:
        print(f"{counts['steps']} steps written, {counts['updates']} updates in "
              f"{counts['seconds']:.1f}s", flush=True)  # fmt: skip
    env, env_params = gymnax.make("CartPole-v1")

    def greedy(params, obs):
        return jnp.argmax(network.apply(params, obs), axis=1)

    return evaluate_and_report(greedy, env, env_params, params, seed, start, CONFIG["eval_envs"])


if __name__ == "__main__":
    command_line(
        main,
        __doc__,
        actors={"type": int, "default": 2, "help": "actor processes (0: the agent in one process)"},
    )
