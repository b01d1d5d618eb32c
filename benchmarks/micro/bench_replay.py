"""Uniform replay: jaxbuf versus Flashbax's item buffer and a bare-gather floor.

Item = {obs: float32[64], action: int32, reward: float32, done: bool}; add batch 8,
sample batch 256; capacities 1e4, 1e5, 1e6. Two settings:

(a) each call jitted on its own (donated `add`, `sample`), timed per call;
(b) one jitted `lax.scan` of 2000 iterations of add 8 + sample 256 (a
    PureJaxRL-style training step), timed per iteration.

The floor is the same data movement with nothing else: a gather of 256 rows at
precomputed indices ((a) and (b)), plus a dynamic_update_slice write of 8 rows in (b).
All implementations are measured in the same run, interleaved, and reported as
medians over repeats; compare the ratios, not the absolute times.

Run: `python -m benchmarks.micro.bench_replay [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, interleaved_medians, run_scan, write_results

ADD_BATCH, SAMPLE_BATCH, SCAN_LENGTH = 8, 256, 2000
EXAMPLE = {
    "obs": jnp.zeros(64, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "done": jnp.bool_(False),
}


def make_items(key: jax.Array, batch: int) -> dict:
    return {
        "obs": jax.random.normal(key, (batch, 64)),
        "action": jnp.zeros(batch, jnp.int32),
        "reward": jnp.ones(batch, jnp.float32),
        "done": jnp.zeros(batch, bool),
    }


class Adapter:
    """The calls the benchmark makes, for any buffer with init/add/sample."""

    def __init__(self, name: str, buffer, capacity: int):
        self.name, self.buffer, self.capacity = name, buffer, capacity

    def fill(self, items_fn) -> object:
        state = self.buffer.init(EXAMPLE)
        return jax.jit(self.buffer.add, donate_argnums=0)(state, items_fn(self.capacity))

    def add(self, state, items):
        return self.buffer.add(state, items)

    def sample(self, state, key):
        return self.buffer.sample(state, key).experience


def jaxbuf_adapter(capacity: int) -> Adapter:
    return Adapter("jaxbuf", jaxbuf.make_replay_buffer(capacity, SAMPLE_BATCH), capacity)


def flashbax_adapter(capacity: int) -> Adapter:
    import flashbax as fbx

    buffer = fbx.make_item_buffer(
        max_length=capacity, min_length=1, sample_batch_size=SAMPLE_BATCH, add_batches=True
    )
    return Adapter("flashbax", buffer, capacity)


def floor_gather(storage, rows):
    return jax.tree.map(lambda x: x[rows], storage)


def standalone_cases(impl, calls: int, repeats: int) -> dict:
    """A donated jitted add of 8 and a jitted sample of 256, on a full buffer."""
    key = jax.random.key(0)
    add = jax.jit(impl.add, donate_argnums=0)
    sample = jax.jit(impl.sample)
    items = make_items(key, ADD_BATCH)
    holder = [impl.fill(lambda n: make_items(key, n))]

    def one_add():
        holder[0] = add(holder[0], items)
        return holder[0]

    # Split outside the timed loop: iterating a key array dispatches one op per key.
    keys = iter(list(jax.random.split(key, calls * (repeats + 1) + 1)))
    return {
        f"{impl.name}_add": (one_add, calls),
        f"{impl.name}_sample": (lambda: sample(holder[0], next(keys)), calls),
    }


def scan_case(impl) -> dict:
    """A jitted scan of SCAN_LENGTH iterations of add 8 + sample 256."""
    key = jax.random.key(1)
    items = make_items(key, ADD_BATCH)

    def body(carry, step_key):
        state, total = carry
        state = impl.add(state, items)
        batch = impl.sample(state, step_key)
        return (state, total + batch["reward"].sum() + batch["obs"][:, 0].sum()), None

    carry = (impl.fill(lambda n: make_items(key, n)), jnp.float32(0))
    keys = jax.random.split(key, SCAN_LENGTH)  # outside the timed loop, as for the floor
    return {f"{impl.name}_scan": (run_scan(body, carry, keys), 1)}


def floor_cases(capacity: int, calls: int) -> dict:
    """The same data movement alone: gathers at precomputed rows, DUS writes."""
    storage = jaxbuf.make_replay_buffer(capacity, 1).init(EXAMPLE).experience
    rows = jax.random.randint(jax.random.key(2), (SAMPLE_BATCH,), 0, capacity)
    gather = jax.jit(floor_gather)
    scan_rows = jax.random.randint(jax.random.key(3), (SCAN_LENGTH, SAMPLE_BATCH), 0, capacity)
    starts = jnp.arange(SCAN_LENGTH, dtype=jnp.int32) * ADD_BATCH % (capacity - ADD_BATCH)
    items = make_items(jax.random.key(4), ADD_BATCH)

    def body(carry, xs):
        storage, total = carry
        start, row = xs
        storage = jax.tree.map(
            lambda s, x: jax.lax.dynamic_update_slice_in_dim(s, x, start, 0), storage, items
        )
        batch = floor_gather(storage, row)
        return (storage, total + batch["reward"].sum() + batch["obs"][:, 0].sum()), None

    scan_storage = jax.tree.map(jnp.copy, storage)
    return {
        "floor_gather": (lambda: gather(storage, rows), calls),
        "floor_scan": (run_scan(body, (scan_storage, jnp.float32(0)), (starts, scan_rows)), 1),
    }


def measure(capacity: int, calls: int, repeats: int) -> dict:
    cases: dict = {}
    for make_adapter in (jaxbuf_adapter, flashbax_adapter):
        impl = make_adapter(capacity)
        cases |= standalone_cases(impl, calls, repeats) | scan_case(impl)
    cases |= floor_cases(capacity, calls)
    times = interleaved_medians(cases, repeats)
    row: dict = {"capacity": capacity}
    for name, seconds in times.items():
        per_iteration = name.endswith("scan")
        row[f"{name}_us{'_per_iter' if per_iteration else ''}"] = (
            seconds * 1e6 / (SCAN_LENGTH if per_iteration else 1)
        )
    return row


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (20, 3) if args.quick else (200, 15)
    rows = []
    for capacity in (10_000, 100_000, 1_000_000):
        row = measure(capacity, calls, repeats)
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    for row in rows:
        row["jaxbuf_add_vs_capacity_1e4"] = row["jaxbuf_add_us"] / rows[0]["jaxbuf_add_us"]
        row["flashbax_add_vs_capacity_1e4"] = row["flashbax_add_us"] / rows[0]["flashbax_add_us"]
        row["sample_jaxbuf_over_flashbax"] = row["jaxbuf_sample_us"] / row["flashbax_sample_us"]
        row["sample_jaxbuf_over_floor"] = row["jaxbuf_sample_us"] / row["floor_gather_us"]
        row["scan_jaxbuf_over_flashbax"] = (
            row["jaxbuf_scan_us_per_iter"] / row["flashbax_scan_us_per_iter"]
        )
        row["scan_jaxbuf_over_floor"] = (
            row["jaxbuf_scan_us_per_iter"] / row["floor_scan_us_per_iter"]
        )
    columns = [
        ("capacity", "capacity", "{:,}"),
        ("add jaxbuf (µs)", "jaxbuf_add_us", "{:.1f}"),
        ("add Flashbax (µs)", "flashbax_add_us", "{:.1f}"),
        ("jaxbuf add / add at 1e4", "jaxbuf_add_vs_capacity_1e4", "{:.2f}"),
        ("Flashbax add / add at 1e4", "flashbax_add_vs_capacity_1e4", "{:.2f}"),
        ("sample jaxbuf (µs)", "jaxbuf_sample_us", "{:.1f}"),
        ("sample Flashbax (µs)", "flashbax_sample_us", "{:.1f}"),
        ("gather floor (µs)", "floor_gather_us", "{:.1f}"),
        ("sample jaxbuf / Flashbax", "sample_jaxbuf_over_flashbax", "{:.2f}"),
        ("sample jaxbuf / floor", "sample_jaxbuf_over_floor", "{:.2f}"),
        ("scan jaxbuf (µs/iter)", "jaxbuf_scan_us_per_iter", "{:.1f}"),
        ("scan Flashbax (µs/iter)", "flashbax_scan_us_per_iter", "{:.1f}"),
        ("scan floor (µs/iter)", "floor_scan_us_per_iter", "{:.1f}"),
        ("scan jaxbuf / Flashbax", "scan_jaxbuf_over_flashbax", "{:.2f}"),
        ("scan jaxbuf / floor", "scan_jaxbuf_over_floor", "{:.2f}"),
    ]
    write_results(args.out, "replay", rows, columns, __doc__)


if __name__ == "__main__":
    main()
