"""Draws the benchmark plots and writes `REPORT.md` from the JSON results.

Run: `python -m benchmarks.reports.report [--out benchmarks/results]` (`run_all.py` runs it last).
Draws `plots/*.png` from the `<name>_<backend>.json` results and writes `REPORT.md`:
every `<name>_<backend>.md` table under `--out` (its machine, versions, settings), and
the plots.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

ORDER = (
    "agents", "learning", "her", "dqn_torch", "cleanrl_dqn", "dqn_atari", "hostloop", "gap",
    "sweep", "donation", "memory", "replay", "trajectory", "transition", "prioritized",
    "flashbax62", "scale", "playground", "gae", "frames", "image_add", "options", "switches",
    "host_memory", "sharding", "dataset", "checkpoint",
)  # fmt: skip
SECTIONS = {
    "cpu": "On a CPU",
    "gpu": "On a GPU (each table names the card; standalone calls there carry 40-100 µs of "
    "dispatch, so read the scan columns for the buffer's own cost)",
}
COLORS = {"jaxbuf": "C0", "flashbax": "C1", "cpprb": "C2", "numpy": "C3"}


def load(folder: pathlib.Path) -> dict[tuple[str, str], dict]:
    results = {}
    for path in sorted(folder.glob("*_*.json")):
        name, backend = path.stem.rsplit("_", 1)
        results[name, backend] = json.loads(path.read_text())
    return results


def _axes(count: int, width: float = 4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(count, 3)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, 3.2 * rows), squeeze=False)
    for extra in axes.flat[count:]:
        extra.set_visible(False)
    return figure, list(axes.flat)


def plot_sweep(rows: list[dict], what: str, axis: str, path: pathlib.Path) -> None:
    """Time of `what` (add or sample) against `axis` (capacity or batch), a panel per kind."""
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    figure, axes = _axes(len(kinds))
    for ax, kind in zip(axes, kinds, strict=False):
        if axis == "capacity":
            points = [r for r in rows if r["kind"] == kind and r["batch"] == 256]
        else:
            points = [r for r in rows if r["kind"] == kind and r["capacity"] == 100_000]
        points.sort(key=lambda r: r[axis])
        for lib, color in COLORS.items():
            key = f"{lib}_{what}_us"
            if points and key in points[0]:
                ax.plot([r[axis] for r in points], [r[key] for r in points], marker="o",
                        color=color, label=lib)  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel(axis if axis == "capacity" else "batch size")
        ax.set_ylabel(f"{what} (µs per call)")
        ax.legend(fontsize=8)
    figure.suptitle(f"{what} against {axis} (lower is better)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def plot_memory(rows: list[dict], path: pathlib.Path) -> None:
    points = [r for r in rows if r["capacity"] == 100_000 and r["batch"] == 256]
    figure, (ax,) = _axes(1, width=7.0)
    libs = [lib for lib in COLORS if any(f"{lib}_bytes_per_item" in r for r in points)]
    width = 0.8 / len(libs)
    for i, lib in enumerate(libs):
        xs = [j + i * width for j, r in enumerate(points) if f"{lib}_bytes_per_item" in r]
        ys = [r[f"{lib}_bytes_per_item"] for r in points if f"{lib}_bytes_per_item" in r]
        ax.bar(xs, ys, width, color=COLORS[lib], label=lib)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(points))], [r["kind"] for r in points])
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set_ylabel("state bytes / item bytes")
    ax.set_title("memory per stored item at capacity 1e5 (1 = the items alone)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def plot_donation(rows: list[dict], path: pathlib.Path) -> None:
    figure, (ax,) = _axes(1, width=5.0)
    capacities = [r["capacity"] for r in rows]
    ax.plot(capacities, [r["donated_us"] for r in rows], marker="o", label="donate_argnums=0")
    ax.plot(capacities, [r["copied_us"] for r in rows], marker="o", label="not donated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity")
    ax.set_ylabel("add of 8 items (µs)")
    ax.set_title("donation: add in place, or copy the storage")
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def plot_gae(rows: list[dict], path: pathlib.Path) -> None:
    methods = [k[: -len("_ms")] for k in rows[0] if k.endswith("_ms")]
    batches = sorted({r["batch"] for r in rows})
    figure, axes = _axes(len(batches))
    for ax, batch in zip(axes, batches, strict=False):
        points = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["T"])
        for method in methods:
            ys = [r.get(f"{method}_ms") for r in points]
            if all(y is not None for y in ys):
                ax.plot([r["T"] for r in points], ys, marker="o", label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (steps)")
        ax.set_ylabel("ms per call")
        ax.set_title(f"GAE, batch {batch}")
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def plot_hostloop(rows: list[dict], path: pathlib.Path) -> None:
    """The buffer's share of an environment-plus-buffer step against the steps per call."""
    figure, (ax,) = _axes(1, 5.0)
    for env in dict.fromkeys(row["env"] for row in rows):
        mine = {r["buffer"]: r for r in rows if r["env"] == env}
        if "NumPy ring" not in mine:  # the learner's rows: no share to draw
            continue
        blocks = sorted(int(b.split("=")[1]) for b in mine if re.fullmatch(r"jaxbuf k=\d+", b))
        line = ax.plot(blocks, [mine[f"jaxbuf k={k}"]["share"] for k in blocks], "o-",
                       label=f"jaxbuf HostLoop, {env}")[0]  # fmt: skip
        ax.axhline(mine["NumPy ring"]["share"], ls="--", lw=1, color=line.get_color(),
                   label=f"NumPy ring, {env}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("steps per call k")
    ax.set_ylabel("buffer's share of env + buffer")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def plots(results: dict, folder: pathlib.Path) -> dict[str, list[str]]:
    """Draws what the results allow; returns result name -> plot paths (relative)."""
    drawn: dict[str, list[str]] = {}
    (folder / "plots").mkdir(exist_ok=True)
    for (name, backend), data in results.items():
        rows, made = data.get("results", []), []  # (the agents' own scripts write others)
        if name == "sweep":
            for what in ("add", "sample"):
                for axis in ("capacity", "batch"):
                    made.append((f"sweep_{what}_{axis}_{backend}.png", plot_sweep, (what, axis)))
            made.append((f"memory_{backend}.png", plot_memory, ()))
        elif name == "donation":
            made.append((f"donation_{backend}.png", plot_donation, ()))
        elif name == "hostloop":
            made.append((f"hostloop_{backend}.png", plot_hostloop, ()))
        elif name == "gae" and rows and "T" in rows[0]:
            made.append((f"gae_{backend}.png", plot_gae, ()))
        for file, draw, args in made:
            draw(rows, *args, folder / "plots" / file)
            drawn.setdefault(f"{name}_{backend}", []).append(f"plots/{file}")
    return drawn


def tables(folder: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """Every results table in `folder`, `<name>_cpu.md` or `<name>[_<card>]_gpu.md`, by
    backend, in `ORDER` and then by name."""
    found: dict[str, list[pathlib.Path]] = {}
    for path in folder.glob("*_*.md"):
        backend = path.stem.rsplit("_", 1)[1]
        if backend in SECTIONS:
            found.setdefault(backend, []).append(path)

    def rank(path: pathlib.Path) -> tuple[int, str]:
        name = path.stem.rsplit("_", 1)[0]
        first = next((i for i, known in enumerate(ORDER) if name.startswith(known)), len(ORDER))
        return first, name

    return {backend: sorted(paths, key=rank) for backend, paths in found.items()}


def report(folder: pathlib.Path) -> pathlib.Path:
    """Writes `REPORT.md`: every table in `folder` (each with its machine, versions and
    settings) and the plots the JSON results allow."""
    drawn = plots(load(folder), folder)
    lines = [
        "# jaxbuf benchmark report",
        "",
        "Every table below comes from one run of `benchmarks/run_all.py` (`RUNS` names the",
        "command of each), which measured jaxbuf and its peers in the same process, taking",
        "turns. Each table's header names its machine, CPU or GPU, threads, Python, JAX, jaxbuf",
        "and the peers' versions; its text block gives the shapes. Read the ratios: absolute",
        "times move with the machine's load. Reproduce with `python -m benchmarks.run_all`",
        "(`--quick` for a smoke run).",
        "",
    ]
    found = tables(folder)
    for backend in sorted(found, key=lambda b: (b != "cpu", b)):
        lines += ["", f"## {SECTIONS[backend]}", ""]
        for table in found[backend]:
            text = table.read_text()
            lines += ["", "##" + text if text.startswith("# ") else text, ""]
            for plot in drawn.get(table.stem, []):
                lines += [f"![{plot}]({plot})", ""]
    path = folder / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    print("wrote", report(pathlib.Path(parser.parse_args().out)))


if __name__ == "__main__":
    main()
