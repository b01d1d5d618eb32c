"""The documentation site builds in strict mode and fetches nothing from the network."""

import inspect
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jaxbuf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_api_reference_lists_every_public_name_once():
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    listed = [
        name
        for page in pages
        for name in re.findall(r"^::: jaxbuf\.(\w+)$", page.read_text(), re.M)
    ]
    assert sorted(listed) == sorted(jaxbuf.__all__)
    index = (ROOT / "docs" / "api" / "index.md").read_text()
    assert all(f"`{name}`" in index for name in jaxbuf.__all__)


def test_site_builds_strictly_and_offline(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    pages = list(tmp_path.rglob("*.html"))
    assert {"index.html", "404.html"} <= {p.name for p in pages}
    api = (tmp_path / "api" / "buffers" / "index.html").read_text()
    assert 'id="jaxbuf.make_replay_buffer"' in api and "sample_batch_size" in api
    assert 'id="jaxbuf.hindsight"' in (tmp_path / "api" / "samplers" / "index.html").read_text()
    # The notebooks with their committed outputs, the benchmark tables and plots (docs/hooks).
    for book in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(book.read_text())["cells"]
        pngs = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))
        page = (tmp_path / "notebooks" / book.stem / "index.html").read_text()
        assert page.count('<img alt="output" src="cell') == pngs >= 1, book.name
        assert len(list((tmp_path / "notebooks" / book.stem).glob("cell*.png"))) == pngs
    for table in (ROOT / "benchmarks" / "results").glob("*_cpu.md"):
        assert (tmp_path / "results" / table.stem / "index.html").exists(), table.name
    performance = (tmp_path / "performance" / "index.html").read_text()
    for plot in re.findall(r'src="\.\./(plots/[\w.]+\.png)"', performance):
        assert (tmp_path / plot).exists(), plot
    assert performance.count('src="../plots/') >= 5
    # Scripts, styles, fonts and images are all local: nothing to fetch when reading offline.
    fetched = re.compile(r'<(?:script|img|link)[^>]+(?:src|href)="(https?:)?//', re.IGNORECASE)
    remote = [p.name for p in pages if fetched.search(p.read_text())]
    assert not remote, remote


def test_returns_figure_shows_what_its_page_says(tmp_path):
    """docs/figures/returns.py: with exact values only truncation-aware targets equal them."""
    sys.path.insert(0, str(ROOT / "docs" / "figures"))
    try:
        import returns as figure
    finally:
        sys.path.pop(0)
    lines = figure.three_ways()
    exact = lines["values (exact)"]
    np.testing.assert_allclose(lines["truncation bootstraps (jaxbuf)"], exact, rtol=1e-5)
    first, second = slice(0, figure.TRUNCATED_AT + 1), slice(figure.TRUNCATED_AT + 1, None)
    as_termination = lines["truncation as termination"]
    assert as_termination[figure.TRUNCATED_AT] == 1.0 and np.all(as_termination[first] < 6)
    np.testing.assert_allclose(as_termination[second], exact[second], rtol=1e-5)
    ignored = lines["episode ends ignored"]
    assert ignored[figure.TERMINATED_AT] > 9 and np.all(ignored[first] < 9.5)
    figure.draw(tmp_path / "returns.svg")
    # Redrawn, it is an SVG like the committed one (bytes differ between matplotlib versions).
    for svg in (tmp_path / "returns.svg", ROOT / "docs" / "figures" / "returns.svg"):
        assert "<svg" in svg.read_text()[:1000] and svg.stat().st_size > 10_000


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Chromium (apt install chromium)"
)
def test_screenshots_script_renders_the_site_offline(tmp_path):
    """docs/screenshots.py: each page is the site's (not an error page) and not blank."""
    result = subprocess.run(
        [sys.executable, "docs/screenshots.py", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        p.name for p in (ROOT / "docs" / "screenshots").glob("*.png")
    )


def test_returns_sections_read_as_prose():
    """A colon in a Returns section's first line would make its start the rendered type."""
    offenders = []
    for path in sorted((ROOT / "jaxbuf").rglob("*.py")):
        for first in re.findall(r"\n\s*Returns:\n\s*(.*)", path.read_text()):
            if ":" in re.sub(r"`[^`]*`", "", first):
                offenders.append(f"{path.name}: {first}")
    assert not offenders, offenders


def test_every_public_name_and_method_has_a_docstring():
    """mkdocstrings leaves an undocumented member out silently; this makes it an error."""
    missing = []
    for name in jaxbuf.__all__:
        obj = getattr(jaxbuf, name)
        if not callable(obj):  # constants (STEP_KEYS) are described where they are used
            continue
        doc = inspect.getdoc(obj) or ""
        if not doc or doc.startswith(f"{name}("):  # a dataclass's generated signature
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if not member.startswith("_") and inspect.isfunction(value) and not value.__doc__:
                    missing.append(f"{name}.{member}")
    assert not missing, missing
