"""n-step transitions: memory per stored step and speed, against full transitions and Flashbax.

16 environments add one step each per call (obs: float32[64], action: int32,
reward: float32, terminated and truncated: bool; episodes end with probability
1/100 per step, so they average 100 steps); `sample` draws 256 transitions.
Total steps stored 1e4, 1e5, 1e6 (capacity per environment = total / 16).

Memory: bytes of the whole buffer state per stored step, for jaxbuf's
transition buffer (side ring sized by `min_episode_length` 100, and 1), a state
holding each step once (the lower bound), full transitions in a jaxbuf replay
buffer (obs and next_obs both stored) and Flashbax's flat buffer (each step
once; it pairs consecutive steps, so it cannot give the true final observation
of an episode that an auto-resetting environment ended).

Speed: a standalone jitted `sample` on a full buffer and a jitted `lax.scan` of
1000 iterations of a donated add + sample, for jaxbuf's transitions (n_step 1
and 3), the replay buffer of full transitions and Flashbax's flat buffer. All
cases take turns in every timed round.

Run: `python -m benchmarks.micro.bench_transition [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, interleaved_medians, run_scan, write_results

NUM_ENVS, BATCH, SCAN_LENGTH, OBS = 16, 256, 1000, 64
STEP = {
    "obs": jnp.zeros(OBS, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "terminated": jnp.bool_(False),
    "truncated": jnp.bool_(False),
}
TRANSITION = jaxbuf.Transition(**STEP, next_obs=STEP["obs"])


def transitions(key: jax.Array, length: int) -> jaxbuf.Transition:
    keys = jax.random.split(key, 4)
    ends = jax.random.uniform(keys[0], (NUM_ENVS, length)) < 0.01
    terminated = ends & (jax.random.uniform(keys[1], (NUM_ENVS, length)) < 0.5)
    return jaxbuf.Transition(
        obs=jax.random.normal(keys[2], (NUM_ENVS, length, OBS)),
        action=jnp.zeros((NUM_ENVS, length), jnp.int32),
        reward=jnp.ones((NUM_ENVS, length), jnp.float32),
        terminated=terminated,
        truncated=ends & ~terminated,
        next_obs=jax.random.normal(keys[3], (NUM_ENVS, length, OBS)),
    )


def nbytes(state) -> int:
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(state))


class Impl:
    """One buffer behind a common interface: add one step per env, sample, consume."""

    def __init__(self, name, buffer, capacity):
        self.name, self.buffer, self.capacity = name, buffer, capacity

    def init(self):
        return self.buffer.init(TRANSITION)

    def add(self, state, step: jaxbuf.Transition):
        return self.buffer.add_step(state, jax.tree.map(lambda x: x[:, 0], step))

    def sample(self, state, key):
        batch = self.buffer.sample(state, key).experience
        return batch.reward.sum() + batch.obs[:, 0].sum() + batch.next_obs[:, 0].sum()

    def full_state(self):
        state, add = self.init(), jax.jit(self.add_chunk, donate_argnums=0)
        return add(state, transitions(jax.random.key(0), self.capacity))

    def add_chunk(self, state, chunk):
        return self.buffer.add(state, chunk)


class FullTransitions(Impl):
    """A jaxbuf replay buffer of whole transitions: next_obs stored with every step."""

    def init(self):
        return self.buffer.init(TRANSITION)

    def add(self, state, step):
        return self.buffer.add(state, jax.tree.map(lambda x: x[:, 0], step))

    def add_chunk(self, state, chunk):
        return self.buffer.add(state, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), chunk))

    def sample(self, state, key):
        batch = self.buffer.sample(state, key).experience
        return batch.reward.sum() + batch.obs[:, 0].sum() + batch.next_obs[:, 0].sum()


class FlashbaxFlat(Impl):
    """Flashbax's flat buffer of steps, sampled as pairs of consecutive steps."""

    def init(self):
        return self.buffer.init(STEP)

    def add(self, state, step):
        return self.buffer.add(state, {k: getattr(step, k)[:, 0] for k in STEP})

    def add_chunk(self, state, chunk):
        add = jax.jit(self.add, donate_argnums=0)
        for t in range(self.capacity):
            state = add(state, jax.tree.map(lambda x, t=t: x[:, t : t + 1], chunk))
        return state

    def full_state(self):
        return self.add_chunk(self.init(), transitions(jax.random.key(0), self.capacity))

    def sample(self, state, key):
        pair = self.buffer.sample(state, key).experience
        return (
            pair.first["reward"].sum()
            + pair.first["obs"][:, 0].sum()
            + (pair.second["obs"][:, 0].sum())
        )


def implementations(capacity: int) -> list[Impl]:
    import flashbax as fbx

    def ours(n_step, min_episode_length=100):
        return jaxbuf.make_transition_buffer(
            NUM_ENVS, capacity, BATCH, n_step=n_step, min_episode_length=min_episode_length
        )

    flat = fbx.make_flat_buffer(
        max_length=capacity * NUM_ENVS, min_length=2, sample_batch_size=BATCH,
        add_sequences=False, add_batch_size=NUM_ENVS,
    )  # fmt: skip
    return [
        Impl("jaxbuf_n1", ours(1), capacity),
        Impl("jaxbuf_n3", ours(3), capacity),
        FullTransitions("full", jaxbuf.make_replay_buffer(capacity * NUM_ENVS, BATCH), capacity),
        FlashbaxFlat("flashbax_flat", flat, capacity),
    ]


