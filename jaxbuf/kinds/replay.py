"""Experience replay: a FIFO ring of items, each drawn whole."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxbuf.core import assembly as _assembly
from jaxbuf.core import contracts as _contracts
from jaxbuf.core import pipeline as _pipeline
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Sampler
from jaxbuf.core.records import Buffer, PyTree
from jaxbuf.core.samplers import uniform
from jaxbuf.core.storage import RingState
from jaxbuf.options import wrappers as _options


def init_ring(example: PyTree, *, capacity: int) -> RingState:
    """An empty ring of `capacity` items shaped like `example` (one item, no batch axis)."""
    spec = _validation.item_spec(example)
    return RingState(experience=_storage.allocate(spec, capacity), **_storage.counters())


def write_items(state: RingState, items: PyTree, where=None, *, capacity: int,
                truncate_ok: bool) -> tuple[RingState, Changes]:  # fmt: skip
    """Checks items `[B, ...]` against the ring's and appends them (the oldest go first);
    returns the state and the rows filled."""
    spec = _storage.item_spec(state.experience, 0)
    (batch,) = _validation.check_batch(spec, items, [("B", None)])
    _storage.check_fits(batch, capacity, truncate_ok, "items")
    state, rows = _storage.append(state, items, where)
    return state, Changes(cleared=None, filled=rows)


def stored_items(state: RingState) -> jax.Array:
    """The drawable items: every stored one (one group)."""
    return state.size


def member_row(state: RingState, group: jax.Array, member: jax.Array) -> jax.Array:
    """The row of the `member`-th drawable item: the member itself (rows from 0)."""
    return member


def stored_rows(state: RingState, rows: jax.Array) -> jax.Array:
    """Whether `rows` hold stored items."""
    return (rows >= 0) & (rows < state.size)


def read_rows(state: RingState, rows: jax.Array) -> tuple[PyTree, None, None]:
    """The items at `rows` `[B]`: leaves `[B, *item]` (no mask, no length)."""
    return _storage.read(state.experience, rows), None, None


def same_rows(rows: jax.Array) -> jax.Array:
    """A sample's indices are rows, and rows are indices."""
    return rows


def _layout(capacity: int, min_size: int, truncate_ok: bool) -> _contracts.Layout:
    return _contracts.Layout(
        init=functools.partial(init_ring, capacity=capacity),
        write=functools.partial(write_items, capacity=capacity, truncate_ok=truncate_ok),
        num_slots=capacity,
        groups=1,
        counts=stored_items,
        slot=member_row,
        usable=stored_rows,
        expand=read_rows,
        ready=functools.partial(_assembly.holds_min_size, min_size=min_size),
        place=same_rows,
        flatten=same_rows,
        steps_axis=0,
    )


