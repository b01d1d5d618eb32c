"""take and take_all: explicit indices and everything in storage order."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros(2)}


def items(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {"id": ids, "obs": jnp.stack([ids, -ids], -1).astype(jnp.float32)}


def test_take_matches_what_sample_returns(variant):
    buffer = jaxbuf.make_replay_buffer(10, 6)
    state = buffer.add(buffer.init(EXAMPLE), items(range(7)))
    batch = buffer.sample(state, jax.random.key(0))
    chex.assert_trees_all_equal(variant(jaxbuf.take)(state, batch.indices), batch.experience)
    vectorized = jaxbuf.vectorize(buffer, 3)
    vstate = vectorized.add(vectorized.init(EXAMPLE), items(np.arange(12).reshape(3, 4)))
    vbatch = vectorized.sample(vstate, jax.random.key(1))
    taken = variant(jaxbuf.take)(vstate, vbatch.buffer_indices, vbatch.indices)
    chex.assert_trees_all_equal(taken, vbatch.experience)
    trajectories = jaxbuf.make_trajectory_buffer(2, 8, 4, 3)
    tstate = trajectories.add(trajectories.init(EXAMPLE), items(np.arange(10).reshape(2, 5)))
    tbatch = trajectories.sample(tstate, jax.random.key(2))
    first_steps = variant(jaxbuf.take)(tstate, tbatch.env_indices, tbatch.time_indices)
    chex.assert_trees_all_equal(first_steps, jax.tree.map(lambda x: x[:, 0], tbatch.experience))


def test_take_all_is_every_valid_item_in_storage_order():
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.add(buffer.init(EXAMPLE), items([0, 1, 2])), items([3, 4, 5, 6]))
    assert jaxbuf.take_all(state)["id"].tolist() == [5, 6, 2, 3, 4]
    halves = jaxbuf.take_all(buffer.add(buffer.init(EXAMPLE), items([7, 8, 9, 10])), 2)
    assert halves["id"].tolist() == [[7, 8], [9, 10]] and halves["obs"].shape == (2, 2, 2)
    single = [buffer.add(buffer.init(EXAMPLE), items(ids)) for ids in ([1, 2, 3], [4])]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *single)
    assert jaxbuf.take_all(stacked)["id"].tolist() == [1, 2, 3, 4]
    trajectories = jaxbuf.make_trajectory_buffer(2, 4, 1, 1)
    tstate = trajectories.add(trajectories.init(EXAMPLE), items([[0, 1, 2], [10, 11, 12]]))
    assert jaxbuf.take_all(tstate, 3)["id"].tolist() == [[0, 1], [2, 10], [11, 12]]


def test_access_errors_are_named():
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.init(EXAMPLE), items([0, 1, 2]))
    with pytest.raises(TypeError, match=re.escape("needs 1 index array(s), got 2")):
        jaxbuf.take(state, jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32))
    with pytest.raises(
        ValueError, match=re.escape("the 3 stored items do not split into num_minibatches=2")
    ):
        jaxbuf.take_all(state, 2)
    with pytest.raises(TypeError, match="expected a replay or trajectory buffer state, got dict"):
        jaxbuf.take_all({"a": 1})


def test_take_and_stored_items_of_trajectory_episode_and_transition_states(variant):
    done = lambda step: step["id"] % 4 == 3  # noqa: E731
    episodes = jaxbuf.make_episode_buffer(2, 6, 5, 4, done_fn=done)
    ids = np.arange(16).reshape(2, 8)
    state = episodes.init(EXAMPLE)
    for chunk in (ids[:, :5], ids[:, 5:]):
        state = episodes.add(state, items(chunk))  # the second add wraps around
    batch = episodes.sample(state, jax.random.key(0))
    first_steps = variant(jaxbuf.take)(state, batch.env_indices, batch.time_indices)
    chex.assert_trees_all_equal(first_steps, jax.tree.map(lambda x: x[:, 0], batch.experience))
    columns = jaxbuf.stored_items(state)
    assert columns["env"].tolist() == [0] * 6 + [1] * 6
    assert columns["time"].tolist() == list(range(6)) * 2
    assert columns["id"].tolist() == [*range(2, 8), *range(10, 16)]  # oldest first
    np.testing.assert_array_equal(columns["obs"][:, 1], -columns["id"])
    trajectories = jaxbuf.make_trajectory_buffer(2, 6, 1, 1)
    tstate = trajectories.init(EXAMPLE)
    for chunk in (ids[:, :5], ids[:, 5:]):
        tstate = trajectories.add(tstate, items(chunk))
    chex.assert_trees_all_equal(jaxbuf.stored_items(tstate), columns)
    transitions = jaxbuf.make_transition_buffer(2, 6, 5)
    step = jaxbuf.Transition(
        obs=items(ids[:, :5]), action=jnp.zeros((2, 5), jnp.int32),
        reward=jnp.zeros((2, 5)), terminated=jnp.zeros((2, 5), bool),
        truncated=jnp.zeros((2, 5), bool), next_obs=items(ids[:, 1:6]),
    )  # fmt: skip
    xstate = transitions.add(transitions.init(jax.tree.map(lambda x: x[0, 0], step)), step)
    xbatch = transitions.sample(xstate, jax.random.key(1))
    taken = variant(jaxbuf.take)(xstate, xbatch.env_indices, xbatch.time_indices)
    chex.assert_trees_all_equal(taken["obs"], xbatch.obs)
    assert jaxbuf.stored_items(xstate)["obs/id"].tolist() == [*range(5), *range(8, 13)]
    assert jaxbuf.take_all(xstate)["obs"]["id"].tolist() == [*range(5), *range(8, 13)]
