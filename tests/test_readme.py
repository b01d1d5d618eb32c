"""The Python examples of the README and of the documentation pages run as written.

The README's run in order; each page's run in order in a namespace of its own, as a reader
pasting one page's code into a fresh interpreter would run them.
"""

import pathlib
import re

import pytest
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


def documented_pages() -> list[str]:
    """The site's pages holding Python examples, in the order of its navigation (notebooks
    run in test_notebooks.py; benchmark tables hold none)."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [page for page in pages(nav)
            if not page.startswith(GENERATED) and python_blocks(ROOT / "docs" / page)]  # fmt: skip


def test_the_documentation_has_examples():
    assert sum(len(python_blocks(ROOT / "docs" / page)) for page in documented_pages()) >= 10


# Ray starts its processes with subprocess's preexec_fn, which runs fork handlers: JAX's
# warns that a fork after its backend started may deadlock; the child runs exec at once.
RAY_FORK = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


@pytest.mark.parametrize("page", [pytest.param(page, marks=RAY_FORK) if page == "ray.md" else page
                                  for page in documented_pages()])  # fmt: skip
def test_each_page_runs_standalone(page):
    namespace: dict = {"__name__": f"docs_{pathlib.Path(page).stem}"}
    path = ROOT / "docs" / page
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), namespace)
