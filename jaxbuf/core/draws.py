"""Drawing batches of integer indices from `[0, n)` with a traced `n`.

Every draw is a deterministic function of the caller's PRNG key. One
`jax.random.bits` call turns the key into a 64-bit seed, and a keyed integer
hash expands it into one 32-bit word per index: `fmix32(fmix32(j * phi + s0) ^ s1)`
for `j = 0, 1, ...`, with murmur3's finalizer `fmix32`, a bijection of 32-bit
words with full avalanche. A word `w` maps to `floor(w * n / 2**32)`
(multiply-high), so no value of `[0, n)` has probability off by more than
`n / 2**32` in relative terms (2e-4 at n = 1e6), the same kind of bias as
`jax.random.randint`. On CPU this costs about a third of drawing the indices
with `jax.random.randint`, whose threefry rounds dominate a replay `sample`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxbuf.core import lowering as _lowering

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive counters


def mix(x: jax.Array) -> jax.Array:
    """murmur3's finalizer `fmix32`: a bijection of uint32 words with full avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def seed_of(key: jax.Array) -> jax.Array:
    """uint32 `[2]`: the seed that `words_of` expands, drawn from `key`."""
    return jax.random.bits(key, (2,), jnp.uint32)


def words_of(seed: jax.Array, count: int) -> jax.Array:
    """`count` pseudo-random uint32 words of a seed (uint32 `[2]`)."""
    counter = jnp.arange(count, dtype=jnp.uint32)
    return mix(mix(counter * jnp.uint32(_GOLDEN) + seed[0]) ^ seed[1])


def random_words(key: jax.Array, count: int) -> jax.Array:
    """`count` pseudo-random uint32 words derived from `key`."""
    return words_of(seed_of(key), count)


def scale_below(words: jax.Array, n: jax.Array) -> jax.Array:
    """`floor(words * n / 2**32)` as int32, exactly, in 32-bit arithmetic.

    Args:
      words: uint32 words.
      n: int32 bounds in `[0, 2**31)`, broadcastable against `words`.
    """
    n = n.astype(jnp.uint32)
    w_hi, w_lo = words >> 16, words & 0xFFFF
    n_hi, n_lo = n >> 16, n & 0xFFFF
    cross_1, cross_2 = w_hi * n_lo, w_lo * n_hi
    carry = ((w_lo * n_lo >> 16) + (cross_1 & 0xFFFF) + (cross_2 & 0xFFFF)) >> 16
    return (w_hi * n_hi + (cross_1 >> 16) + (cross_2 >> 16) + carry).astype(jnp.int32)


def uniform_indices(key: jax.Array, n: jax.Array, count: int) -> jax.Array:
    """`count` independent uniform draws from `[0, n)`; all zeros when `n == 0`.

    Args:
      key: PRNG key.
      n: int32 scalar, the population size.
      count: the static number of draws.

    Returns:
      int32 `[count]`.
    """
    return scale_below(random_words(key, count), n)


