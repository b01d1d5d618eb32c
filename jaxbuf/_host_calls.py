"""The calls of a `HostLoop`: jitted, donated, and the blocks they deliver.

Every call that draws returns a fresh block of `[batches_per_call, B, ...]`
arrays. Allocated anew each time, a block of image batches (3.6 MB per batch of
256 84x84 frame pairs) is memory the operating system maps and zeroes page by
page at every call, and that cost grows with `k`. So each drawing call is also
given back (donated) the block of two calls before, and XLA writes the new block
into its memory. It is safe by construction: JAX donates a buffer only where
nothing outside it still references it. A block the caller still holds (as NumPy
views or Torch tensors) is not reused and stays valid; the call then allocates.
Only blocks the caller can hold as JAX arrays (`output="jax"` on the state's
device) are never given back, since a donated JAX array would be deleted.

With a `device`, blocks are moved there (`jax.device_put`, asynchronous) after
the call; the block on the state's device is then the loop's own and is reused.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import jax
import numpy as np

from jaxbuf import _export
from jaxbuf._blocks import Blocks, single_add
from jaxbuf._types import Sample

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
        self._draw = jax.jit(functools.partial(_run, blocks, draw=True), donate_argnums=(0, 5),
                             keep_unused=True)  # fmt: skip
        self._output, self._device = output, device
        self._spent: collections.deque = collections.deque()

    def __call__(self, state: Any, key: jax.Array, stage: Any, priorities: Any,
                 options: dict, *, draw: bool) -> tuple[Any, jax.Array, Sample | None]:  # fmt: skip
        """Priorities, then the stage's steps, then (with `draw`) a block: returns
        the state, the key and the block, delivered (moved and converted)."""
        if not draw:
            state, key, _ = self._write(state, key, stage, priorities, options, None)
            return state, key, None
        spent = self._spent.popleft() if len(self._spent) == 2 else None
        state, key, made = self._draw(state, key, stage, priorities, options, spent)
        block = made if self._device is None else jax.device_put(made, self._device)
        if self._output != "jax" or not _shares_memory(block, made):
            self._spent.append(made)
        return state, key, convert(block, self._output)


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


def _shares_memory(block: Sample, made: Sample) -> bool:
    """Whether a delivered block may hold the memory of the block the call made:
    it is that block, or shares a device with it (`device_put` to the same
    device aliases)."""
    pairs = zip(jax.tree.leaves(block), jax.tree.leaves(made), strict=True)
    return any(a is b or not a.devices().isdisjoint(b.devices()) for a, b in pairs)
