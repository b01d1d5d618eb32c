"""CleanRL's own `dqn_atari_jax.py`, as upstream wrote it and as our guide changes it, on real ALE.

The client a CleanRL user runs, not our rewrite of it: CleanRL release 1.2.0's
`cleanrl/dqn_atari_jax.py` (MIT), read out of its wheel on the package registry at run time and
checked by hash (`cleanrl_release.py`; the repository holds no CleanRL file). That release's
script takes its replay buffer (`ReplayBuffer(optimize_memory_usage=True)`) and Atari wrappers
from Stable-Baselines3. Each run copies the release's files into a scratch folder and, for
`jaxbuf`, applies the diff printed in `docs/coming_from_cleanrl.md` as a file, with `git apply`
(as a user pastes it); then it runs the script as `python cleanrl/dqn_atari_jax.py --...`
would, in a child process that adds only measurement:

- ALE's v0/v4 ids registered first (`BreakoutNoFrameskip-v4` under CleanRL's Gymnasium 0.29
  with ale-py 0.9 or newer: the guide's note);
- timers around the buffer's calls (SB3's `ReplayBuffer.add` and `.sample`; jaxbuf's
  `HostLoop.add`, which draws the batch) and their parts (jaxbuf: checking and staging a step,
  waiting for the call that read the other stage, the call and its block's delivery), the
  environment's steps, and the JAX compilations (`jax.monitoring`), each by environment step.

Runs alternate `A B B A` per torch thread setting (`OMP_NUM_THREADS=1`, as a user sets it once
SB3's buffer copy contends with the learner; `default`: torch's own). Results:
`benchmarks/results/cleanrl_dqn_cpu.{json,md}`. Needs the `cleanrl` extra
(`pip install -e ".[cleanrl]"`: the `atari` extra on CleanRL's Gymnasium pin, tensorboard).

Run: `python -m benchmarks.agents.cleanrl_dqn --total-timesteps 20000 --learning-starts 5000`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.agents import cleanrl_release

HERE = pathlib.Path(__file__).resolve().parent
GUIDE = HERE.parents[1] / "docs" / "coming_from_cleanrl.md"
RESULTS = HERE.parent / "results"
SCRIPT = cleanrl_release.SCRIPT
WARMUP = 1000  # learning steps left out of "once running" (the first compiles)
VARIANTS = ("cleanrl", "jaxbuf")


def guide_diff(page: pathlib.Path = GUIDE) -> str:
    """The first ```diff block of the guide, as a user copies it into a file."""
    found = re.search(r"^```diff\n(.*?)^```$", page.read_text(), re.S | re.M)
    if found is None:
        raise ValueError(f"{page} has no ```diff block")
    return found.group(1)


def checkout(release: pathlib.Path, folder: pathlib.Path, variant: str) -> pathlib.Path:
    """The release's files (`cleanrl_release.fetch(release)`) copied into `folder`, the script
    checked by hash again and changed by the guide's diff for `jaxbuf` (`git apply`, which
    refuses a diff that does not apply exactly); returns the script."""
    shutil.copytree(release, folder, ignore=shutil.ignore_patterns("wheel"), dirs_exist_ok=True)
    if cleanrl_release.sha256((folder / SCRIPT).read_bytes()) != cleanrl_release.SCRIPT_SHA256:
        raise ValueError(f"{folder / SCRIPT} is not CleanRL {cleanrl_release.RELEASE}'s")
    if variant == "jaxbuf":
        (folder / "guide.diff").write_text(guide_diff())
        subprocess.run(["git", "apply", "--verbose", "guide.diff"], cwd=folder, check=True,
                       capture_output=True, text=True)  # fmt: skip
    return folder / SCRIPT


def script_arguments(args: argparse.Namespace) -> list[str]:
    """The script's own command line (tyro): only what the benchmark's size changes."""
    return ["--seed", str(args.seed), "--total-timesteps", str(args.total_timesteps),
            "--learning-starts", str(args.learning_starts),
            "--buffer-size", str(args.buffer_size)]  # fmt: skip


