"""The documentation site builds in strict mode and fetches nothing from the network."""

import importlib.util
import inspect
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from helpers import public_names, resolve
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[1]


def docs_script(path: str):
    """Imports a script under docs/ as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, ROOT / "docs" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_lists_every_public_name_once():
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    listed = [
        name
        for page in pages
        for name in re.findall(r"^::: (jaxbuf\.[\w.]+)$", page.read_text(), re.M)
    ]
    assert sorted(listed) == sorted(public_names())
    # the index names each: the top level's in its first section, a submodule's in the
    # item that names the submodule
    index = (ROOT / "docs" / "api" / "index.md").read_text()
    top, submodules = index.split("## The named submodules")
    items = {re.match(r"- `([\w.]+)`", item).group(1): item
             for item in re.split(r"\n(?=- )", submodules) if item.startswith("- `")}  # fmt: skip

    def listing(name: str) -> str:
        return top if name.count(".") == 1 else items.get(name.rsplit(".", 1)[0], "")

    missing = [n for n in public_names() if f"`{n.rsplit('.', 1)[1]}`" not in listing(n)]
    assert not missing, missing


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
    for table in (ROOT / "benchmarks" / "results").glob("*_[cg]pu.md"):
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
    figure = docs_script("figures/returns.py")
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


def test_screenshots_script_checks_what_the_browser_rendered(tmp_path, monkeypatch):
    """docs/screenshots.py, with a stand-in for Chromium (CI has none; run the script by hand
    where it is installed): every page it asks for is served from the built site and names
    jaxbuf in its title; Chromium's error page and a blank screenshot each fail the run."""
    screenshots = docs_script("screenshots.py")
    site, committed = tmp_path / "site", ROOT / "docs" / "screenshots"
    screenshots.build(site)
    asked = []

    def browser(executable, *arguments):  # reads pages over HTTP, as Chromium would
        if "--dump-dom" in arguments:
            asked.append(arguments[-1])
            with urllib.request.urlopen(arguments[-1], timeout=30) as page:
                return page.read().decode()
        shot = next(a.split("=", 1)[1] for a in arguments if a.startswith("--screenshot="))
        shutil.copy(committed / "index.png", shot)
        return ""

    monkeypatch.setattr(screenshots, "chromium", browser)
    screenshots.render_all("chromium", site, tmp_path / "out")
    assert len(asked) == len(screenshots.PAGES)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == sorted(
        name for name, _, _ in screenshots.PAGES
    )
    assert sorted(p.name for p in committed.glob("*.png")) == sorted(
        name for name, _, _ in screenshots.PAGES
    )
    for png in committed.glob("*.png"):  # the committed screenshots are rendered pages
        screenshots.check(png)
    error_page = "<html><head><title>127.0.0.1</title></head>No internet</html>"
    monkeypatch.setattr(screenshots, "chromium", lambda *a: error_page if "--dump-dom" in a else "")
    with pytest.raises(SystemExit, match="did not render the site"):
        screenshots.render_all("chromium", site, tmp_path / "failed")
    Image.new("RGB", (200, 100), "white").save(tmp_path / "blank.png")
    with pytest.raises(SystemExit, match="looks blank"):
        screenshots.check(tmp_path / "blank.png")


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
    for name in public_names():
        obj = resolve(name)
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
