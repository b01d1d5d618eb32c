"""Runs every benchmark the documentation quotes, then draws the plots and writes the report.

Run: `python -m benchmarks.run_all [--quick] [--out benchmarks/results] [--only a,b]
[--set accelerator] [--brax-python .venv-brax/bin/python]`.

`RUNS` names every run and the tables it writes; `tests/test_figures.py` checks that
every CPU table a page links is written by one of them. Brax's and Playground's runs
need an environment of their own (`pip install -e ".[playground,bench]"`: Brax needs
JAX 0.9 or older), given by `--brax-python`; the agents' Atari and CleanRL runs need the
`atari` and `cleanrl` extras and take an hour or more each. A run whose needs are not
installed is skipped, and the progress bar says so. `--set accelerator` runs what
matters on a GPU or TPU, where the hot paths differ from the CPU's.

Each run is its own process (a fresh JAX, so one run's memory and compiled code
cannot slow the next), one after another, under a progress bar; its output goes to
`<out>/logs/<name>.log`. `report.py` then writes `plots/*.png` and `REPORT.md` from
every table in `<out>`. The machine and versions are printed first and recorded in
every result.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import subprocess
import sys
import time
from typing import NamedTuple

HERE = pathlib.Path(__file__).resolve().parent


class Run(NamedTuple):
    """One benchmark run: its module (under `benchmarks` unless it starts with `jaxbuf`),
    its arguments, the tables it writes (`results/<table>_<backend>.md`) and the module it
    needs beyond `[bench]` (`brax` and `playground`: run by `--brax-python`; `gpu`: an
    accelerator; others: skipped, said so, where not installed). A standard run takes
    `--out` (the results folder) and `--quick`; the agents' own scripts take what
    `args` gives (`{out}` is the results folder) and have no quick form."""

    module: str
    args: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    needs: str = ""
    standard: bool = True


def atari(buffer: str, size: str, steps: str) -> Run:
    """One of `dqn_atari.py`'s runs (its table is written by the `--summarize` run)."""
    args = ("--buffer", buffer, "--buffer-size", size, "--total-timesteps", steps)
    return Run("agents.dqn_atari", args, (), "ale_py", standard=False)


WIDE = "--sac-env hopper --sac-obs 67"  # hopper's observation repeated to 67 floats
PLAYGROUND = ("--sac-only", "--sac-envs", "256", "--sac-full-size", "4194304")


def sac(table: str, args: str) -> Run:
    """Brax's own SAC with `jaxbuf.brax` and with Brax's queue, the queue full (`args`:
    `bench_scale.py`'s `--sac-*` options)."""
    arguments = ("--sac-only", "--sac-full-only", *args.split(), "--sac-table", table)
    return Run("micro.bench_scale", arguments, (table,), "brax")


