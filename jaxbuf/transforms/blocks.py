"""Blocks: `k` steps written and `k` batches drawn in one call.

Called from a Python loop, every jitted function costs JAX's price per call
(`docs/python_loop.md` measures it), whatever it computes; a loop that
adds a step and draws a batch each environment step pays it twice per step. A
block pays it once per `k` steps: the loop stages `k` steps on the host
(`jaxbuf.HostLoop` does) and one call writes them and draws the next `k`
batches, which the learner then consumes one by one (a PyTorch learner) or
with `lax.scan` (a jitted one). That is what Stable-Baselines3's `train_freq`
and `gradient_steps`, and Reverb's writers, do.

A block is exact, not an approximation:

- `write(state, steps)`, steps leaves `[k, *step]`, gives the state that `k`
  calls of `add_step` (or `add`) give, bit for bit: per-environment kinds take
  the `k` steps as one `add` of `T = k` steps (final observations, episode ends,
  `stale` bounds, sampler changes as for `k` steps), a replay buffer as one
  `add` of `k * n` items, others (rollout, queue) a `lax.scan` of their `add`.
- `draw(state, key)` gives the batches `sample(state, key_i)` gives for
  `key_i = jax.random.split(key, k)[i]` (`next_batch` in turn, for `epochs`;
  `pop`, for a queue), stacked on a leading axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Layout
from jaxbuf.core.records import Buffer, BufferLike, Config, PyTree, Sample, _Record
from jaxbuf.core.samplers import check_priority_pairs
from jaxbuf.kinds.queue import Queue
from jaxbuf.kinds.rollout import RolloutBuffer


@dataclasses.dataclass(frozen=True)
class Blocks(_Record):
    """The pure functions of a buffer taken `k` steps and `k` batches per call
    (see `jaxbuf.blocks`).

    Attributes:
      write: `write(state, steps) -> state`, steps leaves `[steps_per_call, *step]`.
      draw: `draw(state, key, **options) -> (state, Sample)`, the Sample's leaves
        `[batches_per_call, B, ...]`; None for a rollout buffer.
      write_and_draw: `write_and_draw(state, steps, key, **options) -> (state,
        Sample)`: `write`, then `draw`; None for a rollout buffer.
      set_priorities: `set_priorities(state, indices, priorities) -> state` for a
        block's `indices` (any shape, `[k, B]` say), applied in their row-major
        order (the last occurrence of a slot winning); None unless the sampler
        is `prioritized`.
      buffer: the buffer.
      config: `steps_per_call` and `batches_per_call`.

    Examples:
      >>> import jaxbuf
      >>> blocks = jaxbuf.blocks(jaxbuf.make_replay_buffer(64, 8), steps_per_call=4)
      >>> blocks.config.steps_per_call, blocks.config.batches_per_call
      (4, 4)
    """

    write: Callable[..., Any]
    draw: Callable[..., Any] | None
    write_and_draw: Callable[..., Any] | None
    set_priorities: Callable[..., Any] | None
    buffer: Any
    config: Config


def blocks(buffer: BufferLike, steps_per_call: int, batches_per_call: int | None = None) -> Blocks:
    """A buffer's `add` and `sample` taken `k` at a time: one call writes
    `steps_per_call` steps and draws `batches_per_call` batches.

    See the module docstring for what "exact" means here; `jaxbuf.HostLoop`
    stages the steps of a Python loop on the host and makes these calls.

    Args:
      buffer: a sampled buffer (any `make_*_buffer`, with any sampler, goal
        relabeling or frame stacking, `vectorize`d or not), a rollout buffer or
        a queue.
      steps_per_call: `k`, the steps (per-environment kinds: one per
        environment; replay buffers: one `add`'s items) each `write` takes; at
        most the buffer's `capacity` (`num_steps` for a rollout buffer), but any
        number for a replay buffer, whose `k` steps are `k` adds.
      batches_per_call: the batches each `draw` returns; default `steps_per_call`
        (one batch per environment step); 0 for a rollout buffer, which is read
        by `finish` and `minibatches`.

    Returns:
      A `Blocks` record.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(num_envs=2, steps_per_env=16, sample_batch_size=4)
      >>> blocks = jaxbuf.blocks(buffer, steps_per_call=8)
      >>> step = jaxbuf.Transition(obs=jnp.zeros(3), action=jnp.int32(0),
      ...     reward=jnp.float32(0), terminated=jnp.bool_(False),
      ...     truncated=jnp.bool_(False), next_obs=jnp.zeros(3))
      >>> steps = jax.tree.map(lambda x: jnp.zeros((8, 2, *x.shape), x.dtype), step)
      >>> state, batches = blocks.write_and_draw(buffer.init(step), steps, jax.random.key(0))
      >>> int(state.size), batches.experience.obs.shape, batches.valid.shape
      (8, (8, 4, 3), (8, 4))
    """
    if not isinstance(buffer, BufferLike):
        raise TypeError(f"blocks takes a jaxbuf buffer, got {type(buffer).__name__}.")
    config = _check_config(buffer, steps_per_call, batches_per_call)
    k, count = config.steps_per_call, config.batches_per_call
    draw = None if count == 0 else _drawer(buffer, count)
    write = _writer(buffer, k)

    def write_and_draw(state, steps: PyTree, key: jax.Array, **options) -> tuple[Any, Sample]:
        assert draw is not None
        return draw(write(state, steps), key, **options)

    write_and_draw.__doc__ = "`write(state, steps)`, then `draw(that state, key, **options)`."
    has_priorities = getattr(buffer, "set_priorities", None) is not None
    return Blocks(
        write=write,
        draw=draw,
        write_and_draw=None if draw is None else write_and_draw,
        set_priorities=_priority_setter(buffer) if has_priorities else None,
        buffer=buffer,
        config=config,
    )


def _check_config(buffer: Any, steps_per_call: Any, batches_per_call: Any) -> Config:
    limit = buffer.config.get(
        "num_steps", buffer.config.get("steps_per_env", buffer.config.get("capacity"))
    )
    if isinstance(buffer, Buffer) and "truncate_ok" in buffer.config:
        limit = _validation.MAX_INT32  # a step of items is `n` of them; `add` checks `k * n`
    k = _validation.check_int("steps_per_call", steps_per_call, maximum=limit)
    if isinstance(buffer, RolloutBuffer):
        if batches_per_call not in (None, 0):
            raise ValueError(
                f"batches_per_call must be 0 for a rollout buffer (it is read by finish and "
                f"minibatches), got {batches_per_call!r}."
            )
        return Config(steps_per_call=k, batches_per_call=0)
    count = k if batches_per_call is None else batches_per_call
    count = _validation.check_int("batches_per_call", count, minimum=0)
    return Config(steps_per_call=k, batches_per_call=count)


def _writer(buffer: Any, k: int) -> Callable:
    layout = buffer.layout if isinstance(buffer, Buffer) else None

    def write(state, steps: PyTree):
        """Writes `k` steps, leaves `[k, *step]` (what `add_step` takes, or `add` for
        replay, rollout and queue), as `k` calls in order would: returns the state."""
        _check_lead(steps, k)
        if isinstance(layout, Layout):
            data = _as_add_data(layout, state, steps)
            if _fits_one_add(buffer, layout, data):
                return buffer.add(state, data)
        add = single_add(buffer)
        return jax.lax.scan(lambda s, step: (add(s, step), None), state, steps)[0]

    return write


def _fits_one_add(buffer: Buffer, layout: Layout, data: PyTree) -> bool:
    """Whether `k` steps joined (`_as_add_data`) are one `add` that `k` single adds
    equal: always, but for a replay buffer without `truncate_ok` whose `k * n`
    items exceed its capacity (one `add` would refuse them; `k` adds of `n` keep
    the newest `capacity`)."""
    if buffer.config.get("truncate_ok", True):  # steps per environment, or items cut
        return True
    joined = jax.tree_util.tree_leaves(data)[0].shape[layout.steps_axis]
    return joined <= buffer.config.capacity


def single_add(buffer: Any) -> Callable[..., Any]:
    """What one step of a Python loop calls: `add_step`, or `add` for kinds without it."""
    add_step = getattr(buffer, "add_step", None)
    return buffer.add if add_step is None else add_step


def _check_lead(steps: PyTree, k: int) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(steps):
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) == 0 or shape[0] != k:
            raise ValueError(
                f"steps{jax.tree_util.keystr(path)}: expected a leading axis of "
                f"steps_per_call={k} steps, got shape {shape}."
            )


def _as_add_data(layout: Layout, state: Any, steps: PyTree) -> PyTree:
    """`k` steps `[k, *step]` as one `add`'s data: each step as `add_step` expands
    it (`[num_envs, 1, ...]`), then the `k` joined along the layout's `steps_axis`."""
    if layout.one_step is not None:
        steps = jax.vmap(layout.one_step, in_axes=(None, 0))(state, steps)
    axis = layout.steps_axis

    def join(leaf: jax.Array) -> jax.Array:
        moved = jnp.moveaxis(leaf, 0, axis)  # [..., k, unit, ...]
        return moved.reshape(*moved.shape[:axis], -1, *moved.shape[axis + 2 :])

    return jax.tree.map(join, steps)


def _drawer(buffer: Any, count: int) -> Callable:
    advances: Any = getattr(buffer, "next_batch", None)
    pop: Any = buffer.pop if isinstance(buffer, Queue) else None
    sample: Any = getattr(buffer, "sample", None)

    def draw(state, key: jax.Array, **options) -> tuple[Any, Sample]:
        """`count` batches, leaves `[count, B, ...]`: `sample(state, key_i)` for
        `key_i = jax.random.split(key, count)[i]` (`next_batch` in turn with
        `epochs`, `pop` for a queue, each moving the state on)."""
        keys = jax.random.split(key, count)
        if pop is not None:
            return jax.lax.scan(lambda s, _: pop(s), state, None, length=count)
        if advances is not None:
            return jax.lax.scan(lambda s, kk: advances(s, kk, **options), state, keys)
        return state, jax.vmap(lambda kk: sample(state, kk, **options))(keys)

    return draw


def _priority_setter(buffer: Any) -> Callable:
    def set_priorities(state, indices: jax.Array, priorities: jax.Array):
        """Sets the priorities of a block's `indices` (same shape as `priorities`,
        `[k, B]` say), in row-major order, the last occurrence of a slot winning."""
        indices, priorities = jnp.asarray(indices), jnp.asarray(priorities)
        check_priority_pairs(indices, priorities)
        return buffer.set_priorities(state, indices.ravel(), priorities.ravel())

    return set_priorities
