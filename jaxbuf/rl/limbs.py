"""Exact natural numbers below 2**128 as four 32-bit limbs, for 32-bit devices.

A `Natural` is a tuple of 4 uint32 scalars `x` with `x = sum(x[i] * 2**(32 * i))`,
least significant limb first. Every function is a short, loop-free and
branch-free chain of scalar integer operations (carries ripple through 4
unrolled steps, shifts pick limbs with selects), so under `jit` XLA fuses them
on any device. XLA defines a shift by 32 or more to give 0, which the shifts
below rely on. Batching is the caller's `jax.vmap`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

WIDTH = 32
COUNT = 4
Natural = tuple[Any, ...]  # COUNT uint32 scalars (arrays or NumPy), least significant first


def constant(value: int) -> Natural:
    """The limbs (NumPy uint32) of a Python integer in [0, 2**128)."""
    if not 0 <= value < 1 << (WIDTH * COUNT):
        raise ValueError(f"{value} is outside [0, 2**128).")
    return tuple(np.uint32((value >> (WIDTH * i)) & 0xFFFFFFFF) for i in range(COUNT))


def from_words(low: Any, high: Any = 0) -> Natural:
    """The limbs of `high * 2**32 + low` (uint32 scalars)."""
    zero = jnp.zeros((), jnp.uint32)
    return (jnp.asarray(low, jnp.uint32), jnp.asarray(high, jnp.uint32), zero, zero)


def add(x: Natural, y: Natural) -> Natural:
    """`x + y` (the sum must stay below 2**128)."""
    limbs, carry = [], None
    for a, b in zip(x, y, strict=True):
        total = a + b
        over = total < a
        if carry is not None:
            total = total + carry.astype(jnp.uint32)
            over = over | (total < carry.astype(jnp.uint32))
        limbs.append(total)
        carry = over
    return tuple(limbs)


def subtract(x: Natural, y: Natural) -> Natural:
    """`x - y`, for `x >= y`."""
    limbs, borrow = [], None
    for a, b in zip(x, y, strict=True):
        difference = a - b
        under = a < b
        if borrow is not None:
            under = under | (difference < borrow.astype(jnp.uint32))
            difference = difference - borrow.astype(jnp.uint32)
        limbs.append(difference)
        borrow = under
    return tuple(limbs)


def multiply(x: Natural, y: Natural) -> Natural:
    """`x * y` for `x, y < 2**64`: sixteen products of 16-bit pieces, summed by
    columns of 16 bits (each below 2**20) and carried."""
    a = [piece for limb in x[:2] for piece in (limb & 0xFFFF, limb >> 16)]
    b = [piece for limb in y[:2] for piece in (limb & 0xFFFF, limb >> 16)]
    columns: list[Any] = [jnp.zeros((), jnp.uint32)] * 8
    for i in range(4):
        for j in range(4):
            product = a[i] * b[j]
            columns[i + j] = columns[i + j] + (product & 0xFFFF)
            columns[i + j + 1] = columns[i + j + 1] + (product >> 16)
    pieces, carry = [], jnp.zeros((), jnp.uint32)
    for column in columns:
        total = column + carry
        pieces.append(total & 0xFFFF)
        carry = total >> 16
    return tuple(pieces[2 * i] | (pieces[2 * i + 1] << 16) for i in range(COUNT))


def less(x: Natural, y: Natural) -> jax.Array:
    """bool scalar: `x < y` (the highest limb where they differ decides)."""
    smaller, equal = x[-1] < y[-1], x[-1] == y[-1]
    for a, b in zip(x[-2::-1], y[-2::-1], strict=True):
        smaller = smaller | (equal & (a < b))
        equal = equal & (a == b)
    return smaller


def bit_length(x: Natural) -> jax.Array:
    """int32 scalar: the number of bits of `x` (0 for zero)."""
    length = jnp.zeros((), jnp.int32)
    for i, limb in enumerate(x):
        bits = WIDTH - jax.lax.clz(limb).astype(jnp.int32)
        length = jnp.where(limb != 0, WIDTH * i + bits, length)
    return length


def shift(x: Natural, right: jax.Array) -> Natural:
    """`floor(x * 2**-right)`: a right shift by `right` bits (int32), a left shift
    for a negative `right` (the result must stay below 2**128)."""
    right = jnp.clip(right, -WIDTH * COUNT, WIDTH * COUNT)
    step, bits = right >> 5, (right & (WIDTH - 1)).astype(jnp.uint32)  # floor division
    picked = [_limb_at(x, step + j) for j in range(COUNT + 1)]
    return tuple((picked[i] >> bits) | (picked[i + 1] << (WIDTH - bits)) for i in range(COUNT))


def bit(x: Natural, position: jax.Array) -> jax.Array:
    """bool scalar: whether bit `position` of `x` is set (False outside [0, 128))."""
    limb = _limb_at(x, position >> 5)
    return (limb >> (position & (WIDTH - 1)).astype(jnp.uint32)) & 1 == 1


def low_bits_set(x: Natural, count: jax.Array) -> jax.Array:
    """bool scalar: whether any of the lowest `count` bits of `x` is set, that
    is `x mod 2**count != 0` (False for `count <= 0`)."""
    found = jnp.zeros((), jnp.bool_)
    for i, limb in enumerate(x):
        width = jnp.clip(count - WIDTH * i, 0, WIDTH).astype(jnp.uint32)
        found = found | ((limb & ((jnp.uint32(1) << width) - 1)) != 0)
    return found


def _limb_at(x: Natural, index: jax.Array) -> jax.Array:
    """uint32 scalar: limb `index` of `x` (int32), 0 outside [0, 4)."""
    limb = jnp.zeros((), jnp.uint32)
    for i, value in enumerate(x):
        limb = jnp.where(index == i, value, limb)
    return limb
