"""Keyed permutations of `[0, n)`, evaluated only where asked: the swap-or-not shuffle.

Hoang, Morris and Rogaway's swap-or-not ("An Enciphering Scheme Based on a Card
Shuffle", CRYPTO 2012) permutes `[0, n)` for any `n`, a traced one included, one
round at a time. Round `i` draws `k_i` uniform in `[0, n)` and pairs each `x` with
its partner `k_i - x (mod n)`; the pair swaps where a keyed bit of the pair, the
hash of its larger member, is 1:

```text
x' = k_i - x (mod n);   x <- x' if bit_i(max(x, x')) else x
```

Each round is an involution of `[0, n)`, so any number of rounds is a bijection,
and the image of `B` positions costs `B * rounds` elementwise work whatever `n`
is: no table, no sort. With `6 ceil(log2 N)` rounds for `n <= N` the result cannot
be told from a uniform permutation by any test of fewer than about `n` queries
(their Theorem 2); `tests/test_epochs.py` checks the distribution over all
permutations of small `n` by chi-square.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxbuf.core import draws as _draws


def rounds(most: int) -> int:
    """The rounds for permutations of at most `most` elements: `6 ceil(log2 most)`,
    and at least 12."""
    return max(12, 6 * math.ceil(math.log2(max(most, 2))))


def permute(seed: jax.Array, positions: jax.Array, n: jax.Array, count: int) -> jax.Array:
    """The images of `positions` under the permutation of `[0, n)` keyed by `seed`.

    Args:
      seed: uint32 `[2]`, the permutation's key (`draws.seed_of(key)`).
      positions: int32 `[B]`; those outside `[0, n)` give 0.
      n: int32 scalar, the size of the permuted range (0 gives zeros).
      count: the static number of rounds (`rounds(most)`).

    Returns:
      int32 `[B]` in `[0, n)`, a bijection of `[0, n)` for every seed and `n`.
    """
    n = jnp.maximum(n, 1).astype(jnp.int32)
    words = _draws.words_of(seed, 2 * count)
    offsets, keys = _draws.scale_below(words[:count], n), words[count:]
    inside = (positions >= 0) & (positions < n)
    x = jnp.where(inside, positions, 0).astype(jnp.int32)
    for i in range(count):  # unrolled: elementwise work that fuses, on every platform
        partner = offsets[i] - x
        partner = jnp.where(partner < 0, partner + n, partner)
        top = jnp.maximum(x, partner).astype(jnp.uint32)
        swap = (_draws.mix(top ^ keys[i]) & 1) == 1
        x = jnp.where(swap, partner, x)
    return jnp.where(inside, x, 0)
