"""The public names of a namespace, written once: its `if TYPE_CHECKING:` imports.

Each public namespace (`jaxbuf`, `jaxbuf.types`, `jaxbuf.io`, `jaxbuf.rl`, `jaxbuf.envs`)
lists its names as `from jaxbuf.<module> import name as name` lines under `if
TYPE_CHECKING:`: what pyright and the API reference read. `attach(__name__, __file__)`
reads those same lines (`ast`, once, at the namespace's import) and returns the
namespace's `__getattr__`, `__dir__` and `__all__`: a name's module is imported on first
use (PEP 562), so a process that needs one corner of the library (an actor's
`jaxbuf.ray.Writer`) does not import JAX, Flax and every buffer kind.

jaxbuf 0.3 had all 69 names at the top level; 0.4 keeps there what a training script
calls, and `moved_from_top_level` answers a 0.3 name with its 0.4 home, warning once.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

NAMESPACES = ("jaxbuf.types", "jaxbuf.io", "jaxbuf.rl", "jaxbuf.envs")
_WARNED: set[str] = set()


def homes(path: str | pathlib.Path) -> dict[str, str]:
    """name -> defining module, from the `if TYPE_CHECKING:` imports of the file at `path`."""
    tree = ast.parse(pathlib.Path(path).read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        found[alias.asname or alias.name] = statement.module
    return found


def attach(
    namespace: str, path: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`(__getattr__, __dir__, __all__)` for the namespace module `namespace` at `path`."""
    table = homes(path)
    module = importlib.import_module(namespace)

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home is None:
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *table})

    return __getattr__, __dir__, sorted(table)


@functools.cache
def _namespace_homes(namespace: str) -> dict[str, str]:
    spec = importlib.util.find_spec(namespace)
    assert spec is not None and spec.origin is not None, namespace
    return homes(spec.origin)


def moved_home(name: str) -> str | None:
    """The 0.4 namespace of a 0.3 top-level name that moved out of the top level, or None."""
    return next((ns for ns in NAMESPACES if name in _namespace_homes(ns)), None)


def moved_from_top_level(name: str) -> Any:
    """A 0.3 top-level name at its 0.4 home (`moved_home`), with a `DeprecationWarning`
    that names the new home, once per name."""
    namespace = moved_home(name)
    assert namespace is not None, name
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(
            f"jaxbuf.{name} moved to {namespace}.{name} (jaxbuf 0.4); the top-level name goes "
            f"in 0.5. Write `{namespace}.{name}` (or `from {namespace} import {name}`).",
            DeprecationWarning,
            stacklevel=3,
        )
    return getattr(importlib.import_module(namespace), name)
