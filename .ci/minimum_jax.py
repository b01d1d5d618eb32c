"""Prints pip constraints for the minimum-JAX environment of `.ci/run`: jax and jaxlib
pinned to the minimum that pyproject.toml declares, so CI tests the range the package claims.

orbax-checkpoint (which flax and the checkpoint tests bring) is held to 0.11.22, the oldest
that Brax 0.13+ and MuJoCo Playground 0.1+ accept, so that the resolver does not pair the
old JAX with a newer orbax that declares `jax>=0.5.0` but calls what JAX added in 0.6
(`jax.monitoring.record_scalar`, orbax 0.11.24).
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
ORBAX_WITH_OLDEST_JAX = "0.11.22"


def minimum(requirements: list[str], name: str) -> str:
    for requirement in requirements:
        found = re.fullmatch(rf"{name}\s*>=\s*([0-9][0-9.]*)", requirement.strip())
        if found:
            return found.group(1)
    sys.exit(f"pyproject.toml declares no '{name}>=X' dependency")


if __name__ == "__main__":
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("jax", "jaxlib"):
        print(f"{name}=={minimum(dependencies, name)}")
    print(f"orbax-checkpoint=={ORBAX_WITH_OLDEST_JAX}")
