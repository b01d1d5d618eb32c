"""One assembly for every sampled kind: a layout (storage, anchors, unit) × a sampler.

A kind's layout knows where its data lives and how it is written (`init`, `write`),
which slots may be drawn now (its anchors: `num_slots`, `groups`, `counts`,
`slot`, `usable`; `slot` gives where an anchor lies, e.g. `(env, time)`, which
`flatten` turns into the slot `env * capacity + time` and `place` back), what one
drawn slot expands into (`expand`: an item, a
window, an n-step transition, a padded episode) and when the buffer is ready
(`ready(state, slots=None)`: `min_size`; a bool scalar, or per drawn slot).
`sample` is then `sampler.draw` over the anchors,
`layout.expand` of the drawn slots and one read from storage, which is also what
`take(state, indices)` does: a sample's `indices` can always be handed back to
`take` and `set_priorities`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import footprint as _footprint
from jaxbuf.core import lowering as _lowering
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Drawn, Layout, Sampler
from jaxbuf.core.records import Buffer, Config, PyTree, Sample


def holds_min_size(state: Any, slots: jax.Array | None = None, *, min_size: int) -> jax.Array:
    """A layout's `ready` by its size alone: the state holds `min_size` items (or steps
    per environment), whatever the slots drawn."""
    return state.size >= min_size


def init(layout: Layout, sampler: Sampler, example: PyTree) -> Any:
    """Creates an empty state.

    Args:
      example: ONE item (replay) or step (per-environment kinds), a pytree of arrays
        or scalars without batch axes. Only its structure, shapes and dtypes are
        used; storage is preallocated and zero-filled.

    Returns:
      The state, with `experience` leaves `[capacity, ...]` (replay) or `[num_envs,
      capacity, ...]`, counters `position`, `size`, `added`, the kind's `side`
      records and the `sampler`'s state.
    """

    def allocate(example: PyTree) -> Any:
        return layout.init(example).replace(sampler=sampler.init(layout.num_slots, layout.groups))

    # the example is closed over, not abstracted: the layout's own checks name its leaves
    _footprint.refuse_unfit(lambda: allocate(example), example)
    return allocate(example)


def add(layout: Layout, sampler: Sampler, state: Any, data: PyTree, *,
        where: Any = None) -> Any:  # fmt: skip
    """Adds data and returns the new state; donate the state to write in place.

    Args:
      state: the current state.
      data: leaves `[B, *item]` (replay) or `[num_envs, T, *step]` (trajectory,
        transition, episode; `T <= capacity`), with the example's structure and
        dtypes (checked at trace time, errors naming the leaf).
      where: optional bool scalar (traced or not): with false, the call stores
        nothing and returns the state as it was, bit for bit. Where lowered for
        GPU or TPU it is a masked write, not a branch: the rows go out of
        bounds, where the scatter drops them, so gating `add` on a rate limiter
        inside `jit` costs no `lax.cond` (a host round trip there) and the same
        O(B) as an add. On CPU, where a branch is free and skips the work, it
        is a `lax.cond`.

    Returns:
      The new state.
    """
    where = _validation.check_where(where, "whether to store the data")
    if where is None:
        return _write(layout, sampler, state, data, None)

    def branch() -> Any:  # CPU: a branch costs nothing there, and skips the work
        return jax.lax.cond(where, lambda: _write(layout, sampler, state, data, None),
                            lambda: state)  # fmt: skip

    def masked() -> Any:  # accelerators: no predicate sent to the host
        return _write(layout, sampler, state, data, where)

    return _lowering.branch_or_mask(branch=branch, mask=masked)


def _write(layout: Layout, sampler: Sampler, state: Any, data: PyTree, where) -> Any:
    """`add`'s work: write the data (masked by `where`) and tell the sampler."""
    state, changes = layout.write(state, data, where)
    changes = _gate_changes(changes, where)
    return state.replace(sampler=sampler.after_add(state.sampler, changes))


def _gate_changes(changes: Changes, where: jax.Array | None) -> Changes:
    """No slot changes where nothing was written."""
    if where is None:
        return changes
    keep = where if changes.keep is None else changes.keep & where
    cleared = None if changes.cleared is None else jnp.where(where, changes.cleared, -1)
    return changes.replace(cleared=cleared, keep=jnp.broadcast_to(keep, changes.filled.shape))


def add_step(layout: Layout, sampler: Sampler, state: Any, step: PyTree, *,
             where: Any = None) -> Any:  # fmt: skip
    """Adds one step per environment, leaves `[num_envs, *step]`: `add` with `T = 1`
    (`where` as for `add`)."""
    assert layout.one_step is not None
    return add(layout, sampler, state, layout.one_step(state, step), where=where)


def sample(layout: Layout, sampler: Sampler, batch: int, state: Any, key: jax.Array, **options):
    """Draws `sample_batch_size` items; never fails (check `valid` or `can_sample`).

    Args:
      state: the buffer state.
      key: a PRNG key.
      **options: the sampler's options: `importance_exponent` (beta, default 0.4,
        a float or traced scalar) for `prioritized`.

    Returns:
      A `Sample` with `experience` leaves `[B, *item]` (replay), `[B, L, *step]`
      (trajectory windows, with `mask` `[B, L]` given a `done_fn`), a
      `Transition` of `[B, ...]` leaves (n-step transitions, with `length`), or
      `[B, max_length, *step]` (padded episodes, with `mask` and `length`);
      `indices` and `valid` `[B]`; `probabilities` and `weights` `[B]` with a
      prioritized sampler; `goal_source` with goal relabeling. Below `min_size`
      the items are still drawn where anything is drawable, and `valid` is false
      (weights 0).
    """
    return _sample(layout, sampler.draw(layout, state, key, batch, **options), state)