def memory_row(capacity: int) -> dict:
    """Bytes per stored step of each layout (abstract states: nothing is allocated)."""
    import flashbax as fbx

    steps = NUM_ENVS * capacity

    def per_step(make_state):
        return nbytes(jax.eval_shape(make_state)) / steps

    once = jaxbuf.make_trajectory_buffer(NUM_ENVS, capacity, 1, 1)
    full = jaxbuf.make_replay_buffer(steps, 1)
    flat = fbx.make_flat_buffer(max_length=steps, min_length=2, sample_batch_size=1)
    row = {
        "once_bytes": per_step(lambda: once.init(STEP)),
        "full_bytes": per_step(lambda: full.init(TRANSITION)),
        "flashbax_flat_bytes": per_step(lambda: flat.init(STEP)),
    }
    for m in (100, 1):
        buffer = jaxbuf.make_transition_buffer(NUM_ENVS, capacity, 1, min_episode_length=m)
        row[f"jaxbuf_m{m}_bytes"] = per_step(lambda buffer=buffer: buffer.init(TRANSITION))
    return row


def cases_for(impl: Impl, calls: int, repeats: int) -> dict:
    key = jax.random.key(1)
    new = transitions(key, 1)
    sample = jax.jit(impl.sample)
    state = impl.full_state()
    keys = iter(list(jax.random.split(key, calls * (repeats + 1) + 1)))

    def body(carry, step_key):
        state, total = carry
        state = impl.add(state, new)
        return (state, total + impl.sample(state, step_key)), None

    scan = run_scan(body, (impl.full_state(), jnp.float32(0)), jax.random.split(key, SCAN_LENGTH))
    return {
        f"{impl.name}_sample": (lambda: sample(state, next(keys)), calls),
        f"{impl.name}_scan": (scan, 1),
    }


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (10, 3) if args.quick else (100, 11)
    rows = []
    for total in (10_000, 100_000, 1_000_000):
        capacity = total // NUM_ENVS
        cases = {}
        for impl in implementations(capacity):
            cases |= cases_for(impl, calls, repeats)
        times = interleaved_medians(cases, repeats)
        row = {"total_steps": total, **memory_row(capacity)}
        for name, seconds in times.items():
            row[f"{name}_us"] = seconds * 1e6 / (SCAN_LENGTH if name.endswith("scan") else 1)
        for layout in ("jaxbuf_m100", "jaxbuf_m1", "full", "flashbax_flat"):
            row[f"{layout}_over_once"] = row[f"{layout}_bytes"] / row["once_bytes"]
        for n in (1, 3):
            for other in ("full", "flashbax_flat"):
                for what in ("sample", "scan"):
                    mine, theirs = row[f"jaxbuf_n{n}_{what}_us"], row[f"{other}_{what}_us"]
                    row[f"n{n}_{what}_over_{other}"] = mine / theirs
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    columns = [
        ("total steps", "total_steps", "{:,}"),
        ("bytes/step: once", "once_bytes", "{:.1f}"),
        ("jaxbuf (m=100) / once", "jaxbuf_m100_over_once", "{:.3f}"),
        ("jaxbuf (m=1) / once", "jaxbuf_m1_over_once", "{:.3f}"),
        ("full transitions / once", "full_over_once", "{:.3f}"),
        ("Flashbax flat / once", "flashbax_flat_over_once", "{:.3f}"),
        ("sample n=1 (µs)", "jaxbuf_n1_sample_us", "{:.1f}"),
        ("sample n=3 (µs)", "jaxbuf_n3_sample_us", "{:.1f}"),
        ("sample full (µs)", "full_sample_us", "{:.1f}"),
        ("sample Flashbax flat (µs)", "flashbax_flat_sample_us", "{:.1f}"),
        ("n=1 / Flashbax flat", "n1_sample_over_flashbax_flat", "{:.2f}"),
        ("n=3 / Flashbax flat", "n3_sample_over_flashbax_flat", "{:.2f}"),
        ("n=1 / full", "n1_sample_over_full", "{:.2f}"),
        ("scan n=1 (µs/iter)", "jaxbuf_n1_scan_us", "{:.1f}"),
        ("scan n=3 (µs/iter)", "jaxbuf_n3_scan_us", "{:.1f}"),
        ("scan full (µs/iter)", "full_scan_us", "{:.1f}"),
        ("scan Flashbax flat (µs/iter)", "flashbax_flat_scan_us", "{:.1f}"),
        ("scan n=1 / Flashbax flat", "n1_scan_over_flashbax_flat", "{:.2f}"),
        ("scan n=3 / Flashbax flat", "n3_scan_over_flashbax_flat", "{:.2f}"),
        ("scan n=1 / full", "n1_scan_over_full", "{:.2f}"),
    ]
    write_results(args.out, "transition", rows, columns, __doc__)


if __name__ == "__main__":
    main()
