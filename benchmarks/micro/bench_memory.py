"""The bytes a buffer's state takes per stored step: observations once, and what the side ring adds.

Computed with `jaxbuf.memory` (the bytes `init` would allocate, nothing allocated), so the
figures do not move with the machine:

- Atari (CleanRL's `dqn_atari_jax.py` switched, one environment, 84×84 uint8 frames,
  `frames={"obs": 4}`), 1M steps, for `min_episode_length` 1, 5, 20 and 100: frames per
  stored step (the frame ring and the side ring of final observations, in frames) and the
  GiB of the whole state; against them, the frames of a 4-frame stack per step, what
  SB3's `ReplayBuffer(optimize_memory_usage=True)` stores (CleanRL's buffer);
- CartPole (4 float32 observations, 100k steps): observations per stored step of the
  transition buffer for `min_episode_length` 1 and 100, and of a replay buffer of
  `(obs, next_obs)` transitions;
- the transition buffer with its defaults (`min_episode_length` 10), float32[64]
  observations and 8 environments of 2,000 steps each, against `min_episode_length=1` and the
  replay buffer of full transitions: bytes per stored step, and, after adds of episodes of
  exactly 1, 2, 10 and 1,000 steps that wrap the buffer three times, the share of stored steps
  that can still start a transition (`1 - state.side.stale / stored`, over the environments;
  every other step's final observation is kept).

Run: `python -m benchmarks.micro.bench_memory [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, write_results

FRAME = 84 * 84  # bytes of one uint8 frame
GIB = 2**30


def observation_bytes(report) -> int:
    """Bytes of every leaf that holds observations: the ring's (`obs`, and `next_obs` where
    stored) and the side ring's final observations."""
    held = ("['obs']", "['next_obs']", ".side.experience")
    return sum(size for path, size in report.leaves.items() if path.endswith(held))


def atari_rows(steps: int) -> list[dict]:
    frame = jnp.zeros((84, 84), jnp.uint8)
    example = jaxbuf.Transition(frame, jnp.int32(0), jnp.float32(0), jnp.bool_(0),
                                jnp.bool_(0), frame)  # fmt: skip
    rows = []
    for shortest in (1, 5, 20, 100):
        buffer = jaxbuf.make_transition_buffer(
            1, steps, 32, frames={"obs": 4}, min_episode_length=shortest
        )
        report = jaxbuf.memory(buffer, example)
        rows.append({"case": "Atari, jaxbuf transition, frames stacked 4",
                     "min_episode_length": shortest, "steps": steps,
                     "per_step": observation_bytes(report) / FRAME / steps,
                     "unit": "frames", "gib": report.total / GIB})  # fmt: skip
    stacked = 4 * FRAME * steps  # one stack of 4 per step, its frames only
    rows.append({"case": "Atari, a stack per step (SB3's optimize_memory_usage, CleanRL's)",
                 "min_episode_length": None, "steps": steps, "per_step": 4.0, "unit": "frames",
                 "gib": stacked / GIB})  # fmt: skip
    return rows


def cartpole_rows(steps: int) -> list[dict]:
    obs = jnp.zeros(4, jnp.float32)
    example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(0),
                                jnp.bool_(0), obs)  # fmt: skip
    rows = []
    for shortest in (1, 100):
        buffer = jaxbuf.make_transition_buffer(1, steps, 32, min_episode_length=shortest)
        report = jaxbuf.memory(buffer, example)
        rows.append({"case": "CartPole, jaxbuf transition", "min_episode_length": shortest,
                     "steps": steps, "per_step": observation_bytes(report) / 16 / steps,
                     "unit": "observations", "gib": report.total / GIB})  # fmt: skip
    replay = jaxbuf.make_replay_buffer(steps, 32)
    report = jaxbuf.memory(replay, {"obs": obs, "next_obs": obs, "action": jnp.int32(0)})
    rows.append({"case": "CartPole, jaxbuf replay of (obs, next_obs)", "min_episode_length": None,
                 "steps": steps, "per_step": observation_bytes(report) / 16 / steps,
                 "unit": "observations", "gib": report.total / GIB})  # fmt: skip
    return rows


def usable_share(buffer, example, episode: int, envs: int, steps: int) -> float:
    """The share of stored steps that can start a transition after adds of episodes of
    exactly `episode` steps, `3 * steps` per environment (jitted adds of 500 steps)."""
    import jax
    import numpy as np

    state, add = buffer.init(example), jax.jit(buffer.add)
    for start in range(0, 3 * steps, 500):
        t = start + np.arange(500)
        ended = np.broadcast_to(t % episode == episode - 1, (envs, 500))
        chunk = jax.tree.map(lambda x: np.broadcast_to(x, (envs, 500, *x.shape)), example)
        state = add(state, chunk.replace(terminated=ended))
    stale = np.asarray(state.side.stale).sum()
    return 1 - float(stale) / (envs * int(state.size))


def default_rows(envs: int = 8, steps: int = 2000) -> list[dict]:
    obs = jnp.zeros(64, jnp.float32)
    example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(0),
                                jnp.bool_(0), obs)  # fmt: skip
    rows = []
    for shortest in (None, 1):
        buffer = jaxbuf.make_transition_buffer(envs, steps, 256, min_episode_length=shortest)
        report = jaxbuf.memory(buffer, example)
        row = {
            "case": "float32[64], 8 envs, jaxbuf transition"
            + (" (defaults)" if shortest is None else ""),
            "min_episode_length": buffer.config.min_episode_length,
            "steps": envs * steps,
            "per_step": report.per_stored_step,
            "unit": "bytes",
            "gib": report.total / GIB,
        }
        for episode in (1, 2, 10, 1000):
            row[f"usable_{episode}"] = usable_share(buffer, example, episode, envs, steps)
        rows.append(row)  # fmt: skip
    replay = jaxbuf.make_replay_buffer(envs * steps, 256)
    items = {name: getattr(example, name) for name in
             ("obs", "action", "reward", "terminated", "truncated", "next_obs")}  # fmt: skip
    report = jaxbuf.memory(replay, items)
    rows.append({"case": "float32[64], 8 envs, jaxbuf replay of full transitions",
                 "min_episode_length": None, "steps": envs * steps,
                 "per_step": report.per_stored_step, "unit": "bytes", "gib": report.total / GIB,
                 **{f"usable_{e}": 1.0 for e in (1, 2, 10, 1000)}})  # fmt: skip
    return rows


def main() -> None:
    args = command_line(__doc__)
    rows = atari_rows(1_000_000) + cartpole_rows(100_000) + default_rows()
    for row in rows:
        print(row)
    columns = [("case", "case", "{}"), ("min_episode_length", "min_episode_length", "{}"),
               ("stored steps", "steps", "{:,}"), ("per stored step", "per_step", "{:.3f}"),
               ("of", "unit", "{}"), ("state GiB", "gib", "{:.4g}"),
               *[(f"usable, episodes of {e}", f"usable_{e}", "{:.3f}")
                 for e in (1, 2, 10, 1000)]]  # fmt: skip
    write_results(args.out, "memory", rows, columns, __doc__)


if __name__ == "__main__":
    main()
