"""The package's floor plan, read from its source: where platform choices and size switches
live (docs/architecture.md)."""

from __future__ import annotations

import ast
import functools
import pathlib

import jaxbuf
from jaxbuf import _lowering

PACKAGE = pathlib.Path(jaxbuf.__file__).parent
SEAM = PACKAGE / "_lowering.py"


@functools.cache
def modules() -> dict[pathlib.Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def platform_calls(tree: ast.Module) -> list[int]:
    """Lines that name `platform_dependent` in code (not in a docstring)."""
    names = ((node, getattr(node, "attr", getattr(node, "id", None))) for node in ast.walk(tree))
    return [node.lineno for node, name in names if name == "platform_dependent"]


def size_literals(tree: ast.Module) -> list[str]:
    """Comparisons with an integer literal of 16 or more: a size switch written in place."""

    def literal(side: ast.expr) -> bool:
        return isinstance(side, ast.Constant) and type(side.value) is int and side.value >= 16

    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(map(literal, (node.left, *node.comparators)))]  # fmt: skip


def test_only_the_lowering_seam_asks_for_the_platform_or_writes_a_size_switch():
    """`platform_dependent` appears in one module, `_lowering`, and no other module
    compares a size with a literal: every switch is a named constant of the seam."""
    found = {path.relative_to(PACKAGE).as_posix(): (platform_calls(tree), size_literals(tree))
             for path, tree in modules().items()}  # fmt: skip
    assert {name for name, (calls, _) in found.items() if calls} == {"_lowering.py"}
    assert {name: sizes for name, (_, sizes) in found.items() if sizes} == {}
    switches = {"SMALL", "PAIRS", "WIDE_ROW", "FEW_ROWS", "ROW_SLICES", "LEVELS"}
    assert switches <= set(vars(_lowering))
    for path, tree in modules().items():
        if path != SEAM:
            assigned = {target.id for node in tree.body if isinstance(node, ast.Assign)
                        for target in node.targets if isinstance(target, ast.Name)}  # fmt: skip
            assert not assigned & switches, (path, assigned & switches)


def test_the_checks_find_what_they_look_for():
    tree = ast.parse('"""platform_dependent"""\nx = jax.lax.platform_dependent(cpu=f)\n'
                     "if count <= 1024:\n    pass\nif n > 3:\n    pass\n")  # fmt: skip
    assert platform_calls(tree) == [2]
    assert size_literals(tree) == ["count <= 1024"]
