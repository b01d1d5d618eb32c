"""Runs every benchmark, then draws the plots and writes the report.

Run: `python -m benchmarks.run_all [--quick] [--out benchmarks/results] [--only a,b]
[--set accelerator]`.

`--set accelerator` runs what matters on a GPU or TPU, where the hot paths differ
from the CPU's: replay, trajectory, transition, prioritized, GAE, the options
(epochs, rate limiter, goal relabeling) and the agents end to end.

Each script runs in its own process (a fresh JAX, so one script's memory and
compiled code cannot slow the next), one after another, under a progress bar;
its output goes to `<out>/logs/<script>.log`. `report.py` then turns the JSON
results into `plots/*.png` and `REPORT.md`. The machine and versions are printed
first and recorded in every result.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = (
    "micro.bench_hostloop",  # a Gymnasium loop feeding HostLoop against NumPy, cpprb, TorchRL
    "micro.bench_sweep",  # add and sample of every kind over capacity and batch; memory; donation
    "micro.bench_replay",
    "micro.bench_trajectory",
    "micro.bench_transition",
    "micro.bench_scale",  # Brax/Playground scale; its Brax parts need brax (JAX <= 0.9)
    "micro.bench_prioritized",
    "micro.bench_gae",
    "micro.bench_sharding",
    "micro.bench_dataset",
    "micro.bench_checkpoint",  # needs about 14 GiB of host memory (Orbax restoring 6 GiB)
    "micro.bench_frames",
    "micro.bench_options",  # epochs, rate limiter and goal relabeling against the plain buffers
    "agents.bench_her",  # DQN on HER bit flipping with and without relabeling, 5 seeds (~25 min)
    "agents.bench_agents",  # end-to-end training steps/s of three agents, jaxbuf against Flashbax
    "agents.bench_learning",  # what the example agents learn over 5 seeds (~35 min)
)


SETS = {
    "all": SCRIPTS,
    "accelerator": (
        "micro.bench_replay", "micro.bench_trajectory", "micro.bench_transition",
        "micro.bench_prioritized", "micro.bench_gae", "micro.bench_options", "agents.bench_agents",
        "micro.bench_hostloop", "micro.bench_scale",
    ),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of every script")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--only", default="", help="comma-separated script names to run")
    parser.add_argument("--set", default="all", choices=sorted(SETS), help="which scripts")
    args = parser.parse_args()
    from tqdm import tqdm

    from benchmarks.common import environment
    from benchmarks.reports import report

    env = environment()
    print(f"{env['cpu']} ({env['cpu_count']} cores), {env['backend']} backend, "
          f"Python {env['python']}, {env['platform']}")  # fmt: skip
    print(", ".join(f"{k} {v}" for k, v in env["versions"].items() if v))
    out = pathlib.Path(args.out).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) - {""}
    chosen = [s for s in SETS[args.set] if not only or {s, s.split(".")[-1]} & only]
    failed = []
    with tqdm(chosen, unit="script") as bar:
        for script in bar:
            bar.set_description(script.split(".")[-1])
            start = time.perf_counter()
            command = [sys.executable, "-m", f"benchmarks.{script}", "--out", str(out)]
            with open(logs / f"{script}.log", "w") as log:
                done = subprocess.run(
                    command + ["--quick"] * args.quick, cwd=HERE.parent, stdout=log,
                    stderr=subprocess.STDOUT, check=False,
                )  # fmt: skip
            status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
            bar.write(f"{script}: {status} in {time.perf_counter() - start:.0f} s")
            if done.returncode:
                failed.append(script)
    print("wrote", report.report(out))
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (see {logs})")


if __name__ == "__main__":
    main()
