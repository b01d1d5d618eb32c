"""IEEE 754 double-precision (binary64) arithmetic from 32-bit integer words.

JAX computes in 32 bits unless 64-bit mode is switched on for the whole
process, and TPUs have no float64. A decision that must agree with a
double-precision reference (Reverb's rate limiter evaluates `inserts *
samples_per_insert - samples` in C++ doubles) needs the reference's own
roundings, so here they are computed exactly. A `Double` holds

    value = (-1)**neg * mant * 2**exp,    -1074 <= exp <= 971,

with `mant` an exact natural below 2**53 (`_limbs`), at least 2**52 unless
`exp = -1074` (IEEE's own canonical form: subnormals and zero have the least
exponent), or +inf.
Each operation forms the exact result in 128 bits and rounds it as IEEE 754
does by default: to nearest, ties to even, with subnormals and overflow to
infinity. Everything is loop-free and branch-free integer work that XLA fuses.

Only what the rate limiter needs is here: rounding natural numbers,
multiplying finite non-negative values, adding finite values (or +inf and a
finite value), and comparing.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.rl import limbs as _limbs

PRECISION = 53  # significant bits
MIN_EXP = -1074  # the exponent of the smallest subnormal's last bit
MAX_EXP = 1024 - PRECISION  # an `exp` above this is 2**1024 or more: infinite
FAR = 60  # exponents further apart than this: the smaller addend rounds away
_TOP = 1 << (PRECISION - 1 - _limbs.WIDTH)  # 2**52 in the second limb


class Double(NamedTuple):
    """A binary64 value, in IEEE 754's own canonical form (see the module docstring).

    Attributes:
      neg: bool scalar, the sign (False for zero and +inf).
      inf: bool scalar, whether the value is +inf (then `exp`, `mant` are unused).
      exp: int32 scalar in [-1074, 971], the exponent of `mant`'s last bit.
      mant: the significand, a `_limbs.Natural` below 2**53: at least 2**52, or
        `exp = -1074` (a subnormal, or zero).
    """

    neg: Any
    inf: Any
    exp: Any
    mant: _limbs.Natural


def constant(value: float) -> Double:
    """The `Double` of a finite Python float (NumPy scalars, for use as constants)."""
    if not math.isfinite(value):
        raise ValueError(f"{value} is not finite.")
    fraction, exponent = math.frexp(abs(value))
    mant, exp = int(fraction * 2**PRECISION), exponent - PRECISION
    if exp < MIN_EXP or not mant:  # a subnormal: exact, as it came from a double
        mant, exp = mant >> (MIN_EXP - exp) if mant else 0, MIN_EXP
    return Double(np.bool_(value < 0), np.bool_(False), np.int32(exp), _limbs.constant(mant))


def from_natural(x: _limbs.Natural) -> Double:
    """The nearest `Double` to a natural number (exact below 2**53), as C++
    converts an `int64_t` to `double`."""
    return _round(jnp.bool_(False), jnp.int32(0), x)


def multiply(a: Double, b: Double) -> Double:
    """The nearest `Double` to `a * b`, for finite `a` and `b`."""
    return _round(a.neg != b.neg, a.exp + b.exp, _limbs.multiply(a.mant, b.mant))


def negate(a: Double) -> Double:
    """`-a`, for finite `a` (a zero stays +0)."""
    return a._replace(neg=~a.neg & ~_is_zero(a.mant))


def add(a: Double, b: Double) -> Double:
    """The nearest `Double` to `a + b`, for finite `a`, `b` (or either +inf).

    When the exponents are at most `FAR` apart, the sum is formed exactly in
    128 bits and rounded. Further apart, the smaller one is below a quarter of
    the larger one's last unit, so the larger one is the rounded sum.
    """
    gap = a.exp - b.exp
    a_larger = gap >= 0
    apart = jnp.minimum(jnp.abs(gap), FAR)
    x = _limbs.shift(a.mant, jnp.where(a_larger, -apart, 0))
    y = _limbs.shift(b.mant, jnp.where(a_larger, 0, -apart))
    x_smaller = _limbs.less(x, y)
    larger, smaller = _select(x_smaller, y, x), _select(x_smaller, x, y)
    same_sign = a.neg == b.neg
    magnitude = _select(same_sign, _limbs.add(x, y), _limbs.subtract(larger, smaller))
    neg = jnp.where(same_sign | ~x_smaller, a.neg, b.neg)
    near = _round(neg, jnp.minimum(a.exp, b.exp), magnitude)
    total = _select(gap > FAR, a, _select(gap < -FAR, b, near))
    inf = total.inf | a.inf | b.inf
    return total._replace(inf=inf, neg=total.neg & ~inf)


def less_equal(a: Double, b: Double) -> jax.Array:
    """bool scalar: `a <= b` (+0 and -0 equal, +inf the largest)."""
    a_neg = a.neg & ~a.inf & ~_is_zero(a.mant)
    b_neg = b.neg & ~b.inf & ~_is_zero(b.mant)
    same_sign = jnp.where(a_neg, _magnitude_le(b, a), _magnitude_le(a, b))
    return jnp.where(a_neg == b_neg, same_sign, a_neg)


def _magnitude_le(a: Double, b: Double) -> jax.Array:
    """bool scalar: `|a| <= |b|` (the canonical form orders as `(exp, mant)`)."""
    finite = (a.exp < b.exp) | ((a.exp == b.exp) & ~_limbs.less(b.mant, a.mant))
    return b.inf | (~a.inf & finite)


def _round(neg: jax.Array, exp: jax.Array, magnitude: _limbs.Natural) -> Double:
    """The nearest `Double` to `(-1)**neg * magnitude * 2**exp` (ties to even).

    The result's last bit has the exponent `unit = max(exp + length - 53,
    -1074)`: 53 significant bits, fewer for a subnormal. The `unit - exp` bits
    below it go (a negative count shifts left); the kept part rounds up when
    the first of them is set and either any later one is set or the kept part
    is odd. A carry to 2**53 is halved, exactly.
    """
    length = _limbs.bit_length(magnitude)
    unit = jnp.where(length > 0, jnp.maximum(exp + length - PRECISION, MIN_EXP), MIN_EXP)
    dropped = unit - exp
    kept = _limbs.shift(magnitude, dropped)
    half = (dropped > 0) & _limbs.bit(magnitude, dropped - 1)
    up = half & (_limbs.low_bits_set(magnitude, dropped - 1) | (kept[0] & 1 == 1))
    kept = _limbs.add(kept, _limbs.from_words(up.astype(jnp.uint32)))
    carried = kept[1] == 2 * _TOP
    kept = _select(carried, _limbs.constant(1 << (PRECISION - 1)), kept)
    unit = unit + carried.astype(jnp.int32)
    inf = unit > MAX_EXP
    return Double(neg & (length > 0) & ~inf, inf, unit, kept)


def _is_zero(mant: _limbs.Natural) -> jax.Array:
    """bool scalar: whether a significand is 0."""
    return (mant[0] | mant[1] | mant[2] | mant[3]) == 0


def _select(condition: jax.Array, if_true: Any, if_false: Any) -> Any:
    """`if_true` where `condition`, else `if_false`, leaf by leaf (same structure)."""
    return jax.tree.map(lambda u, v: jnp.where(condition, u, v), if_true, if_false)
