"""Preallocated ring storage: a flat ring of items, or one time ring per environment.

Writes touch only the written rows (a scatter with unique, in-bounds indices), so
with a donated state XLA updates the storage in place and a write costs O(B),
independent of the capacity.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf.core import draws as _draws
from jaxbuf.core import hosted as _hosted
from jaxbuf.core import lowering as _lowering
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import PyTree

# A bool scalar that lets a write happen (None: always).
Gate = jax.Array | None

# position + B must fit in int32 for every B <= capacity.
MAX_CAPACITY = _validation.MAX_INT32 // 2


class _Ring(struct.PyTreeNode):
    """The fields every ring state has (see `RingState` and `TimeRingState`)."""

    experience: PyTree
    position: jax.Array
    size: jax.Array
    added: jax.Array
    side: PyTree = None
    sampler: PyTree = None


class RingState(_Ring):
    """A flat ring of items (replay buffer), with its sampler's state.

    Attributes:
      experience: the storage, leaves `[capacity, *item_shape]`; rows `[0, size)`
        hold items, the others zeros.
      position: int32 scalar, the row the next item is written to.
      size: int32 scalar, the number of stored items (at most `capacity`).
      added: uint32 scalar, items ever added, modulo 2**32 (it wraps, never
        overflows): `(added - earlier) % 2**32` counts the items added in between.
      side: None (the flat ring keeps nothing beside its items).
      sampler: the sampler's state: None (uniform) or a `PriorityState`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(100, 8)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((5, 3))})
      >>> state.experience["obs"].shape, int(state.size), int(state.position)
      ((100, 3), 5, 5)
    """

    def stored_rows(self) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...], PyTree]:
        """On the host: `(labels, index, tree)`, the stored items being
        `tree[index]` in storage order (rows `[0, size)`; for a vectorized state,
        `(buffer, row)` pairs buffer after buffer, labelled so)."""
        if np.ndim(self.size):
            return stacked_rows(self)
        return {}, (np.arange(int(self.size), dtype=np.int32),), self.experience


class TimeRingState(_Ring):
    """One time ring per environment (trajectory, transition and episode buffers).

    Attributes:
      experience: leaves `[num_envs, capacity, *step_shape]`, time-major per
        environment: row `t` of environment `e` is one step.
      position: int32 scalar, the time index the next step is written to (all
        environments add together).
      size: int32 scalar, the steps stored per environment.
      added: uint32 scalar, steps ever added per environment, modulo 2**32.
      side: what the kind keeps beside its steps: None (trajectory),
        `FinalObservations` (transition) or `EpisodeRecords` (episode).
      sampler: the sampler's state: None (uniform) or a `PriorityState`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(2, 50, 4, 3)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((2, 7, 3))})
      >>> state.experience["obs"].shape, int(state.size)
      ((2, 50, 3), 7)
    """

    def stored_rows(self) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...], PyTree]:
        """On the host: `(labels, index, tree)`, the stored steps being
        `tree[index]`, environment after environment, each oldest first, labelled
        with `env` and `time` (0 for the oldest stored step)."""
        if np.ndim(self.size):
            return stacked_rows(self)
        size, position = int(self.size), int(self.position)
        num_envs, capacity = jax.tree_util.tree_leaves(self.experience)[0].shape[:2]
        env, time = np.divmod(np.arange(num_envs * size, dtype=np.int32), max(size, 1))
        rows = ((position - size + time) % capacity).astype(np.int32)
        return {"env": env, "time": time}, (env, rows), self.experience


def stacked_rows(state: RingState | TimeRingState):
    """`stored_rows` of a vectorized state (leaves `[num_buffers, ...]`): each
    buffer's in turn, labelled with `buffer` (and `row` for flat rings)."""
    labels: dict[str, list] = {}
    index: list[list] = []
    for b in range(len(state.size)):
        one = jax.tree.map(lambda x, b=b: x[b], state.replace(sampler=None))
        named, rows, _ = one.stored_rows()
        named = {"buffer": np.full(len(rows[0]), b, np.int32), **(named or {"row": rows[0]})}
        for key, value in named.items():
            labels.setdefault(key, []).append(value)
        for axis, value in enumerate((named["buffer"], *rows)):
            (index[axis] if axis < len(index) else index.append([]) or index[axis]).append(value)
    joined = {k: np.concatenate(v) for k, v in labels.items()}
    return joined, tuple(np.concatenate(v) for v in index), state.experience


