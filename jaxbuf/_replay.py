"""Uniform experience replay: a FIFO ring of items sampled uniformly."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _ring, _sampling, _validation
from jaxbuf._base import AddFn, CanSampleFn, InitFn, SampleFn

PyTree = Any

# position + B must fit in int32 for every B <= capacity.
MAX_CAPACITY = _validation.MAX_INT32 // 2


@struct.dataclass
class ReplayBufferState:
    """State of a replay buffer.

    Attributes:
      experience: the storage, leaves `[capacity, *item_shape]`. Rows `[0, size)`
        hold items; the others are zeros.
      position: int32 scalar, the row the next item is written to.
      size: int32 scalar, the number of stored items (at most `capacity`).
      added: uint32 scalar, the number of items ever added, modulo 2**32 (it wraps
        around, never overflows): `(added - earlier_added) % 2**32` counts the items
        added in between, as the on-disk dataset writer does.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(100, 8)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((5, 3))})
      >>> state.experience["obs"].shape, int(state.size), int(state.position)
      ((100, 3), 5, 5)
    """

    experience: PyTree
    position: jax.Array
    size: jax.Array
    added: jax.Array


@struct.dataclass
class ReplaySample:
    """A batch drawn from a replay buffer.

    Attributes:
      experience: leaves `[sample_batch_size, *item_shape]`.
      indices: int32 `[sample_batch_size]`, the storage row of each item.
      valid: bool `[sample_batch_size]`, true where the item was drawn from a buffer
        holding at least `min_size` items. Below `min_size` the items are still
        drawn uniformly from the stored ones; from an empty buffer every item is the
        zero-filled row 0, and `valid` is false.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(100, 8)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((5, 3))})
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, batch.indices.shape, bool(batch.valid.all())
      ((8, 3), (8,), True)
    """

    experience: PyTree
    indices: jax.Array
    valid: jax.Array


class ReplayBufferConfig(NamedTuple):
    """The validated configuration of a replay buffer (see `make_replay_buffer`).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_replay_buffer(100, 8, min_size=10).config
      ReplayBufferConfig(capacity=100, sample_batch_size=8, min_size=10, replacement=True,
      truncate_ok=False)
    """

    capacity: int
    sample_batch_size: int
    min_size: int
    replacement: bool
    truncate_ok: bool


class ReplayBuffer(NamedTuple):
    """The pure functions of a replay buffer, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(capacity=100, sample_batch_size=8)
      >>> type(buffer).__name__, buffer._fields
      ('ReplayBuffer', ('init', 'add', 'sample', 'can_sample', 'config'))
    """

    init: InitFn
    add: AddFn
    sample: SampleFn
    can_sample: CanSampleFn
    config: ReplayBufferConfig


def storage_spec(experience: PyTree, batch_axes: int) -> PyTree:
    """One item's spec, read off storage leaves `[*batch_axes, capacity, *item]`."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[batch_axes + 1 :], x.dtype), experience
    )


def check_fits(batch: int, capacity: int, truncate_ok: bool, what: str) -> None:
    """Raises unless `1 <= batch`, and `batch <= capacity` or truncation is allowed."""
    if batch < 1:
        raise ValueError(f"{what} holds no items (B=0); add at least one item per call.")
    if batch > capacity and not truncate_ok:
        raise ValueError(
            f"{what} holds {batch} items but the capacity is {capacity}. Pass "
            "truncate_ok=True to keep only the newest `capacity` of them."
        )


def append(state: ReplayBufferState, items: PyTree) -> ReplayBufferState:
    """Writes validated items `[B, ...]`; of more than `capacity`, the newest stay."""
    capacity = _ring.capacity_of(state.experience)
    batch = jax.tree_util.tree_leaves(items)[0].shape[0]
    keep = min(batch, capacity)
    newest = jax.tree.map(lambda x: x[batch - keep :], items)
    start = (state.position + (batch - keep) % capacity) % capacity
    return state.replace(
        experience=_ring.write(state.experience, start, newest),
        position=(state.position + batch % capacity) % capacity,
        size=jnp.minimum(state.size + min(batch, capacity), capacity),
        added=state.added + (batch % 2**32),
    )


def draw_fn(replacement: bool):
    return _sampling.uniform_indices if replacement else _sampling.distinct_indices


