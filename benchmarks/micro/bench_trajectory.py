"""Trajectory buffers: jaxbuf versus Flashbax's trajectory and flat buffers and a bare-gather floor.

16 environments add one step each per call ({obs: float32[64], action: int32,
reward: float32, done: bool}); `sample` draws 256 sequences of 2 or 32 steps.
Total steps stored 1e4, 1e5, 1e6 (capacity per environment = total / 16).
Standalone jitted calls (a donated `add`, a `sample` on a full buffer) and a
jitted `lax.scan` of 1000 iterations of add + sample. Flashbax's flat buffer
(which samples pairs of consecutive steps) runs at L=2 only. The floor gathers
the same number of windows at (environment, start) positions drawn in advance,
fresh ones every call as a real sample has (the same positions every call
would stay in the CPU cache and understate the cost at 1e6), and, in the scan,
writes one step per environment with `dynamic_update_slice`. jaxbuf's
`sample` includes its write-head safety and a `done_fn` mask. All cases take
turns in every timed round.

Run: `python -m benchmarks.micro.bench_trajectory [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, interleaved_medians, run_scan, write_results

NUM_ENVS, BATCH, SCAN_LENGTH = 16, 256, 1000
EXAMPLE = {
    "obs": jnp.zeros(64, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "done": jnp.bool_(False),
}


def steps(key: jax.Array, length: int) -> dict:
    return {
        "obs": jax.random.normal(key, (NUM_ENVS, length, 64)),
        "action": jnp.zeros((NUM_ENVS, length), jnp.int32),
        "reward": jnp.ones((NUM_ENVS, length), jnp.float32),
        "done": jax.random.uniform(key, (NUM_ENVS, length)) < 0.01,
    }


class Adapter:
    def __init__(self, name: str, buffer, capacity: int, length: int):
        self.name, self.buffer, self.capacity, self.length = name, buffer, capacity, length

    def full_state(self):
        state = self.buffer.init(EXAMPLE)
        return jax.jit(self.buffer.add, donate_argnums=0)(
            state, steps(jax.random.key(0), self.capacity)
        )

    def add(self, state, new):
        return self.buffer.add(state, new)

    def sample(self, state, key):
        return self.buffer.sample(state, key).experience

    @staticmethod
    def consume(batch) -> jax.Array:
        """What a learner reads of a batch (so that the gathers are not optimized away)."""
        return batch["reward"].sum() + batch["obs"][..., 0].sum()


class FlatAdapter(Adapter):
    """Flashbax's flat buffer: one step per environment in, pairs of steps out."""

    def add(self, state, new):
        return self.buffer.add(state, jax.tree.map(lambda x: x[:, 0], new))

    def full_state(self):
        state = self.buffer.init(EXAMPLE)
        add = jax.jit(self.add, donate_argnums=0)
        chunk = steps(jax.random.key(0), 1)
        for _ in range(self.capacity):
            state = add(state, chunk)
        return state

    @staticmethod
    def consume(batch) -> jax.Array:
        pair = (batch.first, batch.second)
        return sum(p["reward"].sum() + p["obs"][..., 0].sum() for p in pair)


def adapters(capacity: int, length: int) -> list[Adapter]:
    import flashbax as fbx

    ours = jaxbuf.make_trajectory_buffer(
        NUM_ENVS, capacity, BATCH, length, done_fn=lambda step: step["done"]
    )
    theirs = fbx.make_trajectory_buffer(
        max_length_time_axis=capacity, min_length_time_axis=length, sample_batch_size=BATCH,
        add_batch_size=NUM_ENVS, sample_sequence_length=length, period=1,
    )  # fmt: skip
    found = [
        Adapter("jaxbuf", ours, capacity, length),
        Adapter("flashbax", theirs, capacity, length),
    ]
    if length == 2:
        flat = fbx.make_flat_buffer(
            max_length=capacity * NUM_ENVS, min_length=2, sample_batch_size=BATCH,
            add_sequences=False, add_batch_size=NUM_ENVS,
        )  # fmt: skip
        found.append(FlatAdapter("flashbax_flat", flat, capacity, length))
    return found


def cases_for(impl: Adapter, calls: int, repeats: int) -> dict:
    key = jax.random.key(1)
    new = steps(key, 1)
    add, sample = jax.jit(impl.add, donate_argnums=0), jax.jit(impl.sample)
    holder = [impl.full_state()]

    def one_add():
        holder[0] = add(holder[0], new)
        return holder[0]

    keys = iter(list(jax.random.split(key, calls * (repeats + 1) + 1)))

    def body(carry, step_key):
        state, total = carry
        state = impl.add(state, new)
        batch = impl.sample(state, step_key)
        return (state, total + impl.consume(batch)), None

    scan = run_scan(body, (impl.full_state(), jnp.float32(0)), jax.random.split(key, SCAN_LENGTH))
    return {
        f"{impl.name}_add": (one_add, calls),
        f"{impl.name}_sample": (lambda: sample(holder[0], next(keys)), calls),
        f"{impl.name}_scan": (scan, 1),
    }


