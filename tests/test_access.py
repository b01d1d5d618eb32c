"""take and take_all: explicit indices and everything in storage order."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import items

import jaxbuf

EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros(2)}


def transition_steps(ids):
    ids = np.asarray(ids)
    return jaxbuf.Transition(
        obs=items(ids), action=jnp.asarray(ids, jnp.int32), reward=jnp.asarray(ids, jnp.float32),
        terminated=jnp.asarray(ids % 5 == 4), truncated=jnp.asarray(ids % 7 == 6),
        next_obs=items(ids + 100), discount=None,
    )  # fmt: skip


def done(step):
    return step["id"] % 4 == 3


KINDS = {
    "replay": (lambda s: jaxbuf.make_replay_buffer(10, 6, sampler=s), EXAMPLE,
               lambda i: items(np.arange(i, i + 7))),
    "trajectory": (lambda s: jaxbuf.make_trajectory_buffer(2, 8, 4, 3, done_fn=done, sampler=s),
                   EXAMPLE, lambda i: items(np.arange(i, i + 10).reshape(2, 5))),
    "transition": (lambda s: jaxbuf.make_transition_buffer(2, 8, 4, n_step=2, min_episode_length=1,
                                                   sampler=s),
                   jax.tree.map(lambda x: x[0, 0], transition_steps(np.zeros((2, 1), int))),
                   lambda i: transition_steps(np.arange(i, i + 10).reshape(2, 5))),
    "episode": (lambda s: jaxbuf.make_episode_buffer(2, 8, 4, 4, done_fn=done, sampler=s),
                EXAMPLE, lambda i: items(np.arange(i, i + 10).reshape(2, 5))),
}  # fmt: skip


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_take_of_a_samples_indices_returns_its_experience(variant, kind, sampler):
    make, example, data = KINDS[kind]
    buffer = make(jaxbuf.uniform() if sampler == "uniform" else jaxbuf.prioritized())
    state = buffer.init(example)
    for start in (0, 10, 20):  # wraps around
        state = buffer.add(state, data(start))
    batch = buffer.sample(state, jax.random.key(0))
    assert bool(batch.valid.all())
    chex.assert_trees_all_equal(variant(buffer.take)(state, batch.indices), batch.experience)


def test_take_of_a_vectorized_sample_returns_its_experience(variant):
    vectorized = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 6), 3)
    vstate = vectorized.add(vectorized.init(EXAMPLE), items(np.arange(12).reshape(3, 4)))
    vbatch = vectorized.sample(vstate, jax.random.key(1))
    chex.assert_trees_all_equal(variant(vectorized.take)(vstate, vbatch.indices), vbatch.experience)
    np.testing.assert_array_equal(vbatch.source, np.asarray(vbatch.indices) // 10)


def test_take_all_is_every_valid_item_in_storage_order():
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.add(buffer.init(EXAMPLE), items([0, 1, 2])), items([3, 4, 5, 6]))
    assert jaxbuf.io.take_all(state)["id"].tolist() == [5, 6, 2, 3, 4]
    halves = jaxbuf.io.take_all(buffer.add(buffer.init(EXAMPLE), items([7, 8, 9, 10])), 2)
    assert halves["id"].tolist() == [[7, 8], [9, 10]] and halves["obs"].shape == (2, 2, 2)
    single = [buffer.add(buffer.init(EXAMPLE), items(ids)) for ids in ([1, 2, 3], [4])]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *single)
    assert jaxbuf.io.take_all(stacked)["id"].tolist() == [1, 2, 3, 4]
    trajectories = jaxbuf.make_trajectory_buffer(2, 4, 1, 1)
    tstate = trajectories.add(trajectories.init(EXAMPLE), items([[0, 1, 2], [10, 11, 12]]))
    assert jaxbuf.io.take_all(tstate, 3)["id"].tolist() == [[0, 1], [2, 10], [11, 12]]


def test_access_errors_are_named():
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.init(EXAMPLE), items([0, 1, 2]))
    with pytest.raises(TypeError, match=re.escape("indices must be a 1-D integer array [k]")):
        buffer.take(state, jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(
        ValueError, match=re.escape("the 3 stored items do not split into num_minibatches=2")
    ):
        jaxbuf.io.take_all(state, 2)
    with pytest.raises(TypeError, match="take_all takes a jaxbuf buffer state, got dict"):
        jaxbuf.io.take_all({"a": 1})


def test_stored_items_of_trajectory_episode_and_transition_states():
    done = lambda step: step["id"] % 4 == 3  # noqa: E731
    episodes = jaxbuf.make_episode_buffer(2, 6, 5, 4, done_fn=done)
    ids = np.arange(16).reshape(2, 8)
    state = episodes.init(EXAMPLE)
    for chunk in (ids[:, :5], ids[:, 5:]):
        state = episodes.add(state, items(chunk))  # the second add wraps around
    columns = jaxbuf.io.stored_items(state)
    assert columns["env"].tolist() == [0] * 6 + [1] * 6
    assert columns["time"].tolist() == list(range(6)) * 2
    assert columns["id"].tolist() == [*range(2, 8), *range(10, 16)]  # oldest first
    np.testing.assert_array_equal(columns["obs"][:, 1], -columns["id"])
    trajectories = jaxbuf.make_trajectory_buffer(2, 6, 1, 1)
    tstate = trajectories.init(EXAMPLE)
    for chunk in (ids[:, :5], ids[:, 5:]):
        tstate = trajectories.add(tstate, items(chunk))
    chex.assert_trees_all_equal(jaxbuf.io.stored_items(tstate), columns)
    transitions = jaxbuf.make_transition_buffer(2, 6, 5)
    step = jaxbuf.Transition(
        obs=items(ids[:, :5]), action=jnp.zeros((2, 5), jnp.int32),
        reward=jnp.zeros((2, 5)), terminated=jnp.zeros((2, 5), bool),
        truncated=jnp.zeros((2, 5), bool), next_obs=items(ids[:, 1:6]),
    )  # fmt: skip
    xstate = transitions.add(transitions.init(jax.tree.map(lambda x: x[0, 0], step)), step)
    assert jaxbuf.io.stored_items(xstate)["obs/id"].tolist() == [*range(5), *range(8, 13)]
    assert jaxbuf.io.take_all(xstate)["obs"]["id"].tolist() == [*range(5), *range(8, 13)]
