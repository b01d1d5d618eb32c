"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples():
    assert len(python_blocks()) >= 4


def test_readme_examples_run_in_order():
    namespace: dict = {}
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
