"""A samples-per-insert rate limiter with Reverb's `SampleToInsertRatio` rules.

The limiter keeps the learner's sampling and the actors' inserting in a given
ratio. It is a small pure state beside the buffer's: ask `can_insert` and
`can_sample`, and report what was done with `inserted` and `sampled` (and
`deleted`, for kinds that remove items, such as a queue's `pop`). Inside `jit`
gate without a branch: pass the answer as `where=` to the buffer's `add` (a
masked write that stores nothing when false) and to `inserted`/`sampled` (which
then count nothing), and learn only from `valid` rows of a batch drawn where
sampling was allowed. On a GPU a `lax.cond` sends its predicate to the host on
every step; the masked form costs what the ungated step costs. From Python,
call them between jitted steps.

With `size` the items stored and `diff = inserts * samples_per_insert -
samples`, Reverb's rules are:

- `can_sample(n)`: `size >= min_size_to_sample` and `diff - n >= min_diff`;
- `can_insert(n)`: `size + n <= min_size_to_sample` (filling up is never
  limited), or `diff + n * samples_per_insert <= max_diff`.

To be exact in int32 (no float drift however long training runs),
`samples_per_insert` is used as the fraction `p / q` nearest to it with
`q <= 1000` (exact for 0.25, 1.5, 8, and for 0.1 or 1/3 as meant), and the
state keeps `q * diff`, saturating far outside the limits. One call counts at
most `MAX_COUNT` (about 2 million) items.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _validation
from jaxbuf._types import Config, _Record


class RateLimiterState(struct.PyTreeNode):
    """A rate limiter's counts.

    Attributes:
      size: int32 scalar, the items stored (inserts minus deletes, saturating).
      credit: int32 scalar, `q * (inserts * samples_per_insert - samples)` with
        `samples_per_insert = p / q`, saturating at +-(2**31 - 1).

    Examples:
      >>> import jaxbuf
      >>> limiter = jaxbuf.sample_to_insert_ratio(0.5, min_size_to_sample=1, error_buffer=2.0)
      >>> state = limiter.sampled(limiter.inserted(limiter.init(), 4), 1)
      >>> int(state.size), int(state.credit)  # q * (4 * 1/2 - 1) with q = 2
      (4, 2)
    """

    size: jax.Array
    credit: jax.Array


@dataclasses.dataclass(frozen=True)
class RateLimiter(_Record):
    """The pure functions of a rate limiter (see `sample_to_insert_ratio`).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> limiter = jaxbuf.sample_to_insert_ratio(1.0, min_size_to_sample=1, error_buffer=2.0)
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> @jax.jit
      ... def insert(state, limits, items):  # branch-free: a masked write
      ...     allowed = limiter.can_insert(limits, 2)
      ...     return buffer.add(state, items, where=allowed), limiter.inserted(limits, 2, allowed)
      >>> state, limits = buffer.init(jnp.float32(0)), limiter.init()
      >>> for _ in range(3):
      ...     state, limits = insert(state, limits, jnp.ones(2))
      >>> int(state.size), int(limits.size)  # the later inserts wait for samples
      (2, 2)
    """

    init: Callable[[], RateLimiterState]
    can_insert: Callable[..., jax.Array]
    can_sample: Callable[..., jax.Array]
    inserted: Callable[..., RateLimiterState]
    sampled: Callable[..., RateLimiterState]
    deleted: Callable[..., RateLimiterState]
    config: Config


def _limits(ratio: fractions.Fraction, min_size: int, error_buffer: Any) -> tuple[Any, Any]:
    """`(min_diff, max_diff)` of an `error_buffer` (exact fractions where finite),
    checked as Reverb checks them."""
    samples_per_insert = float(ratio)
    if isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
        low, high = (_finite(f"error_buffer[{i}]", v) for i, v in enumerate(error_buffer))
    else:
        buffer = _finite("error_buffer", error_buffer)
        if buffer < 0:
            raise ValueError(f"error_buffer must be at least 0, got {error_buffer}.")
        low, high = ratio * min_size - buffer, ratio * min_size + buffer
    if high - low < 2 * max(1.0, samples_per_insert):
        raise ValueError(
            f"error_buffer gives the range [{float(low)}, {float(high)}], narrower than 2 * max(1, "
            f"samples_per_insert) = {2 * max(1.0, samples_per_insert)}: it could block both "
            "inserts and samples for good."
        )
    if low > samples_per_insert * min_size:
        raise ValueError(
            f"error_buffer's range starts at {float(low)}, above samples_per_insert * "
            f"min_size_to_sample = {samples_per_insert * min_size}: sampling would wait forever "
            "once min_size_to_sample items are stored."
        )
    if high < samples_per_insert * min_size:
        warnings.warn(
            f"error_buffer's range ends at {float(high)}, below samples_per_insert * "
            f"min_size_to_sample = {samples_per_insert * min_size}: a loop that inserts and "
            "samples in turn stops inserting for good once min_size_to_sample items are stored.",
            stacklevel=3,
        )
    return low, high


def _finite(name: str, value: Any) -> fractions.Fraction:
    """A finite real argument as an exact fraction, or a `ValueError` naming it."""
    number = _validation.check_real(name, value)
    if not math.isfinite(number):
        raise ValueError(
            f"{name} must be finite, got {value}; for a limit that never binds, give a large "
            "finite one (Reverb's MinSize uses +-sys.float_info.max)."
        )
    return fractions.Fraction(number)


# Counts per call are capped here, so that `count * p` and `count * q` fit int32.
MAX_COUNT = _validation.MAX_INT32 // 1000


def _count(name: str, value: Any) -> jax.Array:
    """A non-negative count, static or traced, as int32 (at most `MAX_COUNT`)."""
    known = _validation.known(value)
    if known is not None and (known.shape or known.dtype.kind not in "iu" or known < 0):
        raise ValueError(f"{name} must be a non-negative integer scalar, got {value!r}.")
    return jnp.minimum(jnp.asarray(value, jnp.int32), MAX_COUNT)


def _gated(count: jax.Array, where: Any) -> jax.Array:
    """`count`, or 0 where `where` (an optional bool scalar) is false."""
    where = _validation.check_where(where, "whether to count")
    return count if where is None else jnp.where(where, count, 0)


def _bound(value: Any, rounding: Callable[[Any], int]) -> int:
    """A limit on `credit` as an int32 (rounded toward the allowed side)."""
    limit = _validation.MAX_INT32
    return int(rounding(min(max(value, -limit), limit)))


def sample_to_insert_ratio(
    samples_per_insert: float, min_size_to_sample: int, error_buffer: Any
) -> RateLimiter:
    """Makes a rate limiter that keeps `samples_per_insert` samples per inserted item.

    The rules and arguments are Reverb's `SampleToInsertRatio` (see the module
    docstring). Below `min_size_to_sample` stored items inserts are free and
    samples wait; above, `diff = inserts * samples_per_insert - samples` must
    stay within `[min_diff, max_diff]`.

    Args:
      samples_per_insert: how many times, on average, each item is sampled
        (one sampled batch of B counts B samples); positive.
      min_size_to_sample: items stored before sampling may start; positive.
      error_buffer: how far `diff` may stray: a number `e` gives `[s * m - e,
        s * m + e]` (`s * m = samples_per_insert * min_size_to_sample`), a pair
        `(min_diff, max_diff)` is used as is. The range must be at least
        `2 * max(1, samples_per_insert)` wide and start at most at `s * m`.

    Returns:
      A `RateLimiter` with `init()`, `can_insert(state, num_inserts=1)`,
      `can_sample(state, num_samples=1)` (bool scalars), and `inserted(state,
      n, where=None)`, `sampled(state, n, where=None)`, `deleted(state, n,
      where=None)` returning the new state (counting nothing where `where` is
      false). The counts and `where` may be traced.

    Examples:
      >>> import jaxbuf
      >>> limiter = jaxbuf.sample_to_insert_ratio(2.0, min_size_to_sample=2, error_buffer=3.0)
      >>> state = limiter.inserted(limiter.init(), 2)
      >>> bool(limiter.can_sample(state, 3)), bool(limiter.can_insert(state, 3))
      (True, False)
      >>> state = limiter.sampled(state, 3)
      >>> bool(limiter.can_sample(state, 1)), bool(limiter.can_insert(state, 3))
      (False, True)
    """
    spi = _validation.check_real("samples_per_insert", samples_per_insert)
    if not 0 < spi < math.inf:
        raise ValueError(
            f"samples_per_insert must be positive and finite, got {samples_per_insert}."
        )
    min_size = _validation.check_int("min_size_to_sample", min_size_to_sample)
    ratio = fractions.Fraction(spi).limit_denominator(1000)
    low, high = _limits(ratio, min_size, error_buffer)
    p, q = ratio.numerator, ratio.denominator
    most, least = _bound(q * high, math.floor), _bound(q * low, math.ceil)
    config = Config(kind="sample_to_insert_ratio", samples_per_insert=spi,
                    min_size_to_sample=min_size, min_diff=float(low),
                    max_diff=float(high))  # fmt: skip

    def init() -> RateLimiterState:
        """Nothing inserted or sampled yet."""
        return RateLimiterState(size=jnp.zeros((), jnp.int32), credit=jnp.zeros((), jnp.int32))

    def can_insert(state: RateLimiterState, num_inserts: Any = 1) -> jax.Array:
        """bool scalar: whether `num_inserts` more items may be inserted now."""
        n = _count("num_inserts", num_inserts)
        filling = _validation.count_up(state.size, n) <= min_size
        return filling | (_validation.count_up(state.credit, p * n) <= most)

    def can_sample(state: RateLimiterState, num_samples: Any = 1) -> jax.Array:
        """bool scalar: whether `num_samples` items may be sampled now."""
        n = _count("num_samples", num_samples)
        return (state.size >= min_size) & (_validation.count_up(state.credit, -q * n) >= least)

    def inserted(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items were inserted (none where `where` is false)."""
        n = _gated(_count("n", n), where)
        return state.replace(size=_validation.count_up(state.size, n),
                             credit=_validation.count_up(state.credit, p * n))  # fmt: skip

    def sampled(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items were sampled (a batch of B counts B; none where
        `where` is false)."""
        n = _gated(_count("n", n), where)
        return state.replace(credit=_validation.count_up(state.credit, -q * n))

    def deleted(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items left the buffer (a queue's `pop`, say; none where
        `where` is false)."""
        return state.replace(size=jnp.maximum(state.size - _gated(_count("n", n), where), 0))

    return RateLimiter(init, can_insert, can_sample, inserted, sampled, deleted, config)
