"""Direct access to stored items: by explicit indices, or everything in storage order."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf import _validation
from jaxbuf._replay import ReplayBufferState
from jaxbuf._trajectory import TrajectoryBufferState

PyTree = Any


def steps_of(state: Any) -> Any:
    """The replay or trajectory storage inside a composed state (transition, episode,
    prioritized); any other state as it is."""
    while not isinstance(state, (ReplayBufferState, TrajectoryBufferState)) and hasattr(
        state, "storage"
    ):
        state = state.storage
    return state


def _index_count(state: Any) -> int:
    if isinstance(state, TrajectoryBufferState):
        return 2
    if isinstance(state, ReplayBufferState):
        return 1 if np.ndim(state.size) == 0 else 2
    raise TypeError(f"expected a replay or trajectory buffer state, got {type(state).__name__}.")


def take(state: Any, *indices: jax.Array) -> PyTree:
    """The stored items at explicit indices; works inside `jit`.

    Args:
      state: a replay state (`take(state, rows)`), a vectorized replay state
        (`take(state, buffer_indices, rows)`) or a trajectory, transition or
        episode state (`take(state, env_indices, time_indices)`: stored steps), as
        the samples return them; a prioritized state as its storage.
      *indices: integer arrays of one shape, say `[k]`; out-of-range values are
        clamped, as JAX indexing does.

    Returns:
      The items, leaves `[*index_shape, *item_shape]`.

    Example:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(4, 2)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.array([5, 6, 7]))
      >>> jaxbuf.take(state, jnp.array([2, 0])).tolist()
      [7, 5]
    """
    state = steps_of(state)
    expected = _index_count(state)
    if len(indices) != expected:
        raise TypeError(
            f"take on a {type(state).__name__} with leading axes of "
            f"{'one buffer' if expected == 1 else 'several'} needs {expected} index "
            f"array(s), got {len(indices)}."
        )
    indices = tuple(jnp.asarray(i) for i in indices)
    return jax.tree.map(lambda x: x.at[indices].get(mode="clip"), state.experience)


def take_all(state: Any, num_minibatches: int | None = None) -> PyTree:
    """Every valid stored item in storage order; optionally split into minibatches.

    Storage order: rows `[0, size)` of a replay buffer; buffer after buffer for a
    vectorized one; environment after environment (rows `[0, size)` of each) for
    a trajectory buffer. It reads the sizes, so call it outside `jit`.

    Args:
      state: a replay (single or vectorized), trajectory, transition or episode
        buffer state (for the last three: the stored steps).
      num_minibatches: when given, the items are split into that many equal
        minibatches (which must divide their number).

    Returns:
      The items, leaves `[n, *item_shape]`, or `[num_minibatches, n //
      num_minibatches, *item_shape]`.

    Example:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(6, dtype=jnp.int32))
      >>> jaxbuf.take_all(state, num_minibatches=2).tolist()
      [[0, 1, 2], [3, 4, 5]]
    """
    state = steps_of(state)
    _index_count(state)
    sizes = np.asarray(jax.device_get(state.size))
    if isinstance(state, TrajectoryBufferState) or sizes.ndim:
        num_groups = jax.tree_util.tree_leaves(state.experience)[0].shape[0]
        counts = np.broadcast_to(sizes, (num_groups,))
        groups = np.repeat(np.arange(num_groups), counts)
        rows = np.concatenate([np.arange(n) for n in counts])
        items = take(state, jnp.asarray(groups, jnp.int32), jnp.asarray(rows, jnp.int32))
    else:
        items = jax.tree.map(lambda x: x[: int(sizes)], state.experience)
    if num_minibatches is None:
        return items
    num_minibatches = _validation.check_int("num_minibatches", num_minibatches)
    total = len(jax.tree_util.tree_leaves(items)[0])
    if total % num_minibatches:
        raise ValueError(
            f"the {total} stored items do not split into num_minibatches={num_minibatches} "
            "equal minibatches."
        )
    return jax.tree.map(
        lambda x: x.reshape(num_minibatches, total // num_minibatches, *x.shape[1:]), items
    )
