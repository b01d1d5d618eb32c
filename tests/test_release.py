"""A stranger's install: the built wheel, in a fresh virtual environment, runs the quickstart."""

import pathlib
import re
import subprocess
import sys
import venv

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*command, cwd, timeout=900):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def test_wheel_installs_into_a_fresh_environment_and_runs_the_quickstart(tmp_path):
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT),
        cwd=tmp_path)  # fmt: skip
    wheel = next(dist.glob("jaxbuf-*.whl"))
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    run(str(python), "-m", "pip", "install", "-q", str(wheel), cwd=tmp_path)
    quickstart = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)[0]
    (tmp_path / "quickstart.py").write_text(quickstart + "\nprint(jaxbuf.__file__)\n")
    where = run(str(python), "quickstart.py", cwd=tmp_path)  # not the checkout: the wheel
    assert str(tmp_path / "env") in where and str(ROOT) not in where
