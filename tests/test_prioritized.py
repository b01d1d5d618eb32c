"""Prioritized replay and its sum tree against NumPy references."""

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import items
from reference import prioritized_replay, rejects_and_keeps_state
from scipy import stats

from jaxbuf.core.sumtree import blocks as _sumtree_blocks
from jaxbuf.core.sumtree import tree as _sumtree

EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros(2)}


class Reference:
    """Per-row priorities (before the exponent), FIFO rows, the maximum priority."""

    def __init__(self, capacity, alpha):
        self.capacity, self.alpha = capacity, alpha
        self.priority = np.zeros(capacity)
        self.ids = np.zeros(capacity, np.int64)
        self.position = self.size = self.rejected = 0
        self.max_priority = 1.0

    def add(self, ids):
        for i in ids:
            self.priority[self.position], self.ids[self.position] = self.max_priority, i
            self.position = (self.position + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def set(self, indices, priorities):
        for i, p in zip(indices, priorities, strict=True):
            if 0 <= i < self.size and np.isfinite(p) and p >= 0:
                self.priority[i] = p
                self.max_priority = max(self.max_priority, p)
            else:
                self.rejected += 1

    def leaves(self):
        return np.where(self.priority > 0, self.priority**self.alpha, 0.0)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_sum_tree_matches_numpy_after_random_updates_with_duplicates(variant, method):
    rng = np.random.default_rng(0)
    update = variant(functools.partial(_sumtree.update, method=method))
    find = variant(_sumtree.find)
    for capacity in (1, 5, 37):
        tree = _sumtree.init(capacity)
        values = np.zeros(capacity)
        for _ in range(8):
            indices = rng.integers(0, capacity, 12)
            new = rng.choice([0.0, 0.5, 1.0, 2.0, 7.0], 12)
            keep = rng.random(12) < 0.8
            tree = update(tree, jnp.asarray(indices, jnp.int32), jnp.asarray(new, jnp.float32),
                          jnp.asarray(keep))  # fmt: skip
            for i, v, k in zip(indices, new, keep, strict=True):  # the last kept one wins
                if k:
                    values[i] = v
            assert float(tree.total) == values.sum()
            positive = values[values > 0]
            assert float(tree.minimum) == (positive.min() if len(positive) else np.inf)
            np.testing.assert_array_equal(_sumtree.leaves(tree, jnp.arange(capacity)), values)
            if values.sum() == 0:
                continue
            # Targets a quarter away from every prefix sum (multiples of 0.5) land in
            # the leaf whose prefix interval holds them.
            total = values.sum()
            targets = rng.integers(0, int(2 * total), 64) / 2 + 0.25
            found, value, got_total, smallest = find(
                tree, jnp.asarray(targets / total, jnp.float32)
            )
            expected = np.searchsorted(np.cumsum(values), targets, side="right")
            np.testing.assert_array_equal(found, expected)
            np.testing.assert_array_equal(value, values[expected])
            np.testing.assert_array_equal(got_total, np.full(64, total))
            np.testing.assert_array_equal(smallest, np.full(64, positive.min()))


def test_random_operations_match_the_reference_at_every_wrap(platform_path):
    capacity, batch, alpha = 10, 64, 0.7
    buffer = prioritized_replay(capacity, batch, priority_exponent=alpha)
    add = jax.jit(buffer.add, donate_argnums=0)
    set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)
    sample = jax.jit(buffer.sample)
    state, reference = buffer.init(EXAMPLE), Reference(capacity, alpha)
    rng = np.random.default_rng(1)
    fresh = 0
    for step in range(60):
        ids = np.arange(fresh, fresh + int(rng.integers(1, 7)))
        fresh += len(ids)
        state = add(state, items(ids))
        reference.add(ids)
        indices = rng.integers(-2, capacity + 2, 8)
        priorities = rng.choice([0.0, 0.1, 1.0, 3.0, 10.0, -1.0, np.nan, np.inf], 8)
        state = set_priorities(state, jnp.asarray(indices), jnp.asarray(priorities, jnp.float32))
        reference.set(indices, priorities)
        leaves = _sumtree.leaves(state.sampler.tree, jnp.arange(capacity))
        np.testing.assert_allclose(leaves, reference.leaves(), rtol=1e-6)
        assert int(state.sampler.rejected) == reference.rejected
        np.testing.assert_allclose(float(state.sampler.max_priority), reference.max_priority)
        expected = reference.leaves()
        assert bool(buffer.can_sample(state)) == (expected.sum() > 0)
        if expected.sum() == 0:
            continue
        beta = float(rng.uniform(0.2, 1.0))
        got = jax.device_get(sample(state, jax.random.key(step), importance_exponent=beta))
        assert got.valid.all()
        np.testing.assert_array_equal(got.experience["id"], reference.ids[got.indices])
        probability = expected / expected.sum()
        np.testing.assert_allclose(got.probabilities, probability[got.indices], rtol=1e-5)
        n = np.count_nonzero(expected)
        positive = expected > 0
        weight = np.where(positive, n * np.where(positive, probability, 1.0), 1.0) ** -beta
        max_weight = weight[positive].max()
        np.testing.assert_allclose(got.weights, weight[got.indices] / max_weight, rtol=1e-4)
        assert (expected[got.indices] > 0).all()


