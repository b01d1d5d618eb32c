"""The documentation site builds in strict mode and fetches nothing from the network."""

import os
import pathlib
import re
import subprocess
import sys

import jaxbuf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_api_reference_lists_every_public_name():
    listed = re.findall(r"^::: jaxbuf\.(\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M)
    assert sorted(listed) == sorted(jaxbuf.__all__)


def test_site_builds_strictly_and_offline(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    pages = list(tmp_path.rglob("*.html"))
    assert {"index.html", "404.html"} <= {p.name for p in pages}
    api = (tmp_path / "api" / "index.html").read_text()
    assert "make_replay_buffer" in api and "hindsight" in api
    # Scripts, styles, fonts and images are all local: nothing to fetch when reading offline.
    fetched = re.compile(r'<(?:script|img|link)[^>]+(?:src|href)="(https?:)?//', re.IGNORECASE)
    remote = [p.name for p in pages if fetched.search(p.read_text())]
    assert not remote, remote
