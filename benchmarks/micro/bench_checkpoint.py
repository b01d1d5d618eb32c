"""Checkpointing a large buffer: jaxbuf.save/restore (streamed) versus Orbax.

Replay buffers of 2 and 6 GiB (items of 256 float32, filled with random data)
are saved and restored through both paths, the two paths taking turns, each
operation `--repeats` times (the fastest is reported, with its memory). Each
operation runs in a fresh Python process, which reports its wall time and its
peak resident memory above what it held just before the operation (the peak, VmHWM, is reset through
/proc/self/clear_refs first): the host memory the path needs beyond what the
process already held (the buffer itself, for a save). Restores use an abstract template
(`jax.eval_shape`), so they allocate only what they restore; "beyond the state" subtracts
the restored state's own size. Ratios are jaxbuf over Orbax (time) or over the buffer's size
(memory).

Run: `python -m benchmarks.micro.bench_checkpoint [--gib 2 6] [--repeats 2]
[--out benchmarks/results]`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

from benchmarks.common import write_results

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
    # Filled 2**16 items at a time with a donated add: the peak stays near the buffer.
    fill = jax.jit(lambda s, k: buffer.add(s, {"obs": jax.random.normal(k, (2**16, 256))}),
                   donate_argnums=0)
    state = buffer.init(example)
    for i in range(capacity // 2**16):
        state = fill(state, jax.random.key(i))
    state = jax.block_until_ready(state)
    base = reset_peak()
    start = time.perf_counter()
    if mode == "jaxbuf_save":
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
    if mode == "jaxbuf_restore":
        state = jaxbuf.restore(path, abstract, buffer)
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


def measure(name: str, path: pathlib.Path, capacity: int) -> dict:
    shutil.rmtree(path, ignore_errors=True)
    save = run(f"{name}_save", path, capacity)
    restore = run(f"{name}_restore", path, capacity)
    return {"save": save, "restore": restore, "on_disk_gib": folder_gib(path)}


def row_for(name: str, gib: float, runs: list[dict]) -> dict:
    save = min((r["save"] for r in runs), key=lambda r: r["seconds"])
    restore = min((r["restore"] for r in runs), key=lambda r: r["seconds"])
    return {
        "path": "jaxbuf.save/restore (streamed)"
        if name == "jaxbuf"
        else "Orbax StandardCheckpointer",
        "buffer_gib": gib,
        "on_disk_gib": runs[0]["on_disk_gib"],
        "save_s": save["seconds"],
        "save_extra_peak_gib": save["extra_peak_gib"],
        "save_extra_over_buffer": save["extra_peak_gib"] / gib,
        "restore_s": restore["seconds"],
        "restore_beyond_state_gib": restore["extra_peak_gib"] - gib,
        "restore_beyond_over_buffer": (restore["extra_peak_gib"] - gib) / gib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="+", default=[2.0, 6.0], help="buffer sizes")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="a 0.1 GiB buffer (smoke run)")
    args = parser.parse_args()
    sizes, repeats = ([0.1], 1) if args.quick else (args.gib, args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for gib in sizes:
            capacity = max(1, round(gib * 2**30 / (256 * 4) / 2**16)) * 2**16  # whole fills
            runs: dict[str, list] = {"jaxbuf": [], "orbax": []}
            for _ in range(repeats):
                for name in runs:  # the paths take turns
                    runs[name].append(measure(name, pathlib.Path(scratch) / name, capacity))
                    print(name, gib, runs[name][-1], flush=True)
            pair = [row_for(name, capacity * 256 * 4 / 2**30, r) for name, r in runs.items()]
            for row in pair:
                row["save_over_orbax"] = row["save_s"] / pair[1]["save_s"]
                row["restore_over_orbax"] = row["restore_s"] / pair[1]["restore_s"]
            rows += pair
    columns = [
        ("path", "path", "{}"),
        ("buffer (GiB)", "buffer_gib", "{:.2f}"),
        ("on disk (GiB)", "on_disk_gib", "{:.2f}"),
        ("save (s)", "save_s", "{:.1f}"),
        ("save / Orbax", "save_over_orbax", "{:.2f}"),
        ("save: extra peak host memory (GiB)", "save_extra_peak_gib", "{:.2f}"),
        ("save: extra / buffer", "save_extra_over_buffer", "{:.2f}"),
        ("restore (s)", "restore_s", "{:.1f}"),
        ("restore / Orbax", "restore_over_orbax", "{:.2f}"),
        ("restore: peak beyond the state (GiB)", "restore_beyond_state_gib", "{:.2f}"),
        ("restore: beyond / buffer", "restore_beyond_over_buffer", "{:.2f}"),
    ]
    write_results(args.out, "checkpoint", rows, columns, __doc__)


if __name__ == "__main__":
    main()
