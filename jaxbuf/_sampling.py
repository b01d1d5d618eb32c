"""Drawing batches of integer indices from `[0, n)` with a traced `n`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def uniform_indices(key: jax.Array, n: jax.Array, count: int) -> jax.Array:
    """`count` independent uniform draws from `[0, n)`; all zeros when `n == 0`.

    Args:
      key: PRNG key.
      n: int32 scalar, the population size.
      count: the static number of draws.

    Returns:
      int32 `[count]`.
    """
    return jax.random.randint(key, (count,), 0, jnp.maximum(n, 1), dtype=jnp.int32)


def distinct_indices(key: jax.Array, n: jax.Array, count: int) -> jax.Array:
    """`count` draws from `[0, n)` without replacement, in random order.

    Uses Floyd's algorithm, O(count^2) work and never O(n). When `n >= count` the
    draws are distinct and every `count`-subset is equally likely. When
    `0 < n < count` every value appears `count // n` or `count // n + 1` times
    (as distinct as possible); when `n == 0` all draws are 0.

    Args:
      key: PRNG key.
      n: int32 scalar, the population size.
      count: the static number of draws.

    Returns:
      int32 `[count]`.
    """
    draw_key, order_key = jax.random.split(key)
    population = jnp.maximum(n, count)
    # Floyd: for j = population - count, ..., population - 1 draw t in [0, j];
    # take t unless already taken, else take j (never taken before).
    tops = population - count + jnp.arange(count, dtype=jnp.int32)
    draws = jax.random.randint(draw_key, (count,), 0, tops + 1, dtype=jnp.int32)

    def step(chosen: jax.Array, j: jax.Array) -> tuple[jax.Array, None]:
        pick = jnp.where(jnp.any(chosen == draws[j]), tops[j], draws[j])
        return chosen.at[j].set(pick), None

    chosen, _ = lax.scan(step, jnp.full((count,), -1, jnp.int32), jnp.arange(count))
    chosen = jax.random.permutation(order_key, chosen)
    return chosen % jnp.maximum(n, 1)
