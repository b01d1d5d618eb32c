"""What a piece of work costs right after 2 ms of something else, against back to back.

The CleanRL loop calls the buffer once per environment step, after ALE's 2 ms. Timed back to
back, as micro-benchmarks do, work finds its code and data in the caches; in the loop it does
not. This script times the same works both ways, in one process, taking turns:

- `numpy check`: six `np.asarray` and a shape/dtype comparison (what `HostLoop.add` checks);
- `numpy copy 4 MB`: one `np.copyto` (about a CleanRL batch and its copy into tensors);
- `jit identity, 14 leaves`: JAX's dispatch of a donated call whose arguments are a
  transition buffer's state (no work in it);
- `HostLoop, 4 adds`: four steps staged, the call that writes them and draws 32 Atari
  transitions (frames stacked 4, capacity 100k), its block waited for.

Between two timed works: nothing, a busy Python loop of 2 ms, or `time.sleep(0.002)`.
Results: `benchmarks/results/gap_<backend>.{json,md}`.

Run: `python -m benchmarks.micro.bench_gap [--quick]`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks import common

GAP = 0.002
COLUMNS = [
    ("work", "work", "{}"),
    ("back to back, µs median (fastest)", "none", "{}"),
    ("after 2 ms busy", "busy", "{}"),
    ("after 2 ms sleep", "sleep", "{}"),
    ("busy / back to back", "ratio", "{:.1f}"),
]


def _busy(seconds: float) -> None:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def _gaps() -> dict[str, Callable[[], None]]:
    return {"none": lambda: None, "busy": lambda: _busy(GAP), "sleep": lambda: time.sleep(GAP)}


def _numpy_works() -> dict[str, Callable[[], object]]:
    leaves = [np.zeros((1, 84, 84), np.uint8), np.zeros(1, np.int32)] * 3
    signature = [(leaf.shape, leaf.dtype) for leaf in leaves]
    source = np.ones(4 << 20, np.uint8)
    target = np.empty_like(source)

    def check() -> bool:
        arrays = [np.asarray(leaf) for leaf in leaves]
        return [(a.shape, a.dtype) for a in arrays] == signature

    return {"numpy check": check, "numpy copy 4 MB": lambda: np.copyto(target, source)}


def _jax_works() -> dict[str, Callable[[], object]]:
    buffer = jaxbuf.make_transition_buffer(1, 100_000, 32, frames={"obs": 4}, min_episode_length=20)
    frame = jnp.zeros((84, 84), jnp.uint8)
    example = jaxbuf.Transition(
        frame, jnp.int32(0), jnp.float32(0), jnp.bool_(0), jnp.bool_(0), frame
    )
    loop = jaxbuf.HostLoop(
        buffer, buffer.init(example), jax.random.key(0), steps_per_call=4, batches_per_call=1,
        output="jax",
    )  # fmt: skip
    frames = np.random.default_rng(0).integers(0, 255, (1, 84, 84), np.uint8)
    step = jaxbuf.Transition(
        frames, np.zeros(1, np.int32), np.zeros(1, np.float32), np.zeros(1, bool),
        np.zeros(1, bool), frames,
    )  # fmt: skip
    for _ in range(400):
        loop.add(step)
    held = [buffer.init(example)]
    identity = jax.jit(lambda state: state, donate_argnums=0)

    def dispatch() -> None:
        held[0] = jax.block_until_ready(identity(held[0]))

    def call() -> None:  # 4 adds: the 4th makes the call, whose block is waited for
        for _ in range(3):
            loop.add(step)
        jax.block_until_ready(loop.add(step))

    return {"jit identity, 14 leaves": dispatch, "HostLoop, 4 adds (stage, write, draw)": call}


def _time(work: Callable[[], object], gap: Callable[[], None], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        gap()
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    args = common.command_line(__doc__)
    repeats, rounds = (50, 2) if args.quick else (300, 5)
    works = {**_numpy_works(), **_jax_works()}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):  # works and gaps take turns
        for name, work in works.items():
            for gap_name, gap in _gaps().items():
                times.setdefault((name, gap_name), []).extend(_time(work, gap, repeats))
    rows = []
    for name in works:
        row: dict = {"work": name}
        for gap_name in _gaps():
            ts = np.array(times[(name, gap_name)]) * 1e6
            row[gap_name] = f"{np.median(ts):.0f} ({ts.min():.0f})"
            row[f"{gap_name}_median_us"] = float(np.median(ts))
        row["ratio"] = row["busy_median_us"] / row["none_median_us"]
        rows.append(row)
        print(row)
    common.write_results(args.out, "gap", rows, COLUMNS, __doc__)


if __name__ == "__main__":
    main()
