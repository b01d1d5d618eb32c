"""On-disk dataset: how long DatasetWriter.append blocks, against a device-to-host copy.

A full replay buffer of 1e6 items ({obs: float32[64], action: int32, reward:
float32, done: bool}) receives 1000 new items per training step. After each
add, `append` copies the new rows to the host and queues their disk writes;
the floor is the device-to-host copy of the same rows (`jax.device_get` of the
gathered rows), measured right after it, alternately. `flush` (waiting for the
disk) is timed separately, per step's worth of data.

Run: `python -m benchmarks.micro.bench_dataset [--out benchmarks/results]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks.common import write_results

CAPACITY, NEW, STEPS = 1_000_000, 1_000, 60
EXAMPLE = {
    "obs": jnp.zeros(64, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "done": jnp.bool_(False),
}


def items(key, count):
    return {
        "obs": jax.random.normal(key, (count, 64)),
        "action": jnp.zeros(count, jnp.int32),
        "reward": jnp.ones(count, jnp.float32),
        "done": jnp.zeros(count, bool),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="the same run (it is short)")
    args = parser.parse_args()
    buffer = jaxbuf.make_replay_buffer(CAPACITY, 256)
    add = jax.jit(buffer.add, donate_argnums=0)
    gather = jax.jit(lambda experience, rows: jax.tree.map(lambda x: x[rows], experience))
    state = add(buffer.init(EXAMPLE), items(jax.random.key(0), CAPACITY))
    new = items(jax.random.key(1), NEW)
    appends, copies, flushes = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        writer = jaxbuf.io.DatasetWriter(f"{folder}/data", state)
        for step in range(STEPS + 2):
            state = jax.block_until_ready(add(state, new))
            start = time.perf_counter()
            writer.append(state)
            appended = time.perf_counter() - start
            rows = (int(state.position) - NEW + np.arange(NEW)) % CAPACITY
            start = time.perf_counter()
            jax.device_get(gather(state.experience, jnp.asarray(rows)))
            copied = time.perf_counter() - start
            start = time.perf_counter()
            writer.flush()
            flushed = time.perf_counter() - start
            if step >= 2:  # after compilation and the first growth of the arrays
                appends.append(appended)
                copies.append(copied)
                flushes.append(flushed)
    step_mib = NEW * (64 * 4 + 4 + 4 + 1) / 2**20
    row = {
        "new_items_per_step": NEW,
        "step_mib": step_mib,
        "append_ms": float(np.median(appends)) * 1e3,
        "device_to_host_copy_ms": float(np.median(copies)) * 1e3,
        "append_over_copy": float(np.median(appends) / np.median(copies)),
        "flush_ms": float(np.median(flushes)) * 1e3,
        "flush_mib_per_s": step_mib / float(np.median(flushes)),
    }
    print(row)
    columns = [
        ("new items per step", "new_items_per_step", "{:,}"),
        ("MiB per step", "step_mib", "{:.2f}"),
        ("append blocks (ms)", "append_ms", "{:.2f}"),
        ("D2H copy of the rows (ms)", "device_to_host_copy_ms", "{:.2f}"),
        ("append / copy", "append_over_copy", "{:.2f}"),
        ("flush, in the background (ms)", "flush_ms", "{:.2f}"),
        ("flush throughput (MiB/s)", "flush_mib_per_s", "{:.0f}"),
    ]
    write_results(args.out, "dataset", [row], columns, __doc__)


if __name__ == "__main__":
    main()
