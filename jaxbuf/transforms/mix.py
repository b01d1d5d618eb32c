"""Sampling fixed proportions from several buffers at once (offline-to-online)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core import validation as _validation
from jaxbuf.core.records import Sample


def _counts(proportions: Sequence[float] | np.ndarray, total: int) -> list[int]:
    """Largest-remainder rounding of `proportions * total` to integers summing to `total`."""
    shares = np.asarray(proportions, np.float64) / np.sum(proportions) * total
    counts = np.floor(shares).astype(int)
    for index in np.argsort(-(shares - counts), kind="stable")[: total - counts.sum()]:
        counts[index] += 1
    return counts.tolist()


def mix(
    buffers: Sequence[Any], proportions: Sequence[float], sample_batch_size: int
) -> Callable[..., Sample]:
    """Makes `sample(states, key)` drawing fixed shares of a batch from several buffers.

    Buffer `i` gives `round(proportions[i] / sum(proportions) * sample_batch_size)`
    items (largest remainders, so the counts add up exactly), taken from its own
    `sample`; it must be configured to sample at least that many.

    Args:
      buffers: sampled buffers (any kind and sampler, vectorized or not) whose
        items share one structure (n-step transitions from a transition buffer
        mix with each other).
      proportions: non-negative weights, one per buffer, not all zero.
      sample_batch_size: items per mixed batch.

    Returns:
      `sample(states, key) -> Sample`, with `states` a sequence of the buffers'
      states: the items of buffer 0 first, then buffer 1, and so on; `source` is
      the buffer of each item and `indices` its index in that buffer. A field
      that only some buffers fill is None, but for `weights`, which is 1 for the
      valid items of buffers without importance weights.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> offline = jaxbuf.make_replay_buffer(100, 8)
      >>> online = jaxbuf.make_replay_buffer(100, 8)
      >>> sample = jaxbuf.mix([offline, online], [0.25, 0.75], sample_batch_size=8)
      >>> states = [b.add(b.init(jnp.float32(0)), jnp.full(5, v)) for b, v in
      ...           [(offline, 1.0), (online, 2.0)]]
      >>> batch = jax.jit(sample)(states, jax.random.key(0))
      >>> batch.experience.tolist(), batch.source.tolist()
      ([1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [0, 0, 1, 1, 1, 1, 1, 1])
    """
    buffers = list(buffers)
    sample_batch_size = _validation.check_int("sample_batch_size", sample_batch_size)
    if not buffers or len(proportions) != len(buffers):
        raise ValueError(
            f"mix needs one proportion per buffer, got {len(proportions)} for "
            f"{len(buffers)} buffers."
        )
    weights = np.asarray(proportions, np.float64)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(
            f"proportions must be finite, non-negative and not all zero, got {list(proportions)}."
        )
    counts = _counts(weights, sample_batch_size)
    for index, (buffer, count) in enumerate(zip(buffers, counts, strict=True)):
        available = buffer.config.sample_batch_size
        if count > available:
            raise ValueError(
                f"buffers[{index}] samples {available} items per call, but its share of the "
                f"mixed batch is {count}: configure it with sample_batch_size >= {count}."
            )

    def sample(states: Sequence[Any], key: jax.Array) -> Sample:
        if len(states) != len(buffers):
            raise ValueError(
                f"sample needs {len(buffers)} states, one per buffer, got {len(states)}."
            )
        keys = jax.random.split(key, len(buffers))
        parts = [b.sample(s, k) for b, s, k in zip(buffers, states, keys, strict=True)]
        first = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), parts[0].experience
        )
        for index, part in enumerate(parts[1:], start=1):
            _validation.check_batch(
                first, part.experience, [("batch", None)], what=f"buffers[{index}]'s items"
            )
        return _concatenate([_head(p, n) for p, n in zip(parts, counts, strict=True)])

    return sample


def _head(batch: Sample, count: int) -> Sample:
    return jax.tree.map(lambda x: x[:count], batch)


def _concatenate(parts: list[Sample]) -> Sample:
    """One `Sample` of the parts, in order, with `source` set to each part's index."""
    weights = [p.valid.astype(jnp.float32) if p.weights is None else p.weights for p in parts]
    parts = [p.replace(weights=w, source=None) for p, w in zip(parts, weights, strict=True)]
    fields = {}
    names = ("experience", "indices", "valid", "mask", "length", "probabilities", "weights",
             "goal_source")  # fmt: skip
    for name in names:
        values = [getattr(p, name) for p in parts]
        if all(v is not None for v in values):
            fields[name] = jax.tree.map(lambda *x: jnp.concatenate(x), *values)
    sizes = [len(p.valid) for p in parts]
    source = np.repeat(np.arange(len(parts), dtype=np.int32), sizes)
    return Sample(**fields, source=jnp.asarray(source))
