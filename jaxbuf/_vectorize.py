"""Independent buffers, one per environment, behind one interface."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbuf import _sampling, _storage, _validation
from jaxbuf._storage import RingState
from jaxbuf._types import Buffer, Config, PyTree, Sample


def vectorize(buffer: Buffer, num_buffers: int) -> Buffer:
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
      buffer: a buffer made by `make_replay_buffer` with the uniform sampler.
      num_buffers: the number of independent buffers.

    Returns:
      A `Buffer` whose `config` adds `num_buffers`. Its `add` takes leaves
      `[num_buffers, B, ...]`; its samples' `source` is the buffer of each item.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 6), num_buffers=3)
      >>> state = buffers.init({"obs": jnp.zeros(2)})
      >>> state = buffers.add(state, {"obs": jnp.ones((3, 4, 2))})
      >>> batch = buffers.sample(state, jax.random.key(0))
      >>> state.size.tolist(), batch.experience["obs"].shape, batch.source.shape
      ([4, 4, 4], (6, 2), (6,))
    """
    config = getattr(buffer, "config", None)
    kind = (config.get("kind"), config.sampler.kind) if isinstance(config, Config) else None
    if kind != ("replay", "uniform"):
        raise TypeError(
            "vectorize takes a uniform replay buffer (make_replay_buffer), got "
            f"{kind or type(buffer).__name__}. For prioritized replay over many "
            "environments, use make_transition_buffer or make_trajectory_buffer with "
            "sampler=jaxbuf.prioritized() (one sum tree over every environment), or "
            "jax.vmap the buffer's functions to keep one tree and one batch per environment."
        )
    num_buffers = _validation.check_int(
        "num_buffers", num_buffers, maximum=_validation.MAX_INT32 // config.capacity
    )
    pick = _sampling.uniform_indices if config.sampler.replacement else _sampling.distinct_indices

    def init(example: PyTree) -> RingState:
        """`num_buffers` empty states, stacked: every leaf `[num_buffers, ...]`."""
        shapes = jax.eval_shape(lambda: buffer.init(example))
        return jax.tree.map(lambda s: jnp.zeros((num_buffers, *s.shape), s.dtype), shapes)

    def add(state: RingState, items: PyTree) -> RingState:
        """Adds `items` (leaves `[num_buffers, B, ...]`), buffer `i` taking `items[i]`."""
        spec = _storage.item_spec(state.experience, 1)
        _validation.check_batch(spec, items, [("num_buffers", num_buffers), ("B", None)])
        return jax.vmap(buffer.add)(state, items)

    def sample(state: RingState, key: jax.Array) -> Sample:
        """`sample_batch_size` items drawn uniformly over all buffers' items; `indices`
        are `buffer * capacity + row` (for `take`), `source` the buffer."""
        ends = jnp.cumsum(state.size, dtype=jnp.int32)
        which, rows = _sampling.locate(pick(key, ends[-1], config.sample_batch_size), state.size)
        experience = _storage.read(state.experience, which, rows)
        valid = (state.size >= config.min_size)[which]
        return Sample(experience, which * config.capacity + rows, valid, source=which)

    def can_sample(state: RingState) -> jax.Array:
        """bool scalar: true when every buffer can sample."""
        return jnp.all(state.size >= config.min_size)

    def take(state: RingState, indices: jax.Array) -> PyTree:
        """The items at `indices` (`buffer * capacity + row`, a sample's), clamped."""
        flat = jnp.clip(jnp.asarray(indices, jnp.int32), 0, num_buffers * config.capacity - 1)
        return _storage.read(state.experience, *jnp.divmod(flat, config.capacity))

    return Buffer(init, add, sample, can_sample, take, Config(**config, num_buffers=num_buffers))
