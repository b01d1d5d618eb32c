"""Index draws: exact arithmetic, uniformity, independence, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxbuf.core import draws as _draws
from jaxbuf.core import lowering as _lowering


def test_scale_below_is_the_exact_multiply_high():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=5000, dtype=np.uint64)
    words[:4] = [0, 1, 2**32 - 1, 2**31]
    bounds = rng.integers(0, 2**31, size=5000, dtype=np.uint64)
    bounds[:4] = [2**31 - 1, 1, 2**31 - 1, 3]
    expected = (words * bounds) >> np.uint64(32)
    got = jax.jit(_draws.scale_below)(
        jnp.asarray(words.astype(np.uint32)), jnp.asarray(bounds.astype(np.int32))
    )
    np.testing.assert_array_equal(np.asarray(got), expected.astype(np.int64))


def draws(n: int, count: int, num_keys: int) -> np.ndarray:
    keys = jax.random.split(jax.random.key(11), num_keys)
    sample = jax.jit(jax.vmap(_draws.uniform_indices, in_axes=(0, None, None)), static_argnums=2)
    return np.asarray(sample(keys, jnp.int32(n), count))


def test_uniform_indices_are_uniform_and_in_range():
    for n in (1, 7, 1000, 2**31 - 1):
        values = draws(n, 64, 400)
        assert values.min() >= 0 and values.max() < n
    values = draws(37, 256, 400)
    assert stats.chisquare(np.bincount(values.ravel(), minlength=37)).pvalue > 1e-3


def test_draws_are_pairwise_independent_within_and_across_batches():
    values = draws(16, 256, 400)
    within = values[:, :-1] * 16 + values[:, 1:]  # neighbours in one batch
    across = values[:-1] * 16 + values[1:]  # the same position, consecutive keys
    for pairs in (within, across):
        assert stats.chisquare(np.bincount(pairs.ravel(), minlength=256)).pvalue > 1e-3


def test_draws_depend_only_on_the_key_and_work_with_raw_keys():
    typed = _draws.uniform_indices(jax.random.key(3), jnp.int32(100), 8)
    again = _draws.uniform_indices(jax.random.key(3), jnp.int32(100), 8)
    raw = _draws.uniform_indices(jax.random.PRNGKey(3), jnp.int32(100), 8)
    other = _draws.uniform_indices(jax.random.key(4), jnp.int32(100), 8)
    np.testing.assert_array_equal(typed, again)
    np.testing.assert_array_equal(typed, raw)
    assert not np.array_equal(typed, other)


def floyd_reference(draws, tops) -> np.ndarray:
    """Floyd's steps in plain Python: step `j` takes `draws[j]` unless an earlier step
    took it, else `tops[j]`."""
    chosen: list[int] = []
    taken: set[int] = set()
    for draw, top in zip(np.asarray(draws).tolist(), np.asarray(tops).tolist(), strict=True):
        chosen.append(top if draw in taken else draw)
        taken.add(chosen[-1])
    return np.asarray(chosen, np.int32)


def test_floyd_by_pointer_doubling_takes_the_steps_the_loop_takes():
    """Sampling without replacement on accelerators (no loop over the batch) against the CPU's
    step-by-step Floyd: the same picks, with populations from the batch size (every step may
    collide, long chains) to far larger, and batches of 1 to 300."""
    rng = np.random.default_rng(0)
    loop = jax.jit(_draws._floyd_in_loop)
    doubling = jax.jit(_draws._floyd_by_doubling)
    chains = 0
    for count in (1, 2, 3, 17, 64, 256, 300, 1500):
        for population in {count, count + 1, 2 * count, 50 * count}:
            for _ in range(20):
                tops = population - count + np.arange(count, dtype=np.int32)
                draws = jnp.asarray(rng.integers(0, tops + 1), jnp.int32)
                expected = loop(draws, jnp.asarray(tops))
                np.testing.assert_array_equal(expected, floyd_reference(draws, tops))
                got = doubling(jnp.int32(population), draws, jnp.asarray(tops))
                np.testing.assert_array_equal(got, expected)
                assert len(np.unique(np.asarray(got))) == count  # distinct
                chains += int(np.sum(np.asarray(expected) != np.asarray(draws)))
    assert chains > 1000  # many collisions, not only the easy case


def longest_chain(count: int, population: int) -> np.ndarray:
    """Draws where step 1 repeats step 0's draw and every later step draws the top of the
    step before it: every step from 1 on collides, each through a chain of pointers back to
    step 1, the longest chains Floyd's steps can make."""
    low = population - count
    draws = np.zeros(count, np.int32)
    draws[2:] = low + np.arange(1, count - 1)  # step j draws step j-1's top
    return draws


