"""Experience leaves kept in host memory, inside jitted `add` and `sample`.

A buffer made with `host_memory=("obs",)` allocates those leaves in the
device's `pinned_host` memory (JAX's memory kinds: GPU and TPU, and the CPU,
where every kind is the same RAM). Only row slices touch them, the form XLA's
host offloader can serve without a copy of the whole array:

- `add` moves the new rows to host memory and writes them one row at a time
  (`dynamic_update_slice`, in place when the state is donated);
- `sample` reads each drawn row with a `dynamic_slice` and moves it to device
  memory: `B` rows cross, never the array.

Indices, counters, priorities and every other leaf stay in device memory.
`_storage.write` and `_storage.read` take this path for any leaf whose type
says host memory (`jax.typeof(leaf).memory_space`), so the layouts need not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf._types import PyTree

_SPACE: Any = getattr(getattr(jax, "memory", None), "Space", None)  # JAX 0.7+


def on_host(leaf: Any) -> bool:
    """Whether a (traced) array lives in host memory."""
    return _SPACE is not None and getattr(jax.typeof(leaf), "memory_space", None) == _SPACE.Host


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
    if _SPACE is None or "pinned_host" not in kinds:
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
    moved = {name: jax.device_put(experience[name], _SPACE.Host) for name in names}
    return {**experience, **moved}


def hosted_layout(layout: Any, names: tuple[str, ...]) -> Any:
    """`layout` (a `_buffers.Layout`) whose `init` allocates the named experience
    leaves in host memory; its `write` and `expand` keep them there (see
    `_storage.write` and `_storage.read`)."""
    if not names:
        return layout
    check_platform()

    def init(example: PyTree) -> Any:
        state = layout.init(example)
        return state.replace(experience=place(state.experience, names))

    return layout._replace(init=init)


def to_host(values: jax.Array) -> jax.Array:
    """`values` moved to host memory (inside jit: the rows an `add` writes)."""
    return jax.device_put(values, _SPACE.Host)


def write_unrolled(column: jax.Array, values: jax.Array, position: jax.Array, where: Any):
    """`values` `[B, ...]` into rows `(position + j) % capacity` of a host column as `B`
    unrolled row updates (an accelerator's form: no `while`, whose iterations would be
    launches driven from the host), each gated on the device side; none where `where`
    is false. The CPU writes the rows in a loop instead (`_storage`)."""
    capacity, out = column.shape[0], column
    for j in range(values.shape[0]):
        at = (position + j) % capacity
        row = values[j : j + 1]
        if where is not None:
            old = jax.device_put(jax.lax.dynamic_slice_in_dim(out, at, 1), _SPACE.Device)
            row = jnp.where(where, row, old)
        out = jax.lax.dynamic_update_slice_in_dim(out, to_host(row), at, 0)
    return out


def read_rows(column: jax.Array, indices: tuple) -> jax.Array:
    """`column[indices]` (the index arrays broadcast together, one per leading axis)
    read row by row out of host memory into device memory: a loop on CPU, unrolled
    row reads elsewhere."""
    lead = jnp.broadcast_shapes(*(jnp.shape(i) for i in indices))
    flat = [jnp.broadcast_to(jnp.asarray(i, jnp.int32), lead).ravel() for i in indices]
    rest = column.shape[len(indices) :]
    count = flat[0].shape[0] if flat else 1
    out = jnp.zeros((count, *rest), column.dtype)

    def row(j: Any) -> jax.Array:
        start = [i[j] for i in flat] + [0] * len(rest)
        one = jax.lax.dynamic_slice(column, start, (1,) * len(indices) + rest)
        return jax.device_put(one, _SPACE.Device).reshape(1, *rest)

    def looped() -> jax.Array:  # CPU: a loop of row reads
        body = lambda j, out: jax.lax.dynamic_update_slice_in_dim(out, row(j), j, 0)  # noqa: E731
        return jax.lax.fori_loop(0, count, body, out)

    def unrolled() -> jax.Array:  # accelerators: `count` row reads, no `while`
        return jnp.concatenate([row(j) for j in range(count)], axis=0)

    rows = jax.lax.platform_dependent(cpu=looped, default=unrolled)
    return rows.reshape(*lead, *rest)