def counters() -> dict[str, jax.Array]:
    """Zero `position`, `size` (int32) and `added` (uint32)."""
    # Distinct arrays: a donated state may not hold one buffer twice.
    return {
        "position": jnp.zeros((), jnp.int32),
        "size": jnp.zeros((), jnp.int32),
        "added": jnp.zeros((), jnp.uint32),
    }


def allocate(spec: PyTree, *shape: int) -> PyTree:
    """Zero-filled storage `[*shape, *item_shape]` for the given item spec."""
    return jax.tree.map(lambda s: jnp.zeros((*shape, *s.shape), s.dtype), spec)


def capacity_of(experience: PyTree, axis: int = 0) -> int:
    """The static capacity, read off the storage's ring axis."""
    return jax.tree_util.tree_leaves(experience)[0].shape[axis]


def item_spec(experience: PyTree, ring_axis: int) -> PyTree:
    """One item's spec, read off storage leaves `[..., capacity, *item]`."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[ring_axis + 1 :], x.dtype), experience
    )


def write(experience: PyTree, position: jax.Array, items: PyTree, where: Gate = None) -> PyTree:
    """Writes `items` (leaves `[B, ...]`, `B <= capacity`) at `position`, wrapping.

    Item `j` goes to row `(position + j) % capacity`. With `where` (a bool
    scalar) false nothing is written: the rows move out of bounds, where the
    scatter drops them, so the cost stays O(B) and there is no branch.
    """
    batch = jax.tree_util.tree_leaves(items)[0].shape[0]
    capacity = capacity_of(experience)
    rows = ring_rows(position, batch, capacity)
    mode = "promise_in_bounds"
    if where is not None:  # distinct rows past the end: dropped
        rows, mode = jnp.where(where, rows, capacity + jnp.arange(batch, dtype=jnp.int32)), "drop"

    def scatter(column: jax.Array, values: jax.Array) -> jax.Array:
        return column.at[rows].set(values, unique_indices=True, mode=mode)

    def put(column: jax.Array, values: jax.Array) -> jax.Array:
        if _hosted.on_host(column):  # slices only; accelerators: two windows
            return _write_host(column, values, position, where)
        if column.dtype.itemsize * np.prod(column.shape[1:]) < _lowering.WIDE_ROW:
            return scatter(column, values)
        slices = _write_rows if batch <= _lowering.FEW_ROWS else _write_window_or_slices
        cpu = lambda: slices(column, values, position, where)  # noqa: E731
        return _lowering.copies_or_scatter(copies=cpu, scatter=lambda: scatter(column, values))

    return jax.tree.map(put, experience, items)


@jax.custom_batching.custom_vmap
def _write_host(column: jax.Array, values: jax.Array, position: jax.Array, where: Gate):
    """`write` of one host-memory leaf: row by row on CPU (up to `_lowering.FEW_ROWS` rows),
    else as two windows."""
    rows = functools.partial(_write_rows, column, _hosted.to_host(values))
    windows = functools.partial(_write_slices, column, values)
    cpu = rows if values.shape[0] <= _lowering.FEW_ROWS else windows
    return _lowering.copies_or_scatter(position, where, copies=cpu, scatter=windows)


@_write_host.def_vmap
def _write_host_batched(size: int, batched: tuple, column, values, position, where):
    """`_write_host` of stacked buffers (`vectorize`): their rows written one by one."""
    column, values, position, where = _hosted.stacked(size, batched, column, values,
                                                           position, where)  # fmt: skip
    count, capacity = values.shape[1], column.shape[1]
    rows = (position[:, None] + jnp.arange(count, dtype=jnp.int32)[None, :]) % capacity
    valid = jnp.broadcast_to(True if where is None else where[:, None], rows.shape)
    buffers = jnp.arange(size, dtype=jnp.int32)[:, None]
    return _hosted.write_at(column, (buffers, rows), values, valid), True


def _write_rows(column: jax.Array, values: jax.Array, position: jax.Array, where: Gate):
    """`write` of one leaf, row by row: row `j` of `values` to `(position + j) % capacity`;
    no row at all where `where` is false."""
    batch, capacity = values.shape[0], column.shape[0]
    count = batch if where is None else jnp.where(where, batch, 0)

    def one(j: jax.Array, column: jax.Array) -> jax.Array:
        row = jax.lax.dynamic_slice_in_dim(values, j, 1)
        return jax.lax.dynamic_update_slice_in_dim(column, row, (position + j) % capacity, 0)

    return jax.lax.fori_loop(0, count, one, column)


def _write_window_or_slices(column: jax.Array, values: jax.Array, position: jax.Array,
                            where: Gate) -> jax.Array:  # fmt: skip
    """`write` of one device leaf on CPU: one slice update where the rows do not wrap
    (a `lax.cond`, free on CPU), else `_write_slices`."""
    fits = position + values.shape[0] <= column.shape[0]
    window = functools.partial(_write_column, column, values, position, where, axis=0)
    return jax.lax.cond(fits, window, lambda: _write_slices(column, values, position, where))


def _write_slices(column: jax.Array, values: jax.Array, position: jax.Array, where: Gate):
    """`write` of one leaf as two `dynamic_update_slice`s: rows `[0, B)` first, then
    `[start, start + B)` with `start = min(position, capacity - B)`, each window's rows
    that the write does not reach keeping what they held (read after the first update,
    so windows that overlap when `capacity < 2B` stay right). A column in host memory
    is read and written by the same two windows: four copies, whatever `B`."""
    batch, capacity = values.shape[0], column.shape[0]
    start = jnp.minimum(position, capacity - batch)
    shift = position - start  # > 0 only where the write wraps around: rows [0, shift)
    rolled = jnp.roll(values, shift, axis=0)  # rolled[j] = values[(j - shift) % B]
    j = jnp.arange(batch, dtype=jnp.int32).reshape(-1, *[1] * (values.ndim - 1))
    allowed = True if where is None else where

    hosted = _hosted.on_host(column)  # windows move: out to merge, back to write

    def update(column: jax.Array, at: jax.Array, new: jax.Array) -> jax.Array:
        old = jax.lax.dynamic_slice_in_dim(column, at, batch)
        merged = jnp.where(new & allowed, rolled, _hosted.to_device(old) if hosted else old)
        merged = _hosted.to_host(merged) if hosted else merged
        return jax.lax.dynamic_update_slice_in_dim(column, merged, at, axis=0)

    column = update(column, jnp.int32(0), j < shift)
    return update(column, start, j >= shift)


def gated(where: Gate, new: PyTree, old: PyTree) -> PyTree:
    """`new` where `where` (a bool scalar, or None for always), else `old`; for
    small leaves only (counters): a select reads and writes the whole leaf."""
    if where is None:
        return new
    return jax.tree.map(lambda n, o: jnp.where(where, n, o), new, old)


def read(experience: PyTree, *indices: jax.Array) -> PyTree:
    """Gathers `experience[indices]` (all in bounds) from every leaf."""

    def one(leaf: jax.Array) -> jax.Array:
        if _hosted.on_host(leaf):  # row slices into device memory, never a gather
            return _hosted.read_rows(leaf, indices)
        return leaf.at[indices].get(mode="promise_in_bounds")

    return jax.tree.map(one, experience)


def check_fits(batch: int, capacity: int, truncate_ok: bool, what: str) -> None:
    """Raises unless `1 <= batch`, and `batch <= capacity` or truncation is allowed."""
    if batch < 1:
        raise ValueError(f"{what} holds no items (B=0); add at least one item per call.")
    if batch > capacity and not truncate_ok:
        raise ValueError(
            f"{what} holds {batch} items but the capacity is {capacity}. Pass "
            "truncate_ok=True to keep only the newest `capacity` of them."
        )


def append(state: RingState, items: PyTree, where: Gate = None) -> tuple[RingState, jax.Array]:
    """Writes validated items `[B, ...]`; of more than `capacity`, the newest stay.
    With `where` false, nothing (see `write`).

    Returns the state and the rows written (int32 `[min(B, capacity)]`, distinct).
    """
    capacity = capacity_of(state.experience)
    batch = jax.tree_util.tree_leaves(items)[0].shape[0]
    keep = min(batch, capacity)
    newest = jax.tree.map(lambda x: x[batch - keep :], items)
    start = (state.position + (batch - keep) % capacity) % capacity
    counters = _counters(state)
    state = state.replace(
        experience=write(state.experience, start, newest, where),
        position=(state.position + batch % capacity) % capacity,
        size=jnp.minimum(state.size + keep, capacity),
        added=state.added + (batch % 2**32),
    )
    state = state.replace(**gated(where, _counters(state), counters))
    return state, ring_rows(start, keep, capacity)


def _counters(state: RingState | TimeRingState) -> dict[str, jax.Array]:
    return {"position": state.position, "size": state.size, "added": state.added}


def append_steps(state: TimeRingState, steps: PyTree, where: Gate = None) -> TimeRingState:
    """Writes validated steps `[num_envs, T, ...]`, `T <= capacity`, at `position`;
    with `where` false, nothing (see `write`)."""
    capacity = capacity_of(state.experience, 1)
    length = jax.tree_util.tree_leaves(steps)[0].shape[1]
    experience = write_times(state.experience, state.position, steps, where)
    counters = {"position": (state.position + length) % capacity,
                "size": jnp.minimum(state.size + length, capacity),
                "added": state.added + length}  # fmt: skip
    return state.replace(experience=experience, **gated(where, counters, _counters(state)))


def write_times(rings: PyTree, position: jax.Array, steps: PyTree, where: Gate = None) -> PyTree:
    """`write` of `T` steps per row into time-major rings (leaves `[N, capacity, ...]`
    and `[N, T, ...]`), at the same `position` of every row."""
    if any(_hosted.on_host(ring) for ring in jax.tree.leaves(rings)):  # leaf by leaf
        return jax.tree.map(functools.partial(_write_leaf_times, position=position, where=where),
                            rings, steps)  # fmt: skip
    window = functools.partial(_write_column, position=position, where=where)
    length, capacity = jax.tree_util.tree_leaves(steps)[0].shape[1], capacity_of(rings, 1)
    if length == 1:  # one step per row: one column, never wrapping, one slice update
        return jax.tree.map(window, rings, steps)

    def rows() -> PyTree:  # row by row, wrapping
        return jax.vmap(write, in_axes=(0, None, 0, None))(rings, position, steps, where)

    def windows() -> PyTree:  # CPU: one slice update per leaf where the steps do not wrap
        fits = position + length <= capacity
        return jax.lax.cond(fits, lambda: jax.tree.map(window, rings, steps), rows)

    if all(_row_bytes(ring, 2) < _lowering.WIDE_ROW for ring in jax.tree.leaves(rings)):
        return rows()  # narrow steps: a scatter beats the branch and its copies on CPU too
    return _lowering.copies_or_scatter(copies=windows, scatter=rows)


def _row_bytes(leaf: jax.Array, leading: int) -> int:
    """Bytes of one row of `leaf` past its `leading` axes."""
    return int(leaf.dtype.itemsize * np.prod(leaf.shape[leading:], dtype=np.int64))


def _write_leaf_times(ring: jax.Array, steps: jax.Array, position: jax.Array, where: Gate):
    """`write_times` of one leaf, which may live in host memory."""
    if _hosted.on_host(ring):
        return _hosted.write_steps(ring, steps, position, where)
    return write_times(ring, position, steps, where)


def _write_column(
    column: jax.Array, values: jax.Array, position: jax.Array, where: Gate, axis: int = 1
) -> jax.Array:
    """`T` steps of every environment (`values` `[num_envs, T, ...]`) into times
    `[position, position + T)` of `column` `[num_envs, capacity, ...]`, which must not
    wrap: one slice update, as Flashbax writes its time column. On CPU a memory copy,
    where a per-environment scatter or slice pair would read and write it several
    times; on accelerators one kernel without index arrays (not a scatter of
    `num_envs` (environment, time) pairs). With `where` false the column is kept.
    (`axis=0`: rows `[position, position + B)` of a ring of items.)"""
    if where is not None:
        old = jax.lax.dynamic_slice_in_dim(column, position, values.shape[axis], axis=axis)
        values = jnp.where(where, values, old)
    return jax.lax.dynamic_update_slice_in_dim(column, values, position, axis=axis)


def check_steps(spec: PyTree, steps: PyTree, num_envs: int, capacity: int) -> int:
    """Checks steps (leaves `[num_envs, T, *step_shape]`) against the step spec; returns T."""
    axes = [("num_envs", num_envs), ("T", None)]
    _, length = _validation.check_batch(spec, steps, axes, what="steps")
    if length < 1:
        raise ValueError("steps holds no steps (T=0); add at least one step per call.")
    if length > capacity:
        raise ValueError(
            f"steps holds T={length} steps per environment, more than steps_per_env={capacity}."
        )
    return length


def one_step(spec: PyTree, step: PyTree, num_envs: int) -> PyTree:
    """Checks one step per environment (leaves `[num_envs, *step_shape]`) and returns it
    with a time axis of length 1."""
    _validation.check_batch(spec, step, [("num_envs", num_envs)], what="step")
    return jax.tree.map(lambda x: jnp.expand_dims(x, 1), step)


def push_where(
    rings: PyTree, next_slot: jax.Array, filled: jax.Array, mask: jax.Array, values: PyTree
) -> tuple[PyTree, jax.Array, jax.Array, jax.Array]:
    """Appends, row by row, the values where `mask` is true to side rings of `K` slots.

    Args:
      rings: leaves `[N, K, ...]`, one ring per row.
      next_slot: int32 `[N]`, the slot each ring writes next.
      filled: int32 `[N]`, the slots of each ring holding a value.
      mask: bool `[N, T]`, which values to append, in order.
      values: leaves `[N, T, ...]`.

    Returns:
      `(rings, next_slot, filled, slots)`. When a row appends more than `K`
      values only its last `K` are written; `slots` (int32 `[N, T]`) is the slot
      each appended value went to (meaningless where `mask` is false).
    """
    k = jax.tree_util.tree_leaves(rings)[0].shape[1]
    rank = _draws.running_sum(mask, axis=1) - 1
    count = rank[:, -1] + 1
    slots = (next_slot[:, None] + rank) % k
    rows = jnp.where(mask & (rank >= count[:, None] - k), slots, k)  # k: out of bounds, dropped
    envs = jnp.arange(mask.shape[0], dtype=jnp.int32)[:, None]

    def push(ring: jax.Array, v: jax.Array) -> jax.Array:
        if _hosted.on_host(ring):  # row writes, never a scatter
            return _hosted.write_at(ring, (envs, jnp.minimum(rows, k - 1)), v, rows < k)
        return ring.at[envs, rows].set(v, mode="drop")

    rings = jax.tree.map(push, rings, values)
    return rings, (next_slot + count) % k, jnp.minimum(filled + count, k), slots


def ring_rows(start: jax.Array, count: int, capacity: int) -> jax.Array:
    """int32 `[count]`: the rows `start, start + 1, ...` of a ring, wrapping."""
    return (start + jnp.arange(count, dtype=jnp.int32)) % capacity


def split(slots: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """`(slots // size, slots % size)` of non-negative int32 `slots` (truncating
    division by a constant: cheaper on CPU than `jnp.divmod`'s floor rounding)."""
    size_ = jnp.int32(size)
    return jax.lax.div(slots, size_), jax.lax.rem(slots, size_)
