"""CleanRL's files, read at run time out of its released wheel on the package registry.

The repository holds no CleanRL file. `fetch(folder)` downloads the wheel of release
`RELEASE` (`pip download --no-deps --only-binary=:all: --python-version 3.10 cleanrl==1.2.0`:
the wheel declares Python below 3.11, so pip is told which Python to download for), checks the
wheel's SHA-256 against `WHEEL_SHA256`, and writes out of it the files a run needs:

- `cleanrl/dqn_atari_jax.py`, checked against `SCRIPT_SHA256` as well;
- the `cleanrl_utils/` package (the script imports its evaluation under `--save-model`);
- CleanRL's `LICENSE` (MIT), from the wheel's metadata folder.

Each written file is checked against the SHA-256 that the wheel's own `RECORD` lists. Release
1.2.0's script takes its replay buffer and Atari wrappers from Stable-Baselines3
(`stable_baselines3.common.buffers.ReplayBuffer`, `...atari_wrappers`), which the `atari` extra
installs. A registry that cannot be reached, or a file whose hash differs, raises: nothing falls
back to another copy.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import pathlib
import subprocess
import sys
import zipfile

RELEASE = "1.2.0"
WHEEL = f"cleanrl-{RELEASE}-py3-none-any.whl"
WHEEL_SHA256 = "002f6dac6cd0efb5889cd9096a252da1b4bc98a8f52ccb1f47a7215c18b30369"
SCRIPT = "cleanrl/dqn_atari_jax.py"
SCRIPT_SHA256 = "5499c733d446251448c161fd422d30132db2049bca08ffb8dbb6d7e2c06e77e3"
LICENSE = f"cleanrl-{RELEASE}.dist-info/LICENSE"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(folder: pathlib.Path) -> pathlib.Path:
    """The release's wheel in `folder`, downloaded by this interpreter's pip and checked by hash."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.10", "--dest", str(folder),
               f"cleanrl=={RELEASE}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = folder / WHEEL
    if done.returncode != 0 or not wheel.exists():
        raise RuntimeError(f"could not download CleanRL {RELEASE}'s wheel from the package "
                           f"registry ({' '.join(command)}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")  # fmt: skip
    found = sha256(wheel.read_bytes())
    if found != WHEEL_SHA256:
        raise ValueError(f"{wheel} has SHA-256 {found}, expected {WHEEL_SHA256} "
                         f"(CleanRL {RELEASE})")  # fmt: skip
    return wheel


def recorded_hashes(wheel: zipfile.ZipFile) -> dict[str, str]:
    """path -> hex SHA-256, from the wheel's RECORD (which writes them as url-safe base64)."""
    record = wheel.read(f"cleanrl-{RELEASE}.dist-info/RECORD").decode()
    hashes = {}
    for path, digest, _ in csv.reader(io.StringIO(record)):
        if digest.startswith("sha256="):
            encoded = digest.removeprefix("sha256=")
            raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            hashes[path] = raw.hex()
    return hashes


def extract(wheel_path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """Writes the script, `cleanrl_utils/` and the license into `folder`, each checked
    against the wheel's RECORD (the script against `SCRIPT_SHA256` too); returns the script."""
    with zipfile.ZipFile(wheel_path) as wheel:
        hashes = recorded_hashes(wheel)
        names = [SCRIPT, LICENSE] + [n for n in wheel.namelist() if n.startswith("cleanrl_utils/")]
        for name in names:
            data = wheel.read(name)
            if sha256(data) != hashes.get(name):
                raise ValueError(f"{name} in {wheel_path.name} does not match its RECORD hash")
            target = folder / ("LICENSE" if name == LICENSE else name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    if sha256((folder / SCRIPT).read_bytes()) != SCRIPT_SHA256:
        raise ValueError(f"{SCRIPT} is not CleanRL {RELEASE}'s")
    return folder / SCRIPT


def fetch(folder: pathlib.Path) -> pathlib.Path:
    """Downloads the release into `folder/wheel/` and writes its files into `folder`;
    returns the script's path."""
    (folder / "wheel").mkdir(parents=True, exist_ok=True)
    return extract(download(folder / "wheel"), folder)
