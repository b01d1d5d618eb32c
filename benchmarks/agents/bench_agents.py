"""End to end: training steps per second of the example agents, jaxbuf against Flashbax.

The agents are the examples' own (`dqn_cartpole`, `dqn_nstep` prioritized,
`rdqn_cartpole`), unchanged but for their buffer: each `make_train` takes a
`buffer=` with jaxbuf's functions, and here that is either jaxbuf's or a thin
adapter over Flashbax's buffer for the same job, with the same network,
hyper-parameters and environments:

- DQN: `make_replay_buffer` against `fbx.make_item_buffer` (whole transitions
  as items, `add_batches=True`), and against `fbx.make_flat_buffer` as
  PureJaxRL's `dqn.py` uses it (steps sampled as pairs, the second's
  observation standing in for `next_obs`);
- n-step prioritized DQN (n = 3): `make_transition_buffer(...,
  sampler=prioritized())` against `fbx.make_prioritised_trajectory_buffer` over
  windows of n + 1 steps, the n-step return, discount and next observation
  computed from the window in the adapter (as a Flashbax user writes it);
- recurrent Q-learning: `make_trajectory_buffer` against
  `fbx.make_trajectory_buffer`, windows of burn-in + 24 + 3 steps, period 12.

For each agent, "full" is a training step as the example runs it, and "buffer
only" replaces the network update by a no-op that still consumes the sample
(acting, environment steps, add and sample remain): the buffer's share. Every
variant is compiled once in this process, then the variants take turns, one
jitted chunk of training each per round; the table gives steps per second
(environment steps, all environments) from the median and fastest rounds, and
jaxbuf's time over Flashbax's.

Run: `python -m benchmarks.agents.bench_agents [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

from types import SimpleNamespace

import flashbax as fbx
import gymnax
import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, flashbax_device, interleaved_times, write_results
from jaxbuf.examples import dqn_cartpole, dqn_nstep, rdqn_cartpole


def _sample(experience, batch: int, **fields) -> jaxbuf.Sample:
    return jaxbuf.Sample(experience, jnp.zeros(batch, jnp.int32), jnp.ones(batch, bool), **fields)


def flashbax_items(config: dict) -> SimpleNamespace:
    """Flashbax's item buffer behind the replay buffer's functions."""
    inner = fbx.make_item_buffer(
        max_length=config["buffer_capacity"], min_length=config["learning_starts"],
        sample_batch_size=config["batch_size"], add_sequences=False, add_batches=True,
    )  # fmt: skip
    return SimpleNamespace(
        init=inner.init, add=inner.add, can_sample=inner.can_sample,
        sample=lambda state, key: _sample(inner.sample(state, key).experience,
                                          config["batch_size"]),
    )  # fmt: skip


def flashbax_flat(config: dict) -> SimpleNamespace:
    """Flashbax's flat buffer as PureJaxRL's DQN uses it: steps without `next_obs`,
    sampled as pairs of consecutive steps (`first`, `second`)."""
    inner = fbx.make_flat_buffer(  # min_length as PureJaxRL sets it
        max_length=config["buffer_capacity"], min_length=config["batch_size"],
        sample_batch_size=config["batch_size"], add_sequences=False,
        add_batch_size=config["num_envs"],
    )  # fmt: skip

    def sample(state, key):
        pair = inner.sample(state, key).experience
        return _sample({**pair.first, "next_obs": pair.second["obs"]}, config["batch_size"])

    drop = lambda items: {k: v for k, v in items.items() if k != "next_obs"}  # noqa: E731
    return SimpleNamespace(
        init=lambda example: inner.init(drop(example)), can_sample=inner.can_sample,
        add=lambda state, items: inner.add(state, drop(items)), sample=sample,
    )  # fmt: skip


def flashbax_nstep(config: dict) -> SimpleNamespace:
    """Flashbax's prioritized trajectory buffer behind the transition buffer's functions."""
    n, gamma, batch = config["n_step"], config["discount"], config["batch_size"]
    inner = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=config["num_envs"], sample_batch_size=batch,
        sample_sequence_length=n + 1, period=1, min_length_time_axis=config["learning_starts"]
        // config["num_envs"], max_length_time_axis=config["steps_per_env"],
        priority_exponent=config["priority_exponent"], device=flashbax_device(),
    )  # fmt: skip

    def n_step(window: jaxbuf.Transition) -> jaxbuf.Transition:
        """The n-step transition of each window `[B, n + 1]`, cut at an episode end."""
        alive, total = jnp.ones(batch), jnp.zeros(batch)
        last, terminated = jnp.zeros(batch, jnp.int32), jnp.zeros(batch, bool)
        for j in range(n):
            total = total + alive * gamma**j * window.reward[:, j]
            last = jnp.where(alive > 0, j, last)
            terminated = jnp.where(alive > 0, window.terminated[:, j], terminated)
            done = window.terminated[:, j] | window.truncated[:, j]
            alive = alive * (1.0 - done.astype(jnp.float32))
        take = lambda x: jnp.take_along_axis(  # noqa: E731
            x, last.reshape(-1, *[1] * (x.ndim - 1)), axis=1)[:, 0]  # fmt: skip
        discount = jnp.where(terminated, 0.0, gamma ** (last + 1).astype(jnp.float32))
        return jaxbuf.Transition(window.obs[:, 0], window.action[:, 0], total, terminated,
                                 take(window.truncated), jax.tree.map(take, window.next_obs),
                                 discount)  # fmt: skip

    def sample(state, key, importance_exponent):
        drawn = inner.sample(state, key)
        count = jnp.maximum(state.sum_tree_state.nodes.shape[0] // 2, 1)  # slots, for (N P)^-b
        weights = (count * drawn.probabilities) ** -importance_exponent
        batch_sample = _sample(n_step(drawn.experience), batch, weights=weights / weights.max(),
                               probabilities=drawn.probabilities)  # fmt: skip
        return batch_sample.replace(indices=drawn.indices)

    return SimpleNamespace(
        init=inner.init, can_sample=inner.can_sample, sample=sample,
        add_step=lambda state, step: inner.add(state, jax.tree.map(lambda x: x[:, None], step)),
        set_priorities=inner.set_priorities,
    )  # fmt: skip


def flashbax_windows(config: dict) -> SimpleNamespace:
    """Flashbax's trajectory buffer behind the trajectory buffer's functions."""
    length = config["burn_in"] + config["length"] + config["n_step"]
    inner = fbx.make_trajectory_buffer(
        add_batch_size=config["num_envs"], sample_batch_size=config["batch_size"],
        sample_sequence_length=length, period=config["length"] // 2,
        min_length_time_axis=length, max_length_time_axis=config["buffer_capacity"],
    )  # fmt: skip
    return SimpleNamespace(
        init=inner.init, can_sample=inner.can_sample,
        add_step=lambda state, step: inner.add(state, jax.tree.map(lambda x: x[:, None], step)),
        sample=lambda state, key: _sample(inner.sample(state, key).experience,
                                          config["batch_size"]),
    )  # fmt: skip


def agents(quick: bool) -> dict:
    """name -> (config, make(config, buffer) -> (init, train_chunk), flashbax adapter)."""
    env, params = gymnax.make("CartPole-v1")
    dqn = {**dqn_cartpole.CONFIG, "total_timesteps": 200_000, "num_chunks": 20}
    nstep = {**dqn_nstep.CONFIG, "total_timesteps": 100_000, "num_chunks": 10}
    rdqn = {**rdqn_cartpole.CONFIG, "total_timesteps": 64_000, "num_chunks": 10}
    return {
        "DQN (replay)": (dqn, lambda c, b: dqn_cartpole.make_train(c, env, params, b)[:2],
                         {"item buffer": flashbax_items,
                          "flat buffer (PureJaxRL's)": flashbax_flat}),
        "n-step prioritized DQN (transition)": (
            nstep, lambda c, b: dqn_nstep.make_train(c, env, params, True, b)[:2],
            {"prioritised trajectory buffer": flashbax_nstep}),
        "recurrent Q (trajectory)": (
            rdqn, lambda c, b: rdqn_cartpole.make_train(c, env, params, False, True, b)[:2],
            {"trajectory buffer": flashbax_windows}),
    }  # fmt: skip


def measure(config: dict, make, adapters: dict, repeats: int) -> dict:
    runs, steps = {}, config["total_timesteps"] // config["num_chunks"]
    for update in (True, False):
        for library in ("jaxbuf", *adapters):
            variant = {**config, "update": update}
            buffer = adapters[library](variant) if library in adapters else None
            init, train_chunk = make(variant, buffer)
            holder = [init(jax.random.key(0))]
            holder[0], _ = train_chunk(holder[0])  # past learning_starts: every step learns

            def run(holder=holder, train_chunk=train_chunk):
                holder[0], loss = train_chunk(holder[0])
                return loss

            runs[(library, "full" if update else "buffer only")] = run
    times = interleaved_times({k: (f, 1) for k, f in runs.items()}, repeats)
    return {k: (steps / median, steps / fastest) for k, (median, fastest) in times.items()}


def main() -> None:
    args = command_line(__doc__)
    rows = []
    for name, (config, make, adapters) in agents(args.quick).items():
        rates = measure(config, make, adapters, 3 if args.quick else 7)
        for peer in adapters:
            for step in ("full", "buffer only"):
                ours, theirs = rates[("jaxbuf", step)], rates[(peer, step)]
                rows.append({"agent": name, "peer": peer, "step": step, "jaxbuf_sps": ours[0],
                             "flashbax_sps": theirs[0], "ratio": theirs[0] / ours[0],
                             "fastest_ratio": theirs[1] / ours[1]})  # fmt: skip
                print(rows[-1], flush=True)
    columns = [
        ("agent (jaxbuf buffer)", "agent", "{}"),
        ("Flashbax buffer", "peer", "{}"),
        ("training step", "step", "{}"),
        ("jaxbuf steps/s (median)", "jaxbuf_sps", "{:.0f}"),
        ("Flashbax steps/s (median)", "flashbax_sps", "{:.0f}"),
        ("jaxbuf time / Flashbax (median)", "ratio", "{:.2f}"),
        ("(fastest)", "fastest_ratio", "{:.2f}"),
    ]
    write_results(args.out, "agents", rows, columns, __doc__)


if __name__ == "__main__":
    main()
