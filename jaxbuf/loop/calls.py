"""The calls of a `HostLoop`: jitted, donated, and the blocks they deliver.

Every call that draws returns a fresh block of `[batches_per_call, B, ...]`
arrays. Allocated anew each time, a block of image batches (3.6 MB per batch of
256 84x84 frame pairs) is memory the operating system maps and zeroes page by
page at every call, and that cost grows with `k`. So each drawing call is also
given back (donated) the block of two calls before, and XLA writes the new block
into its memory, once nothing but the loop references that block: no Python
object (a JAX array the caller kept, a NumPy view) counts it, and JAX itself
declines to donate memory that a Torch tensor still shares. A block the caller
still holds stays valid; the call then gets a new block instead.

The block given back is always an argument, a new one of the same shapes before
there is a spent one, so the drawing call has one signature and compiles once
(where the state is on one device; a state sharded over several takes a second
compile at its third call). A call that draws without writing (`draw()`, and
prefetch's first call, which draws twice) is a second program.

With a `device`, blocks are moved there (`jax.device_put`, asynchronous) after
the call; the block on the state's device is then the loop's own and is reused.
"""

from __future__ import annotations

import collections
import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.records import Sample
from jaxbuf.io import exporting as _export
from jaxbuf.transforms.blocks import Blocks, single_add

OUTPUTS = ("numpy", "torch", "jax")


class Calls:
    """A loop's jitted, donated calls (compiled once per loop and step structure)
    and the spent blocks they reuse.

    Args:
      blocks: the loop's `jaxbuf.blocks`.
      output: `"numpy"`, `"torch"` or `"jax"`.
      device: where blocks are delivered (a `jax.Device` or `Sharding`); None:
        where the state is.
    """

    def __init__(self, blocks: Blocks, output: str, device: Any = None):
        self.one = jax.jit(single_add(blocks.buffer), donate_argnums=0)
        self._write = jax.jit(functools.partial(_run, blocks, draw=False), donate_argnums=0)
        drawing = functools.partial(_run, blocks, draw=True)
        self._draw = jax.jit(drawing, donate_argnums=(0, 5), keep_unused=True)
        self._drawing = None if blocks.draw is None else drawing  # traced for the block's shapes
        self._output, self._device = output, device
        # per spent block: its structure, its arrays, and those of a delivered
        # copy that may share their memory (device_put to the same device)
        self._spent: collections.deque = collections.deque()
        self._new_block: Any = None  # jitted: the state -> a block of zeros

    def __call__(self, state: Any, key: jax.Array, stage: Any, priorities: Any,
                 options: dict, *, draw: bool) -> tuple[Any, jax.Array, Sample | None]:  # fmt: skip
        """Priorities, then the stage's steps, then (with `draw`) a block: returns
        the state, the key and the block, delivered (moved and converted)."""
        args = (state, key, stage, priorities, options)
        if self._new_block is None and self._drawing is not None:
            # traced at the first call, which often only writes (before learning)
            shapes = jax.eval_shape(self._drawing, *args, None)[2]
            self._new_block = jax.jit(lambda _: jax.tree.map(_zeros, shapes))
        if not draw:
            state, key, _ = self._write(*args, None)
            return state, key, None
        state, key, made = self._draw(*args, self._given_back(*args))
        block = made if self._device is None else jax.device_put(made, self._device)
        leaves, treedef = jax.tree.flatten(made)
        aliases = jax.tree.leaves(block) if _may_alias(block, made) else []
        self._spent.append((treedef, leaves, aliases))
        return state, key, convert(block, self._output)

    def _given_back(self, *args: Any) -> Sample | None:
        """The block the drawing call writes into: that of two calls before if
        nothing but the loop references it any more, else a new one of the
        same shapes (None only for a state on several devices)."""
        if len(self._spent) == 2:
            treedef, leaves, aliases = self._spent.popleft()
            if _unreferenced(leaves) and _unreferenced(aliases):
                return jax.tree.unflatten(treedef, leaves)
        if len({d for leaf in jax.tree.leaves(args[0]) for d in leaf.devices()}) != 1:
            return None
        return self._new_block(args[0])  # beside the state: its device, committed as it is


def _zeros(shape: jax.ShapeDtypeStruct) -> jax.Array:
    return jnp.zeros(shape.shape, shape.dtype)


def _count_in_list(items: list, index: int) -> int:
    """What `sys.getrefcount` says of `items[index]` (2 on CPython up to 3.13 for
    an object only the list holds: the list's count and the call's; measured
    below, since an interpreter that borrows the argument says less)."""
    return sys.getrefcount(items[index])


_ALONE = _count_in_list([object()], 0)


def _unreferenced(leaves: list[jax.Array]) -> bool:
    """Whether each array is referenced by `leaves` alone: no block, JAX array
    or NumPy view the caller kept."""
    return all(_count_in_list(leaves, i) <= _ALONE for i in range(len(leaves)))


def _run(blocks: Blocks, state, key, steps, priorities, options, spent, *, draw: bool):
    """One call: staged priorities, then the staged steps, then (with `draw`) a
    block; `spent` (a block of an earlier call, or None) is donated: XLA writes
    the new block into its memory."""
    del spent
    if priorities is not None:
        assert blocks.set_priorities is not None
        state = blocks.set_priorities(state, *priorities)
    if steps is not None:
        state = blocks.write(state, steps)
    if not draw:
        return state, key, None
    assert blocks.draw is not None
    key, now = jax.random.split(key)
    state, block = blocks.draw(state, now, **options)
    return state, key, block


def convert(block: Sample, output: str) -> Sample:
    """A block in the loop's output format: NumPy views (copies off the CPU), Torch
    tensors (DLPack) or the JAX arrays."""
    if output == "numpy":
        return jax.tree.map(np.asarray, block)
    if output == "torch":
        return _export.to_torch(block)
    return block


def _may_alias(block: Sample, made: Sample) -> bool:
    """Whether a delivered block may hold the memory of the block the call made
    under other array objects: moved to a device the made block is on
    (`device_put` to the same device aliases)."""
    pairs = zip(jax.tree.leaves(block), jax.tree.leaves(made), strict=True)
    return any(a is not b and not a.devices().isdisjoint(b.devices()) for a, b in pairs)