def make_replay_buffer(
    capacity: int,
    sample_batch_size: int,
    *,
    min_size: int = 1,
    sampler: Sampler = uniform(),  # a frozen record: one shared default is safe
    truncate_ok: bool = False,
    storage_dtypes: Mapping[str, Any] | None = None,
    host_memory: Sequence[str] | None = None,
) -> Buffer:
    """Makes a replay buffer: a FIFO ring of items, drawn by `sampler`.

    Args:
      capacity: the number of items stored; once full, `add` overwrites the oldest.
      sample_batch_size: the number of items `sample` returns.
      min_size: the number of items from which `can_sample` (and `valid`) is true.
      sampler: `jaxbuf.uniform(replacement=True)` (the default) or
        `jaxbuf.prioritized(...)`, which adds `set_priorities`.
      truncate_ok: whether `add` accepts more than `capacity` items at once,
        keeping the newest `capacity` of them.
      storage_dtypes: `{"obs": "bfloat16"}`: float32 leaves kept in 2 bytes
        (`"bfloat16"` or `"float16"`), sampled as float32; lossy, opt-in. Each
        name covers its own top-level leaf: name `obs` and `next_obs` both.
      host_memory: `("obs",)`: leaves kept in the device's `pinned_host`
        memory (JAX 0.7+). Both options are described once, in
        `jaxbuf.options.wrappers`.

    Returns:
      A `Buffer` with `init(example)`, `add(state, items)` with leaves `[B, ...]`,
      `sample(state, key) -> Sample` whose `indices` are storage rows,
      `can_sample(state)`, `take(state, rows)`. `add` and `sample` raise at trace
      time on items of the wrong structure, shape or dtype; `sample` never fails
      (below `min_size` its items are real stored ones, flagged invalid; from an
      empty buffer they are the zero-filled row 0).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(capacity=100, sample_batch_size=4)
      >>> state = buffer.init({"obs": jnp.zeros(3), "reward": jnp.float32(0)})
      >>> add = jax.jit(buffer.add, donate_argnums=0)
      >>> state = add(state, {"obs": jnp.ones((8, 3)), "reward": jnp.ones(8)})
      >>> batch = jax.jit(buffer.sample)(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, int(state.size), bool(buffer.can_sample(state))
      ((4, 3), 8, True)
    """
    capacity = _validation.check_int("capacity", capacity, maximum=_storage.MAX_CAPACITY)
    sample_batch_size = _validation.check_int("sample_batch_size", sample_batch_size)
    min_size = _validation.check_int("min_size", min_size)
    sampler = _pipeline.check_sampler(sampler)
    truncate_ok = _validation.check_bool("truncate_ok", truncate_ok)
    options = _options.storage(storage_dtypes=storage_dtypes, host_memory=host_memory)
    if min_size > capacity:
        raise ValueError(
            f"min_size={min_size} exceeds capacity={capacity}: can_sample would never be true."
        )
    if not sampler.config.get("replacement", True) and sample_batch_size > capacity:
        raise ValueError(
            f"sample_batch_size={sample_batch_size} exceeds capacity={capacity}, so a batch "
            "without replacement can never be distinct."
        )
    return _pipeline.build(
        _layout(capacity, min_size, truncate_ok), sampler, sample_batch_size, options,
        kind="replay", capacity=capacity, sample_batch_size=sample_batch_size,
        min_size=min_size, truncate_ok=truncate_ok,
    )  # fmt: skip


def from_data(
    data: PyTree,
    capacity: int | None = None,
    *,
    sample_batch_size: int,
    truncate_ok: bool = False,
    **options: Any,
) -> tuple[Buffer, RingState]:
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

    Examples:
      >>> import numpy as np, jaxbuf
      >>> data = {"obs": np.arange(10.0, dtype=np.float32), "done": np.zeros(10, bool)}
      >>> buffer, state = jaxbuf.io.from_data(data, capacity=4, sample_batch_size=2,
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
    count = jax.tree.leaves(data)[0].shape[0]
    buffer = make_replay_buffer(
        count if capacity is None else capacity, sample_batch_size, **options
    )
    return buffer, fill(buffer, data, truncate_ok, "data")


def fill(buffer: Buffer, data: PyTree, truncate_ok: bool, what: str) -> RingState:
    """A state of the replay `buffer` holding `data` (leaves `[N, *item]`) in order,
    as one `add`; more than `capacity` items keep the newest if `truncate_ok`, else
    raise (naming `what`)."""
    spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[1:], jax.dtypes.canonicalize_dtype(x.dtype)),
        data,
    )
    (count,) = _validation.check_batch(spec, data, [("N", None)], what=what)
    _storage.check_fits(count, buffer.config.capacity, truncate_ok, what)
    config = buffer.config
    filler = make_replay_buffer(config.capacity, config.sample_batch_size,
                                min_size=config.min_size, sampler=buffer.sampler,
                                truncate_ok=True)  # fmt: skip
    return jax.jit(filler.add, donate_argnums=0)(buffer.init(spec), data)
