"""HostLoop: a buffer fed and drawn from a Python loop, `k` steps per call.

The host-side part of `jaxbuf.blocks`: it stages the steps a Python loop adds in
preallocated NumPy arrays and, every `k` steps, makes one jitted, donated call
that writes them and draws the next `k` batches. Everything on the device stays
pure (`blocks`); this class only holds the state, the key and the stage between
calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.records import BufferLike, PyTree, Sample
from jaxbuf.core.samplers import check_priority_pairs
from jaxbuf.io import exporting as _export
from jaxbuf.kinds.queue import Queue
from jaxbuf.loop.calls import OUTPUTS, Calls
from jaxbuf.loop.stage import Stage, leaf_name
from jaxbuf.transforms.blocks import Blocks, blocks


class HostLoop:
    """A buffer fed from a Python loop: `add` stages steps on the host, and every
    `steps_per_call` steps one call writes them and draws the next block of
    batches.

    The loop a Stable-Baselines3, cpprb or TorchRL user knows, with JAX's price
    per call paid once per block instead of twice per step:

        loop = jaxbuf.HostLoop(buffer, buffer.init(example), key, steps_per_call=32)
        for t in range(steps):
            ...                                   # step the environments
            block = loop.add(step)                # NumPy (or torch) leaves [num_envs, ...]
            if block is not None:                 # every 32 steps: 32 batches
                for j in range(32):
                    learn(block.experience.obs[j], ...)

    Semantics:

    - **What a batch can contain**: what was written up to the call that drew
      it, the block's own `k` steps included; steps staged since are not
      drawable yet. So a batch learned from at step `t` may miss the last `k`
      steps, as with SB3's `train_freq=k`.
    - **Distribution**: a block's `k` batches are exactly `k` calls of
      `sample` with keys split from the loop's key (`blocks`): the same draws,
      independent, as `k` single calls; `valid` and `min_size` as in `sample`.
    - **Nothing is lost**: `state` writes the staged steps before returning the
      state, so `jaxbuf.save(path, loop.state, buffer)` saves every step given
      to `add`; leaving a `with HostLoop(...)` block (by an exception too)
      writes them; `flush()` writes them at once. A step that fails its checks
      raises in `add` and is not staged; nothing staged before is touched. A
      call that fails (a learner's exception in a device callback, say) keeps
      the steps it did not write staged: the next `add`, `flush` or `state`
      writes them first.
    - **Priorities**: `set_priorities(indices, priorities)` (a block's `[k, B]`
      at once, or a batch's `[B]`) are staged and applied at the next call,
      before its steps are written, in the order given.
    - **Memory**: nothing is allocated per call. Two host stages take turns, and
      each drawing call writes its block into the memory of the block of two
      calls before, once nothing but the loop references that block (a block
      you keep, as JAX arrays, NumPy views or Torch tensors, stays valid: the
      call then writes a new one). The drawing call compiles once: before two
      blocks were spent it is given new ones of the same shapes. Resident
      memory: the state, two stages and about two blocks.
    - **Prefetch** (`prefetch=True`, uniform and prioritized sampling): each
      call draws the block the next call returns, so a block holds what was
      written up to the call before the one that returns it (the last `2k`
      steps may be missing) and its draw and transfer overlap the learner's
      use of the previous block; the first call draws twice. Priorities set for
      a block reach draws from two calls later.

    Args:
      buffer: any buffer `jaxbuf.blocks` takes (every sampled kind and sampler,
        goal relabeling, frame stacking, `vectorize`, the rollout buffer, the
        queue).
      state: the buffer's state (`buffer.init(example)`); it is donated at every
        call, so read it back from `loop.state`.
      key: a PRNG key; every drawing call splits it.
      steps_per_call: `k`, the steps staged per call.
      batches_per_call: batches per block; default `k` (0 for a rollout buffer).
      output: `"numpy"` (views of the block on CPU, copies elsewhere),
        `"torch"` (`jaxbuf.io.to_torch`: no copy on CPU or CUDA) or `"jax"` (for a
        jitted learner that scans over the block).
      device: where blocks are delivered (a `jax.Device` or `Sharding`: the
        learner's), with `output="jax"` or `"torch"`; the state stays where it
        is (on the host CPU for a buffer bigger than the accelerator's memory).
        None: blocks come where the state is.
      prefetch: draw each block one call ahead (see Prefetch above).
      **sample_options: the sampler's options (`importance_exponent` for
        `prioritized`); `loop.sample_options` may be changed between calls
        (traced: no recompilation).

    Examples:
      >>> import jax, jax.numpy as jnp, numpy as np, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(num_envs=2, steps_per_env=64, sample_batch_size=4)
      >>> example = jaxbuf.Transition(obs=jnp.zeros(3), action=jnp.int32(0),
      ...     reward=jnp.float32(0), terminated=jnp.bool_(False),
      ...     truncated=jnp.bool_(False), next_obs=jnp.zeros(3))
      >>> loop = jaxbuf.HostLoop(buffer, buffer.init(example), jax.random.key(0), steps_per_call=8)
      >>> step = jaxbuf.Transition(obs=np.ones((2, 3), np.float32), action=np.zeros(2, np.int32),
      ...     reward=np.ones(2, np.float32), terminated=np.zeros(2, bool),
      ...     truncated=np.zeros(2, bool), next_obs=np.ones((2, 3), np.float32))
      >>> blocks = [loop.add(step) for _ in range(8)]
      >>> blocks[6] is None, blocks[7].experience.obs.shape, type(blocks[7].valid).__name__
      (True, (8, 4, 3), 'ndarray')
      >>> loop.add(step) is None, loop.staged, int(loop.state.size), loop.staged
      (True, 1, 9, 0)
    """

    def __init__(self, buffer: BufferLike, state: Any, key: jax.Array, *, steps_per_call: int,
                 batches_per_call: int | None = None, output: str = "numpy",
                 device: Any = None, prefetch: bool = False,
                 **sample_options: Any):  # fmt: skip
        self.blocks: Blocks = blocks(buffer, steps_per_call, batches_per_call)
        _check_delivery(self.blocks, output, device, prefetch)
        if output == "torch":
            _export._import_torch()
        self._state, self._key = state, _check_key(key)
        self.sample_options: dict[str, Any] = dict(sample_options)
        self._stage = Stage(self.steps_per_call)
        self._priorities: list[tuple[np.ndarray, np.ndarray]] = []
        self._calls = Calls(self.blocks, output, device)
        self._prefetch, self._ahead = prefetch, None

    @property
    def staged(self) -> int:
        """The steps staged on the host, not written yet."""
        return self._stage.count

    @property
    def steps_per_call(self) -> int:
        """`k`: the steps each call writes."""
        return self.blocks.config.steps_per_call

    @property
    def state(self) -> Any:
        """The buffer state, holding every step given to `add`: staged steps (and
        priorities) are written first. It is donated at the next call: save or
        copy it before the loop goes on."""
        self.flush()
        return self._state

    @state.setter
    def state(self, state: Any) -> None:
        """Replaces the state (after `finish` and `clear` of a rollout, say); steps
        staged since the last call are written into the new one. A prefetched
        block, drawn from the state replaced, is dropped: the next block is drawn
        from the new one."""
        self._state = state
        self._ahead = None

    def add(self, step: PyTree, *, draw: bool = True) -> Sample | None:
        """Stages one step: what `buffer.add_step` takes (leaves `[num_envs, ...]`),
        or `buffer.add` for kinds without it (replay: one call's `[n, ...]`
        items; rollout: one step; queue: `[add_batch_size, ...]` items), as
        NumPy arrays, torch CPU tensors or JAX arrays with the example's dtypes.

        Args:
          step: the step.
          draw: whether the call this step may complete draws a block; False
            writes only (before a learner starts, say: no batch is drawn that
            no one uses). A prefetched block is dropped then, not kept stale.

        Returns:
          None, or, when this step completes `steps_per_call` staged steps and
          the loop draws, the block: a `Sample` with leaves `[batches_per_call,
          B, ...]` in the loop's `output` format (with `prefetch`, the block
          the previous call drew).
        """
        if not isinstance(draw, bool):
            raise TypeError(f"draw must be True or False, got {draw!r}.")
        leaves = self._checked_leaves(step)
        if self.staged == self.steps_per_call:  # the call that writes them failed: retry
            self._write_stage(draw=False)
        self._stage.put(leaves)
        if self.staged < self.steps_per_call:
            return None
        return self._write_stage(draw=draw and self.blocks.draw is not None)

    def draw(self) -> Sample:
        """Writes what is staged, then draws a block now (one call when nothing is
        staged): for more batches per step than `batches_per_call`, or batches
        before the first block. Never a prefetched one."""
        if self.blocks.draw is None:
            raise TypeError(
                "this loop draws no batches (a rollout buffer, which finish and minibatches "
                "read, or batches_per_call=0): nothing to draw."
            )
        self.flush()
        block = self._call(None, draw=True)
        assert block is not None
        return block

    def set_priorities(self, indices: Any, priorities: Any) -> None:
        """Stages new priorities for a block's (`[k, B]`) or a batch's (`[B]`)
        `indices`; the next call applies them, in order, before it writes."""
        if self.blocks.set_priorities is None:
            raise TypeError("set_priorities needs a buffer made with sampler=jaxbuf.prioritized().")
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        check_priority_pairs(indices, priorities)
        self._priorities.append((indices.astype(np.int32).ravel(), priorities.ravel().copy()))

    def flush(self) -> None:
        """Writes the staged steps (and priorities) now: one call for a full
        stage, one per step for a partial one (at a save or the end of a run)."""
        if self.staged == self.steps_per_call:
            self._write_stage(draw=False)
            return
        if self._priorities:
            self._call(None, draw=False)
        written = 0
        try:
            for j in range(self.staged):
                self._state = self._calls.one(self._state, self._stage.step(j))
                written += 1
        finally:  # what is left stays staged
            self._stage.drop_first(written, self._state)

    def __enter__(self) -> HostLoop:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.flush()

    def _checked_leaves(self, step: PyTree) -> list[np.ndarray]:
        leaves, treedef = jax.tree.flatten(step)
        leaves = [np.asarray(leaf) for leaf in leaves]
        if self._stage.treedef is None:
            self._first_step(step, leaves, treedef)
        if treedef != self._stage.treedef:
            raise ValueError(_structure_mismatch(step, self._stage.treedef))
        if not self._stage.fits(leaves):
            raise TypeError(self._stage.shape_error(step, leaves))
        return leaves

    def _first_step(self, step: PyTree, leaves: list[np.ndarray], treedef: Any) -> None:
        """Checks the first step against the buffer (its errors name the leaf),
        then allocates the stage."""
        for index, leaf in enumerate(leaves):
            if jax.dtypes.canonicalize_dtype(leaf.dtype) != leaf.dtype:
                raise TypeError(
                    f"step{leaf_name(step, index)}: got {leaf.dtype}, which JAX would cast "
                    f"to {jax.dtypes.canonicalize_dtype(leaf.dtype)} (jax_enable_x64 is off); "
                    "give the example's dtype (nothing is cast silently)."
                )
        specs = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves]
        jax.eval_shape(self._calls.one, self._state, jax.tree.unflatten(treedef, specs))
        self._stage.allocate(treedef, specs)

    def _write_stage(self, *, draw: bool) -> Sample | None:
        """One call with the full stage (`[k, *step]` steps); once it is made, the
        other stage fills, and until then nothing staged is dropped. With
        `prefetch`, the block drawn one call before is returned (the first call
        draws twice)."""
        block = self._call(self._stage.tree(), draw=draw)
        # the call may read the stage until it has run: a drawing call's new key
        # tells when (waited for at the next turn); a call that only writes returns
        # its key untouched, so its state is waited for now
        if not draw:
            jax.block_until_ready(self._state)
        self._stage.turn(self._key if draw else None)
        if block is None or not self._prefetch:
            self._ahead = None
            return block
        if self._ahead is None:
            self._ahead = self._call(None, draw=True)
            return block
        block, self._ahead = self._ahead, block
        return block

    def _call(self, stage: PyTree | None, *, draw: bool) -> Sample | None:
        priorities = None
        if self._priorities:
            priorities = tuple(np.concatenate(x) for x in zip(*self._priorities, strict=True))
        self._state, self._key, block = self._calls(
            self._state, self._key, stage, priorities, self.sample_options, draw=draw
        )
        self._priorities = []
        return block


def _structure_mismatch(step: PyTree, first: Any) -> str:
    """Why `step` does not have the structure `first` of the loop's first step,
    naming the first leaf that differs."""
    names = [jax.tree_util.keystr(path) for path in _paths(step)]
    wanted = [
        jax.tree_util.keystr(path) for path in _paths(first.unflatten([0] * first.num_leaves))
    ]
    missing = [f"lacks step{name}" for name in wanted if name not in names]
    extra = [
        f"has step{name}, which the first step had not" for name in names if name not in wanted
    ]
    if missing or extra:
        named = [*missing[:1], *extra[:1]]
        more = len(missing) + len(extra) - len(named)
        tail = f" ({more} more leaves differ)" if more else ""
        return f"step {' and '.join(named)}{tail}: every step needs the loop's first step's leaves."
    return (
        f"step has the loop's leaves ({', '.join(names) or 'none'}) in other containers: "
        f"{jax.tree.structure(step)}, but the loop's first step had {first}."
    )


def _paths(tree: PyTree) -> list[Any]:
    return [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _check_delivery(blocks: Blocks, output: Any, device: Any, prefetch: Any) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}.")
    if device is not None and output == "numpy":
        raise ValueError(
            f"device={device!r} delivers blocks on a device, but output='numpy' delivers them "
            "as host arrays: give output='jax' (or 'torch') with a device, or no device."
        )
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}.")
    moves = (
        isinstance(blocks.buffer, Queue) or getattr(blocks.buffer, "next_batch", None) is not None
    )
    if prefetch and (blocks.draw is None or moves):
        raise ValueError(
            "prefetch draws each block one call before it is returned, which only samplers "
            "whose draws leave the state as it was allow (uniform, prioritized): a queue's pop "
            "or an epoch's next_batch would move the state past batches no one received yet "
            "(and a loop that draws nothing has nothing to prefetch)."
        )


def _check_key(key: Any) -> jax.Array:
    if not isinstance(key, jax.Array) or not (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        or (key.dtype == np.uint32 and key.shape == (2,))
    ):
        raise TypeError(
            "key must be a PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed)), got "
            f"{getattr(key, 'dtype', type(key).__name__)}{list(getattr(key, 'shape', []))}."
        )
    return key
