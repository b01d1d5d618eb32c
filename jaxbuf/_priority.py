"""Priorities over a buffer's slots: sampling in proportion, importance weights, updates.

Every prioritized buffer keeps a `PriorityState` beside its storage. A slot's
leaf in the sum tree holds `priority ** priority_exponent` while the slot may be
sampled and 0 otherwise (never written, overwritten, or not a valid start), so a
draw lands only on samplable slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf import _sampling, _sumtree


@struct.dataclass
class PriorityState:
    """Priorities of a buffer's slots.

    Attributes:
      tree: sums and minima of `priority ** priority_exponent` over the slots.
      max_priority: float32 scalar, the largest priority set so far (1 at first);
        new items get it, as in Schaul et al. (2016).
      rejected: int32 scalar, how many `set_priorities` entries were ignored
        (negative or non-finite priorities, out-of-range indices, or slots that
        may not be sampled now).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_replay_buffer(100, 8)
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.ones(5))
      >>> state = buffer.set_priorities(state, jnp.array([0, 1]), jnp.array([2.0, -1.0]))
      >>> float(state.priorities.max_priority), int(state.priorities.rejected)
      (2.0, 1)
    """

    tree: _sumtree.SumTreeState
    max_priority: jax.Array
    rejected: jax.Array


def init(num_slots: int) -> PriorityState:
    return PriorityState(
        tree=_sumtree.init(num_slots),
        max_priority=jnp.ones((), jnp.float32),
        rejected=jnp.zeros((), jnp.int32),
    )


def check_exponent(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a Python number, got {value!r}.")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}.")
    return float(value)


def fill(state: PriorityState, slots: jax.Array, exponent: float, keep=None) -> PriorityState:
    """Gives `slots` (int32, distinct) the maximum priority, where `keep` (default all)."""
    value = jnp.broadcast_to(state.max_priority**exponent, slots.shape)
    return state.replace(tree=_sumtree.update(state.tree, slots, value, keep, unique=True))


def clear(state: PriorityState, slots: jax.Array) -> PriorityState:
    """Makes `slots` (int32, distinct) unsamplable."""
    zero = jnp.zeros(slots.shape, jnp.float32)
    return state.replace(tree=_sumtree.update(state.tree, slots, zero, unique=True))


def check_update(indices, priorities) -> tuple[jax.Array, jax.Array]:
    """Trace-time checks of `set_priorities` arguments; returns int32 and float32 arrays."""
    for name, value in (("indices", indices), ("priorities", priorities)):
        if not hasattr(value, "shape") or np.ndim(value) != 1:
            raise ValueError(
                f"{name} must be a 1-D array [B], got "
                f"{getattr(value, 'shape', type(value).__name__)}."
            )
    if np.shape(indices) != np.shape(priorities):
        raise ValueError(
            f"indices and priorities must have one shape [B], got {np.shape(indices)} "
            f"and {np.shape(priorities)}."
        )
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"indices must be integers, got dtype {indices.dtype}.")
    if not jnp.issubdtype(priorities.dtype, jnp.floating):
        raise TypeError(f"priorities must be floating point, got dtype {priorities.dtype}.")
    return jnp.asarray(indices).astype(jnp.int32), jnp.asarray(priorities).astype(jnp.float32)


def update(
    state: PriorityState,
    indices: jax.Array,
    priorities: jax.Array,
    allowed: jax.Array,
    exponent: float,
) -> PriorityState:
    """Sets the priorities of `indices` where `allowed`, the last occurrence winning.

    Negative, NaN and infinite priorities are ignored (the slot keeps its priority)
    and counted in `rejected`, as are entries that are not `allowed`.
    """
    ok = allowed & jnp.isfinite(priorities) & (priorities >= 0)
    value = jnp.where(ok, priorities, 0.0)
    tree = _sumtree.update(state.tree, indices, value**exponent, ok)
    return state.replace(
        tree=tree,
        max_priority=jnp.maximum(state.max_priority, jnp.max(value, initial=0.0)),
        rejected=state.rejected + jnp.sum(~ok, dtype=jnp.int32),
    )


class Draw(struct.PyTreeNode):
    slots: jax.Array
    probabilities: jax.Array
    weights: jax.Array
    positive: jax.Array


def draw(
    state: PriorityState,
    key: jax.Array,
    count: int,
    num_slots: int,
    stratified: bool,
    importance_exponent,
) -> Draw:
    """`count` slots drawn in proportion to their leaves, with importance weights.

    Weights are `(N * P(i)) ** -beta / max_j (N * P(j)) ** -beta`, over the slots
    `j` with a positive priority, which is `(leaf_i / min_leaf) ** -beta`.
    """
    beta = jnp.asarray(importance_exponent, jnp.float32)
    words = _sampling.random_words(key, count)
    uniform = (words >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)  # [0, 1)
    if stratified:  # one draw in each of `count` equal segments of the mass
        uniform = (jnp.arange(count, dtype=jnp.float32) + uniform) / count
    # Every read of the tree happens inside `find` (see `_sumtree`).
    slots, leaf, total, smallest = _sumtree.find(state.tree, uniform)
    slots = jnp.minimum(slots, num_slots - 1)
    positive = (leaf > 0) & (total > 0)
    safe = jnp.where(positive, leaf, 1.0)
    weights = jnp.where(positive, (safe / jnp.where(positive, smallest, 1.0)) ** -beta, 0.0)
    probabilities = jnp.where(positive, safe / jnp.where(total > 0, total, 1.0), 0.0)
    return Draw(slots, probabilities, weights, positive)


def check_importance_exponent(value) -> None:
    if hasattr(value, "shape") and np.shape(value) != ():
        raise ValueError(f"importance_exponent must be a scalar, got shape {np.shape(value)}.")
    dtype = getattr(value, "dtype", None)
    if isinstance(value, bool) or (dtype is not None and not jnp.issubdtype(dtype, jnp.floating)):
        raise TypeError(f"importance_exponent must be a float, got {value!r}.")
