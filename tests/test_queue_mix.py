"""The FIFO queue against a Python deque, and the mixer of several buffers."""

import collections
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros(2)}


def chunk(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {"id": ids, "obs": jnp.stack([ids, -ids], -1).astype(jnp.float32)}


def test_the_queue_is_first_in_first_out_across_wrap_arounds():
    queue = jaxbuf.make_queue(capacity=7, add_batch_size=3, sample_batch_size=2)
    add, pop = jax.jit(queue.add, donate_argnums=0), jax.jit(queue.pop)
    state, reference, dropped = queue.init(EXAMPLE), collections.deque(), 0
    rng = np.random.default_rng(0)
    next_id = 0
    for _ in range(200):
        if rng.random() < 0.5:
            room = bool(queue.can_add(state))
            assert room == (len(reference) + 3 <= 7)
            state = add(state, chunk(range(next_id, next_id + 3)))
            if room:
                reference.extend(range(next_id, next_id + 3))
            else:
                dropped += 3
            next_id += 3
        else:
            ready = bool(queue.can_sample(state))
            assert ready == (len(reference) >= 2)
            state, batch = pop(state)
            assert jax.device_get(batch.valid).tolist() == [ready] * 2
            if ready:
                expected = [reference.popleft() for _ in range(2)]
                assert jax.device_get(batch.experience["id"]).tolist() == expected
                np.testing.assert_array_equal(batch.experience["obs"][:, 1], -np.asarray(expected))
        assert int(state.size) == len(reference) and int(state.dropped) == dropped


def test_queue_errors_are_named(variant):
    with pytest.raises(ValueError, match=re.escape("add_batch_size=5 exceeds capacity=4")):
        jaxbuf.make_queue(4, 5, 1)
    with pytest.raises(ValueError, match=re.escape("sample_batch_size=9 exceeds capacity=4")):
        jaxbuf.make_queue(4, 1, 9)
    queue = jaxbuf.make_queue(4, 2, 2)
    with pytest.raises(
        ValueError,
        match=re.escape("items['id'] has add_batch_size=3 (shape (3,)), but it must be 2"),
    ):
        variant(queue.add)(queue.init(EXAMPLE), chunk([1, 2, 3]))


def filled(buffer, value, count):
    return buffer.add(buffer.init(EXAMPLE), chunk(np.full(count, value)))


def test_mix_takes_fixed_shares_and_says_where_items_came_from():
    buffers = [jaxbuf.make_replay_buffer(50, 16) for _ in range(3)]
    sample = jax.jit(jaxbuf.mix(buffers, [0.5, 0.3, 0.2], sample_batch_size=16))
    states = [filled(b, 10 * (i + 1), 5 + i) for i, b in enumerate(buffers)]
    batch = sample(states, jax.random.key(0))
    assert np.bincount(np.asarray(batch.source)).tolist() == [8, 5, 3]
    np.testing.assert_array_equal(batch.experience["id"], 10 * (np.asarray(batch.source) + 1))
    assert bool(batch.valid.all())
    below = jaxbuf.make_replay_buffer(50, 16, min_size=40)
    batch = jaxbuf.mix([buffers[0], below], [1, 1], 8)(
        [states[0], filled(below, 7, 3)], jax.random.key(1)
    )
    assert jax.device_get(batch.valid).tolist() == [True] * 4 + [False] * 4


def test_mix_works_with_vectorized_buffers_and_is_deterministic_per_key():
    replay = jaxbuf.make_replay_buffer(20, 6)
    vectorized = jaxbuf.vectorize(replay, 2)
    vstate = vectorized.add(vectorized.init(EXAMPLE), chunk(np.full((2, 4), 3)))
    sample = jaxbuf.mix([replay, vectorized], [1, 2], 6)
    states = [filled(replay, 1, 4), vstate]
    first, again = sample(states, jax.random.key(5)), sample(states, jax.random.key(5))
    chex.assert_trees_all_equal(first, again)
    assert jax.device_get(first.experience["id"]).tolist() == [1, 1, 3, 3, 3, 3]


def test_mix_errors_are_named():
    small = jaxbuf.make_replay_buffer(10, 2)
    large = jaxbuf.make_replay_buffer(10, 8)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "buffers[0] samples 2 items per call, but its share of the mixed batch is 4"
        ),
    ):
        jaxbuf.mix([small, large], [1, 1], 8)
    with pytest.raises(ValueError, match="one proportion per buffer, got 1 for 2 buffers"):
        jaxbuf.mix([large, large], [1], 8)
    with pytest.raises(
        ValueError, match="proportions must be finite, non-negative and not all zero"
    ):
        jaxbuf.mix([large, large], [1, -1], 8)
    other = jaxbuf.make_replay_buffer(10, 8)
    sample = jaxbuf.mix([large, other], [1, 1], 8)
    states = [
        filled(large, 1, 3),
        other.add(other.init({"id": jnp.int32(0)}), {"id": jnp.arange(3, dtype=jnp.int32)}),
    ]
    with pytest.raises(
        ValueError, match=re.escape("buffers[1]'s items does not have the tree structure")
    ):
        sample(states, jax.random.key(0))
    with pytest.raises(ValueError, match="sample needs 2 states, one per buffer, got 1"):
        sample(states[:1], jax.random.key(0))