def test_floyd_by_pointer_doubling_follows_chains_of_every_length():
    """Every batch size from 1 to 20 and around powers of two to 2048, with the longest chains
    (which need every round of doubling) and, for small batches, every possible draw.
    Against Floyd's steps in Python (the previous test holds the CPU's loop to them too):
    one compiled program per batch size, not two."""
    doubling = jax.jit(_draws._floyd_by_doubling)
    around = [n + d for n in (32, 64, 128, 256, 1024) for d in (-1, 0, 1)]
    for count in [*range(1, 21), *around, 2048]:
        for population in (count, count + 3):
            tops = jnp.asarray(population - count + np.arange(count, dtype=np.int32))
            draws = jnp.asarray(longest_chain(count, population))
            expected = floyd_reference(draws, tops)
            np.testing.assert_array_equal(doubling(jnp.int32(population), draws, tops), expected)
            assert np.sum(np.asarray(expected) != np.asarray(draws)) == max(count - 1, 0)
    all_loop = jax.jit(jax.vmap(_draws._floyd_in_loop, in_axes=(0, None)))
    all_doubling = jax.jit(jax.vmap(_draws._floyd_by_doubling, in_axes=(None, 0, None)))
    for count in range(1, 7):
        for population in (count, count + 2):
            tops = population - count + np.arange(count, dtype=np.int32)
            grid = np.stack(np.meshgrid(*[np.arange(t + 1) for t in tops], indexing="ij"), -1)
            draws = jnp.asarray(grid.reshape(-1, count), jnp.int32)
            expected = all_loop(draws, jnp.asarray(tops))
            got = all_doubling(jnp.int32(population), draws, jnp.asarray(tops))
            np.testing.assert_array_equal(got, expected)


def test_locate_finds_group_and_member_on_both_sides_of_every_switch(platform_path):
    """`locate` against NumPy for groups on both sides of `SMALL` (compared with every end
    below; above, a binary search in a loop on CPU, on accelerators a search of wide
    reads: 2 levels up to 16,383 groups, 3 from 16,384), with empty groups, runs of them,
    every draw at a group's edges, and the placeholders where every group is empty."""
    rng = np.random.default_rng(3)
    locate = jax.jit(_draws.locate)
    for groups in (65, 4096, 16384):  # every group empty: group G - 1, member 0
        found = locate(jnp.zeros(5, jnp.int32), jnp.zeros(groups, jnp.int32))
        assert np.asarray(found).tolist() == [[groups - 1] * 5, [0] * 5]
    for groups in (1, 3, _lowering.SMALL, _lowering.SMALL + 1, 1024, 4096, 16383, 16384):
        counts = rng.integers(0, 5, groups).astype(np.int32)
        counts[rng.random(groups) < 0.3] = 0  # empty groups, some in runs
        counts[-1] = max(counts[-1], 1)
        ends = np.cumsum(counts)
        edges = np.concatenate([ends - 1, ends[:-1], [0]])
        flat = np.concatenate([edges, rng.integers(0, ends[-1], 8192)]).astype(np.int32)
        flat = flat[(flat >= 0) & (flat < ends[-1])]
        group, member = locate(jnp.asarray(flat), jnp.asarray(counts))
        expected = np.searchsorted(ends, flat, side="right")
        np.testing.assert_array_equal(group, expected)
        np.testing.assert_array_equal(member, flat - (ends - counts)[expected])
        assert np.all(counts[np.asarray(group)] > np.asarray(member))


def test_repeated_draws_are_found_by_pairs_and_by_sort_alike():
    """`_repeated` compares every pair up to 1,024 draws and sorts above: both against
    NumPy's first occurrences, with few distinct values (many repeats) and many."""
    rng = np.random.default_rng(5)
    repeated = jax.jit(_draws._repeated)
    for count in (1, _lowering.PAIRS, _lowering.PAIRS + 1, 8192):
        for distinct in (3, count, 10 * count):
            draws = rng.integers(0, distinct, count).astype(np.int32)
            first = np.zeros(count, bool)
            first[np.unique(draws, return_index=True)[1]] = True
            got = repeated(jnp.asarray(draws), jnp.arange(count, dtype=jnp.int32))
            np.testing.assert_array_equal(got, ~first)
