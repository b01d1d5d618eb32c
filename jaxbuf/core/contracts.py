"""The contract records between the parts of a sampled buffer, in one place.

A kind describes its storage, anchors and unit as a `Layout` (the frames it stacks as
`StackRead`s); a sampler is a `Sampler`
record of pure functions over it, told on every `add` which slots changed (`Changes`) and
answering a draw with a `Drawn`; an option is an `Option`, whose rewrite of what is drawn
is a `Relabel`. Each is built by keyword (`Layout(init=..., write=..., ...)`); the modules
that fill them (`assembly`, `samplers`, `pipeline`, the kinds, the options) import them
from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
from flax import struct

from jaxbuf.core.records import Config, PyTree, _Record


class Layout(NamedTuple):
    """A sampled kind's storage, anchors and unit (see the module docstring)."""

    init: Callable[[PyTree], Any]
    write: Callable[..., tuple[Any, Changes]]  # (state, data, where=None)
    num_slots: int
    groups: int
    counts: Callable[[Any], jax.Array]
    slot: Callable[[Any, jax.Array, jax.Array], Any]
    usable: Callable[[Any, jax.Array], jax.Array]
    expand: Callable[[Any, Any], tuple[PyTree, jax.Array | None, jax.Array | None]]
    ready: Callable[..., jax.Array]
    place: Callable[[jax.Array], Any]
    flatten: Callable[[Any], jax.Array]
    one_step: Callable[[Any, PyTree], PyTree] | None = None
    # The axis of `add`'s data along which consecutive calls' data follow each other
    # (`jaxbuf.blocks`): 0 for items `[B, ...]`, 1 for steps `[num_envs, T, ...]`.
    steps_axis: int = 1
    # The top-level leaf whose side ring follows it (`state.side.experience`: a
    # transition buffer's final observations follow `obs`); options that narrow or
    # place a leaf take its side ring along.
    side_of: str | None = None
    # Where the frames stacked for a drawn item come from (`frames=`): `(state, where,
    # drawn, stacks) -> {leaf: StackRead}`, `drawn` as `expand` returned it; None where
    # the kind stacks nothing.
    frame_reads: Callable[..., Mapping[str, StackRead]] | None = None


class StackRead(NamedTuple):
    """How one stacked leaf of a drawn item is made, oldest frame first along `axis` (the
    one after the item's leading axes `[...]`: `[B]` or `[B, L]`): the newest frames of
    the stack `older` but its oldest, then the stored `leaf` gathered at `(envs, times)`
    (int32 `[..., j]`; none where None), then `newest` (values `[...]`), each where
    given; zero where `keep` (bool `[...]`) is false."""

    leaf: str
    envs: jax.Array
    times: jax.Array | None
    older: str | None = None
    newest: PyTree | None = None
    keep: jax.Array | None = None
    axis: int = 1


class Changes(struct.PyTreeNode):
    """Which slots an `add` made undrawable (`cleared`, distinct where not -1) and
    drawable (`filled` where `keep`, distinct); int32 arrays, or None for none.
    `disjoint` (static): no slot is both cleared and filled, so a sampler need not
    find the ones that are (a sort of every entry above `_lowering.PAIRS` of them)."""

    cleared: jax.Array | None
    filled: jax.Array
    keep: jax.Array | None = None
    disjoint: bool = struct.field(pytree_node=False, default=False)


class Drawn(struct.PyTreeNode):
    slots: jax.Array
    where: Any
    valid: jax.Array
    probabilities: jax.Array | None = None
    weights: jax.Array | None = None
    state: Any = None  # the sampler's state after the draw, for samplers that advance


@dataclasses.dataclass(frozen=True)
class Sampler(_Record):
    """The pure functions of a sampler (see the module docstring).

    Examples:
      >>> import jaxbuf
      >>> jaxbuf.prioritized(priority_exponent=0.5).config
      Config(kind='prioritized', priority_exponent=0.5, stratified=True)
    """

    config: Config
    init: Callable[[int, int], PyTree]  # (num_slots, groups)
    draw: Callable[..., Drawn]
    after_add: Callable[[PyTree, Changes], PyTree]
    available: Callable[[Any, Any], jax.Array]
    set_priorities: Callable[..., Any] | None = None
    advances: bool = False  # whether a draw moves the sampler on (`next_batch`)


class Relabel(NamedTuple):
    """A rewrite of drawn items: `choose(state, where, key) -> source` and
    `apply(state, where, experience, source) -> experience`, `where` as the layout's
    `place` gives it (goal relabeling: `source` is the sample's `goal_source`)."""

    choose: Callable[[Any, Any, jax.Array], jax.Array]
    apply: Callable[[Any, Any, PyTree, jax.Array], PyTree]


class Option(NamedTuple):
    """One option of a buffer (see the module docstring)."""

    name: str
    config: Mapping[str, Any] = {}
    refuses: Mapping[str, str] = {}  # the options it cannot be combined with, and why
    layout: Callable[[Layout], Layout] | None = None
    relabel: Relabel | None = None
