"""How a sampled buffer draws its anchors: `uniform` or `prioritized`.

A sampler is a small record of pure functions whose state nests in the
buffer's state (`state.sampler`), as `optax.chain` nests its states. It sees
the buffer's kind only through its layout's anchors: `num_slots` slots, of which
`counts(state)` per group are drawable, the `slot(state, group, member)` of
each, and `usable(state, slots)`. The prioritized sampler keeps a sum tree
over the slots whose leaf is positive exactly while the slot is drawable, and
the kind reports, on every `add`, which slots stopped and started being
drawable (`Changes`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf.core import draws as _draws
from jaxbuf.core import permutation as _permutation
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Drawn, Sampler
from jaxbuf.core.records import Config
from jaxbuf.core.sumtree import tree as _sumtree


class PriorityState(struct.PyTreeNode):
    """The prioritized sampler's state.

    Attributes:
      tree: sums and minima of `priority ** priority_exponent` over the slots; a
        slot's leaf is 0 while it may not be drawn.
      max_priority: float32 scalar, the largest priority set so far (1 at first);
        new items get it, as in Schaul et al. (2016).
      rejected: int32 scalar, how many `set_priorities` entries were ignored
        (negative or non-finite priorities, indices that are not drawable now);
        it saturates at 2**31 - 1, never wraps.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(100, 8, sampler=jaxbuf.prioritized())
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.ones(5))
      >>> state = buffer.set_priorities(state, jnp.array([0, 1]), jnp.array([2.0, -1.0]))
      >>> float(state.sampler.max_priority), int(state.sampler.rejected)
      (2.0, 1)
    """

    tree: _sumtree.SumTreeState
    max_priority: jax.Array
    rejected: jax.Array


def _no_state(num_slots: int, groups: int) -> None:
    """The uniform sampler keeps no state."""
    return None


def _unchanged(state: None, changes: Changes) -> None:
    """An add changes nothing the uniform sampler keeps."""
    return state


def uniform(replacement: bool = True) -> Sampler:
    """Draws every drawable anchor (item, window start, episode) with equal probability.

    Args:
      replacement: whether a batch may hold the same anchor twice. Without
        replacement the anchors of a batch are distinct whenever at least
        `sample_batch_size` are drawable; below that each appears
        `sample_batch_size // n` or one more times.

    Returns:
      A `Sampler` for the `sampler=` argument of the `make_*` factories.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(10, 4, sampler=jaxbuf.uniform(replacement=False))
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(4, dtype=jnp.int32))
      >>> sorted(buffer.sample(state, jax.random.key(0)).experience.tolist())
      [0, 1, 2, 3]
    """
    replacement = _validation.check_bool("replacement", replacement)
    pick = _draws.uniform_indices if replacement else _draws.distinct_indices

    def draw(layout, state, key, count: int) -> Drawn:
        counts = layout.counts(state)
        # The total is the last running sum, never a separate `counts.sum()`: XLA
        # fuses a separate sum's consumers into the group search, once per group.
        ends = _draws.running_sum(counts) if counts.ndim else None
        total = counts * layout.groups if ends is None else ends[-1]
        if layout.groups == 1:
            group, member = jnp.zeros((count,), jnp.int32), pick(key, total, count)
        elif counts.ndim == 0 and replacement:  # equal groups: no division (slow on CPU)
            words = _draws.random_words(key, 2 * count)
            group = _draws.scale_below(words[:count], jnp.int32(layout.groups))
            member = _draws.scale_below(words[count:], counts)
        elif counts.ndim == 0:
            group, member = jnp.divmod(pick(key, total, count), jnp.maximum(counts, 1))
        else:
            group, member = _draws.locate(pick(key, total, count), counts, ends)
        where = layout.slot(state, group, member)
        return Drawn(slots=layout.flatten(where), where=where,
                     valid=jnp.broadcast_to(total > 0, (count,)))  # fmt: skip

    def available(layout, state) -> jax.Array:
        return jnp.sum(layout.counts(state)) > 0

    config = Config(kind="uniform", replacement=replacement)
    return Sampler(config=config, init=_no_state, draw=draw, after_add=_unchanged,
                   available=available)  # fmt: skip


def prioritized(priority_exponent: float = 0.6, stratified: bool = True) -> Sampler:
    """Draws anchors in proportion to priority (Schaul et al., 2016).

    Anchor `i` is drawn with probability `P(i) = p_i**alpha / sum_k p_k**alpha`
    (`alpha = priority_exponent`; 0 is uniform). A new anchor gets the largest
    priority set so far (1 before any), so each is likely to be seen once. The
    buffer then has `set_priorities(state, indices, priorities)`, and its
    `sample(state, key, *, importance_exponent=0.4)` fills `probabilities` and
    `weights` (beta may be a traced scalar, to anneal it inside `jit`).

    `set_priorities` takes int `[B]` indices (a sample's) and float `[B]`
    priorities. Where an index appears more than once, the last accepted entry
    wins. A negative, NaN or infinite priority, or an index that is not drawable
    now (out of range, not yet or no longer stored), is ignored and counted in
    `state.sampler.rejected`. A priority of 0 stops the anchor from being drawn
    until it is overwritten; positive ones are clamped into `[1e-18, 1e18]`, so
    the total never overflows and no positive priority becomes 0. In float32 a
    draw never returns an anchor of zero priority or one never written.

    Weights are `(min_j P(j) / P(i)) ** beta` over the anchors of positive
    priority: always in `(0, 1]` (at least 1e-36), 0
    only for invalid rows. `importance_exponent` (beta) must be in [0, 1] when
    known at trace time (else `ValueError`); a traced beta is clamped into
    [0, 1], NaN counting as 1 (full correction).

    Indices are storage positions, not item identities: if `add` overwrote a row
    between `sample` and `set_priorities`, the priority goes to the new item
    there, as in Dopamine and Flashbax. Keep the adds between a sample and its
    update below the free capacity, as a usual training loop does.

    Args:
      priority_exponent: alpha, in [0, 1].
      stratified: draw one anchor from each of `sample_batch_size` equal segments
        of the total priority (the paper's scheme, lower variance); otherwise
        every draw is independent.

    Returns:
      A `Sampler` for the `sampler=` argument of the `make_*` factories.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.prioritized(1.0))
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(4, dtype=jnp.int32))
      >>> state = buffer.set_priorities(state, jnp.arange(4), jnp.array([0.0, 0, 3, 1]))
      >>> batch = buffer.sample(state, jax.random.key(0), importance_exponent=1.0)
      >>> batch.experience.tolist(), batch.probabilities.tolist(), batch.weights.tolist()
      ([2, 2, 2, 3], [0.75, 0.75, 0.75, 0.25], [0.333..., 0.333..., 0.333..., 1.0])
    """
    alpha = _validation.check_fraction("priority_exponent", priority_exponent)
    stratified = _validation.check_bool("stratified", stratified)

    def init(num_slots: int, groups: int) -> PriorityState:
        return PriorityState(
            tree=_sumtree.init(num_slots),
            max_priority=jnp.ones((), jnp.float32),
            rejected=jnp.zeros((), jnp.int32),
        )

    def after_add(state: PriorityState, changes: Changes) -> PriorityState:
        filled = changes.filled
        value = jnp.broadcast_to(state.max_priority**alpha, filled.shape)
        keep = jnp.ones(filled.shape, bool) if changes.keep is None else changes.keep
        if changes.cleared is None:
            tree = _sumtree.update(state.tree, filled, value, keep, unique=True)
            return state.replace(tree=tree)
        # One update: the cleared slots (-1 marks none) get 0, then the filled ones
        # their priority, a slot in both ending filled (the later entry wins; with
        # `disjoint` changes there is none to find).
        slots = jnp.concatenate([changes.cleared, filled])
        values = jnp.concatenate([jnp.zeros(changes.cleared.shape, jnp.float32), value])
        keep = jnp.concatenate([changes.cleared >= 0, keep])
        tree = _sumtree.update(state.tree, slots, values, keep, unique=changes.disjoint)
        return state.replace(tree=tree)

    def draw(layout, state, key, count: int, *, importance_exponent=0.4) -> Drawn:
        _check_importance_exponent(importance_exponent)
        drawn = _draw_in_proportion(
            state.sampler, key, count, layout.num_slots, stratified, importance_exponent
        )
        valid = drawn.valid & layout.usable(state, drawn.slots)
        return drawn.replace(where=layout.place(drawn.slots), valid=valid)

    def available(layout, state) -> jax.Array:
        return state.sampler.tree.total > 0

    def set_priorities(layout, state, indices: jax.Array, priorities: jax.Array):
        indices, priorities = _check_update(indices, priorities)
        slots = jnp.clip(indices, 0, layout.num_slots - 1)
        allowed = (indices == slots) & layout.usable(state, slots)
        return state.replace(sampler=_update(state.sampler, slots, priorities, allowed, alpha))

    config = Config(kind="prioritized", priority_exponent=alpha, stratified=stratified)
    return Sampler(config=config, init=init, draw=draw, after_add=after_add, available=available,
                   set_priorities=set_priorities)  # fmt: skip


def _check_update(indices: Any, priorities: Any) -> tuple[jax.Array, jax.Array]:
    """Trace-time checks of `set_priorities` arguments; returns int32 and float32 arrays."""
    for name, value in (("indices", indices), ("priorities", priorities)):
        if not hasattr(value, "shape") or np.ndim(value) != 1:
            raise ValueError(
                f"{name} must be a 1-D array [B], got "
                f"{getattr(value, 'shape', type(value).__name__)}."
            )
    check_priority_pairs(indices, priorities, "[B]")
    return jnp.asarray(indices).astype(jnp.int32), jnp.asarray(priorities).astype(jnp.float32)


def check_priority_pairs(indices: Any, priorities: Any, shape: str = "") -> None:
    """Raises unless `indices` (integers) and `priorities` (floats) share one shape."""
    if np.shape(indices) != np.shape(priorities):
        raise ValueError(
            f"indices and priorities must have one shape{' ' + shape if shape else ''}, got "
            f"{np.shape(indices)} and {np.shape(priorities)}."
        )
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"indices must be integers, got dtype {indices.dtype}.")
    if not jnp.issubdtype(priorities.dtype, jnp.floating):
        raise TypeError(f"priorities must be floating point, got dtype {priorities.dtype}.")


# Positive priorities are clamped into this range: the tree total stays finite
# for any number of slots (2**31 * 1e18 < 3.4e38), nothing positive is flushed
# to zero, and importance weights stay at least (1e-18 / 1e18) ** 1 = 1e-36.
PRIORITY_RANGE = (1e-18, 1e18)


def _update(state: PriorityState, slots, priorities, allowed, alpha: float) -> PriorityState:
    """Sets the priorities of `slots` where `allowed`, the last occurrence winning;
    negative, NaN and infinite priorities are ignored and counted in `rejected`,
    positive ones clamped into `PRIORITY_RANGE`."""
    ok = allowed & jnp.isfinite(priorities) & (priorities >= 0)
    # Positive by the bits: XLA on CPU reads subnormal floats (below 1.2e-38) as 0.
    positive = jax.lax.bitcast_convert_type(priorities, jnp.int32) > 0
    value = jnp.where(positive, jnp.clip(priorities, *PRIORITY_RANGE), 0.0)
    value = jnp.where(ok, value, 0.0)
    return state.replace(
        # a zero stays zero at every alpha (0**0 would be 1: drawn again at alpha 0)
        tree=_sumtree.update(state.tree, slots, jnp.where(value > 0, value**alpha, 0.0), ok),
        max_priority=jnp.maximum(state.max_priority, jnp.max(value, initial=0.0)),
        rejected=_validation.count_up(state.rejected, jnp.sum(~ok, dtype=jnp.int32)),
    )


def _draw_in_proportion(
    state: PriorityState, key, count: int, num_slots: int, stratified: bool, beta
) -> Drawn:
    """`count` slots drawn in proportion to their leaves, with importance weights
    `(N P(i))**-beta / max_j (N P(j))**-beta = (leaf_i / min_leaf)**-beta` over the
    slots `j` of positive priority."""
    beta = jnp.asarray(beta, jnp.float32)
    beta = jnp.where(jnp.isnan(beta), 1.0, jnp.clip(beta, 0.0, 1.0))
    words = _draws.random_words(key, count)
    uniform = (words >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)  # [0, 1)
    if stratified:  # one draw in each of `count` equal segments of the mass
        uniform = (jnp.arange(count, dtype=jnp.float32) + uniform) / count
    # Every read of the tree happens inside `find` (see `_sumtree`).
    slots, leaf, total, smallest = _sumtree.find(state.tree, uniform)
    slots = jnp.minimum(slots, num_slots - 1)
    positive = (leaf > 0) & (total > 0)
    safe = jnp.where(positive, leaf, 1.0)
    # (smallest / leaf) ** beta, not (leaf / smallest) ** -beta: the ratio is at least
    # 1e-36 (`PRIORITY_RANGE`), while its inverse can overflow to inf and give 0.
    ratio = jnp.where(positive, smallest, 1.0) / safe
    weights = jnp.where(positive, jnp.minimum(ratio**beta, 1.0), 0.0)
    probabilities = jnp.where(positive, safe / jnp.where(total > 0, total, 1.0), 0.0)
    return Drawn(slots=slots, where=slots, valid=positive, probabilities=probabilities,
                 weights=weights)  # fmt: skip


def _check_importance_exponent(value: Any) -> None:
    """A known beta must be a number in [0, 1]; a traced one is clamped (NaN as 1)."""
    if hasattr(value, "shape") and np.shape(value) != ():
        raise ValueError(f"importance_exponent must be a scalar, got shape {np.shape(value)}.")
    dtype = getattr(value, "dtype", None)
    if isinstance(value, bool) or (dtype is not None and not jnp.issubdtype(dtype, jnp.floating)):
        raise TypeError(f"importance_exponent must be a float, got {value!r}.")
    beta = _validation.known(value)
    if beta is not None:
        _validation.check_fraction("importance_exponent", beta.item())


class EpochState(struct.PyTreeNode):
    """The epochs sampler's state: where the current pass stands.

    A pass is a keyed permutation of the anchors drawable when it began, ranked
    group by group (`ends`), each group's at equal steps from its first slot
    (`first`, `stride`); a call evaluates the permutation at its batch's positions
    only (`jaxbuf.core.permutation`).

    Attributes:
      changed: int32 `[num_slots]`, the pass (`epoch`) during which each slot last
        started or stopped being drawable: an anchor stamped with the current pass
        was overwritten since it began, and is skipped.
      first: int32 `[groups]`, each group's first anchor (a slot) when the pass began.
      stride: int32 `[groups]`, the slots between a group's consecutive anchors.
      ends: int32 `[groups]`, the running sum of the anchors per group when the
        pass began.
      seed: uint32 `[2]`, the pass's permutation key.
      size: int32 scalar, the anchors in the current pass.
      cursor: int32 scalar, the anchors of the pass handed out so far.
      epoch: int32 scalar, the passes begun (saturating at 2**31 - 1).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.epochs())
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(6, dtype=jnp.int32))
      >>> state, batch = buffer.next_batch(state, jax.random.key(0))
      >>> int(state.sampler.epoch), int(state.sampler.size), int(state.sampler.cursor)
      (1, 6, 4)
    """

    changed: jax.Array
    first: jax.Array
    stride: jax.Array
    ends: jax.Array
    seed: jax.Array
    size: jax.Array
    cursor: jax.Array
    epoch: jax.Array


def epochs() -> Sampler:
    """Hands out every stored anchor exactly once per pass, in shuffled order.

    For offline training: the buffer gets `next_batch(state, key) -> (state,
    Sample)`, which returns the next `sample_batch_size` anchors of the current
    pass and moves on. A pass holds the anchors drawable when it began, in an
    order drawn with the key of that call; its last batch is partial (the rows
    past the pass are `valid` false), and the next call begins a new pass.
    Anchors added during a pass join the next one; anchors overwritten during
    a pass are skipped (their rows are `valid` false). `sample(state, key)`
    returns what `next_batch` would, without moving on. `state.sampler.epoch`
    counts the passes begun.

    A pass's order is a keyed permutation of its anchors (the swap-or-not
    shuffle, `6 ceil(log2 num_slots)` rounds), evaluated at each batch's
    positions only: a call costs O(`sample_batch_size` x rounds) plus
    O(environments) when a pass begins, never O(capacity), on every platform and
    without a branch. The state holds 4 bytes per slot.

    Returns:
      A `Sampler` for the `sampler=` argument of the `make_*` factories.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.epochs())
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(6, dtype=jnp.int32))
      >>> seen = []
      >>> for key in jax.random.split(jax.random.key(0), 2):
      ...     state, batch = buffer.next_batch(state, key)
      ...     seen += batch.experience[batch.valid].tolist()
      >>> sorted(seen)
      [0, 1, 2, 3, 4, 5]
    """

    def init(num_slots: int, groups: int) -> EpochState:
        # distinct arrays, each made anew: a donated state may not hold one buffer twice
        def zeros(*shape: int) -> jax.Array:
            return jnp.zeros(shape, jnp.int32)

        return EpochState(changed=jnp.full(num_slots, -1, jnp.int32), first=zeros(groups),
                          stride=zeros(groups), ends=zeros(groups),
                          seed=jnp.zeros(2, jnp.uint32), size=zeros(), cursor=zeros(),
                          epoch=zeros())  # fmt: skip

    def after_add(state: EpochState, changes: Changes) -> EpochState:
        changed, num_slots = state.changed, state.changed.shape[0]
        filled = (
            changes.filled if changes.keep is None else jnp.where(changes.keep, changes.filled, -1)
        )
        for slots in (changes.cleared, filled):
            if slots is not None:  # -1 pads (and filled slots not kept): out of bounds, dropped
                slots = jnp.where(slots >= 0, slots, num_slots)
                changed = changed.at[slots].set(state.epoch, mode="drop")
        return state.replace(changed=changed)

    def begin(layout, state, key) -> dict[str, jax.Array]:
        """The fields of the pass that begins now: O(groups)."""
        groups = jnp.arange(layout.groups, dtype=jnp.int32)
        first = layout.flatten(layout.slot(state, groups, jnp.zeros_like(groups)))
        second = layout.flatten(layout.slot(state, groups, jnp.ones_like(groups)))
        ends = _draws.running_sum(jnp.broadcast_to(layout.counts(state), (layout.groups,)))
        epoch = _validation.count_up(state.sampler.epoch, ends[-1] > 0)
        return {"first": first, "stride": (second - first) % _span(layout), "ends": ends,
                "seed": _draws.seed_of(key), "size": ends[-1], "cursor": jnp.int32(0),
                "epoch": epoch}  # fmt: skip

    def draw(layout, state, key, count: int) -> Drawn:
        current, fresh = state.sampler, begin(layout, state, key)
        ended = current.cursor >= current.size  # no branch: the new pass's fields, selected
        current = current.replace(**{name: jnp.where(ended, value, getattr(current, name))
                                     for name, value in fresh.items()})  # fmt: skip
        positions = current.cursor + jnp.arange(count, dtype=jnp.int32)
        slots = _pass_slots(layout, current, positions)
        valid = (positions < current.size) & (current.changed[slots] != current.epoch)
        after = current.replace(cursor=jnp.minimum(current.cursor + count, current.size))
        return Drawn(slots=slots, where=layout.place(slots),
                     valid=valid & layout.usable(state, slots), state=after)  # fmt: skip

    def available(layout, state) -> jax.Array:
        return jnp.sum(layout.counts(state)) > 0

    config = Config(kind="epochs")
    return Sampler(config=config, init=init, draw=draw, after_add=after_add, available=available,
                   advances=True)  # fmt: skip


def _span(layout) -> int:
    """The slots of each group (every group has as many)."""
    return layout.num_slots // layout.groups


def _pass_slots(layout, current: EpochState, positions: jax.Array) -> jax.Array:
    """The slots at `positions` of the current pass: the permuted rank, its group and
    member, and the member's slot, counted from the group's first at `stride`s."""
    rounds = _permutation.rounds(layout.num_slots)
    ranks = _permutation.permute(current.seed, positions, current.size, rounds)
    counts = jnp.diff(current.ends, prepend=0)
    group, member = _draws.locate(ranks, counts, current.ends)
    base = group * _span(layout)
    first = _draws.take_small(current.first, group) - base
    step = _draws.take_small(current.stride, group) * member
    return base + (first + step) % _span(layout)