def floor_cases(capacity: int, length: int, calls: int) -> dict:
    storage = jax.tree.map(lambda x: jnp.zeros((NUM_ENVS, capacity, *x.shape), x.dtype), EXAMPLE)
    storage = jax.jit(lambda s, new: jax.tree.map(lambda x, n: x.at[:, :].set(n), s, new))(
        storage, steps(jax.random.key(0), capacity)
    )  # filled with data, as the buffers are
    key = jax.random.key(2)

    def windows(count):
        envs = jax.random.randint(key, (count, BATCH), 0, NUM_ENVS)
        starts = jax.random.randint(key, (count, BATCH), 0, capacity - length + 1)
        return envs[..., None], starts[..., None] + jnp.arange(length)[None, None, :]

    def gather(storage, env, time):
        return jax.tree.map(lambda x: x[env, time], storage)

    jitted = jax.jit(gather)
    envs, times = windows(SCAN_LENGTH)
    batches = list(zip(list(envs), list(times), strict=True))  # sliced once, not per call
    fresh = iter(range(10**9))

    def one_gather():
        env, time = batches[next(fresh) % SCAN_LENGTH]
        return jitted(storage, env, time)

    new = jax.tree.map(lambda x: x[:, 0], steps(key, 1))
    positions = jnp.arange(SCAN_LENGTH, dtype=jnp.int32) % capacity

    def body(carry, xs):
        storage, total = carry
        position, env, time = xs
        storage = jax.tree.map(
            lambda s, x: jax.lax.dynamic_update_index_in_dim(s, x, position, 1), storage, new
        )
        batch = gather(storage, env, time)
        return (storage, total + Adapter.consume(batch)), None

    scan_storage = jax.tree.map(jnp.copy, storage)
    return {
        "floor_gather": (one_gather, calls),
        "floor_scan": (run_scan(body, (scan_storage, jnp.float32(0)), (positions, envs, times)), 1),
    }


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (10, 3) if args.quick else (100, 11)
    rows = []
    for length in (2, 32):
        for total in (10_000, 100_000, 1_000_000):
            capacity = total // NUM_ENVS
            cases = floor_cases(capacity, length, calls)
            for impl in adapters(capacity, length):
                cases |= cases_for(impl, calls, repeats)
            times = interleaved_medians(cases, repeats)
            row = {"sequence_length": length, "total_steps": total}
            for name, seconds in times.items():
                scale = SCAN_LENGTH if name.endswith("scan") else 1
                row[f"{name}_us"] = seconds * 1e6 / scale
            rows.append(row)
            print(
                {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True
            )
    for row in rows:
        base = next(r for r in rows if r["sequence_length"] == row["sequence_length"])
        row["add_vs_1e4"] = row["jaxbuf_add_us"] / base["jaxbuf_add_us"]
        row["sample_over_flashbax"] = row["jaxbuf_sample_us"] / row["flashbax_sample_us"]
        row["sample_over_floor"] = row["jaxbuf_sample_us"] / row["floor_gather_us"]
        row["scan_over_flashbax"] = row["jaxbuf_scan_us"] / row["flashbax_scan_us"]
        row["scan_over_floor"] = row["jaxbuf_scan_us"] / row["floor_scan_us"]
        if "flashbax_flat_sample_us" in row:
            row["sample_over_flat"] = row["jaxbuf_sample_us"] / row["flashbax_flat_sample_us"]
            row["scan_over_flat"] = row["jaxbuf_scan_us"] / row["flashbax_flat_scan_us"]
    columns = [
        ("L", "sequence_length", "{}"),
        ("total steps", "total_steps", "{:,}"),
        ("add jaxbuf (µs)", "jaxbuf_add_us", "{:.1f}"),
        ("add Flashbax (µs)", "flashbax_add_us", "{:.1f}"),
        ("jaxbuf add / at 1e4", "add_vs_1e4", "{:.2f}"),
        ("sample jaxbuf (µs)", "jaxbuf_sample_us", "{:.1f}"),
        ("sample Flashbax (µs)", "flashbax_sample_us", "{:.1f}"),
        ("gather floor (µs)", "floor_gather_us", "{:.1f}"),
        ("sample / Flashbax", "sample_over_flashbax", "{:.2f}"),
        ("sample / floor", "sample_over_floor", "{:.2f}"),
        ("scan jaxbuf (µs/iter)", "jaxbuf_scan_us", "{:.1f}"),
        ("scan Flashbax (µs/iter)", "flashbax_scan_us", "{:.1f}"),
        ("scan floor (µs/iter)", "floor_scan_us", "{:.1f}"),
        ("scan / Flashbax", "scan_over_flashbax", "{:.2f}"),
        ("scan / floor", "scan_over_floor", "{:.2f}"),
        ("sample / Flashbax flat", "sample_over_flat", "{:.2f}"),
        ("scan / Flashbax flat", "scan_over_flat", "{:.2f}"),
    ]
    write_results(args.out, "trajectory", rows, columns, __doc__)


if __name__ == "__main__":
    main()