def _sample(layout: Layout, drawn: Drawn, state: Any) -> Sample:
    experience, mask, length = layout.expand(state, drawn.where)
    valid = drawn.valid & layout.ready(state, drawn.slots)
    weights = None if drawn.weights is None else jnp.where(valid, drawn.weights, 0.0)
    return Sample(experience=experience, indices=drawn.slots, valid=valid, mask=mask,
                  length=length, probabilities=drawn.probabilities, weights=weights)  # fmt: skip


def next_batch(layout: Layout, sampler: Sampler, batch: int, state: Any, key: jax.Array):
    """The next `sample_batch_size` anchors of the current pass (see `jaxbuf.epochs`).

    Args:
      state: the buffer state.
      key: a PRNG key; it shuffles the next pass when this call begins one.

    Returns:
      `(state, Sample)`, the state with the sampler moved on, and the batch as
      `sample` gives it; rows past the end of the pass, or whose anchor was
      overwritten during the pass, are `valid` false.
    """
    drawn = sampler.draw(layout, state, key, batch)
    return state.replace(sampler=drawn.state), _sample(layout, drawn, state)


def can_sample(layout: Layout, sampler: Sampler, state: Any) -> jax.Array:
    """bool scalar: the buffer holds `min_size` and something is drawable."""
    return layout.ready(state) & sampler.available(layout, state)


def take(layout: Layout, state: Any, indices: jax.Array, goal_source: jax.Array | None = None):
    """What `sample` returned as `experience` for these `indices` (a sample's).

    Args:
      state: the buffer state.
      indices: int `[k]`, as in `Sample.indices`; values outside `[0, num_slots)`
        are clamped. For indices that are not drawable now (`valid` false) the
        result is what storage holds there, not a stored item.
      goal_source: with goal relabeling, the sample's `goal_source` (int `[k]`
        or `[k, max_length]`), to relabel the same goals; None gives the items
        as stored.

    Returns:
      The items, leaves `[k, ...]` as in `Sample.experience`.
    """
    if goal_source is not None:  # the goals option's `take` takes it
        raise TypeError("goal_source is only for buffers made with goals=jaxbuf.hindsight(...).")
    return layout.expand(state, place(layout, indices))[0]


def place(layout: Layout, indices: Any) -> Any:
    """Where a sample's `indices` (int `[k]`) lie in the layout, clamped into
    `[0, num_slots)`; a `TypeError` for anything but 1-D integers."""
    indices = jnp.asarray(indices)
    if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"indices must be a 1-D integer array [k], got {indices.dtype}"
                        f"{list(indices.shape)}.")  # fmt: skip
    return layout.place(jnp.clip(indices.astype(jnp.int32), 0, layout.num_slots - 1))


def set_priorities(layout: Layout, sampler: Sampler, state: Any, indices, priorities) -> Any:
    """Sets the priorities of drawn anchors (see `jaxbuf.prioritized`).

    Args:
      state: the buffer state.
      indices: int `[B]`, a sample's `indices`.
      priorities: float `[B]`, non-negative and finite (others are ignored and
        counted in `state.sampler.rejected`).

    Returns:
      The new state.
    """
    assert sampler.set_priorities is not None
    return sampler.set_priorities(layout, state, indices, priorities)


def wrapped(fn: Callable, inner: Callable) -> Callable:
    """`fn`, a wrapper of `inner`, showing `inner`'s name, docstring and signature."""
    fn.__name__ = fn.__qualname__ = inner.__name__
    fn.__doc__ = inner.__doc__
    fn.__signature__ = inspect.signature(inner)  # type: ignore[attr-defined]
    return fn


def bind(fn: Callable, *bound: Any) -> Callable:
    """`fn` with its first arguments bound, keeping its name, docstring and the
    signature of the remaining arguments (so `help()` shows them)."""

    def bound_fn(*args, **kwargs):
        return fn(*bound, *args, **kwargs)

    signature = inspect.signature(fn)
    parameters = list(signature.parameters.values())[len(bound) :]
    bound_fn.__name__ = bound_fn.__qualname__ = fn.__name__
    bound_fn.__doc__ = fn.__doc__
    bound_fn.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return bound_fn


def assemble(layout: Layout, sampler: Sampler, batch: int, /, **config: Any) -> Buffer:
    """The `Buffer` of a layout and a sampler drawing `batch` items per `sample`."""
    return Buffer(
        init=bind(init, layout, sampler),
        add=bind(add, layout, sampler),
        sample=bind(sample, layout, sampler, batch),
        can_sample=bind(can_sample, layout, sampler),
        take=bind(take, layout),
        config=Config(**config, sampler=sampler.config),
        add_step=None if layout.one_step is None else bind(add_step, layout, sampler),
        set_priorities=(
            None if sampler.set_priorities is None else bind(set_priorities, layout, sampler)
        ),
        next_batch=bind(next_batch, layout, sampler, batch) if sampler.advances else None,
        layout=layout,
        sampler=sampler,
    )
