"""Where the time of an add and a sample goes, kernel by kernel, against Flashbax's flat buffer.

For the rows of the GPU table of issue 66, at the shapes users run (E environments x 256
steps, observations float32[D], actions float32[8], batch B; `--shapes E,D,B ...`), each
operation runs `STEPS` times in a jitted, donated `lax.scan` on a full buffer, once under
JAX's profiler (`jax.profiler.trace`, its Perfetto trace): every kernel the compiled program
launched (on a GPU the device's kernels; on a CPU the compiled program's fused operations
as the host ran them), matched to the program's optimized HLO by name. The variants are
`bench_scale`'s, whose tables the GPU rows came from: Flashbax's flat buffer (pairs of
consecutive steps), the transition kind (n=1, `min_episode_length=100`), the replay kind of
full transitions, the prioritized transition kind; each adds one step of every environment
(`add`) and samples a batch (`sample`); the prioritized kind also sets the priorities of a
batch of random slots (`set_priorities`).

Two tables: `kernels` (per operation and shape: kernels launched per call, device
microseconds per call (the kernels' summed durations, so a kernel-count-bound program shows
up as many short kernels), the wall microseconds per call of the scan, and the ratio of each
to Flashbax's same operation), and `kernel_list` (the kernels of each call, the costliest
first: calls per operation, microseconds per operation, the HLO they run). The figures hold
for the platform named in the file's name only; on a CPU the "kernels" are the CPU's fused
loops, which says nothing of a GPU's.

Run: `python -m benchmarks.micro.bench_kernels [--quick] [--shapes 4096,64,8192 ...]`.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import write_results
from benchmarks.micro import bench_scale

STEPS = 16  # operations per timed scan
USERS = ((4096, 64, 8192), (4096, 512, 8192), (4096, 64, 32768), (4096, 512, 32768),
         (512, 128, 8192))  # fmt: skip
QUICK = ((64, 16, 256),)


# bench_scale's variants (the GPU table's rows came from it and from its probe): the
# transition kinds with `min_episode_length=100`, adds of one step of every environment
KINDS = {
    "flashbax flat": "flashbax flat",
    "transition n=1": "jaxbuf transition n=1",
    "replay": "jaxbuf replay",
    "prioritized transition": "jaxbuf prioritized transition",
}


def variants(envs: int, obs: int, batch: int) -> Iterator[tuple[str, Any, dict[str, Callable]]]:
    """`(variant, full state, {operation: scan body})`, one variant at a time (a state of
    4,096 x 256 x 512 floats is 2 GiB), each body `(carry, t) -> (carry, None)`."""
    base = jax.random.normal(jax.random.key(0), (envs, obs))
    for name, scale_name in KINDS.items():
        state, add, sample = bench_scale.VARIANTS[scale_name](envs, batch, obs)
        bodies = bench_scale.scan_bodies(add, sample, base)
        operations = {"add": bodies["add"], "sample": bodies["sample"]}
        if name.startswith("prioritized"):
            operations["set_priorities"] = _set_priorities(envs, batch)
        yield name, bench_scale.filled(state, add, base), operations


def _set_priorities(envs: int, batch: int) -> Callable:
    """A scan body setting the priorities of `batch` random slots."""
    buffer = jaxbuf.make_transition_buffer(envs, bench_scale.STEPS_PER_ENV, batch,
                                           min_episode_length=100,
                                           sampler=jaxbuf.prioritized())  # fmt: skip

    def body(carry, t):
        state, total = carry
        key = jax.random.fold_in(jax.random.key(3), t)
        indices = jax.random.randint(key, (batch,), 0, envs * bench_scale.STEPS_PER_ENV)
        return (buffer.set_priorities(state, indices, jax.random.uniform(key, (batch,))),
                total), None  # fmt: skip

    return body


def scanned(body: Callable) -> Callable:
    """`STEPS` calls of a scan body in one jitted, donated `lax.scan`."""

    def run(state):
        return jax.lax.scan(body, (state, jnp.float32(0)), jnp.arange(STEPS))[0]

    return jax.jit(run, donate_argnums=0)


def hlo_names(compiled: Any) -> dict[str, str]:
    """{instruction name: its HLO line's opcode} of the optimized program: what a trace's
    kernel events are named after (or name in their `hlo_op`)."""
    names = {}
    for line in compiled.as_text().splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = \S+ ([\w-]+)\(", line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def kernels(trace_dir: str, names: dict[str, str]) -> list[tuple[str, float]]:
    """`(kernel, microseconds)` of every complete event of the trace that ran a part of
    the program (named after an instruction, or naming one in its `hlo_op` argument): on
    a GPU or TPU every event of the device's, on a CPU the host's that name the program's
    instructions."""
    path = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)[0]
    with gzip.open(path) as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}  # fmt: skip
    # on an accelerator its kernels only (the host's launches of them carry the same names)
    devices = {pid for pid, name in processes.items() if re.search(r"/device:(GPU|TPU)", name)}
    found = []
    for event in events:
        if event.get("ph") != "X" or (devices and event.get("pid") not in devices):
            continue
        hlo = (event.get("args") or {}).get("hlo_op", event["name"])
        # a device runs only this program while traced: every kernel counts, named by its
        # HLO where the trace says it (kernels inside XLA's command buffers may not)
        if devices or hlo in names or event["name"] in names:
            found.append((hlo if hlo in names else event["name"], event.get("dur", 0.0)))
    return found


def profile(fn: Callable, state: Any, repeats: int) -> dict[str, Any]:
    """Wall time per call (median and fastest of `repeats` scans) and the kernels of one
    scan under the profiler."""
    compiled = fn.lower(state).compile()
    state = fn(state)[0]  # warm
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, total = fn(state)
        jax.block_until_ready((state, total))
        walls.append((time.perf_counter() - start) / STEPS * 1e6)
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        state, total = fn(state)
        jax.block_until_ready((state, total))
    names = hlo_names(compiled)
    return {"wall_us": statistics.median(walls), "wall_us_min": min(walls),
            "kernels": kernels(folder, names), "names": names}  # fmt: skip


def measure(shape: tuple[int, int, int], repeats: int) -> tuple[list[dict], list[dict]]:
    envs, obs, batch = shape
    rows, listed = [], []
    for name, full, operations in variants(envs, obs, batch):
        for operation, body in operations.items():
            state = jax.tree.map(jnp.copy, full)  # each operation its own: the scans donate it
            found = profile(scanned(body), state, repeats)
            per_kernel = collections.defaultdict(lambda: [0, 0.0])
            for kernel, micros in found["kernels"]:
                per_kernel[kernel][0] += 1
                per_kernel[kernel][1] += micros
            rows.append({"variant": name, "operation": operation, "envs": envs, "obs": obs,
                         "batch": batch, "kernels": len(found["kernels"]) / STEPS,
                         "device_us": sum(m for _, m in found["kernels"]) / STEPS,
                         "wall_us": found["wall_us"],
                         "wall_us_min": found["wall_us_min"]})  # fmt: skip
            for kernel, (calls, micros) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
                listed.append({"variant": name, "operation": operation,
                               "shape": f"{envs} x {obs}, B {batch}", "kernel": kernel,
                               "hlo": found["names"].get(kernel, "?"), "calls": calls / STEPS,
                               "us": micros / STEPS})  # fmt: skip
    for row in rows:  # ratios to Flashbax's same operation at the same shape
        peer = next((r for r in rows if r["variant"] == "flashbax flat"
                     and r["operation"] == row["operation"]), None)  # fmt: skip
        for key in ("kernels", "device_us", "wall_us"):
            row[f"{key}_ratio"] = row[key] / peer[key] if peer and peer[key] else None
    return rows, listed


COLUMNS = {
    "kernels": [("variant", "variant", "{}"), ("operation", "operation", "{}"),
                ("environments", "envs", "{:,}"), ("obs floats", "obs", "{}"),
                ("batch", "batch", "{:,}"), ("kernels per call", "kernels", "{:.1f}"),
                ("/ Flashbax's", "kernels_ratio", "{:.2f}"),
                ("device µs per call", "device_us", "{:.1f}"),
                ("/ Flashbax's", "device_us_ratio", "{:.2f}"),
                ("wall µs per call (median)", "wall_us", "{:.1f}"),
                ("wall µs per call (fastest)", "wall_us_min", "{:.1f}"),
                ("/ Flashbax's (median)", "wall_us_ratio", "{:.2f}")],
    "kernel_list": [("variant", "variant", "{}"), ("operation", "operation", "{}"),
                    ("shape", "shape", "{}"), ("kernel", "kernel", "`{}`"), ("HLO", "hlo", "{}"),
                    ("calls per operation", "calls", "{:.1f}"),
                    ("µs per operation", "us", "{:.2f}")],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", nargs="*", help="E,D,B ...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else None
    rows, listed = [], []
    for shape in shapes or (QUICK if args.quick else USERS):
        found, kernels_found = measure(shape, args.repeats)
        rows += found
        listed += kernels_found
        for row in found:
            print(row, flush=True)
    write_results(args.out, "kernels", rows, COLUMNS["kernels"], __doc__)
    write_results(args.out, "kernel_list", listed, COLUMNS["kernel_list"], __doc__)


if __name__ == "__main__":
    main()
