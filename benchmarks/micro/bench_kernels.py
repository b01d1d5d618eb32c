"""Where the time of an add and a sample goes, kernel by kernel, against Flashbax's flat buffer.

For the rows of the GPU table of issue 66, at the shapes users run (E environments x 256
steps, observations float32[D], actions float32[8], batch B; `--shapes E,D,B ...`), each
operation runs `STEPS` times in a jitted, donated `lax.scan` on a full buffer, once under
JAX's profiler (`jax.profiler.trace`, its Perfetto trace): every kernel the compiled program
launched (on a GPU the device's kernels; on a CPU the compiled program's fused operations
as the host ran them), matched to the program's optimized HLO by name. Variants:

- `flashbax flat`: `make_flat_buffer` (pairs of consecutive steps), `add` of one step per
  environment, `sample`;
- `transition n=1`: `make_transition_buffer` with its defaults, `add_step`, `sample`;
- `replay`: `make_replay_buffer` of full transitions (obs and next_obs), `add` of `E`, `sample`;
- `prioritized transition`: the transition kind with `jaxbuf.prioritized()`: `add_step`,
  `sample`, and `set_priorities` of a batch.

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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import write_results

STEPS_PER_ENV = 256
STEPS = 16  # operations per timed scan
USERS = ((4096, 64, 8192), (4096, 512, 8192), (4096, 64, 32768), (4096, 512, 32768),
         (512, 128, 8192))  # fmt: skip
QUICK = ((64, 16, 256),)


def _step(obs: int) -> dict[str, jax.Array]:
    return {"obs": jnp.zeros(obs), "action": jnp.zeros(8), "reward": jnp.float32(0),
            "done": jnp.bool_(False)}  # fmt: skip


def _steps(envs: int, obs: int, t: jax.Array) -> dict[str, jax.Array]:
    """One step of every environment at time `t` (an episode ends every 100 steps)."""
    step = jax.tree.map(lambda x: jnp.broadcast_to(x, (envs, *x.shape)), _step(obs))
    done = (jnp.arange(envs) + t) % 100 == 99
    return {**step, "obs": step["obs"] + t.astype(jnp.float32), "done": done}


def _flashbax(envs: int, obs: int, batch: int) -> dict[str, tuple]:
    import flashbax as fbx

    buffer = fbx.make_flat_buffer(max_length=envs * STEPS_PER_ENV, min_length=2 * envs,
                                  sample_batch_size=batch, add_sequences=False,
                                  add_batch_size=envs)  # fmt: skip
    state = buffer.init(_step(obs))

    def add(state, t):
        return buffer.add(state, _steps(envs, obs, t))

    def sample(state, key):
        drawn = buffer.sample(state, key).experience
        return drawn.first["obs"].sum() + drawn.second["obs"].sum() + drawn.first["reward"].sum()

    return {"add": (state, add), "sample": (state, sample)}


def _transition_kind(envs: int, obs: int, batch: int, sampler: Any) -> dict[str, tuple]:
    buffer = jaxbuf.make_transition_buffer(envs, STEPS_PER_ENV, batch, sampler=sampler)
    example = _step(obs)
    fields = ("obs", "action", "reward", "done", "done", "obs")
    state = buffer.init(jaxbuf.Transition(*(example[f] for f in fields)))

    def add(state, t):
        s = _steps(envs, obs, t)
        step = jaxbuf.Transition(s["obs"], s["action"], s["reward"], s["done"] & False,
                                 s["done"], s["obs"] + 1)  # fmt: skip
        return buffer.add_step(state, step)

    def sample(state, key):
        drawn = buffer.sample(state, key).experience
        return drawn.obs.sum() + drawn.next_obs.sum() + drawn.reward.sum()

    ops = {"add": (state, add), "sample": (state, sample)}
    if getattr(buffer, "set_priorities", None) is not None:

        def set_priorities(state, key):
            indices = jax.random.randint(key, (batch,), 0, envs * STEPS_PER_ENV)
            return buffer.set_priorities(state, indices, jax.random.uniform(key, (batch,)))

        ops["set_priorities"] = (state, set_priorities)
    return ops


def _replay(envs: int, obs: int, batch: int) -> dict[str, tuple]:
    buffer = jaxbuf.make_replay_buffer(envs * STEPS_PER_ENV, batch)
    state = buffer.init({**_step(obs), "next_obs": jnp.zeros(obs)})

    def add(state, t):
        s = _steps(envs, obs, t)
        return buffer.add(state, {**s, "next_obs": s["obs"] + 1})

    def sample(state, key):
        drawn = buffer.sample(state, key).experience
        return drawn["obs"].sum() + drawn["next_obs"].sum() + drawn["reward"].sum()

    return {"add": (state, add), "sample": (state, sample)}


def variants(envs: int, obs: int, batch: int) -> dict[str, dict[str, tuple]]:
    """{variant: {operation: (state, fn)}}: `fn(state, t_or_key)` an add (returns the
    state) or a draw (returns a scalar)."""
    return {"flashbax flat": _flashbax(envs, obs, batch),
            "transition n=1": _transition_kind(envs, obs, batch, jaxbuf.uniform()),
            "replay": _replay(envs, obs, batch),
            "prioritized transition": _transition_kind(envs, obs, batch,
                                                       jaxbuf.prioritized())}  # fmt: skip


def scanned(operation: str, fn: Callable) -> Callable:
    """`STEPS` calls of `fn` in one `lax.scan`: adds carry the state, the others carry the
    state too (a set of priorities) or sum their draws."""

    def run(state, key):
        def body(carry, i):
            state, total = carry
            if operation == "add":
                return (fn(state, i), total), None
            out = fn(state, jax.random.fold_in(key, i))
            if operation == "sample":
                return (state, total + out), None
            return (out, total), None

        return jax.lax.scan(body, (state, jnp.float32(0)), jnp.arange(STEPS))[0]

    return jax.jit(run, donate_argnums=0)


def _compatible(fn: Callable) -> Callable:
    """Flashbax's code relies on JAX's default promotion rules."""

    def call(*args):
        with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
            return fn(*args)

    return call


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
    the program (named after an instruction, or naming one in its `hlo_op` argument)."""
    path = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)[0]
    with gzip.open(path) as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    found = []
    for event in events:
        if event.get("ph") != "X":
            continue
        hlo = (event.get("args") or {}).get("hlo_op", event["name"])
        if hlo in names or event["name"] in names:
            found.append((event["name"] if event["name"] in names else hlo, event.get("dur", 0.0)))
    return found


