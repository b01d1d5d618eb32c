"""Independent buffers, one per environment, behind one interface."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _replay, _validation
from jaxbuf._base import AddFn, CanSampleFn, InitFn, SampleFn

PyTree = Any


@struct.dataclass
class VectorizedSample:
    """A batch drawn across the buffers of a vectorized buffer.

    Attributes:
      experience: leaves `[sample_batch_size, *item_shape]`.
      buffer_indices: int32 `[sample_batch_size]`, the buffer each item came from.
      indices: int32 `[sample_batch_size]`, the storage row within that buffer.
      valid: bool `[sample_batch_size]`, true where the item's buffer holds at least
        `min_size` items (see `ReplaySample.valid`).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 4), num_buffers=3)
      >>> state = buffers.add(buffers.init(jnp.float32(0)), jnp.ones((3, 2)))
      >>> batch = buffers.sample(state, jax.random.key(0))
      >>> batch.experience.shape, batch.buffer_indices.shape, batch.indices.shape
      ((4,), (4,), (4,))
    """

    experience: PyTree
    buffer_indices: jax.Array
    indices: jax.Array
    valid: jax.Array


class VectorizedReplayBuffer(NamedTuple):
    """The pure functions of `num_buffers` independent replay buffers.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 4), num_buffers=3)
      >>> buffers.num_buffers, buffers.config.capacity
      (3, 10)
    """

    init: InitFn
    add: AddFn
    sample: SampleFn
    can_sample: CanSampleFn
    config: _replay.ReplayBufferConfig
    num_buffers: int


def vectorize(buffer: _replay.ReplayBuffer, num_buffers: int) -> VectorizedReplayBuffer:
    """Turns one replay buffer into `num_buffers` independent ones over a stacked state.

    Each buffer (say, one per environment) keeps its own FIFO order. The state is
    the single-buffer state with a leading `[num_buffers]` axis on every leaf,
    `size` included; `init`, `add` and `can_sample` equal `jax.vmap` of the single
    functions (`can_sample` is true when every buffer can sample).

    `sample` draws `sample_batch_size` items in total, uniformly over all the
    items stored in all buffers: the number taken from each buffer is random
    (multinomial, in proportion to its size) and the sample says which buffer
    each item came from. Without replacement the `(buffer, row)` pairs are
    distinct whenever the buffers hold `sample_batch_size` items together.

    Args:
      buffer: a buffer made by `make_replay_buffer`.
      num_buffers: the number of independent buffers.

    Returns:
      A `VectorizedReplayBuffer`. Its `add` takes leaves `[num_buffers, B, ...]`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 6), num_buffers=3)
      >>> state = buffers.init({"obs": jnp.zeros(2)})
      >>> state = buffers.add(state, {"obs": jnp.ones((3, 4, 2))})
      >>> batch = buffers.sample(state, jax.random.key(0))
      >>> state.size.tolist(), batch.experience["obs"].shape, batch.buffer_indices.shape
      ([4, 4, 4], (6, 2), (6,))
    """
    if not isinstance(buffer, _replay.ReplayBuffer):
        raise TypeError(
            f"vectorize takes a buffer made by make_replay_buffer, got {type(buffer).__name__}. "
            "For prioritized replay over many environments, use "
            "make_prioritized_trajectory_buffer (one sum tree over every environment), or "
            "jax.vmap the buffer's functions to keep one tree and one batch per environment."
        )
    config = buffer.config
    num_buffers = _validation.check_int(
        "num_buffers", num_buffers, maximum=_validation.MAX_INT32 // config.capacity
    )
    draw = _replay.draw_fn(config.replacement)

    def init(example: PyTree) -> _replay.ReplayBufferState:
        shapes = jax.eval_shape(lambda: buffer.init(example))
        return jax.tree.map(lambda s: jnp.zeros((num_buffers, *s.shape), s.dtype), shapes)

    def add(state: _replay.ReplayBufferState, items: PyTree) -> _replay.ReplayBufferState:
        spec = _replay.storage_spec(state.experience, 1)
        _validation.check_batch(spec, items, [("num_buffers", num_buffers), ("B", None)])
        return jax.vmap(buffer.add)(state, items)

    def sample(state: _replay.ReplayBufferState, key: jax.Array) -> VectorizedSample:
        ends = jnp.cumsum(state.size, dtype=jnp.int32)
        flat = draw(key, ends[-1], config.sample_batch_size)
        which = jnp.searchsorted(ends, flat, side="right").astype(jnp.int32)
        which = jnp.minimum(which, num_buffers - 1)  # only when every buffer is empty
        rows = flat - (ends - state.size)[which]
        experience = jax.tree.map(
            lambda x: x.at[which, rows].get(mode="promise_in_bounds"), state.experience
        )
        valid = (state.size >= config.min_size)[which]
        return VectorizedSample(experience, which, rows, valid)

    def can_sample(state: _replay.ReplayBufferState) -> jax.Array:
        return jnp.all(state.size >= config.min_size)

    return VectorizedReplayBuffer(init, add, sample, can_sample, config, num_buffers)
