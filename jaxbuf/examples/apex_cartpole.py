"""Ape-X DQN on Gymnasium's CartPole-v1: actor processes on a Ray cluster, one learner.

Run with `python -m jaxbuf.examples.apex_cartpole [--actors 2] [--seed N] [--quiet]`
(install `jaxbuf[ray,demo,torch]`: Ray, gymnax and optax, Gymnasium). Without a cluster
address (`RAY_ADDRESS`) it starts a local one.

Each actor process (`jaxbuf.examples.apex_actor`: NumPy and Gymnasium, no JAX there)
steps its own Gymnasium environments with a NumPy copy of the network, forms n-step
transitions with their initial priorities and sends them with a `jaxbuf.ray.Writer`. The
learner writes them into a prioritized replay buffer through `jaxbuf.ray.Ingest`, whose
rate limiter keeps the one-process agent's samples per inserted step (`dqn_nstep`: a
batch of 128 per 10 environment steps), learns as `dqn_nstep` does (importance weights,
beta annealed, new priorities |TD error|), and publishes its parameters every few updates.
Exploration follows `dqn_nstep` in every actor (epsilon from 1 to 0.05 over the first half
of its steps) rather than Ape-X's fixed per-actor epsilons, so that the two agents compare.
"""

from __future__ import annotations

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
from jaxbuf.examples.apex_actor import Acting, Actor
from jaxbuf.examples.dqn_cartpole import QNetwork
from jaxbuf.ray import Ingest
from jaxbuf.ray.ingest import write_block

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
    error_buffer=8192.0,  # samples the learner may run ahead of or behind the ratio
    learning_rate=2.5e-4,
    epsilon_start=1.0,
    epsilon_end=0.05,
    epsilon_fraction=0.5,
    target_update_every=50,  # updates (dqn_nstep: 500 steps of 10 environments)
    publish_every=20,  # updates between parameters sent to the actors
    updates_per_check=16,  # updates at most per look at the limiter (one host sync)
    fetch_every=10,  # an actor's steps of its environments between looks for parameters
    priority_exponent=0.6,
    importance_start=0.4,
    importance_end=1.0,
    priority_floor=1e-3,
    block_size=256,  # transitions per block sent (a block's inserts fit the error buffer)
    window=4,  # blocks in flight per actor
    eval_envs=64,
)


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
        error_buffer=config["error_buffer"],
    )  # fmt: skip
    example = {"obs": np.zeros(4, np.float32), "action": np.int32(0), "reward": np.float32(0),
               "discount": np.float32(0), "next_obs": np.zeros(4, np.float32)}  # fmt: skip
    return buffer, limiter, example


def make_ingest(config: dict, inbox: str) -> Ingest:
    """The learner's buffer and limiter behind `Ingest`, fed by the inbox `inbox`."""
    buffer, limiter, example = make_buffer(config)
    return Ingest(buffer, buffer.init(example), inbox=inbox, limiter=limiter,
                  capacity=8 * config["window"])  # fmt: skip


def compiled_update(config: dict, network: QNetwork, buffer: Any, learner: dict,
                    buffer_state: Any) -> Any:  # fmt: skip
    """`make_update`'s step compiled ahead for these shapes (the learner compiles it
    while its actors start; the one-process agent before its first step)."""
    update = make_update(config, network, buffer, optax.adam(config["learning_rate"]))
    key, beta = jax.random.key(0), jnp.float32(0)
    return update.lower(learner, buffer_state, key, beta).compile()


class Learning:
    """The learner's updates, as both agents run them: bursts of the updates the limiter
    allows (one check for up to `updates_per_check` of them), beta annealed over the
    run, the target network copied every `target_update_every` updates."""

    def __init__(self, config: dict, network: QNetwork, buffer: Any, buffer_state: Any,
                 seed: int) -> None:  # fmt: skip
        params = network.init(jax.random.key(seed), jnp.zeros(4))
        self.learner = {"params": params, "target": jax.tree.map(jnp.copy, params),
                        "opt": optax.adam(config["learning_rate"]).init(params)}  # fmt: skip
        self.update = compiled_update(config, network, buffer, self.learner, buffer_state)
        steps, per_step = config["total_timesteps"], config["samples_per_insert"]
        self.config, self.total = config, int(steps * per_step / config["batch_size"])
        self.key, self.updates, self.loss = jax.random.key(seed), 0, jnp.float32(0)

    @property
    def done(self) -> bool:
        return self.updates >= self.total

    def burst(self, buffer_state: Any, allowed: int) -> tuple[Any, int, bool]:
        """`allowed` updates (fewer at the end of the run): the buffer state after them,
        how many ran, and whether parameters are due for the actors."""
        c, count, publish = self.config, min(allowed, self.total - self.updates), False
        # keys for a whole burst in one call of one shape (a shape per count would compile
        # a split for each count)
        self.key, *draws = list(jax.random.split(self.key, self.config["updates_per_check"] + 1))
        for draw in draws[:count]:
            frac = min(self.updates / self.total, 1.0)
            beta = c["importance_start"] + frac * (c["importance_end"] - c["importance_start"])
            self.learner, buffer_state, self.loss = self.update(
                self.learner, buffer_state, draw, jnp.float32(beta))  # fmt: skip
            self.updates += 1
            if self.updates % c["target_update_every"] == 0:
                self.learner["target"] = jax.tree.map(jnp.copy, self.learner["params"])
            publish |= self.updates % c["publish_every"] == 0
        return buffer_state, count, publish


