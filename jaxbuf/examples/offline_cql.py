"""Offline RL from an on-disk dataset: record DQN's experience, then train CQL on it.

Run with `python -m jaxbuf.examples.offline_cql [--seed N] [--dataset PATH]`.

Step 1 trains the DQN example (`jaxbuf.examples.dqn_cartpole`) on gymnax
CartPole-v1 and records everything its replay buffer receives into a
`jaxbuf.io.DatasetWriter` dataset (one `append` after every jitted chunk of
training, each chunk adding at most the buffer's capacity). The dataset holds
the whole history of an agent that learns: random play at first, then better
and better episodes.

Step 2 forgets the environment: `jaxbuf.io.dataset_to_state` loads the dataset
into a replay buffer with the `jaxbuf.epochs()` sampler, so each pass of
`next_batch` visits every recorded transition exactly once, in a new order.
A Q-network is trained on it with discrete conservative Q-learning (Kumar et
al., 2020): the double-DQN loss plus `alpha * (logsumexp_a Q(s, a) - Q(s, a_data))`,
which keeps the values of actions the data never took from growing. The
offline policy is then evaluated greedily in the environment it never
interacted with.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from typing import Any, NamedTuple

import gymnax
import jax
import jax.numpy as jnp
import optax

import jaxbuf
from jaxbuf.examples import dqn_cartpole
from jaxbuf.examples._common import command_line, evaluate_and_report

CONFIG = dict(
    record_timesteps=300_000,  # DQN steps recorded (all environments)
    batch_size=256,
    epochs=6,  # passes over the dataset
    learning_rate=3e-4,
    discount=0.99,
    cql_alpha=1.0,
    target_update_every=1_000,  # updates
    eval_envs=64,
)


def record(path: pathlib.Path, seed: int, config: dict, quiet: bool) -> None:
    """Trains DQN and writes every transition its buffer receives."""
    dqn = {**dqn_cartpole.CONFIG, "total_timesteps": config["record_timesteps"]}
    per_chunk = dqn["buffer_capacity"] // dqn["num_envs"]  # iterations filling the buffer once
    dqn["num_chunks"] = dqn["total_timesteps"] // (per_chunk * dqn["num_envs"])
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, _ = dqn_cartpole.make_train(dqn, env, env_params)
    runner = init(jax.random.key(seed))
    writer = jaxbuf.io.DatasetWriter(path, runner.buffer_state)
    start = time.perf_counter()
    for _ in range(dqn["num_chunks"]):
        runner, _ = train_chunk(runner)
        writer.append(runner.buffer_state)  # before the next chunk donates the state
        if not quiet:
            recorded = int(runner.step) * dqn["num_envs"]
            print(f"[{time.perf_counter() - start:6.1f}s] recorded {recorded:>7d} transitions"
                  f"  DQN episode return {float(runner.last_returns.mean()):6.1f}",
                  flush=True)  # fmt: skip
    writer.flush()


class Learner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer_state: Any
    updates: jax.Array  # int32
    key: jax.Array


def make_offline(config: dict, network, buffer: jaxbuf.Buffer, num_updates: int):
    optimizer = optax.adam(config["learning_rate"])

    def loss_fn(params, target_params, batch: dict, valid: jax.Array):
        q = network.apply(params, batch["obs"])
        taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
        best = jnp.argmax(network.apply(params, batch["next_obs"]), axis=1)
        next_q = jnp.take_along_axis(network.apply(target_params, batch["next_obs"]),
                                     best[:, None], axis=1)[:, 0]  # fmt: skip
        not_terminated = 1.0 - batch["terminated"].astype(jnp.float32)
        target = batch["reward"] + config["discount"] * not_terminated * next_q
        td = (taken - jax.lax.stop_gradient(target)) ** 2
        conservative = jax.nn.logsumexp(q, axis=1) - taken
        weight = valid.astype(jnp.float32)  # the last batch of a pass may be partial
        per_item = td + config["cql_alpha"] * conservative
        return jnp.sum(weight * per_item) / jnp.maximum(weight.sum(), 1.0)

    def update(learner: Learner, _) -> tuple[Learner, jax.Array]:
        key, batch_key = jax.random.split(learner.key)
        state, batch = buffer.next_batch(learner.buffer_state, batch_key)
        loss, grads = jax.value_and_grad(loss_fn)(learner.params, learner.target_params,
                                                  batch.experience, batch.valid)  # fmt: skip
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        params = optax.apply_updates(learner.params, updates)
        step = learner.updates + 1
        sync = step % config["target_update_every"] == 0
        target = jax.tree.map(lambda t, p: jnp.where(sync, p, t), learner.target_params, params)
        return Learner(params, target, opt_state, state, step, key), loss

    def train(learner: Learner) -> tuple[Learner, jax.Array]:
        learner, losses = jax.lax.scan(update, learner, length=num_updates)
        return learner, losses.mean()

    return optimizer, jax.jit(train, donate_argnums=0)


def main(seed: int = 0, quiet: bool = False, dataset: str | None = None,
         config: dict | None = None) -> float:  # fmt: skip
    """Records a dataset (unless `dataset` exists), trains offline, returns the
    greedy evaluation return of the offline policy."""
    config = {**CONFIG, **(config or {})}
    path = pathlib.Path(dataset or tempfile.mkdtemp(prefix="jaxbuf-offline-")) / "dqn"
    if not (path / "dataset.json").exists():
        print(f"== recording DQN's experience into {path} ==", flush=True)
        record(path, seed, config, quiet)
    size = len(jaxbuf.io.read_dataset(path, stop=None)["reward"])
    buffer = jaxbuf.make_replay_buffer(size, config["batch_size"], sampler=jaxbuf.epochs())
    state = jaxbuf.io.dataset_to_state(path, buffer)
    env, env_params = gymnax.make("CartPole-v1")
    network = dqn_cartpole.QNetwork(env.action_space(env_params).n,
                                    tuple(dqn_cartpole.CONFIG["hidden"]))  # fmt: skip
    per_epoch = -(-size // config["batch_size"])
    optimizer, train_epoch = make_offline(config, network, buffer, per_epoch)
    params = network.init(jax.random.key(seed + 1), jnp.zeros(4))
    learner = Learner(params, jax.tree.map(jnp.copy, params), optimizer.init(params), state,
                      jnp.zeros((), jnp.int32), jax.random.key(seed + 2))  # fmt: skip
    print(f"== CQL on {size} recorded transitions, {config['epochs']} passes ==", flush=True)
    start = time.perf_counter()
    for _ in range(config["epochs"]):
        learner, loss = train_epoch(learner)
        if not quiet:
            print(f"[{time.perf_counter() - start:6.1f}s] pass "
                  f"{int(learner.buffer_state.sampler.epoch)}  updates {int(learner.updates)}"
                  f"  loss {float(loss):.4f}", flush=True)  # fmt: skip

    def greedy(params, obs):
        return jnp.argmax(network.apply(params, obs), axis=1)

    return evaluate_and_report(greedy, env, env_params, learner.params, seed, start,
                               config["eval_envs"])  # fmt: skip


if __name__ == "__main__":
    command_line(
        main, __doc__, dataset={"help": "folder for the dataset (reused if recorded already)"}
    )
