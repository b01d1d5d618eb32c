"""Double arithmetic from 32-bit words against the machine's own float64, bit for bit."""

import math

import jax
import numpy as np

from jaxbuf.rl import binary64 as _binary64
from jaxbuf.rl import limbs as _limbs

N = 6000


def doubles(rng, n):
    """Non-negative finite doubles of every kind: any bit pattern (subnormals
    included), integers of up to 63 bits (whose products and sums tie), and values
    people type."""
    patterns = rng.integers(0, 0x7FF0000000000000, n, dtype=np.int64).view(np.float64)
    subnormals = rng.integers(0, 1 << 52, n, dtype=np.int64).view(np.float64)
    integers = np.floor(2.0 ** rng.uniform(0, 63, n))
    typed = rng.choice([0.0, 0.1, 1 / 3, 0.0004, 1.5, 2.0, 5e-324, 1e300, np.finfo(float).max], n)
    near = 2.0**53 + rng.integers(-8, 8, n)
    kinds = rng.integers(0, 5, n)
    return np.choose(kinds, [patterns, subnormals, integers, typed, near])


def batch(values):
    """A batched `Double` of NumPy float64 values."""
    parts = [_binary64.constant(float(v)) for v in values]
    return jax.tree.map(lambda *leaves: np.stack(leaves), *parts)


def as_float(double):
    """NumPy float64 values of a batched `Double`."""
    mant = np.asarray(double.mant[0], np.uint64) | (np.asarray(double.mant[1], np.uint64) << 32)
    with np.errstate(over="ignore"):  # where `inf` is set, `exp` is unused
        value = np.ldexp(mant.astype(np.float64), np.asarray(double.exp))
    value = np.where(np.asarray(double.neg), -value, value)
    return np.where(np.asarray(double.inf), np.inf, value)


def is_canonical(double):
    mant = np.asarray(double.mant[0], np.uint64) | (np.asarray(double.mant[1], np.uint64) << 32)
    exp, finite = np.asarray(double.exp), ~np.asarray(double.inf)
    zero_limbs = (np.asarray(double.mant[2]) == 0) & (np.asarray(double.mant[3]) == 0)
    normal = (mant >= 2**52) | (exp == _binary64.MIN_EXP)
    in_range = (mant < 2**53) & (exp >= _binary64.MIN_EXP) & (exp <= _binary64.MAX_EXP)
    return bool(np.all(~finite | (normal & in_range & zero_limbs)))


@jax.jit
@jax.vmap
def operations(a, b, c, words):
    """Products, sums, comparisons and conversions of one row of operands."""
    natural = _binary64.from_natural(_limbs.from_words(words[0], words[1]))
    return (_binary64.multiply(a, b), _binary64.add(a, c), _binary64.add(c, a),
            _binary64.less_equal(a, c), natural)  # fmt: skip


def test_products_sums_comparisons_and_conversions_round_as_ieee_754():
    rng = np.random.default_rng(7)
    a, b = doubles(rng, N), doubles(rng, N)
    with np.errstate(over="ignore"):  # values near a, often one unit apart
        near = a * (1 + rng.choice([0, 2**-52, -(2**-53), 2**-30], N))
    c = np.where((rng.random(N) < 0.3) & np.isfinite(near), near, doubles(rng, N))
    c = c * rng.choice([-1.0, 1.0], N)
    counts = np.concatenate([
        rng.integers(0, 2**63, N - 6, dtype=np.uint64),
        np.array([0, 2**53 + 1, 2**53 + 3, 2**63 - 1, 2**64 - 1, 2**54 + 2], np.uint64),
    ])  # fmt: skip
    words = np.stack([counts & 0xFFFFFFFF, counts >> 32], axis=1).astype(np.uint32)
    product, sum_ac, sum_ca, ordered, natural = operations(batch(a), batch(b), batch(c), words)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(as_float(product), a * b)
        np.testing.assert_array_equal(as_float(sum_ac), a + c)
        np.testing.assert_array_equal(as_float(sum_ca), a + c)
    np.testing.assert_array_equal(np.asarray(ordered), a <= c)
    np.testing.assert_array_equal(as_float(natural), counts.astype(np.float64))
    assert all(is_canonical(x) for x in (product, sum_ac, natural))
    # the cases that make rounding matter did occur: overflow, subnormal results,
    # inexact sums
    with np.errstate(over="ignore"):
        assert np.isinf(a * b).any() and ((a * b > 0) & (a * b < 2.0**-1022)).any()
        total = a + c
    finite = np.isfinite(total)
    assert (total[finite] - a[finite] != c[finite]).sum() > N // 10


def test_ties_round_to_even_and_overflow_to_infinity():
    cases = [  # (a, b, a * b) with an exact tie or an overflow
        (float(2**52 + 1), 3.0, 13510798882111492.0),  # ...491: up to the even ...492
        (float(2**52 + 3), 3.0, 13510798882111496.0),  # ...497: down to the even ...496
        (np.finfo(float).max, 2.0, math.inf),
        (5e-324, 0.5, 0.0),  # half the least subnormal: to the even 0
        (5e-324 * 3, 0.5, 1e-323),  # 1.5 least subnormals: to the even 2
    ]
    a, b, expected = (np.array(column) for column in zip(*cases, strict=True))
    zero = np.zeros((len(cases), 2), np.uint32)
    product = operations(batch(a), batch(b), batch(a), zero)[0]
    np.testing.assert_array_equal(as_float(product), expected)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(expected, a * b)  # the machine agrees
