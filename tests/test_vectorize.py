"""vectorize: independent buffers behind one interface, equal to vmap of one buffer."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import RingBuffer
from scipy import stats

import jaxbuf

EXAMPLE = {"obs": np.zeros(2, np.float32), "action": np.int32(0)}


def items_for(rng, num_buffers, batch, start):
    ids = start + np.arange(num_buffers * batch, dtype=np.int32).reshape(num_buffers, batch)
    return {"obs": rng.normal(size=(num_buffers, batch, 2)).astype(np.float32), "action": ids}


def test_init_add_can_sample_equal_vmap_of_the_single_functions(variant):
    buffer = jaxbuf.make_replay_buffer(7, 5, min_size=4)
    buffers = jaxbuf.vectorize(buffer, 3)
    add, can_sample = variant(buffers.add), variant(buffers.can_sample)
    state = buffers.init(EXAMPLE)
    reference = jax.vmap(buffer.init, axis_size=3, in_axes=None)(EXAMPLE)
    chex.assert_trees_all_equal(state, reference)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, reference)
    rng = np.random.default_rng(0)
    refs = [RingBuffer(7, EXAMPLE) for _ in range(3)]
    for step, batch in enumerate([1, 3, 5, 2, 7, 4]):
        items = items_for(rng, 3, batch, 100 * step)
        state = add(state, items)
        reference = jax.vmap(buffer.add)(reference, items)
        chex.assert_trees_all_equal(state, reference)
        for b, ref in enumerate(refs):
            ref.add(jax.tree.map(lambda x, b=b: x[b], items))
            chex.assert_trees_all_equal(
                jax.device_get(jax.tree.map(lambda x, b=b: x[b], state.experience)), ref.storage
            )
        assert bool(can_sample(state)) == bool(jnp.all(jax.vmap(buffer.can_sample)(reference)))


def stacked_state(buffer, sizes):
    """A vectorized state whose buffers hold different numbers of items."""
    rng = np.random.default_rng(1)
    singles = []
    for b, size in enumerate(sizes):
        state = buffer.init(EXAMPLE)
        if size:
            state = buffer.add(
                state, jax.tree.map(lambda x: x[0], items_for(rng, 1, size, 1000 * b))
            )
        singles.append(state)
    return jax.tree.map(lambda *x: jnp.stack(x), *singles)


def test_sample_says_where_each_item_came_from(variant):
    buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 64, min_size=3), 4)
    state = stacked_state(jaxbuf.make_replay_buffer(10, 64, min_size=3), [5, 0, 2, 10])
    sample = variant(buffers.sample)
    batch = sample(state, jax.random.key(0))
    chex.assert_shape([batch.source, batch.indices, batch.valid], (64,))
    which, rows = np.divmod(np.asarray(batch.indices), 10)
    np.testing.assert_array_equal(batch.source, which)
    expected = jax.tree.map(lambda x: x[which, rows], state.experience)
    chex.assert_trees_all_equal(batch.experience, expected)
    assert np.all(rows < np.array([5, 0, 2, 10])[which])
    np.testing.assert_array_equal(batch.valid, np.array([5, 0, 2, 10])[which] >= 3)
    assert not bool(buffers.can_sample(state))


@pytest.mark.parametrize("replacement", [True, False])
def test_sample_is_uniform_over_all_stored_items(replacement):
    sizes = [5, 0, 2, 10]
    buffer = jaxbuf.make_replay_buffer(10, 8, sampler=jaxbuf.uniform(replacement=replacement))
    buffers = jaxbuf.vectorize(buffer, 4)
    state = stacked_state(buffer, sizes)
    keys = jax.random.split(jax.random.key(3), 1500)
    batch = jax.jit(jax.vmap(buffers.sample, in_axes=(None, 0)))(state, keys)
    flat = np.asarray(batch.indices)
    stored = [b * 10 + r for b, size in enumerate(sizes) for r in range(size)]
    counts = np.bincount(flat.ravel(), minlength=40)
    assert counts[np.setdiff1d(np.arange(40), stored)].sum() == 0
    assert stats.chisquare(counts[stored]).pvalue > 1e-3
    if not replacement:
        assert all(len(set(row)) == 8 for row in flat.tolist())


def test_sample_from_empty_buffers_is_flagged_invalid():
    buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(4, 3), 2)
    batch = buffers.sample(buffers.init(EXAMPLE), jax.random.key(0))
    assert not bool(batch.valid.any())
    assert np.all(np.asarray(batch.source) < 2) and np.all(np.asarray(batch.indices) % 4 == 0)


def test_vectorized_functions_never_retrace_and_donate():
    buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(16, 8), 4)
    add = jax.jit(chex.assert_max_traces(buffers.add, n=1), donate_argnums=0)
    sample = jax.jit(chex.assert_max_traces(buffers.sample, n=1))
    state = buffers.init(EXAMPLE)
    rng = np.random.default_rng(0)
    for step in range(10):
        old = jax.tree.leaves(state)
        state = add(state, items_for(rng, 4, 3, 12 * step))
        assert all(leaf.is_deleted() for leaf in old)
        sample(state, jax.random.key(step))
    assert np.asarray(state.size).tolist() == [16] * 4
