"""Reads and writes of experience leaves kept in host memory, inside jitted code.

A leaf whose type says host memory (`jax.typeof(leaf).memory_space`, JAX's memory
kinds: GPU and TPU, and the CPU, where every kind is the same RAM) moves between the
memories by rows, never whole, and no gather or scatter on a host array runs in
device code:

- writes go by `dynamic_update_slice` (in place when the state is donated): a time
  ring's steps one column slice each (`write_steps`); scattered rows, such as the
  transition buffer's final observations, one gated row each up to
  `_lowering.ROW_SLICES` rows, more scattered by the host (`compute_on`; `write_at`);
- reads take up to `_lowering.ROW_SLICES` rows with a `dynamic_slice` each and move
  them to device memory; more are gathered by the host (`compute_on`) into one block
  that moves at once (`read_rows`).

Under `vmap` (`vectorize`, `jaxbuf.blocks`) custom batching rules make the batch one
more row index. `_storage` (`write`, `write_times`, `read`, `push_where`) and
`time_ring.gather` take these paths for any leaf in host memory, so the layouts need
not know; the option that places leaves there is `jaxbuf.options.host_memory`.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import lowering as _lowering

SPACE: Any = getattr(getattr(jax, "memory", None), "Space", None)  # JAX 0.7+


def on_host(leaf: Any) -> bool:
    """Whether an array (traced, or an abstract value) lives in host memory."""
    if SPACE is None:
        return False
    try:
        aval = jax.typeof(leaf)
    except TypeError:  # already an abstract value (`jax.jit(...).trace().out_avals`)
        aval = leaf
    return getattr(aval, "memory_space", None) == SPACE.Host


def zeros(shape: tuple, dtype: Any) -> jax.Array:
    """Zeros made in host memory by a jitted call: never whole in device memory."""
    return jax.jit(lambda: to_host(jnp.zeros(shape, dtype)))()


def to_host(values: jax.Array) -> jax.Array:
    """`values` moved to host memory (inside jit: the rows an `add` writes)."""
    return jax.device_put(values, SPACE.Host)


def to_device(values: jax.Array) -> jax.Array:
    """`values` moved to device memory (inside jit: rows read out of host memory)."""
    return jax.device_put(values, SPACE.Device)


def each(count: int, body: Any, carry: Any) -> Any:
    """`carry = body(j, carry)` for `j` in `range(count)`: a loop on CPU; unrolled
    elsewhere, where a `while`'s iterations would be launches driven from the host."""

    def unrolled(carry: Any) -> Any:
        for j in range(count):
            carry = body(j, carry)
        return carry

    looped = lambda carry: jax.lax.fori_loop(0, count, body, carry)  # noqa: E731
    return _lowering.loop_or_unrolled(carry, loop=looped, unrolled=unrolled)


def stacked(size: int, batched: tuple, column: jax.Array, *args: Any) -> tuple:
    """The arguments of a host write under `vmap`, each given the batch's leading
    axis (`None` stays `None`); raises unless the column itself is batched (stacked
    buffers): writes of a batch into one column have no meaning."""
    if not batched[0]:
        raise NotImplementedError(
            "a host-memory leaf written under vmap must be stacked along the vmapped "
            "axis (jaxbuf.vectorize); one column cannot take a batch of writes."
        )
    lead = [x if b or x is None else jnp.broadcast_to(x, (size, *jnp.shape(x)))
            for x, b in zip(args, batched[1:], strict=True)]  # fmt: skip
    return (column, *lead)


@jax.custom_batching.custom_vmap
def write_steps(column: jax.Array, steps: jax.Array, position: jax.Array, where: Any):
    """`steps` `[N, T, ...]` into times `(position + t) % capacity` of a host time ring
    `[N, capacity, ...]`: one slice update of `N` rows per step (a `vmap` would turn
    the slices into a gather and a scatter, which host memory refuses); none where
    `where` is false."""
    capacity = column.shape[1]

    def one(t: Any, column: jax.Array) -> jax.Array:
        at = (position + t) % capacity
        new = jax.lax.dynamic_slice_in_dim(steps, t, 1, axis=1)
        if where is not None:
            old = to_device(jax.lax.dynamic_slice_in_dim(column, at, 1, axis=1))
            new = jnp.where(where, new, old)
        return jax.lax.dynamic_update_slice_in_dim(column, to_host(new), at, axis=1)

    return each(steps.shape[1], one, column)