@pytest.mark.parametrize("stratified", [True, False])
def test_frequencies_are_proportional_to_priority_to_the_alpha(stratified):
    capacity, alpha = 12, 0.6
    buffer = prioritized_replay(capacity, 256, priority_exponent=alpha, stratified=stratified)
    state = buffer.add(buffer.init(EXAMPLE), items(np.arange(capacity)))
    priorities = np.array([0.1, 1, 2, 3, 4, 5, 0, 7, 8, 9, 10, 20], np.float32)
    state = buffer.set_priorities(state, jnp.arange(capacity), jnp.asarray(priorities))
    keys = jax.random.split(jax.random.key(4), 200)
    drawn = jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0)))(state, keys).indices
    counts = np.bincount(np.asarray(drawn).ravel(), minlength=capacity)
    expected = priorities.astype(np.float64) ** alpha * (priorities > 0)
    expected = expected / expected.sum() * counts.sum()
    assert counts[6] == 0  # zero priority: never drawn
    keep = expected > 0
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-3


def test_a_zero_priority_is_never_drawn_at_alpha_0():
    """alpha 0 draws the positive priorities uniformly; a zero stays zero (0**0 is not 1)."""
    buffer = prioritized_replay(4, 64, priority_exponent=0.0)
    state = buffer.add(buffer.init(EXAMPLE), items(np.arange(4)))
    state = buffer.set_priorities(state, jnp.arange(4), jnp.array([0.0, 5.0, 0.0, 0.1]))
    drawn = np.asarray(buffer.sample(state, jax.random.key(1)).indices)
    assert set(drawn.tolist()) == {1, 3}


def test_float32_never_draws_an_empty_or_zero_priority_slot_after_a_million_updates():
    capacity, batch = 5000, 256
    buffer = prioritized_replay(capacity, batch, priority_exponent=1.0)
    example = {"id": jnp.int32(0)}

    def step(state, key):
        keys = jax.random.split(key, 4)
        state = buffer.add(state, {"id": jnp.zeros(7, jnp.int32)})
        rows = jax.random.randint(keys[0], (batch,), 0, state.size)
        scale = 10.0 ** jax.random.randint(keys[1], (batch,), -30, 30).astype(jnp.float32)
        zero = jax.random.uniform(keys[2], (batch,)) < 0.3
        priorities = jnp.where(zero, 0.0, jax.random.uniform(keys[3], (batch,)) * scale)
        state = buffer.set_priorities(state, rows, priorities)
        drawn = buffer.sample(state, key)
        leaf = _sumtree.leaves(state.sampler.tree, drawn.indices)
        bad = jnp.sum(drawn.valid & ((leaf <= 0) | (drawn.indices >= state.size)))
        return state, (bad, drawn.valid.all() | ~buffer.can_sample(state))

    state = buffer.init(example)
    run = jax.jit(lambda state, keys: jax.lax.scan(step, state, keys))
    state, (bad, consistent) = run(state, jax.random.split(jax.random.key(0), 4000))
    assert int(bad.sum()) == 0 and bool(consistent.all())  # 4000 * 256 > 1e6 updates
    tree = state.sampler.tree
    leaves = np.asarray(_sumtree.leaves(tree, jnp.arange(capacity)), np.float64)
    np.testing.assert_allclose(float(tree.total), leaves.sum(), rtol=1e-5)
    # Targets at and past the float32 total still land on positive leaves.
    one = jnp.float32(1)
    edges = jnp.stack([one, jnp.nextafter(one, jnp.inf), 2 * one, 0 * one])
    found, value, _, _ = _sumtree.find(tree, edges)
    assert (leaves[np.asarray(found)] > 0).all() and (np.asarray(value) > 0).all()