def run(variant: str, threads: str, args: argparse.Namespace, release: pathlib.Path) -> dict:
    """One run in a child process (fresh JAX, the thread setting in its environment)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads != "default":
        env["OMP_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(scratch)
        script = checkout(release, folder / "run", variant)
        out = folder / "measured.json"
        command = [sys.executable, str(HERE / "cleanrl_probe.py"), str(script), str(out),
                   str(args.learning_starts), "--", *script_arguments(args)]  # fmt: skip
        done = subprocess.run(command, cwd=folder / "run", env=env, capture_output=True,
                              text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{variant} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        measured = json.loads(out.read_text())
    measured.update(variant=variant, threads=threads)
    return measured


def summary(measured: dict, learning_starts: int) -> dict:
    """Per environment step while learning: the buffer's µs once running (after WARMUP
    learning steps) and with the compiles; steps/s; the longest buffer call."""
    buffer = measured["buffer_s"]
    start = learning_starts + 1
    running = buffer[start + WARMUP :]
    parts = {name: sum(values[start + WARMUP :]) / len(running) * 1e6
             for name, values in measured["parts_s"].items()}  # fmt: skip
    return {
        "buffer_us": sum(running) / len(running) * 1e6,
        "buffer_us_with_compiles": sum(buffer[start:]) / len(buffer[start:]) * 1e6,
        "env_us": sum(measured["env_s"][start + WARMUP :]) / len(running) * 1e6,
        "parts_us": parts,
        "sps_learning": (len(buffer) - start) / measured["learning_s"],
        "longest_buffer_call_s": max(buffer[start:]),
        "compiles_when_learning_starts": [c for c in measured["compiles"] if c[0] >= start],
        "returns": measured["returns"][:32],
        "peak_rss_gib": measured["peak_rss_gib"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-timesteps", type=int, default=20_000)
    parser.add_argument("--learning-starts", type=int, default=5_000)
    parser.add_argument("--buffer-size", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", nargs="+", default=["1", "default"])
    parser.add_argument("--order", default="ABBA", help="A: cleanrl, B: jaxbuf")
    parser.add_argument("--out", default="cleanrl_dqn_cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        release = pathlib.Path(scratch)
        cleanrl_release.fetch(release)
        rows = measure(args, release)
    write(rows, args)


def measure(args: argparse.Namespace, release: pathlib.Path) -> list[dict]:
    """Every run, in the order asked (`--order` per `--threads` setting)."""
    rows = []
    for threads in args.threads:
        for letter in args.order:
            variant = VARIANTS["AB".index(letter)]
            started = time.perf_counter()
            measured = run(variant, threads, args, release)
            row = {"variant": variant, "threads": threads,
                   **summary(measured, args.learning_starts)}  # fmt: skip
            print(f"{variant:8} threads={threads:7} buffer {row['buffer_us']:7.1f} µs/step, "
                  f"{row['sps_learning']:6.1f} steps/s, {time.perf_counter() - started:.0f} s",
                  flush=True)  # fmt: skip
            rows.append(row)
    return rows


def write(rows: list[dict], args: argparse.Namespace) -> None:
    from benchmarks.reports.cleanrl_report import table

    settings = {
        "release": cleanrl_release.RELEASE, "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "python": platform.python_version(), "size": vars(args), "versions": versions(),
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"settings": settings, "runs": rows},
                                                         indent=1))  # fmt: skip
    (RESULTS / f"{args.out}.md").write_text(table(rows, settings))


def versions() -> dict:
    from importlib import metadata

    names = ("jaxbuf", "jax", "jaxlib", "flax", "optax", "torch", "gymnasium", "ale-py",
             "stable-baselines3")  # fmt: skip
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


if __name__ == "__main__":
    main()