@write_steps.def_vmap
def _write_steps_batched(size: int, batched: tuple, column, steps, position, where):
    """`write_steps` of stacked buffers: their rows written one by one."""
    column, steps, position, where = stacked(size, batched, column, steps, position, where)
    num_envs, length, capacity = steps.shape[1], steps.shape[2], column.shape[2]
    times = (position[:, None, None] + jnp.arange(length, dtype=jnp.int32)[None, None]) % capacity
    shape = (size, num_envs, length)
    valid = jnp.broadcast_to(True if where is None else where[:, None, None], shape)
    buffers = jnp.arange(size, dtype=jnp.int32)[:, None, None]
    envs = jnp.arange(num_envs, dtype=jnp.int32)[None, :, None]
    return write_at(column, (buffers, envs, times), steps, valid), True


def write_at(column: jax.Array, indices: tuple, values: jax.Array, valid: jax.Array):
    """`column[indices] = values` where `valid`: `indices` (int32, one array per
    leading axis, broadcasting to `valid`'s shape `[*lead]`), `values` `[*lead,
    *row]`. Rows with `valid` false are kept, so indices may repeat among them; the
    valid ones must be distinct.

    Up to `_lowering.ROW_SLICES` rows, row by row (each read back and written, gated on the
    device side); more, a loop of those on CPU and, on accelerators, one scatter
    computed by the host (`compute_on`) with the rows moved there at once: never a
    row write per environment unrolled into the program (4,096 of them for one
    step of 4,096 environments)."""
    return _write_at(column, tuple(indices), values, valid)


@jax.custom_batching.custom_vmap
def _write_at(column: jax.Array, indices: tuple, values: jax.Array, valid: jax.Array):
    lead = jnp.shape(valid)
    flat = [jnp.broadcast_to(i, lead).ravel().astype(jnp.int32) for i in indices]
    keep = jnp.broadcast_to(valid, lead).ravel()
    rows = values.reshape(-1, *values.shape[len(lead) :])
    shape = (1,) * len(indices) + column.shape[len(indices) :]

    def one(j: Any, column: jax.Array) -> jax.Array:
        start = [i[j] for i in flat] + [0] * (column.ndim - len(indices))
        old = to_device(jax.lax.dynamic_slice(column, start, shape))
        row = jnp.where(keep[j], rows[j].reshape(shape), old)
        return jax.lax.dynamic_update_slice(column, to_host(row), start)

    count = keep.shape[0]
    if count <= _lowering.ROW_SLICES:
        return each(count, one, column)
    # dropped rows go past the end, each to its own row (the valid ones are distinct)
    first = jnp.where(keep, flat[0], column.shape[0] + jnp.arange(count, dtype=jnp.int32))
    at = tuple(to_host(i) for i in (first, *flat[1:]))
    return _lowering.copies_or_scatter(
        column,
        copies=lambda column: jax.lax.fori_loop(0, count, one, column),
        scatter=lambda column: _on_host(_scatter, column, at, to_host(rows)),
    )


@_write_at.def_vmap
def _write_at_batched(size: int, batched: tuple, column, indices, values, valid):
    """`write_at` of stacked buffers: the buffer index leads the indices."""
    column_batched, index_batched, values_batched, valid_batched = batched
    column, values, valid = stacked(size, (column_batched, values_batched, valid_batched),
                                    column, values, valid)  # fmt: skip
    indices = tuple(i if b else jnp.broadcast_to(i, (size, *jnp.shape(i)))
                    for i, b in zip(indices, index_batched, strict=True))  # fmt: skip
    buffers = jnp.arange(size, dtype=jnp.int32).reshape(size, *[1] * (valid.ndim - 1))
    return write_at(column, (buffers, *indices), values, valid), True


