"""Shared benchmark plumbing: the machine and versions, and result files."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]  # where `python -m benchmarks...` runs


def _version(package: str) -> str | None:
    """The installed version; for jaxbuf run from a checkout that is not installed (the GPU
    machine's copy), the checkout's own `jaxbuf.__version__`."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        if package == "jaxbuf":
            import jaxbuf

            return jaxbuf.__version__
        return None


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """What the numbers were measured on."""
    import jax

    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "device_count": jax.device_count(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": threads(),
        "command": command(),
        "versions": {
            p: _version(p)
            for p in (
                "jaxbuf",
                "jax",
                "jaxlib",
                "flax",
                "flashbax",
                "brax",
                "playground",
                "mujoco",
                "mujoco-mjx",
            )
        },
    }


def command() -> str:
    """How this process was started: `python -m <module> <arguments>`."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    start = f"-m {spec.name}" if spec else pathlib.Path(sys.argv[0]).name
    args = sys.argv[1:]
    if "--out" in args[:-1]:  # where the results went, not how they were measured
        del args[args.index("--out") : args.index("--out") + 2]
    return " ".join(["python", start, *args])


def threads() -> str:
    """The threads the measured libraries ran on: XLA's CPU client uses every core this
    process may run on; torch its own count (where it was imported); any override."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    said = [f"XLA on {cores} cores"]
    if "torch" in sys.modules:
        said.append(f"torch {sys.modules['torch'].get_num_threads()} threads")
    said += [f"{name}={os.environ[name]}" for name in ("OMP_NUM_THREADS", "XLA_FLAGS")
             if os.environ.get(name)]  # fmt: skip
    return ", ".join(said)


def resident_bytes() -> int:
    """This process's resident memory now (Linux: `/proc/self/statm`; 0 elsewhere)."""
    try:
        pages = int(pathlib.Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def flashbax_device() -> str:
    """The `device=` of Flashbax's prioritized buffers: its sum-tree path for the
    backend the benchmark runs on (`"cpu"`, `"gpu"` or `"tpu"`)."""
    import jax

    return jax.default_backend()


def command_line(doc: str, flags: dict[str, str] | None = None) -> argparse.Namespace:
    """The arguments every timing script takes: `--quick` (a smoke run) and `--out`, and
    the script's own on/off `flags` (`{"--name": "help"}`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--out", default="benchmarks/results")
    for flag, text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    return parser.parse_args()


def write_results(out: str, name: str, rows: list[dict], columns: list, doc: str) -> None:
    """Writes `<name>_<backend>.json` and `.md` (a table of `columns`) under `out`."""
    env = environment()
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{name}_{env['backend']}"
    stem.with_suffix(".json").write_text(
        json.dumps({"environment": env, "results": rows}, indent=2)
    )
    header = "| " + " | ".join(title for title, _, _ in columns) + " |"
    lines = [
        f"# {doc.strip().splitlines()[0]}",
        "",
        f"Measured {env['date']} on {env['device']} ({env['backend']}; {env['cpu']}, "
        f"{env['cpu_count']} cores; {env['threads']}), Python {env['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f". Command: `{env['command']}`.",
        "",
        header,
        "|" + "---|" * len(columns),
        *(
            "| "
            + " | ".join(
                "-" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in columns
            )
            + " |"
            for row in rows
        ),
        "",
        "```text",
        doc.strip(),
        "```",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")


def interleaved_times(cases: dict[str, tuple[Callable[[], object], int]], repeats: int):
    """`(median, fastest)` seconds per call of each case; the cases take turns in
    every repeat.

    Args:
      cases: name -> (a function doing one call, calls per repeat).
      repeats: how many timed rounds.
    """
    import jax

    for fn, _ in cases.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, calls) in cases.items():
            start = time.perf_counter()
            for _ in range(calls - 1):
                fn()
            jax.block_until_ready(fn())
            times[name].append((time.perf_counter() - start) / calls)
    return {name: (float(np.median(t)), float(np.min(t))) for name, t in times.items()}


def interleaved_medians(cases: dict[str, tuple[Callable[[], object], int]], repeats: int):
    """Median seconds per call of each case (see `interleaved_times`)."""
    return {name: median for name, (median, _) in interleaved_times(cases, repeats).items()}


def run_scan(body, carry, xs) -> Callable[[], object]:
    """One call of a donated jitted scan of `body` over `xs`, keeping the carry."""
    import jax

    run = jax.jit(lambda carry, xs: jax.lax.scan(body, carry, xs)[0], donate_argnums=0)
    return donated(run, [carry], xs)


def donated(fn, holder: list, *args) -> Callable[[], object]:
    """One call of the donating `fn(holder[0], *args)`, its result kept in `holder[0]`
    (calls that share a holder work on one state)."""

    def once():
        holder[0] = fn(holder[0], *args)
        return holder[0]

    return once
