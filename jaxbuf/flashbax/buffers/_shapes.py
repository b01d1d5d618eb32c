"""How Flashbax's flat and item buffers take and give data: the axes an `add` adds to
the batch it is given, and the pair of steps a flat buffer's sample is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def with_axes(add: Callable, add_batches: bool, add_sequences: bool) -> Callable:
    """`add(state, batch)` taking what Flashbax's flags say a batch is: `[B, T, ...]` with
    both, `[B, ...]` without sequences, `[T, ...]` without batches, one step without either
    (the missing axes are added as size 1)."""
    axes = [axis for axis, given in ((0, add_batches), (1, add_sequences)) if not given]

    def added(state: Any, batch: Any) -> Any:
        for axis in axes:
            batch = jax.tree.map(lambda x, a=axis: jnp.expand_dims(x, a), batch)
        return add(state, batch)

    return added


def as_one_row(add: Callable) -> Callable:
    """`add(state, batch)` of an item buffer: a batch `[B, T, ...]` written as one row of
    `B * T` steps, row after row."""

    def added(state: Any, batch: Any) -> Any:
        return add(state, jax.tree.map(lambda x: x.reshape(1, -1, *x.shape[2:]), batch))

    return added


def first_and_second(experience: Any) -> tuple[Any, Any]:
    """The two steps of sequences `[B, 2, ...]`."""
    return jax.tree.map(lambda x: x[:, 0], experience), jax.tree.map(lambda x: x[:, 1], experience)


def squeezed(experience: Any) -> Any:
    """Sequences of one step `[B, 1, ...]` as items `[B, ...]`."""
    return jax.tree.map(lambda x: x[:, 0], experience)
