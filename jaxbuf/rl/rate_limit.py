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

With `size = inserts - deletes` and `diff = inserts * samples_per_insert -
samples`, Reverb's rules are:

- `can_sample(n)`: `size >= min_size_to_sample` and `diff - n >= min_diff`;
- `can_insert(n)`: `size + n <= min_size_to_sample` (filling up is never
  limited), or `(inserts + n) * samples_per_insert - samples <= max_diff`.

Reverb keeps int64 counts and evaluates `diff` in C++ doubles. So does this
limiter, on any device: each count is exact in 64 bits (two uint32 words,
saturating at 2**63 - 1 where Reverb's would overflow), and `diff` is computed
with the very roundings of IEEE double arithmetic (`_binary64`), so every
decision is Reverb's, bit for bit, for any finite positive ratio: 0.0004 after
100,000 inserts allows 41 samples, and counts past 2**32 stay exact. A check
costs a few hundred fused scalar integer operations.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf.core import validation as _validation
from jaxbuf.core.records import Config, _Record
from jaxbuf.rl import binary64 as _binary64
from jaxbuf.rl import limbs as _limbs


class RateLimiterState(struct.PyTreeNode):
    """A rate limiter's counts, as Reverb keeps them.

    Each is an unsigned 64-bit count held as uint32[2] words `[low, high]`
    (JAX computes in 32 bits by default), saturating at 2**63 - 1; `counts()`
    reads them on the host.

    Attributes:
      inserts: uint32[2], the items inserted.
      samples: uint32[2], the items sampled (a batch of B counts B).
      deletes: uint32[2], the items that left the buffer.

    Examples:
      >>> import jaxbuf
      >>> limiter = jaxbuf.sample_to_insert_ratio(0.5, min_size_to_sample=1, error_buffer=2.0)
      >>> state = limiter.sampled(limiter.inserted(limiter.init(), 4), 1)
      >>> {name: int(count) for name, count in state.counts().items()}
      {'inserts': 4, 'samples': 1, 'deletes': 0}
    """

    inserts: jax.Array
    samples: jax.Array
    deletes: jax.Array

    def counts(self) -> dict[str, np.ndarray]:
        """The counts as NumPy uint64 arrays (of the batch shape, if batched)."""

        def value(words: Any) -> np.ndarray:
            words = np.asarray(words, np.uint64)
            return (words[..., 1] << np.uint64(32)) | words[..., 0]

        return {"inserts": value(self.inserts), "samples": value(self.samples),
                "deletes": value(self.deletes)}  # fmt: skip


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
      >>> int(state.size), int(limits.counts()["inserts"])  # the later inserts wait for samples
      (2, 2)
    """

    init: Callable[[], RateLimiterState]
    can_insert: Callable[..., jax.Array]
    can_sample: Callable[..., jax.Array]
    inserted: Callable[..., RateLimiterState]
    sampled: Callable[..., RateLimiterState]
    deleted: Callable[..., RateLimiterState]
    config: Config


def _limits(samples_per_insert: float, min_size: int, error_buffer: Any) -> tuple[float, float]:
    """`(min_diff, max_diff)` of an `error_buffer`, computed and checked in doubles
    as Reverb's `SampleToInsertRatio` does."""
    offset = samples_per_insert * min_size
    if isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
        low, high = (_finite(f"error_buffer[{i}]", v) for i, v in enumerate(error_buffer))
    else:
        buffer = _finite("error_buffer", error_buffer)
        if buffer < 0:
            raise ValueError(f"error_buffer must be at least 0, got {error_buffer}.")
        low, high = offset - buffer, offset + buffer
    if not math.isfinite(low) or not math.isfinite(high):
        raise ValueError(
            f"samples_per_insert * min_size_to_sample = {offset} with error_buffer = "
            f"{error_buffer} gives the range [{low}, {high}], outside the doubles: make "
            "samples_per_insert or min_size_to_sample smaller."
        )
    if high - low < 2 * max(1.0, samples_per_insert):
        raise ValueError(
            f"error_buffer gives the range [{low}, {high}], narrower than 2 * max(1, "
            f"samples_per_insert) = {2 * max(1.0, samples_per_insert)}: it could block both "
            "inserts and samples for good."
        )
    if low > offset:
        raise ValueError(
            f"error_buffer's range starts at {low}, above samples_per_insert * "
            f"min_size_to_sample = {offset}: sampling would wait forever once "
            "min_size_to_sample items are stored."
        )
    if high < offset:
        warnings.warn(
            f"error_buffer's range ends at {high}, below samples_per_insert * "
            f"min_size_to_sample = {offset}: a loop that inserts and samples in turn stops "
            "inserting for good once min_size_to_sample items are stored.",
            stacklevel=3,
        )
    return low, high


def _finite(name: str, value: Any) -> float:
    """A finite real argument as a float, or a `ValueError` naming it."""
    number = _validation.check_real(name, value)
    if not math.isfinite(number):
        raise ValueError(
            f"{name} must be finite, got {value}; for a limit that never binds, give a large "
            "finite one (Reverb's MinSize uses +-sys.float_info.max)."
        )
    return number


class _Rule(NamedTuple):
    """The constants of a limiter's decisions (arguments, so that one compiled
    check serves every limiter)."""

    samples_per_insert: _binary64.Double
    min_diff: _binary64.Double
    max_diff: _binary64.Double
    min_size: _limbs.Natural


_SATURATED = np.array([2**32 - 1, 2**31 - 1], np.uint32)  # 2**63 - 1 as [low, high]


def _check_count(name: str, value: Any) -> Any:
    """`value`, checked where it is known: an integer scalar in [0, 2**31 - 1]."""
    known = _validation.known(value)
    if known is not None and (
        known.shape or known.dtype.kind not in "iu" or not 0 <= known <= _validation.MAX_INT32
    ):
        raise ValueError(f"{name} must be an integer scalar in [0, 2**31 - 1], got {value!r}.")
    return value


def _as_count(value: Any) -> jax.Array:
    """uint32 scalar: a checked count (a traced negative one counts 0)."""
    return jnp.maximum(jnp.asarray(value, jnp.int32), 0).astype(jnp.uint32)


@jax.jit
def _count_up(words: jax.Array, n: Any, where: jax.Array | None) -> jax.Array:
    """uint32[2]: the 64-bit count `words` plus `n` (0 where `where` is false),
    saturating at 2**63 - 1."""
    n = _as_count(n)
    if where is not None:
        n = jnp.where(where, n, jnp.uint32(0))
    low = words[0] + n
    high = words[1] + (low < words[0]).astype(jnp.uint32)
    return jnp.where(high > _SATURATED[1], _SATURATED, jnp.stack([low, high]))


def _counted(words: jax.Array, n: Any, where: Any) -> jax.Array:
    """uint32[2]: a count after `n` more (none where `where` is false), both checked."""
    where = _validation.check_where(where, "whether to count")
    return _count_up(words, _check_count("n", n), where)


def _natural(words: jax.Array) -> _limbs.Natural:
    """The limbs of a count, uint32[2] words `[low, high]`."""
    return _limbs.from_words(words[0], words[1])


def _diff(rule: _Rule, inserts: _limbs.Natural, samples: jax.Array) -> _binary64.Double:
    """`inserts * samples_per_insert - samples` in double arithmetic, as Reverb's C++
    evaluates it: each count rounded to a double, then each operation."""
    product = _binary64.multiply(_binary64.from_natural(inserts), rule.samples_per_insert)
    return _binary64.add(product, _binary64.negate(_binary64.from_natural(_natural(samples))))


@jax.jit
def _may_insert(rule: _Rule, state: RateLimiterState, n: jax.Array) -> jax.Array:
    """bool scalar: Reverb's `CanInsert(n)`."""
    after = _limbs.add(_natural(state.inserts), _limbs.from_words(_as_count(n)))
    filling = ~_limbs.less(_limbs.add(_natural(state.deletes), rule.min_size), after)
    return filling | _binary64.less_equal(_diff(rule, after, state.samples), rule.max_diff)


@jax.jit
def _may_sample(rule: _Rule, state: RateLimiterState, n: jax.Array) -> jax.Array:
    """bool scalar: Reverb's `CanSample(n)`."""
    inserts = _natural(state.inserts)
    filled = ~_limbs.less(inserts, _limbs.add(_natural(state.deletes), rule.min_size))
    taken = _binary64.negate(_binary64.from_natural(_limbs.from_words(_as_count(n))))
    diff = _binary64.add(_diff(rule, inserts, state.samples), taken)
    return filled & _binary64.less_equal(rule.min_diff, diff)


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
        `(min_diff, max_diff)` is used as is (both computed in doubles, as
        Reverb does, and finite). The range must be at least
        `2 * max(1, samples_per_insert)` wide and start at most at `s * m`.

    Returns:
      A `RateLimiter` with `init()`, `can_insert(state, num_inserts=1)`,
      `can_sample(state, num_samples=1)` (bool scalars), and `inserted(state,
      n, where=None)`, `sampled(state, n, where=None)`, `deleted(state, n,
      where=None)` returning the new state (counting nothing where `where` is
      false). The counts (integers in [0, 2**31 - 1]) and `where` may be
      traced; a traced negative count counts as 0.

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
    low, high = _limits(spi, min_size, error_buffer)
    rule = _Rule(_binary64.constant(spi), _binary64.constant(low), _binary64.constant(high),
                 _limbs.constant(min_size))  # fmt: skip
    rule = jax.tree.map(jnp.asarray, rule)  # on the device once, not at each call
    config = Config(kind="sample_to_insert_ratio", samples_per_insert=spi,
                    min_size_to_sample=min_size, min_diff=low, max_diff=high)  # fmt: skip

    def init() -> RateLimiterState:
        """Nothing inserted, sampled or deleted yet."""
        zeros = [jnp.zeros(2, jnp.uint32) for _ in range(3)]  # 3 buffers, to donate
        return RateLimiterState(*zeros)

    def can_insert(state: RateLimiterState, num_inserts: Any = 1) -> jax.Array:
        """bool scalar: whether `num_inserts` more items may be inserted now."""
        return _may_insert(rule, state, _check_count("num_inserts", num_inserts))

    def can_sample(state: RateLimiterState, num_samples: Any = 1) -> jax.Array:
        """bool scalar: whether `num_samples` items may be sampled now."""
        return _may_sample(rule, state, _check_count("num_samples", num_samples))

    def inserted(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items were inserted (none where `where` is false)."""
        return state.replace(inserts=_counted(state.inserts, n, where))

    def sampled(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items were sampled (a batch of B counts B; none where
        `where` is false)."""
        return state.replace(samples=_counted(state.samples, n, where))

    def deleted(state: RateLimiterState, n: Any, where: Any = None) -> RateLimiterState:
        """The state after `n` items left the buffer (a queue's `pop`, say; none where
        `where` is false)."""
        return state.replace(deletes=_counted(state.deletes, n, where))

    return RateLimiter(init, can_insert, can_sample, inserted, sampled, deleted, config)


def batches_allowed(limiter: RateLimiter, state: RateLimiterState, batch_size: Any,
                    most: int) -> jax.Array:  # fmt: skip
    """int32 scalar in [0, most]: how many batches of `batch_size` the limiter allows
    drawn now, one after another, with no insert between. `can_sample(k * batch_size)`
    falls from true to false as k grows (`diff - k * batch_size` only falls), so the
    answer is the number of k in 1..most it allows: one check (one host sync from
    Python) before k updates instead of one before each.

    >>> import jaxbuf
    >>> limiter = jaxbuf.sample_to_insert_ratio(2.0, min_size_to_sample=10, error_buffer=64.0)
    >>> state = limiter.inserted(limiter.init(), 40)   # diff 80, min_diff -44
    >>> int(jaxbuf.batches_allowed(limiter, state, batch_size=16, most=16))   # 7 * 16 <= 124
    7
    """
    most = _validation.check_int("most", most, maximum=4096)
    k = jnp.arange(1, most + 1, dtype=jnp.int32)
    allowed = jax.vmap(lambda ki: limiter.can_sample(state, ki * batch_size))(k)
    return jnp.sum(allowed, dtype=jnp.int32)