def test_rejected_priorities_leave_the_tree_intact():
    buffer = prioritized_replay(4, 8)
    state = buffer.add(buffer.init(EXAMPLE), items([0, 1, 2]))
    before = jax.device_get(state.sampler.tree)
    bad = jnp.array([-1.0, jnp.nan, jnp.inf, 5.0, 5.0])
    state = buffer.set_priorities(state, jnp.array([0, 1, 2, 3, -1]), bad)  # 3 and -1: no item
    chex.assert_trees_all_equal(jax.device_get(state.sampler.tree), before)
    assert int(state.sampler.rejected) == 5 and float(state.sampler.max_priority) == 1.0


def test_vmap_across_buffers_equals_a_loop_and_beta_anneals_without_retracing():
    buffer = prioritized_replay(6, 5)
    examples = jax.tree.map(lambda x: jnp.zeros((3, *x.shape), x.dtype), EXAMPLE)
    states = jax.vmap(buffer.init)(examples)
    chunks = items(np.arange(12).reshape(3, 4))
    states = jax.vmap(buffer.add)(states, chunks)
    priorities = jnp.asarray(np.random.default_rng(0).random((3, 4)), jnp.float32)
    indices = jnp.tile(jnp.arange(4), (3, 1))
    states = jax.vmap(buffer.set_priorities)(states, indices, priorities)
    keys = jax.random.split(jax.random.key(0), 3)
    sample = chex.assert_max_traces(buffer.sample, n=1)
    jitted = jax.jit(
        jax.vmap(lambda s, k, b: sample(s, k, importance_exponent=b), in_axes=(0, 0, None))
    )

    @jax.jit
    def alone(chunk, indices, priorities, key, beta):  # one buffer, its own calls
        one = buffer.set_priorities(buffer.add(buffer.init(EXAMPLE), chunk), indices, priorities)
        return buffer.sample(one, key, importance_exponent=beta)

    for beta in (0.4, 0.7, 1.0):  # a traced beta: one trace for all
        batches = jax.device_get(jitted(states, keys, jnp.float32(beta)))
        for i in range(3):
            chunk = jax.tree.map(lambda x, i=i: x[i], chunks)
            expected = alone(chunk, indices[i], priorities[i], keys[i], jnp.float32(beta))
            chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: x[i], batches), expected)


def test_donated_add_and_set_priorities_alias_the_state():
    buffer = prioritized_replay(1000, 8)
    state = buffer.init(EXAMPLE)
    text = jax.jit(buffer.add, donate_argnums=0).lower(state, items(np.arange(8))).as_text()
    assert text.count("tf.aliasing_output") == len(jax.tree.leaves(state))
    args = (state, jnp.arange(8), jnp.ones(8))
    text = jax.jit(buffer.set_priorities, donate_argnums=0).lower(*args).as_text()
    assert text.count("tf.aliasing_output") == len(jax.tree.leaves(state))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"priority_exponent": 1.5}, ValueError, "priority_exponent must be in [0, 1], got 1.5"),
        ({"priority_exponent": "0.6"}, TypeError, "priority_exponent must be a number in [0, 1]"),
        ({"stratified": 1}, TypeError, "stratified must be a bool"),
        ({"min_size": 0}, ValueError, "min_size must be in [1,"),
    ],
)
def test_configuration_errors(kwargs, error, match):
    with pytest.raises(error, match=re.escape(match)):
        prioritized_replay(8, 4, **kwargs)


@pytest.mark.parametrize("wrap", ["eager", "jit", "vmap"])
@pytest.mark.parametrize(
    "args, error, match",
    [
        ((jnp.zeros((2, 2), jnp.int32), jnp.ones((2, 2))), ValueError,
         "indices must be a 1-D array [B], got (2, 2)"),
        ((jnp.zeros(3, jnp.int32), jnp.ones(2)), ValueError,
         "indices and priorities must have one shape [B], got (3,) and (2,)"),
        ((jnp.zeros(2), jnp.ones(2)), TypeError, "indices must be integers, got dtype float32"),
        ((jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.int32)), TypeError,
         "priorities must be floating point, got dtype int32"),
    ],
)  # fmt: skip
def test_set_priorities_errors(wrap, args, error, match):
    buffer = prioritized_replay(8, 4)
    state = buffer.add(buffer.init(EXAMPLE), items([1, 2]))
    rejects_and_keeps_state(wrap, buffer.set_priorities, state, *args, error=error, match=match)