def make_replay_buffer(
    capacity: int,
    sample_batch_size: int,
    *,
    min_size: int = 1,
    replacement: bool = True,
    truncate_ok: bool = False,
) -> ReplayBuffer:
    """Makes a uniform replay buffer: FIFO storage, uniform sampling.

    Args:
      capacity: the number of items stored; once full, `add` overwrites the oldest.
      sample_batch_size: the number of items `sample` returns.
      min_size: the number of items from which `can_sample` is true.
      replacement: whether a batch may hold the same item twice. Without
        replacement the items of a batch are distinct whenever
        `size >= sample_batch_size`; below that each stored item appears
        `sample_batch_size // size` or one more times.
      truncate_ok: whether `add` accepts more than `capacity` items at once,
        keeping the newest `capacity` of them.

    Returns:
      A `ReplayBuffer` of pure functions. `add` and `sample` raise at trace time on
      items of the wrong structure, shape or dtype. `sample` never fails: check
      `can_sample` (or the sample's `valid`) before learning from a batch.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(capacity=100, sample_batch_size=4)
      >>> state = buffer.init({"obs": jnp.zeros(3), "reward": jnp.float32(0)})
      >>> add = jax.jit(buffer.add, donate_argnums=0)
      >>> state = add(state, {"obs": jnp.ones((8, 3)), "reward": jnp.ones(8)})
      >>> batch = jax.jit(buffer.sample)(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, int(state.size), bool(buffer.can_sample(state))
      ((4, 3), 8, True)
    """
    config = ReplayBufferConfig(
        capacity=_validation.check_int("capacity", capacity, maximum=MAX_CAPACITY),
        sample_batch_size=_validation.check_int("sample_batch_size", sample_batch_size),
        min_size=_validation.check_int("min_size", min_size),
        replacement=_validation.check_bool("replacement", replacement),
        truncate_ok=_validation.check_bool("truncate_ok", truncate_ok),
    )
    if config.min_size > config.capacity:
        raise ValueError(
            f"min_size={config.min_size} exceeds capacity={config.capacity}: "
            "can_sample would never be true."
        )
    if not config.replacement and config.sample_batch_size > config.capacity:
        raise ValueError(
            f"sample_batch_size={config.sample_batch_size} exceeds capacity="
            f"{config.capacity}, so a batch without replacement can never be distinct."
        )
    draw = draw_fn(config.replacement)

    def init(example: PyTree) -> ReplayBufferState:
        spec = _validation.item_spec(example)
        return ReplayBufferState(
            experience=_ring.allocate(spec, config.capacity),
            position=jnp.zeros((), jnp.int32),
            size=jnp.zeros((), jnp.int32),
            added=jnp.zeros((), jnp.uint32),
        )

    def add(state: ReplayBufferState, items: PyTree) -> ReplayBufferState:
        spec = storage_spec(state.experience, 0)
        (batch,) = _validation.check_batch(spec, items, [("B", None)])
        check_fits(batch, config.capacity, config.truncate_ok, "items")
        return append(state, items)

    def sample(state: ReplayBufferState, key: jax.Array) -> ReplaySample:
        rows = draw(key, state.size, config.sample_batch_size)
        return ReplaySample(
            experience=_ring.read(state.experience, rows),
            indices=rows,
            valid=jnp.broadcast_to(state.size >= config.min_size, rows.shape),
        )

    def can_sample(state: ReplayBufferState) -> jax.Array:
        return state.size >= config.min_size

    return ReplayBuffer(init, add, sample, can_sample, config)


def from_data(
    data: PyTree,
    capacity: int | None = None,
    *,
    sample_batch_size: int,
    truncate_ok: bool = False,
    **options: Any,
) -> tuple[ReplayBuffer, ReplayBufferState]:
    """Builds a replay buffer and a state filled with existing items, in one call.

    Shapes and dtypes are inferred from `data`, whose leaves are `[N, *item_shape]`
    in insertion order (oldest first). The result equals `init` followed by `add`
    of the `N` items.

    Args:
      data: the items, every leaf with the same leading axis `N >= 1`.
      capacity: the buffer's capacity; `N` when None.
      sample_batch_size: as for `make_replay_buffer`.
      truncate_ok: when `N > capacity`, keep the newest `capacity` items instead of
        raising. It applies to this call only; the buffer's own `add` is
        configured by `options`.
      **options: further keyword arguments of `make_replay_buffer`.

    Returns:
      `(buffer, state)`.

    Example:
      >>> import numpy as np, jaxbuf
      >>> data = {"obs": np.arange(10.0, dtype=np.float32), "done": np.zeros(10, bool)}
      >>> buffer, state = jaxbuf.from_data(data, capacity=4, sample_batch_size=2,
      ...                                  truncate_ok=True)
      >>> state.experience["obs"].tolist(), int(state.size)
      ([8.0, 9.0, 6.0, 7.0], 4)
    """
    leaves = jax.tree_util.tree_flatten_with_path(data)[0]
    for path, leaf in leaves:
        if not getattr(leaf, "shape", ()):
            raise ValueError(
                f"data{jax.tree_util.keystr(path)} has shape (); from_data needs "
                "leaves [N, *item_shape] with the items along the first axis."
            )
    spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[1:], jax.dtypes.canonicalize_dtype(x.dtype)),
        data,
    )
    (count,) = _validation.check_batch(spec, data, [("N", None)], what="data")
    buffer = make_replay_buffer(
        count if capacity is None else capacity, sample_batch_size, **options
    )
    check_fits(count, buffer.config.capacity, truncate_ok, "data")
    state = buffer.init(spec)
    return buffer, jax.jit(append, donate_argnums=0)(state, data)