RUNS = {
    # a Gymnasium loop feeding HostLoop against NumPy, cpprb, TorchRL; then the learner
    "hostloop": Run("micro.bench_hostloop", (), ("hostloop",)),
    "hostloop_learner": Run("micro.bench_hostloop", ("--learner",), ("hostloop_learner",)),
    # add and sample of every kind over capacity and batch; memory; donation
    "sweep": Run("micro.bench_sweep", (), ("sweep", "donation")),
    "replay": Run("micro.bench_replay", (), ("replay",)),
    "trajectory": Run("micro.bench_trajectory", (), ("trajectory",)),
    "transition": Run("micro.bench_transition", (), ("transition",)),
    "prioritized": Run("micro.bench_prioritized", (), ("prioritized",)),
    "flashbax62": Run("micro.bench_flashbax62", (), ("flashbax62",)),
    "flashbax_dropin": Run("micro.bench_flashbax_dropin", (), ("flashbax_dropin",)),
    "gae": Run("micro.bench_gae", (), ("gae",)),
    "sharding": Run("micro.bench_sharding", (), ("sharding",)),
    "dataset": Run("micro.bench_dataset", (), ("dataset",)),
    # needs about 14 GiB of host memory (Orbax restoring 6 GiB)
    "checkpoint": Run("micro.bench_checkpoint", (), ("checkpoint",)),
    "frames": Run("micro.bench_frames", (), ("frames",)),
    "image_add": Run("micro.bench_image_add", (), ("image_add",)),
    # epochs, rate limiter and goal relabeling against the plain buffers
    "options": Run("micro.bench_options", (), ("options",)),
    "memory": Run("micro.bench_memory", (), ("memory",)),
    "switches": Run("micro.bench_switches", (), ("switches",)),
    "gap": Run("micro.bench_gap", (), ("gap",)),
    # Brax/Playground scale against Flashbax and Brax's queue (brax: JAX <= 0.9)
    "scale": Run("micro.bench_scale", (), ("scale",), "brax"),
    "scale_apart": Run(
        "micro.bench_scale", ("--apart", "--table", "scale_apart"), ("scale_apart",), "brax"
    ),
    "scale_wide_apart": Run(
        "micro.bench_scale",
        ("--apart", "--shapes", "1024,8192,512", "--table", "scale_wide_apart"),
        ("scale_wide_apart",),
        "brax",
    ),
    "scale_users": Run(
        "micro.bench_scale", ("--users", "--table", "scale_users"), ("scale_users",), "brax"
    ),
    # one table of three configurations: 64 envs and 1M, 256 envs and Playground's 4 x 1M,
    # hopper at 256 envs and 4 x 1M, each with a queue that never fills and a full one
    "scale_sac": Run("micro.bench_scale", ("--sac-only",), ("scale_sac",), "brax"),
    "scale_sac_256": Run("micro.bench_scale", (*PLAYGROUND, "--sac-keep"), (), "brax"),
    "scale_sac_hopper": Run(
        "micro.bench_scale", (*PLAYGROUND, "--sac-env", "hopper", "--sac-keep"), (), "brax"
    ),
    "scale_sac_seeds": sac(
        "scale_sac_seeds", "--sac-seeds 3 --sac-full-size 20000 --sac-steps 10000"
    ),
    "scale_sac_wide": sac("scale_sac_wide", f"{WIDE} --sac-envs 128 --sac-seeds 3"),
    "scale_sac_wide_4m": sac("scale_sac_wide_4m", f"{WIDE} --sac-envs 256 --sac-full-size 4194304"),
    "playground_sac": Run("agents.playground_sac", (), ("playground_sac",), "playground"),
    "her": Run("agents.bench_her", (), ("her",)),  # DQN on HER bit flipping, 5 seeds (~25 min)
    # end-to-end training steps/s of three agents, jaxbuf against Flashbax
    "agents": Run("agents.bench_agents", (), ("agents",)),
    # what the examples learn over 5 seeds (about 70 minutes on a 2-core AMD EPYC), and the
    # demo's two agents alone, in a table of their own
    "learning": Run("agents.bench_learning", (), ("learning",)),
    "learning_demo": Run(
        "agents.bench_learning",
        ("--only", "the demo's", "--table", "learning_demo"),
        ("learning_demo",),
    ),
    # actor processes on a local Ray cluster: transport against echo and TorchRL, the object
    # store, the Ape-X agent against one process, a soak of 20 kills (about 15 minutes)
    "ray": Run(
        "agents.bench_ray",
        (),
        ("ray_transport", "ray_calls", "ray_store", "ray_apex", "ray_soak"),
        "echo",
    ),
    "dqn_torch": Run(
        "jaxbuf.examples.dqn_torch",
        ("--out", "{out}/dqn_torch_cpu.md"),
        ("dqn_torch",),
        "torch",
        standard=False,
    ),
    # CleanRL's own file and the guide's diff, 10,000 steps learning from step 3,000
    "cleanrl_dqn": Run(
        "agents.cleanrl_dqn",
        ("--total-timesteps", "13000", "--learning-starts", "3000"),
        ("cleanrl_dqn",),
        "tensorboard",
        standard=False,
    ),
    "dqn_atari_jaxbuf": atari("jaxbuf", "100000", "120000"),
    "dqn_atari_sb3": atari("sb3", "100000", "120000"),
    "dqn_atari_jaxbuf_1m": atari("jaxbuf", "1000000", "25000"),
    "dqn_atari_sb3_1m": atari("sb3", "1000000", "25000"),
    "dqn_atari": Run(
        "agents.dqn_atari", ("--summarize",), ("dqn_atari",), "ale_py", standard=False
    ),
    # on accelerators only: host-placed against device-resident experience
    "host_memory": Run("micro.bench_host_memory", (), ("host_memory",), "gpu"),
    "kernels": Run("micro.bench_kernels", (), ("kernels", "kernel_list"), "gpu"),
}

SETS = {
    "all": tuple(name for name, run in RUNS.items() if run.needs != "gpu"),
    "accelerator": (
        "replay", "trajectory", "transition", "prioritized", "gae", "options", "agents",
        "hostloop", "hostloop_learner", "scale_users", "host_memory", "sweep", "frames",
    ),
}  # fmt: skip


def command(run: Run, out: pathlib.Path, quick: bool, brax_python: str) -> list[str] | str:
    """The command line of `run`, or why it does not run here."""
    python = sys.executable
    if run.needs in ("brax", "playground"):
        if not brax_python:
            return f"needs {run.needs} (JAX <= 0.9): give --brax-python"
        python = brax_python
    elif run.needs == "gpu":
        import jax

        if jax.default_backend() == "cpu":
            return "needs a GPU or TPU"
    elif run.needs and importlib.util.find_spec(run.needs) is None:
        return f"needs {run.needs}"
    if quick and not run.standard:
        return "no quick form"
    module = run.module if run.module.startswith("jaxbuf") else f"benchmarks.{run.module}"
    args = [arg.format(out=out) for arg in run.args]
    if run.standard:
        args += ["--out", str(out)] + ["--quick"] * quick
    return [python, "-m", module, *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of every script")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--only", default="", help="comma-separated names (RUNS) to run")
    parser.add_argument("--set", default="all", choices=sorted(SETS), help="which runs")
    parser.add_argument(
        "--brax-python", default="", help="the Python of a [playground,bench] environment"
    )
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
    chosen = [name for name in SETS[args.set] if not only or name in only]
    failed = []
    with tqdm(chosen, unit="run") as bar:
        for name in bar:
            bar.set_description(name)
            line = command(RUNS[name], out, args.quick, args.brax_python)
            if isinstance(line, str):
                bar.write(f"{name}: not run ({line})")
                continue
            start = time.perf_counter()
            with open(logs / f"{name}.log", "w") as log:
                done = subprocess.run(line, cwd=HERE.parent, stdout=log,
                                      stderr=subprocess.STDOUT, check=False)  # fmt: skip
            status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
            bar.write(f"{name}: {status} in {time.perf_counter() - start:.0f} s")
            if done.returncode:
                failed.append(name)
    print("wrote", report.report(out))
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (see {logs})")


if __name__ == "__main__":
    main()