def distinct_indices(key: jax.Array, n: jax.Array, count: int) -> jax.Array:
    """`count` draws from `[0, n)` without replacement, in random order.

    Uses Floyd's algorithm, never O(n) work: step by step on CPU up to 1,024 draws
    (O(count^2)), else by pointer doubling (`_floyd_by_doubling`). When `n >= count` the
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
    words = random_words(key, 2 * count)
    population = jnp.maximum(n, count)
    # Floyd: for j = population - count, ..., population - 1 draw t in [0, j];
    # take t unless already taken, else take j (never taken before).
    tops = population - count + jnp.arange(count, dtype=jnp.int32)
    draws = scale_below(words[:count], tops + 1)

    doubling = functools.partial(_floyd_by_doubling, population)
    # Above `PAIRS` draws the loop's O(B^2) passes cost the CPU more than the doubling.
    chosen = (
        _lowering.loop_or_unrolled(draws, tops, loop=_floyd_in_loop, unrolled=doubling)
        if count <= _lowering.PAIRS
        else doubling(draws, tops)
    )
    shuffled = chosen[jnp.argsort(words[count:])]
    return shuffled % jnp.maximum(n, 1)


def _floyd_in_loop(draws: jax.Array, tops: jax.Array) -> jax.Array:
    """Floyd's steps one after another (the CPU path): step `j` takes `draws[j]`
    unless an earlier step took it, else `tops[j]`."""

    def step(chosen: jax.Array, j: jax.Array) -> tuple[jax.Array, None]:
        pick = jnp.where(jnp.any(chosen == draws[j]), tops[j], draws[j])
        return chosen.at[j].set(pick), None

    count = draws.shape[0]
    chosen, _ = lax.scan(step, jnp.full((count,), -1, jnp.int32), jnp.arange(count))
    return chosen


def _floyd_by_doubling(population: jax.Array, draws: jax.Array, tops: jax.Array) -> jax.Array:
    """`_floyd_in_loop`'s picks without a loop over the steps (for accelerators).

    Step `j` collides (takes `tops[j]`) iff `draws[j]` was taken before: as an
    earlier draw (`draws[i] == draws[j]`, `i < j`, whatever step `i` took, since a
    colliding draw was itself taken earlier), or as the top of an earlier step
    that collided. Tops are distinct and step `i`'s is `population - count + i`,
    so that earlier step is one index, `i = draws[j] - population + count`: each
    step points to at most one earlier one, and collides iff some step on its
    chain of pointers has a repeated draw. `ceil(log2 count)` rounds of pointer
    doubling (static, unrolled) fold each chain. For accelerators, and for the CPU
    above 1,024 draws, where the loop's O(B^2) passes cost more.
    """
    count = draws.shape[0]
    steps = jnp.arange(count, dtype=jnp.int32)
    repeated = _repeated(draws, steps)
    pointer = draws - (population - count)
    pointer = jnp.where((pointer >= 0) & (pointer < steps), pointer, -1)  # -1: none
    collided = repeated
    for _ in range(max(count - 1, 0).bit_length()):
        has = pointer >= 0
        # The step each pointer names, read by comparison below 1024 steps ([B, B]
        # elementwise work that fuses) and gathered above.
        if count <= _lowering.PAIRS:
            named = pointer[:, None] == steps[None, :]
            collided = collided | jnp.any(named & collided[None, :], axis=1)
            pointer = jnp.where(has, jnp.sum(jnp.where(named, pointer[None, :], 0), axis=1), -1)
        else:
            safe = jnp.maximum(pointer, 0)
            collided = collided | (has & collided[safe])
            pointer = jnp.where(has, pointer[safe], -1)
    return jnp.where(collided, tops, draws)


def _repeated(draws: jax.Array, steps: jax.Array) -> jax.Array:
    """bool `[B]`: whether `draws[j]` equals some `draws[i]`, `i < j`. Up to 1,024
    draws by comparing every pair (`[B, B]` elementwise work that fuses); above, where
    that grows to 10⁹ pairs at 32,768, by one sort of `(draw, step)` pairs, in which a
    draw repeats iff the pair before it has the same draw."""
    if draws.shape[0] <= _lowering.PAIRS:
        return jnp.any((draws[:, None] == draws[None, :]) & (steps[None, :] < steps[:, None]), 1)
    ordered, order = lax.sort((draws, steps), num_keys=2)
    again = jnp.concatenate([jnp.zeros(1, bool), ordered[1:] == ordered[:-1]])
    return jnp.zeros(draws.shape, bool).at[order].set(again, unique_indices=True)


def locate(
    draws: jax.Array, counts: jax.Array, ends: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """The (group, member) of flat draws from `[0, sum(counts))`.

    The group is `searchsorted(ends, draw, side="right")` (groups without members are
    skipped) and the member `draw - ends[group - 1]` (`ends[-1] = 0`), for `ends` the
    running sum of `counts`. Up to `_lowering.SMALL` groups every draw is compared with
    every end (`[B, G]` elementwise work that fuses, no loop). Above, on CPU, a binary
    search in a `while` (an iteration is cheap there) and one read of the group's first
    draw; on accelerators `_locate_wide`: one gather of `[B, w]` ends instead of
    `log2 G` dependent narrow ones (each a kernel there). Every form gives the same pairs.

    Args:
      draws: int32 `[B]`, each in `[0, sum(counts))`.
      counts: int32 `[G]`, the members of each group (zero allowed); their sum
        must fit in int32.
      ends: `cumsum(counts)`, when the caller has it.

    Returns:
      `(group, member)`, int32 `[B]` each, with `0 <= member < counts[group]`.
      When every count is zero they are placeholders in range: check
      `sum(counts) > 0` before using them.
    """
    ends = running_sum(counts) if ends is None else ends
    if ends.shape[0] <= _lowering.SMALL:
        group = jnp.searchsorted(ends, draws, side="right", method="compare_all")
        return _member(draws, counts, ends, group)

    def search(ends: jax.Array, counts: jax.Array, draws: jax.Array):
        group = jnp.searchsorted(ends, draws, side="right", method="scan")
        return _member(draws, counts, ends, group)

    return _lowering.loop_or_unrolled(ends, counts, draws, loop=search, unrolled=_locate_wide)


def _member(draws: jax.Array, counts: jax.Array, ends: jax.Array,
            group: jax.Array) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`(group, member)` from the searched group: one read of the group's first draw
    `ends - counts` (a comparison on accelerators for `G <= SMALL`, else a gather)."""
    group = jnp.minimum(group, counts.shape[0] - 1).astype(jnp.int32)
    return group, draws - take_small(ends - counts, group)


