"""The table of `dqn_atari.py`'s runs: `dqn_atari_cpu.md` (and `.json`)."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from benchmarks.common import write_results

WINDOW = 20_000  # steps per point of the learning curve


def curve(returns: list, total: int) -> str:
    """Mean episodic return per window of `WINDOW` steps, as `a / b / c`."""
    points = []
    for start in range(0, total, WINDOW):
        inside = [r for step, r in returns if start <= step < start + WINDOW]
        points.append(f"{np.mean(inside):.1f}" if inside else "-")
    return " / ".join(points)


def row(run: dict) -> dict:
    if "error" in run:
        return {**run, "curve": run["error"]}
    return {**run, "curve": curve(run["returns"], run["total_timesteps"]),
            "episodes": len(run["returns"])}  # fmt: skip


def summarize(folder: pathlib.Path, out: pathlib.Path) -> None:
    runs = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    rows = [row(run) for run in sorted(runs, key=lambda r: (r["buffer_size"], r["buffer"]))]
    for r in rows:
        r.pop("returns", None)
    columns = [("buffer", "buffer", "{}"), ("buffer_size", "buffer_size", "{}"),
               ("seed", "seed", "{}"), ("steps/s while learning", "sps_learning", "{:.1f}"),
               ("buffer µs per env step", "buffer_us", "{:.0f}"),
               ("peak resident GiB", "peak_rss_gib", "{:.2f}"),
               ("buffer GiB", "buffer_gib", "{:.2f}"), ("episodes", "episodes", "{}"),
               (f"mean return per {WINDOW // 1000}k steps", "curve", "{}")]  # fmt: skip
    script = pathlib.Path(__file__).parents[1] / "agents" / "dqn_atari.py"
    write_results(str(out), "dqn_atari", rows, columns, script.read_text().split('"""')[1])
