"""Checkpointing a large buffer: jaxbuf.save/restore (flax msgpack) versus Orbax.

A replay buffer of 2 GiB (2**21 items of 256 float32, filled with random data)
is saved and restored through both paths. Each operation runs in a fresh Python
process, which reports its wall time and its peak resident memory above what
it held just before the operation (the peak, VmHWM, is reset through
/proc/self/clear_refs first): the host memory the path needs beyond what the
process already held (the buffer itself, for a save). Restores use an abstract template
(`jax.eval_shape`), so they allocate only what they restore.

Run: `python benchmarks/bench_checkpoint.py [--gib 2] [--out benchmarks/results]`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

from common import write_results

WORKER = r"""
import json, sys, time
import jax, jax.numpy as jnp
import jaxbuf

mode, path, capacity = sys.argv[1], sys.argv[2], int(sys.argv[3])
buffer = jaxbuf.make_replay_buffer(capacity, 256)
example = {"obs": jnp.zeros(256, jnp.float32)}

def status_gib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError(field)

def reset_peak():
    # Writing 5 to clear_refs resets the peak resident size (VmHWM) to the current one.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_gib("VmRSS")

def peak_gib():
    return status_gib("VmHWM")

if mode.endswith("save"):
    items = {"obs": jax.random.normal(jax.random.key(0), (capacity, 256))}
    state = jax.block_until_ready(buffer.add(buffer.init(example), items))
    del items
    base = reset_peak()
    start = time.perf_counter()
    if mode == "msgpack_save":
        jaxbuf.save(path, state, buffer)
    else:
        import orbax.checkpoint as ocp
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path, state)
        checkpointer.wait_until_finished()
        checkpointer.close()
else:
    abstract = jax.eval_shape(lambda: buffer.init(example))
    base = reset_peak()
    start = time.perf_counter()
    if mode == "msgpack_restore":
        state = jaxbuf.restore(path, abstract)
    else:
        import orbax.checkpoint as ocp
        checkpointer = ocp.StandardCheckpointer()
        state = checkpointer.restore(path, abstract)
        checkpointer.close()
    jax.block_until_ready(state)
    assert int(state.size) == capacity
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "extra_peak_gib": peak_gib() - base}))
"""


def run(mode: str, path: pathlib.Path, capacity: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", WORKER, mode, str(path), str(capacity)],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode:
        raise RuntimeError(f"{mode} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def folder_gib(path: pathlib.Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="buffer size")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="a 0.1 GiB buffer (smoke run)")
    args = parser.parse_args()
    gib = 0.1 if args.quick else args.gib
    capacity = int(gib * 2**30 / (256 * 4))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("msgpack", "orbax"):
            path = pathlib.Path(scratch) / name
            save = run(f"{name}_save", path, capacity)
            restore = run(f"{name}_restore", path, capacity)
            row = {
                "path": "jaxbuf.save/restore (flax msgpack)"
                if name == "msgpack"
                else "Orbax StandardCheckpointer",
                "buffer_gib": capacity * 256 * 4 / 2**30,
                "on_disk_gib": folder_gib(path),
                "save_s": save["seconds"],
                "save_extra_peak_gib": save["extra_peak_gib"],
                "restore_s": restore["seconds"],
                "restore_extra_peak_gib": restore["extra_peak_gib"],
            }
            rows.append(row)
            print(row, flush=True)
    columns = [
        ("path", "path", "{}"),
        ("buffer (GiB)", "buffer_gib", "{:.2f}"),
        ("on disk (GiB)", "on_disk_gib", "{:.2f}"),
        ("save (s)", "save_s", "{:.1f}"),
        ("save: extra peak host memory (GiB)", "save_extra_peak_gib", "{:.2f}"),
        ("restore (s)", "restore_s", "{:.1f}"),
        ("restore: extra peak host memory (GiB)", "restore_extra_peak_gib", "{:.2f}"),
    ]
    write_results(args.out, "checkpoint", rows, columns, __doc__)


if __name__ == "__main__":
    main()
