"""Everything a buffer stores, in storage order, optionally split into minibatches."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import validation as _validation
from jaxbuf.core.records import PyTree


def take_all(state: Any, num_minibatches: int | None = None) -> PyTree:
    """Every valid stored item in storage order; optionally split into minibatches.

    The order is `stored_items`'s: rows `[0, size)` of a replay buffer; buffer
    after buffer for a vectorized one; environment after environment, each
    oldest first, for the per-environment kinds (their stored steps); oldest
    first for a queue; time-major for a rollout (with `advantage` and `return`).
    It reads the sizes, so call it outside `jit`.

    Args:
      state: the state of any jaxbuf buffer.
      num_minibatches: when given, the items are split into that many equal
        minibatches (which must divide their number).

    Returns:
      The items, leaves `[n, *item_shape]`, or `[num_minibatches, n //
      num_minibatches, *item_shape]`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(6, dtype=jnp.int32))
      >>> jaxbuf.io.take_all(state, num_minibatches=2).tolist()
      [[0, 1, 2], [3, 4, 5]]
    """
    if not hasattr(state, "stored_rows"):
        raise TypeError(f"take_all takes a jaxbuf buffer state, got {type(state).__name__}.")
    _, index, tree = jax.device_get(state).stored_rows()
    index = tuple(jnp.asarray(i) for i in index)
    items = jax.tree.map(lambda x: jnp.asarray(x)[index], tree)
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