def test_add_and_sample_errors_are_named():
    buffer = prioritized_replay(8, 4)
    state = buffer.init(EXAMPLE)
    with pytest.raises(
        TypeError, match=re.escape("items['obs'] has dtype int32; expected float32")
    ):
        jax.jit(buffer.add)(state, {"id": jnp.zeros(2, jnp.int32), "obs": jnp.zeros((2, 2), int)})
    with pytest.raises(ValueError, match=re.escape("importance_exponent must be a scalar")):
        buffer.sample(state, jax.random.key(0), importance_exponent=jnp.ones(2))
    with pytest.raises(TypeError, match=re.escape("importance_exponent must be a float")):
        buffer.sample(state, jax.random.key(0), importance_exponent=jnp.int32(1))
    batch = jax.jit(buffer.sample)(state, jax.random.key(0))  # empty: placeholders, all invalid
    assert not batch.valid.any() and not batch.weights.any()


@pytest.mark.parametrize("capacity", [1, 3, 33, 5000, 70_000])
def test_block_paths_give_the_cpu_paths_tree_and_draws_bit_for_bit(capacity):
    """The accelerator paths (several levels per access, no loop) against the CPU paths on
    float values with zeros, duplicates and skipped entries, at depths 0 to 17 (jumps of
    every remainder): the same sums and minima, the same leaves drawn, bit for bit."""
    rng = np.random.default_rng(capacity)
    sequential = jax.jit(functools.partial(_sumtree.update, method="sequential"))
    parallel = jax.jit(functools.partial(_sumtree.update, method="parallel"))
    loop, blocks = jax.jit(_sumtree._find_in_loop), jax.jit(_sumtree_blocks.find)
    one = other = _sumtree.init(capacity)
    for round_ in range(8):
        count = (7, 256)[round_ % 2]  # two shapes: two compilations
        indices = jnp.asarray(rng.integers(0, capacity, count), jnp.int32)
        values = rng.exponential(size=count) * (rng.random(count) > 0.2)
        values = jnp.asarray(values * 10.0 ** rng.integers(-6, 6, count), jnp.float32)
        keep = jnp.asarray(rng.random(count) < 0.8)
        one, other = sequential(one, indices, values, keep), parallel(other, indices, values, keep)
        np.testing.assert_array_equal(one.sums, other.sums)
        np.testing.assert_array_equal(one.minima, other.minima)
        edges = [0.0, 1e-9, 0.5, 1 - 2**-24, 1.0, np.nextafter(np.float32(1), np.float32(2))]
        fractions = jnp.asarray(np.concatenate([rng.random(509), edges]), jnp.float32)
        for a, b in zip(loop(one, fractions), blocks(one, fractions), strict=True):
            np.testing.assert_array_equal(a, b)
        found, value, total, _ = blocks(one, fractions)
        if float(total[0]) > 0:
            assert (np.asarray(value) > 0).all() and (np.asarray(found) < capacity).all()


def test_jumps_cover_the_depth_with_the_remainder_first():
    assert _sumtree_blocks.jumps(0) == [] and _sumtree_blocks.jumps(5) == [5]
    assert _sumtree_blocks.jumps(12) == [2, 5, 5] and _sumtree_blocks.jumps(20) == [5, 5, 5, 5]
    assert _sumtree_blocks.jumps(7, 3) == [1, 3, 3]


def test_parallel_update_of_more_than_1024_entries_keeps_the_last_kept_duplicate():
    rng = np.random.default_rng(7)
    capacity, batch = 300, 2048  # many duplicates; the sort-based branch of last_occurrence
    indices = rng.integers(0, capacity, batch)
    values = rng.choice([0.0, 0.5, 1.0, 3.0], batch)
    keep = rng.random(batch) < 0.7
    tree = jax.jit(functools.partial(_sumtree.update, method="parallel"))(
        _sumtree.init(capacity), jnp.asarray(indices, jnp.int32),
        jnp.asarray(values, jnp.float32), jnp.asarray(keep),
    )  # fmt: skip
    expected = np.zeros(capacity)
    for i, v, k in zip(indices, values, keep, strict=True):
        if k:
            expected[i] = v
    np.testing.assert_array_equal(_sumtree.leaves(tree, jnp.arange(capacity)), expected)
    assert float(tree.total) == expected.sum()
