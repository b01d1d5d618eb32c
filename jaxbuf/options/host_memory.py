"""The host-memory option: experience leaves kept in host memory, inside jitted `add`
and `sample`.

A buffer made with `host_memory=("obs",)` allocates those leaves in the device's
`pinned_host` memory (`hosted_layout`); the ring writes and reads move only rows
between the memories (`jaxbuf.core.hosted`): a ring's `B` new rows as two windows on
accelerators (where the ring wraps; each read back to merge, then written), row by
row on CPU up to `_lowering.FEW_ROWS` rows. Indices, counters, priorities and every
other leaf stay in device memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from jaxbuf.core import hosted as _hosted
from jaxbuf.core.records import PyTree


def check_names(host_memory: Any) -> tuple[str, ...]:
    """`host_memory` as a tuple of leaf names (None gives `()`); raises naming it."""
    if host_memory is None:
        return ()
    if (
        isinstance(host_memory, str)
        or not isinstance(host_memory, Sequence)
        or not all(isinstance(name, str) for name in host_memory)
    ):
        raise TypeError(
            f"host_memory must be a sequence of leaf names, e.g. ('obs',), got {host_memory!r}."
        )
    return tuple(host_memory)


def check_platform() -> None:
    """Raises unless this JAX places arrays in host memory on the default device."""
    kinds = _memory_kinds()
    if _hosted.SPACE is None or "pinned_host" not in kinds:
        raise ValueError(
            f"host_memory needs JAX's memory kinds (JAX 0.7 or newer, a device with "
            f"'pinned_host' memory); JAX {jax.__version__} on {jax.devices()[0].platform} "
            f"offers {sorted(kinds) or 'none'}."
        )


def _memory_kinds() -> set[str]:
    try:
        return {memory.kind for memory in jax.devices()[0].addressable_memories()}
    except (AttributeError, NotImplementedError):
        return set()


def place(experience: PyTree, names: tuple[str, ...]) -> PyTree:
    """`experience` (a dict of storage leaves by top-level name) with the named
    entries moved to host memory; raises naming a name it lacks."""
    if not names:
        return experience
    keys = sorted(experience) if isinstance(experience, dict) else []
    missing = [name for name in names if name not in keys]
    if missing:
        raise ValueError(
            f"host_memory names {missing}, which the example does not hold (its top-level "
            f"leaves: {keys})."
        )
    moved = {name: jax.device_put(experience[name], _hosted.SPACE.Host) for name in names}
    return {**experience, **moved}


def hosted_layout(layout: Any, names: tuple[str, ...], side: str | None = None) -> Any:
    """`layout` (a `_contracts.Layout`) whose `init` allocates the named experience
    leaves in host memory; its `write` and `expand` keep them there (see
    `_storage.write` and `_storage.read`). With `side` among `names`, the state's
    side ring of that leaf (`state.side.experience`, the transition buffer's final
    observations) goes to host memory too."""
    if not names:
        return layout
    check_platform()

    def placed(example: PyTree) -> Any:
        state = layout.init(example)
        state = state.replace(experience=place(state.experience, names))
        if side in names:
            ring = jax.device_put(state.side.experience, _hosted.SPACE.Host)
            state = state.replace(side=state.side.replace(experience=ring))
        return state

    # Jitted, so that the zeros are made where they stay: never the whole leaf in
    # device memory first.
    return layout._replace(init=lambda example: jax.jit(placed)(example))


def hosted_paths(state: Any, buffer: Any = None) -> set[str]:
    """The paths (`jax.tree_util.keystr`) of a state's leaves in host memory: those
    of `state` that are arrays there, and those the `buffer`'s `host_memory` names
    (for templates without memory kinds: `jax.eval_shape`'s), in every buffer
    state `state` holds (itself, or one inside a training state's dicts, lists
    and records)."""
    config = {} if buffer is None else dict(buffer.config)
    names = tuple(config.get("host_memory", ()))
    inside = tuple(f".experience['{name}']" for name in names)
    if getattr(getattr(buffer, "layout", None), "side_of", None) in names:
        inside += (".side.experience",)  # the side ring that follows a named leaf
    prefixes = tuple(root + path for root in _buffer_states(state) for path in inside)
    found = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = jax.tree_util.keystr(path)
        kind = getattr(getattr(leaf, "sharding", None), "memory_kind", None)
        if kind == "pinned_host" or name.startswith(prefixes):
            found.add(name)
    return found


def _buffer_states(tree: Any) -> list[str]:
    """The paths of the buffer states in `tree` (records with `experience` and
    `position`), `""` for `tree` itself."""

    def is_state(node: Any) -> bool:
        return hasattr(node, "experience") and hasattr(node, "position")

    nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_state)[0]
    return [jax.tree_util.keystr(path) for path, node in nodes if is_state(node)]
