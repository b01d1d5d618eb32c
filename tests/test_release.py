"""A stranger's install: the built wheel, in a fresh virtual environment, runs the quickstart.

`python -m build` makes the sdist and the wheel, `twine check` reads their metadata as PyPI
would, both carry the Apache-2.0 `LICENSE` that the metadata names, and the version in
`jaxbuf/_version.py`, the newest `CHANGELOG.md` entry, the built file names and the
documentation all agree.
"""

import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile

import jaxbuf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*command, cwd, timeout=900):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def source(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the checkout's sources to build from: a build writes `build/` and
    `jaxbuf.egg-info` beside its sources, and the two build tests (and CI's editable
    installs) run at the same time."""
    ignored = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                     "__pycache__", ".*_cache", "logs")  # fmt: skip
    return pathlib.Path(shutil.copytree(ROOT, tmp_path / "source", ignore=ignored))


def test_version_changelog_and_docs_agree():
    releases = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases[0] == jaxbuf.__version__, (releases, jaxbuf.__version__)
    assert len(set(releases)) == len(releases), releases
    index = (ROOT / "docs" / "index.md").read_text()
    assert f"jaxbuf {jaxbuf.__version__}" in index
    assert (ROOT / "docs" / "changelog.md").read_text().strip() == '--8<-- "CHANGELOG.md"'


def test_build_and_twine_check(tmp_path):
    """`python -m build` makes the sdist and the wheel (from the sdist), named for the
    version, `twine check --strict` passes both, and both carry `LICENSE` as it is in the
    checkout (the wheel under `licenses/`, named in its metadata). (With the next test, this
    was one test: build, check, install.)"""
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "-q", "--outdir", str(dist), str(source(tmp_path)),
        cwd=tmp_path)  # fmt: skip
    version = jaxbuf.__version__
    built = sorted(p.name for p in dist.iterdir())
    assert built == [f"jaxbuf-{version}-py3-none-any.whl", f"jaxbuf-{version}.tar.gz"], built
    checked = run(sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir()),
                  cwd=tmp_path)  # fmt: skip
    assert checked.count("PASSED") == 2, checked
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    with zipfile.ZipFile(dist / built[0]) as wheel:
        carried = wheel.read(f"jaxbuf-{version}.dist-info/licenses/LICENSE").decode()
        metadata = wheel.read(f"jaxbuf-{version}.dist-info/METADATA").decode()
    assert carried == license_text
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    with tarfile.open(dist / built[1]) as sdist:
        member = sdist.extractfile(f"jaxbuf-{version}/LICENSE")
        assert member is not None and member.read().decode() == license_text


def test_a_fresh_install_of_the_wheel_runs_the_quickstart(tmp_path):
    """The wheel, installed with its dependencies into a fresh virtual environment (as a
    stranger's `pip install` would, less the byte compilation, which Python does at the
    first import), runs the README's quickstart from the wheel.

    The isolated build of both files is the previous test's: this wheel is built with
    the setuptools of the test environment (`--no-isolation`, 2 s rather than 8), and the
    environment is made without pip of its own and filled by this pip (`--python`: no
    `ensurepip`, 0.4 s rather than 10)."""
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "-q", "--wheel", "--no-isolation", "--outdir", str(dist),
        str(source(tmp_path)), cwd=tmp_path)  # fmt: skip
    version = jaxbuf.__version__
    wheel = dist / f"jaxbuf-{version}-py3-none-any.whl"
    assert wheel.exists(), list(dist.iterdir())
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
        str(wheel), cwd=tmp_path)  # fmt: skip
    quickstart = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)[0]
    (tmp_path / "quickstart.py").write_text(quickstart + "\nprint(jaxbuf.__file__)\n")
    where = run(str(python), "quickstart.py", cwd=tmp_path)  # not the checkout: the wheel
    assert str(tmp_path / "env") in where and str(ROOT) not in where
    installed = run(str(python), "-c", "import importlib.metadata as m; print(m.version('jaxbuf'))",
                    cwd=tmp_path)  # fmt: skip
    assert installed.strip() == version