def read_rows(column: jax.Array, indices: tuple) -> jax.Array:
    """`column[indices]` (the index arrays broadcast together, one per leading axis)
    out of host memory into device memory: up to `_lowering.ROW_SLICES` rows one slice each,
    more gathered by the host and moved in one block. Never the whole column.

    Under `vmap` (`jaxbuf.blocks` draws several batches, `vectorize` stacks
    buffers) the batch becomes one more leading index axis: still one read of all
    the rows (a vmapped slice would be a gather, which host memory refuses)."""
    return _read_rows(column, tuple(indices))


@jax.custom_batching.custom_vmap
def _read_rows(column: jax.Array, indices: tuple) -> jax.Array:
    lead = jnp.broadcast_shapes(*(jnp.shape(i) for i in indices))
    flat = [jnp.broadcast_to(jnp.asarray(i, jnp.int32), lead).ravel() for i in indices]
    rest = column.shape[len(indices) :]
    count = flat[0].shape[0] if flat else 1
    if count > _lowering.ROW_SLICES:
        rows = to_device(_host_gather(column, tuple(to_host(i) for i in flat)))
        return rows.reshape(*lead, *rest)

    def row(j: Any) -> jax.Array:
        start = [i[j] for i in flat] + [0] * len(rest)
        one = jax.lax.dynamic_slice(column, start, (1,) * len(indices) + rest)
        return to_device(one).reshape(1, *rest)

    def looped() -> jax.Array:  # CPU: the first row, repeated, starts the block (so
        # that it varies as the column does under shard_map), a loop writes the rest
        put = lambda j, out: jax.lax.dynamic_update_slice_in_dim(out, row(j), j, 0)  # noqa: E731
        return jax.lax.fori_loop(1, count, put, jnp.broadcast_to(row(0), (count, *rest)))

    def unrolled() -> jax.Array:  # accelerators: `count` row reads, no `while`
        return jnp.concatenate([row(j) for j in range(count)], axis=0)

    rows = _lowering.loop_or_unrolled(loop=looped, unrolled=unrolled)
    return rows.reshape(*lead, *rest)


@_read_rows.def_vmap
def _read_batched(size: int, batched: tuple, column: jax.Array, indices: tuple):
    """`_read_rows` of a batch: `size` more rows per index, the batch's axis first;
    a batched column (stacked buffers) gets its buffer index as the first index."""
    column_batched, index_batched = batched
    indices = tuple(i if b else jnp.broadcast_to(i, (size, *jnp.shape(i)))
                    for i, b in zip(indices, index_batched, strict=True))  # fmt: skip
    if column_batched:
        depth = max(jnp.ndim(i) for i in indices)
        indices = (jnp.arange(size, dtype=jnp.int32).reshape(size, *[1] * (depth - 1)), *indices)
    return read_rows(column, indices), True


def _gather(column: jax.Array, indices: tuple) -> jax.Array:
    return column.at[indices].get(mode="promise_in_bounds")


def _scatter(column: jax.Array, indices: tuple, rows: jax.Array) -> jax.Array:
    """`column[indices] = rows`, distinct indices, those out of bounds dropped."""
    return column.at[indices].set(rows, mode="drop", unique_indices=True)


def _host_gather(column: jax.Array, indices: tuple) -> jax.Array:
    """`column[indices]` computed by the host on host memory, left there."""
    return _on_host(_gather, column, indices)


def _on_host(fn: Any, *args: Any) -> jax.Array:
    """`fn(*args)` computed by the host on host arrays (JAX's `compute_on`, whose
    form changed in JAX 0.11), the result left in host memory."""
    from jax.experimental import compute_on as module

    compute_on: Any = module.compute_on  # its signature depends on the JAX version
    if "out_memory_spaces" in inspect.signature(compute_on).parameters:  # JAX 0.11+
        return compute_on(fn, compute_type="device_host", out_memory_spaces=SPACE.Host)(*args)
    with compute_on("device_host"):
        return jax.jit(fn)(*args)