def learn(config: dict, ingest: Ingest, runs: list, learning: Learning, start: float,
          quiet: bool) -> dict:  # fmt: skip
    """Updates while the limiter allows, publishing parameters, until the actors are done
    and no more sample is allowed. Returns the counts (seconds from `start`)."""
    import ray

    shown = 0
    while not learning.done:
        allowed = ingest.batches_allowed(config["updates_per_check"])
        if not allowed:
            actors_done = not ray.wait(runs, num_returns=len(runs), timeout=0)[1]
            if not ingest.poll(timeout=0.5) and actors_done and not ingest.can_sample():
                break  # every step the actors sent is written, and no sample is allowed
            continue
        if not learning.updates:  # the learning phase starts: its steps and seconds
            first = (time.perf_counter(), sum(e.steps for e in ingest.ledger.entries.values()))
        ingest.state, count, publish = learning.burst(ingest.state, allowed)
        ingest.sampled(count * config["batch_size"])
        if publish:
            ingest.publish(learning.learner["params"])
            ingest.poll(timeout=0.0)
        if not quiet and learning.updates >= shown + 1000:
            shown, steps = learning.updates, sum(e.steps for e in ingest.ledger.entries.values())
            print(f"[{time.perf_counter() - start:6.1f}s] updates {shown:>6d}  steps written "
                  f"{steps:>7d}  loss {float(learning.loss):.4f}", flush=True)  # fmt: skip
    end, steps = time.perf_counter(), sum(e.steps for e in ingest.ledger.entries.values())
    return {"updates": learning.updates, "steps": steps, "seconds": end - start,
            "learning": _phase(first, end, steps) if learning.updates else None}  # fmt: skip


def _phase(first: tuple[float, int], end: float, steps: int) -> dict:
    """The learning phase's steps and seconds (from the first update to the end)."""
    return {"seconds": end - first[0], "steps": steps - first[1]}


def train(seed: int = 0, actors: int = 2, config: dict = CONFIG, quiet: bool = False):
    """Starts Ray (or joins `RAY_ADDRESS`), the learner's inbox and `actors` actor
    processes; trains; returns the parameters, the network and the counts."""
    import ray

    config = {**config, "seed": seed}
    if not ray.is_initialized():
        ray.init(num_cpus=max(actors, 1) + 1, include_dashboard=False, logging_level="ERROR")
    namespace, inbox = ray.get_runtime_context().namespace, f"apex-{uuid.uuid4().hex[:8]}"
    ingest, network = make_ingest(config, inbox), QNetwork(2, tuple(config["hidden"]))
    ingest.publish(network.init(jax.random.key(seed), jnp.zeros(4)))  # Learning's first
    start, remote = time.perf_counter(), ray.remote(num_cpus=1)(Actor)
    handles = [remote.remote(inbox, i, config, seed, namespace) for i in range(actors)]
    runs = [h.run.remote(config["total_timesteps"] // actors) for h in handles]
    learning = Learning(config, network, ingest.buffer, ingest.state, seed)  # as they start
    counts = learn(config, ingest, runs, learning, start, quiet)
    counts["actors"], counts["inbox"] = ray.get(runs), ingest.stats()["inbox"]
    ingest.close()
    for handle in handles:
        ray.kill(handle)
    return learning.learner["params"], network, counts


def train_one_process(seed: int = 0, config: dict = CONFIG, quiet: bool = False):
    """The same agent in one process, for comparison: one `Acting` (the environments of
    one actor) and the learner take turns, as the limiter allows; the same buffer,
    limiter, blocks (`write_block`, one jitted call each) and bursts of updates."""
    config = {**config, "seed": seed}
    acting, (buffer, limiter, example) = Acting(0, config, seed), make_buffer(config)
    network, state = QNetwork(2, tuple(config["hidden"])), buffer.init(example)
    start = time.perf_counter()
    learning = Learning(config, network, buffer, state, seed)
    write = jax.jit(functools.partial(write_block, buffer, limiter), donate_argnums=(0, 1))
    allowed = jax.jit(functools.partial(jaxbuf.batches_allowed, limiter),
                      static_argnames="most")  # fmt: skip
    can_insert, sampled = jax.jit(limiter.can_insert), jax.jit(limiter.sampled)
    limits, pending, done, size = limiter.init(), [], 0, config["block_size"]
    host_params = jax.device_get(learning.learner["params"])
    while not learning.done and (done < config["total_timesteps"] or pending):
        if len(pending) >= size and bool(can_insert(limits, size)):
            block = {k: np.stack([t[k] for t, _ in pending[:size]]) for k in pending[0][0]}
            priorities = np.array([p for _, p in pending[:size]], np.float32)
            state, limits = write(state, limits, block, priorities)
            pending = pending[size:]
        elif n := int(allowed(limits, config["batch_size"], most=config["updates_per_check"])):
            if not learning.updates:
                first = (time.perf_counter(), int(limits.counts()["inserts"]))
            state, count, publish = learning.burst(state, n)
            limits = sampled(limits, count * config["batch_size"])
            if publish:
                host_params = jax.device_get(learning.learner["params"])
        elif done < config["total_timesteps"]:
            epsilon = acting.epsilon(done, config["total_timesteps"])
            transitions, priorities = acting.step(host_params, epsilon)
            pending += list(zip(transitions, priorities, strict=True))
            done += len(acting.envs)
        else:
            break
    end, steps = time.perf_counter(), int(limits.counts()["inserts"])
    counts = {"updates": learning.updates, "steps": steps, "seconds": end - start,
              "learning": _phase(first, end, steps) if learning.updates else None}  # fmt: skip
    return learning.learner["params"], network, counts


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