def _locate_wide(ends: jax.Array, counts: jax.Array, draws: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`locate` above `SMALL` groups for accelerators: the ends are padded to `w^L`
    entries (`L >= 2` levels, `w^L > G`, `w <= 128`) and searched from the top level
    down, each level comparing a draw with `w - 1` ends `stride` apart and skipping the
    strides that end at or before it (the top level's ends are the same for every draw:
    a slice, no gather; each lower level one gather of `[B, w - 1]`: one at 4,096
    groups, where a binary search takes 13 dependent narrow reads). The largest end
    passed is `ends[group - 1]`, the group's first draw: no further read."""
    size = ends.shape[0]
    bits = size.bit_length()
    levels = max(2, -(-bits // 7))
    width = 1 << -(-bits // levels)
    top = jnp.iinfo(jnp.int32).max  # past every draw
    padded = jnp.concatenate([ends, jnp.full(width**levels - size, top, ends.dtype)])
    low, first = jnp.zeros_like(draws), jnp.zeros_like(draws)
    for level in reversed(range(levels)):
        stride = width**level
        if level == levels - 1:  # from 0: the same ends for every draw
            passed = padded[stride - 1 :: stride][None, : width - 1]
        else:
            steps = stride * jnp.arange(1, width, dtype=jnp.int32)
            passed = padded[low[:, None] + steps[None, :] - 1]
        before = passed <= draws[:, None]
        low = low + stride * jnp.sum(before, axis=1, dtype=jnp.int32)
        first = jnp.maximum(first, jnp.max(jnp.where(before, passed, 0), axis=1))
    return jnp.minimum(low, size - 1).astype(jnp.int32), draws - first


def take_small(values: jax.Array, indices: jax.Array) -> jax.Array:
    """`values[indices]` for a 1-D table `values` `[G]` and in-range int `indices`.

    Where lowered for CPU a gather; on accelerators, for `G <= SMALL`, a
    comparison of every index with every entry `[*indices.shape, G]`, summed:
    elementwise work that fuses with its neighbours instead of a gather kernel
    of its own (per-environment counters indexed by a batch's environments).
    Both give the same values.
    """
    size = values.shape[0]
    if size > _lowering.SMALL:
        return values[indices]

    def compare(values: jax.Array, indices: jax.Array) -> jax.Array:
        lead = (1,) * indices.ndim
        hit = indices[..., None] == jnp.arange(size, dtype=indices.dtype).reshape(*lead, size)
        table = values.reshape(*lead, size)
        return jnp.sum(jnp.where(hit, table, jnp.zeros((), values.dtype)), axis=-1,
                       dtype=values.dtype)  # fmt: skip

    return _lowering.gather_or_compare(values, indices, gather=lambda v, i: v[i], compare=compare)


def take_columns(values: jax.Array, columns: jax.Array) -> jax.Array:
    """`values[b, columns[b]]` for `values` `[B, n]` and in-range int `columns` `[B]`:
    `take_along_axis` where lowered for CPU; on accelerators, for `n <= SMALL`, a
    comparison with every column (no gather). Both give the same values."""
    width = values.shape[1]

    def gather(values: jax.Array, columns: jax.Array) -> jax.Array:
        return jnp.take_along_axis(values, columns[:, None], axis=1)[:, 0]

    if width > _lowering.SMALL:
        return gather(values, columns)

    def compare(values: jax.Array, columns: jax.Array) -> jax.Array:
        hit = columns[:, None] == jnp.arange(width, dtype=columns.dtype)[None, :]
        return jnp.sum(jnp.where(hit, values, jnp.zeros((), values.dtype)), axis=1,
                       dtype=values.dtype)  # fmt: skip

    return _lowering.gather_or_compare(values, columns, gather=gather, compare=compare)


def running_sum(x: jax.Array, axis: int = 0) -> jax.Array:
    """int32 inclusive running sum of `x` (bool or integer) along `axis`: `jnp.cumsum`
    on CPU; elsewhere `jax.lax.associative_scan`, slices and adds `O(log n)` deep
    (`cumsum` may lower for GPUs to a scan op that `jax.export` writes as a `while`)."""
    x = x.astype(jnp.int32)
    scan = functools.partial(jax.lax.associative_scan, jnp.add, axis=axis)
    return _lowering.loop_or_unrolled(x, loop=lambda x: jnp.cumsum(x, axis=axis), unrolled=scan)
