"""The package's floor plan (docs/architecture.md), read from its source: wings that import
only the wings below them, no import circle, and one lowering seam."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

from jaxbuf.core import lowering as _lowering

PACKAGE = pathlib.Path(__file__).parent.parent / "jaxbuf"
SEAM = "jaxbuf.core.lowering"
# Each wing imports its own and those of lower rank only; the package's `__init__`, its public
# namespaces (`types`, `envs`), `brax` and the examples sit above every wing; `ray` (the
# writer, inbox, ingest and ledger of actors in other processes) and `flashbax` (Flashbax's
# API over the kinds) are the top wings.
RANKS = {"core": 0, "options": 1, "rl": 1, "kinds": 2, "transforms": 3, "io": 4, "loop": 5,
         "ray": 6, "flashbax": 6}  # fmt: skip
TOP = 7


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def sources() -> dict[str, ast.Module]:
    """Every module of the package (the examples aside), by dotted name."""
    return {module_name(path): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))
            if "examples" not in path.parts}  # fmt: skip


def imports_of(tree: ast.Module) -> set[str]:
    """The `jaxbuf` modules a module imports (`from jaxbuf.x import y` counts `jaxbuf.x.y`
    where that is a module, else `jaxbuf.x`), anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "jaxbuf" or node.module.startswith("jaxbuf."):
                named = {f"{node.module}.{alias.name}" for alias in node.names}
                found |= named & set(sources()) or {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("jaxbuf.")}
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (packages' `__init__` left out)."""
    modules = {name for name, tree in sources().items() if name != "jaxbuf"}
    return {name: (imports_of(tree) & modules) - {name} for name, tree in sources().items()
            if name in modules}  # fmt: skip


def rank(module: str) -> int:
    """A module's wing's rank (a wing's package too); `TOP` outside the wings, but the
    version string and the reader of public listings (`_public`, which imports no jaxbuf
    module by name), which any module may import."""
    if module in ("jaxbuf._version", "jaxbuf._public"):
        return 0
    return RANKS.get(module.split(".")[1], TOP)


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
    assert len(graph()) > 40
    assert circles(graph()) == []


def test_the_circle_check_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c", "a"]]
    assert "jaxbuf.core.sumtree.blocks" in graph()["jaxbuf.core.sumtree.tree"]


def test_every_module_sits_in_a_wing_and_imports_none_above_it():
    """The core imports nothing outside the core, options and rl the core only, kinds
    the core, options and rl; no module imports one of a higher wing."""
    wings = {name.split(".")[1] for name in graph() if name.count(".") >= 2}
    assert wings == set(RANKS)
    flat = {name for name in graph() if name.count(".") == 1 and name.split(".")[1] not in RANKS}
    assert flat == {"jaxbuf._version", "jaxbuf._public", "jaxbuf.brax", "jaxbuf.types",
                    "jaxbuf.envs"}, flat  # fmt: skip
    upward = [f"{module} imports {other}" for module, others in graph().items()
              for other in others if rank(other) > rank(module)]  # fmt: skip
    assert upward == []
    assert rank("jaxbuf.core.assembly") < rank("jaxbuf.options.goals")


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
    """`platform_dependent` appears in one module, the seam, and no other module compares
    a size with a literal or defines a switch: each is a named constant of the seam."""
    found = {name: (platform_calls(tree), size_literals(tree)) for name, tree in sources().items()}
    assert {name for name, (calls, _) in found.items() if calls} == {SEAM}
    assert {name: sizes for name, (_, sizes) in found.items() if sizes} == {}
    switches = {"SMALL", "PAIRS", "WIDE_ROW", "FEW_ROWS", "ROW_SLICES", "LEVELS"}
    assert switches <= set(vars(_lowering))
    for name, tree in sources().items():
        assigned = {target.id for node in tree.body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)}  # fmt: skip
        assert name == SEAM or not assigned & switches, (name, assigned & switches)


def test_the_seam_checks_find_what_they_look_for():
    tree = ast.parse('"""platform_dependent"""\nx = jax.lax.platform_dependent(cpu=f)\n'
                     "if count <= 1024:\n    pass\nif n > 3:\n    pass\n")  # fmt: skip
    assert platform_calls(tree) == [2]
    assert size_literals(tree) == ["count <= 1024"]


def test_the_architecture_page_names_every_wing_and_module():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(\w+)/?`", page))
    missing = [name for name in graph()
               if name.split(".")[1] in RANKS and name.split(".")[-1] not in named]  # fmt: skip
    assert missing == []
