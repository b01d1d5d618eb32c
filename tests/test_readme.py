"""The Python examples of the README and of the documentation pages run as written.

The README's run in order; the pages' run in the order of the site's navigation, in one
namespace (a page may use what an earlier page made, as a reader going through them would).
"""

import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
# pages docs/hooks/site.py generates from files outside docs/
GENERATED = ("notebooks/", "results/")


def python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


def pages(nav) -> list[str]:
    """The markdown files of the site's navigation, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in pages(value)]
    return [page for item in nav for page in pages(item)]


def test_readme_has_examples():
    assert len(python_blocks(README)) >= 1


def test_readme_examples_run_in_order():
    namespace: dict = {}
    for block in python_blocks(README):
        exec(compile(block, str(README), "exec"), namespace)


def test_documentation_examples_run_in_order():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    namespace: dict = {}
    count = 0
    for page in pages(nav):
        if page.startswith(GENERATED):
            continue  # notebooks (run by test_notebooks.py) and benchmark tables
        path = ROOT / "docs" / page
        for block in python_blocks(path):
            exec(compile(block, str(path), "exec"), namespace)
            count += 1
    assert count >= 10
