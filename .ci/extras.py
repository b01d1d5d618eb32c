"""Checks the install table of `docs/install.md` against `pyproject.toml`'s extras.

Each row's command is resolved from scratch with uv's resolver (`uv pip compile`, about a
second a row where `pip install --dry-run` downloads and unpacks wheels for minutes), with
this machine's pip settings (`uv_flags.py`). A row fails unless it resolves, its JAX falls
in the "allows" column, every package its last column names is in the resolution, and no
CUDA package is. The table must name every extra in `pyproject.toml` and no other.

Usage: `python3 .ci/extras.py UV PIP` (uv's and pip's executables); prints one line a row.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA = re.compile(r"^(nvidia-|cuda-|triton)")


def rows(text: str) -> list[dict]:
    """The table under "## By use": each row's extra ('' for the core), allowed JAX
    and named packages."""
    table = text.split("## By use", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[1].startswith("`pip install"):
            continue
        extra = re.search(r"\[([\w,-]+)\]", cells[1])
        found.append({
            "extra": extra.group(1) if extra else "",
            "allows": cells[2].strip("`"),
            "resolves": cells[3],
            "packages": re.findall(r"`([\w.-]+)`", cells[4]),
        })  # fmt: skip
    return found


def resolve(uv: str, flags: list[str], extra: str) -> dict[str, str]:
    """name -> version of everything `pyproject.toml` with `extra` resolves to."""
    command = [uv, "pip", "compile", str(ROOT / "pyproject.toml"), "--python-version", "3.11",
               "--quiet", "--no-header", "--no-annotate", *flags]  # fmt: skip
    if extra:
        command += ["--extra", extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"[{extra}] does not resolve:\n{done.stderr}")
    pins = (line.split("==") for line in done.stdout.split() if "==" in line)
    return {name.lower(): version for name, version in pins}


def in_range(version: str, allows: str) -> bool:
    """Whether `version` (such as 0.10.2) meets every `>=x` and `<y` of `allows`."""
    number = tuple(int(part) for part in version.split(".")[:3])
    for operator, bound in re.findall(r"(>=|<)([\d.]+)", allows):
        limit = tuple(int(part) for part in bound.split("."))
        if (number < limit) if operator == ">=" else (number >= limit):
            return False
    return True


def check(uv: str, pip: str) -> list[str]:
    """The problems found, one line each."""
    flags = subprocess.run([sys.executable, str(ROOT / ".ci/uv_flags.py"), pip],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    table = rows((ROOT / "docs/install.md").read_text())
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(extras["optional-dependencies"]) | {""}
    named = {row["extra"] for row in table}
    problems = [f"extra [{e}] is not in the table" for e in sorted(declared - named)]
    for row in table:
        extra = row["extra"]
        if extra not in declared:
            problems.append(f"the table names [{extra}], which pyproject.toml lacks")
            continue
        pins = resolve(uv, flags, extra)
        jax = pins.get("jax", "none")
        print(f"[{extra}] jax {jax}, {len(pins)} packages")
        if not in_range(jax, row["allows"]):
            problems.append(f"[{extra}] resolves jax {jax}, outside {row['allows']}")
        if jax != row["resolves"]:  # a newer release: the table should say so, not fail CI
            print(f"  note: the table says it resolves jax {row['resolves']}")
        problems += [f"[{extra}] lacks {name}" for name in row["packages"]
                     if name.lower() not in pins]  # fmt: skip
        problems += [f"[{extra}] pulls {name} (CUDA)" for name in pins if CUDA.match(name)]
    return problems


if __name__ == "__main__":
    found = check(*sys.argv[1:3])
    print("\n".join(found) or "every row resolves as the table says")
    raise SystemExit(1 if found else 0)