def profile(fn: Callable, state: Any, key: jax.Array, repeats: int) -> dict[str, Any]:
    """Wall time per call (median and fastest of `repeats` scans) and the kernels of one
    scan under the profiler."""
    compiled = fn.lower(state, key).compile()
    state = fn(state, key)[0]  # warm; the scans run on a full (or written-to) buffer
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, total = fn(state, key)
        jax.block_until_ready((state, total))
        walls.append((time.perf_counter() - start) / STEPS * 1e6)
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        state, total = fn(state, key)
        jax.block_until_ready((state, total))
    names = hlo_names(compiled)
    return {"wall_us": statistics.median(walls), "wall_us_min": min(walls),
            "kernels": kernels(folder, names), "names": names}  # fmt: skip


def filled(variant: dict[str, tuple]) -> Any:
    """The variant's state after `STEPS_PER_ENV + 1` adds (full, its ring wrapped)."""
    state, add = variant["add"]
    fill = jax.jit(lambda s: jax.lax.fori_loop(0, STEPS_PER_ENV + 1, lambda t, s: add(s, t), s))
    return fill(state)


def measure(shape: tuple[int, int, int], repeats: int) -> tuple[list[dict], list[dict]]:
    envs, obs, batch = shape
    rows, listed = [], []
    for name, ops in variants(envs, obs, batch).items():
        if name.startswith("flashbax"):
            ops = {op: (state, _compatible(fn)) for op, (state, fn) in ops.items()}
        for operation, (_, fn) in ops.items():
            state = filled(ops)  # each operation its own: the scans donate it
            found = profile(scanned(operation, fn), state, jax.random.key(0), repeats)
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
