"""Renders pages of the built site in headless Chromium and saves what a visitor sees.

Run from the repository root (Debian: `apt-get install chromium`):

    python docs/screenshots.py [--out docs/screenshots] [--site DIR]

It builds the site in strict mode (unless `--site` names a built one), serves it on 127.0.0.1,
and points Chromium at each page with every other host name unresolvable, so the screenshots
show the site as an offline reader gets it. Each page is checked to be the site's (its title
names jaxbuf: not Chromium's error page) and each PNG to hold a rendered page, not a blank; the
script exits non-zero otherwise.
"""

import argparse
import contextlib
import functools
import http.server
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
# (file name, page path, window height): the index, one API entry, and pages with figures.
PAGES = [
    ("index.png", "", 1400),
    ("api_buffers.png", "api/buffers/", 1400),
    ("returns.png", "returns/", 2200),
    ("notebook_dqn_per.png", "notebooks/dqn_per/", 2400),
]


def build(site: pathlib.Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)]
    subprocess.run(command, cwd=ROOT, check=True, env=env)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(site: pathlib.Path):
    """An HTTP server of `site` on a free port of 127.0.0.1; yields its base address."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium(browser: str, *arguments: str) -> str:
    """Runs headless Chromium, offline but for 127.0.0.1, with a fresh profile; its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        command = [
            browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--user-data-dir={profile}", "--virtual-time-budget=3000", *arguments,
        ]  # fmt: skip
        result = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    return result.stdout


def screenshot(browser: str, url: str, path: pathlib.Path, height: int) -> None:
    title = re.search(r"<title>(.*?)</title>", chromium(browser, "--dump-dom", url), re.S)
    if title is None or "jaxbuf" not in title.group(1):
        raise SystemExit(f"{url} did not render the site: title {title and title.group(1)!r}")
    chromium(browser, f"--window-size=1280,{height}", f"--screenshot={path}", url)


def check(path: pathlib.Path) -> None:
    """Fails unless `path` is a PNG with many colours (a page, not a blank)."""
    from PIL import Image

    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    if colours is None or len(colours) < 50:
        raise SystemExit(f"{path} looks blank: {0 if colours is None else len(colours)} colours")


def render_all(browser: str, site: pathlib.Path, out: pathlib.Path) -> None:
    """Serves the built `site` and saves a checked screenshot of each of `PAGES` under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with serve(site) as base:
        for name, page, height in PAGES:
            screenshot(browser, base + page, out / name, height)
            check(out / name)
            print(f"{base + page} -> {out / name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--site", type=pathlib.Path, help="a built site (default: build one)")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("Chromium not found: apt-get install chromium")
    with tempfile.TemporaryDirectory() as scratch:
        site = args.site or pathlib.Path(scratch) / "site"
        if args.site is None:
            build(site)
        render_all(browser, site, args.out)


if __name__ == "__main__":
    main()
