"""The package's layout: no module of `jaxbuf/` imports one that imports it back."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parent.parent / "jaxbuf"


def imports_of(path: pathlib.Path) -> set[str]:
    """The `jaxbuf` modules a module imports (`from jaxbuf import _x`, `from jaxbuf._x
    import y`, `import jaxbuf._x`), anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "jaxbuf":
                found |= {f"jaxbuf.{alias.name}" for alias in node.names}
            elif node.module.startswith("jaxbuf."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("jaxbuf.")}
    return found


def graph() -> dict[str, set[str]]:
    modules = {f"jaxbuf.{path.stem}": path for path in PACKAGE.glob("*.py")}
    modules.pop("jaxbuf.__init__")
    return {name: imports_of(path) & modules.keys() for name, path in modules.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk (each reported once per entry)."""
    found, done = [], set()

    def walk(name: str, trail: list[str]) -> None:
        if name in trail:
            found.append([*trail[trail.index(name) :], name])
            return
        if name in done:
            return
        for other in sorted(edges.get(name, ())):
            walk(other, [*trail, name])
        done.add(name)

    for name in sorted(edges):
        walk(name, [])
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert len(graph()) > 20
    assert circles(graph()) == []


def test_the_circle_check_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c", "a"]]
    assert imports_of(PACKAGE / "_sumtree.py") >= {"jaxbuf._sumtree_blocks"}
