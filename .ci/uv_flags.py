"""Prints the `uv pip install` flags that make uv install what pip would on this machine.

`.ci/run` installs its environments with uv (a resolver and installer that downloads and
unpacks in parallel: the main environment in about 40 s where pip takes about 170 s, most
of pip's on one core). pip's settings here (`pip config list`: find-links, extra indexes,
constraints, from pip.conf or PIP_* variables) are passed on, and, as pip does, uv picks
the best version across all indexes (`unsafe-best-match`), not the first index's.

Usage: `python3 .ci/uv_flags.py PIP` where PIP is a pip executable; one flag per line.
"""

import shlex
import subprocess
import sys

FLAGS = {"find-links": "--find-links", "index-url": "--index-url",
         "extra-index-url": "--extra-index-url", "constraint": "--constraint"}  # fmt: skip


def settings(pip: str) -> list[tuple[str, str]]:
    """(key, value) pairs of `pip config list`, such as ('find-links', '/opt/wheels')."""
    listed = subprocess.run([pip, "config", "list"], capture_output=True, text=True, check=True)
    pairs = []
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        pairs.append((key.rsplit(".", 1)[-1], " ".join(shlex.split(value))))
    return pairs


def flags(pairs: list[tuple[str, str]]) -> list[str]:
    """Each setting's values (pip separates several by spaces) as uv's flags, each once."""
    pairs_once = dict.fromkeys((FLAGS[key], item) for key, value in pairs if key in FLAGS
                               for item in value.split())  # fmt: skip
    out = [part for pair in pairs_once for part in pair]
    if "--extra-index-url" in out or "--find-links" in out:
        out += ["--index-strategy", "unsafe-best-match"]
    return out


if __name__ == "__main__":
    print("\n".join(flags(settings(sys.argv[1]))))
