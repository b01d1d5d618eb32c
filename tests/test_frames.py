"""Frame stacking against a NumPy reference over random episodes and wrap-arounds."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

ENVS, CAPACITY, K = 2, 11, 3


def reference_stack(ids, done, i, k, oldest):
    """Frames `k` ending at history index `i`: never before the episode's first
    step (after the last `done` before `i`) nor before history index `oldest`."""
    start = oldest
    for j in range(i - 1, max(oldest, i - k + 1) - 1, -1):
        if done[j]:
            start = j + 1
            break
    return [ids[max(i - d, start)] for d in range(k - 1, -1, -1)]


def history(rng, adds):
    """Per environment: step ids and done flags of `adds` chunks of random length."""
    chunks = [int(rng.integers(1, 6)) for _ in range(adds)]
    total = sum(chunks)
    ids = 1000 * np.arange(ENVS)[:, None] + np.arange(total)[None]
    done = rng.random((ENVS, total)) < 0.25
    return chunks, ids.astype(np.int32), done


@pytest.mark.parametrize("seed", range(3))
def test_trajectory_windows_stack_frames_as_the_reference(seed):
    rng = np.random.default_rng(seed)
    buffer = jaxbuf.make_trajectory_buffer(ENVS, CAPACITY, 64, 4, done_fn=lambda s: s["done"],
                                           frames={"obs": K})  # fmt: skip
    add, sample = jax.jit(buffer.add), jax.jit(buffer.sample)
    state = buffer.init({"obs": jnp.int32(0), "done": jnp.bool_(False)})
    chunks, ids, done = history(rng, 12)
    added = 0
    for count in chunks:
        steps = {"obs": ids[:, added : added + count], "done": done[:, added : added + count]}
        state, added = add(state, jax.tree.map(jnp.asarray, steps)), added + count
        batch = jax.device_get(sample(state, jax.random.key(added)))
        oldest = max(0, added - CAPACITY)
        for row in np.flatnonzero(batch.valid):
            env = int(batch.experience["obs"][row, 0, -1]) // 1000
            for step in range(4):
                i = int(batch.experience["obs"][row, step, -1]) % 1000
                want = reference_stack(ids[env], done[env], i, K, oldest)
                assert batch.experience["obs"][row, step].tolist() == want


CASES = [(0, 1, K), (1, 1, K), (2, 2, K), (3, 2, K), (4, 3, K), (5, 1, 1), (6, 2, 1)]


@pytest.mark.parametrize(("seed", "n", "k"), CASES)
def test_transition_obs_and_next_obs_stacks_match_the_reference(seed, n, k):
    """n = 1 builds the next stack from the first one moved on by a step; n > 1
    gathers it apart; k = 1 gives stacks of one frame, `[B, 1]`."""
    rng = np.random.default_rng(10 + seed)
    buffer = jaxbuf.make_transition_buffer(ENVS, CAPACITY, 64, n_step=n, frames={"obs": k})
    add, sample = jax.jit(buffer.add), jax.jit(buffer.sample)
    chunks, ids, done = history(rng, 12)
    truncated = done & (rng.random(done.shape) < 0.5)
    terminated = done & ~truncated

    def steps(a, b):
        obs = jnp.asarray(ids[:, a:b])
        return jaxbuf.Transition(obs, obs, jnp.ones(obs.shape), jnp.asarray(terminated[:, a:b]),
                                 jnp.asarray(truncated[:, a:b]), -obs)  # fmt: skip

    state = buffer.init(jax.tree.map(lambda x: x[0, 0], steps(0, 1)))
    added = 0
    for count in chunks:
        state, added = add(state, steps(added, added + count)), added + count
        batch = jax.device_get(sample(state, jax.random.key(added)))
        oldest = max(0, added - CAPACITY)
        for row in np.flatnonzero(batch.valid):
            env, i = divmod(int(batch.experience.action[row]), 1000)
            assert batch.experience.obs[row].tolist() == reference_stack(
                ids[env], done[env], i, k, oldest)  # fmt: skip
            end = next((j for j in range(i, i + n) if done[env, j]), None)
            if end is None:
                want = reference_stack(ids[env], done[env], i + n, k, oldest)
            else:
                want = [*reference_stack(ids[env], done[env], end, k - 1, oldest), -ids[env, end]]
            assert batch.experience.next_obs[row].tolist() == want


def test_episodes_stack_within_the_episode_and_pad_with_zeros():
    buffer = jaxbuf.make_episode_buffer(1, 16, 8, 5, done_fn=lambda s: s["done"],
                                        frames={"obs": K})  # fmt: skip
    ids = jnp.arange(1, 10, dtype=jnp.int32)[None]
    state = buffer.init({"obs": jnp.int32(0), "done": jnp.bool_(False)})
    state = buffer.add(state, {"obs": ids, "done": (ids == 2) | (ids == 6)})
    batch = buffer.sample(state, jax.random.key(0))
    by_length = {int(length): frames.tolist() for length, frames in
                 zip(batch.length, batch.experience["obs"], strict=True)}  # fmt: skip
    assert by_length[2] == [[1, 1, 1], [1, 1, 2]] + [[0, 0, 0]] * 3
    assert by_length[4] == [[3, 3, 3], [3, 3, 4], [3, 4, 5], [4, 5, 6], [0, 0, 0]]


def test_frames_are_stored_once_and_bad_options_are_named():
    stacked = jaxbuf.make_trajectory_buffer(2, 32, 4, 2, frames={"obs": 4})
    state = stacked.init({"obs": jnp.zeros((84, 84), jnp.uint8)})
    assert state.experience["obs"].shape == (2, 32, 84, 84)
    assert stacked.sample(state, jax.random.key(0)).experience["obs"].shape == (4, 2, 4, 84, 84)
    assert stacked.config.frames == {"obs": 4}
    with pytest.raises(ValueError, match=re.escape("frames names ['pixels'], which the example")):
        jaxbuf.make_trajectory_buffer(2, 32, 4, 2, frames={"pixels": 4}).init({"obs": jnp.int32(0)})
    with pytest.raises(ValueError, match=re.escape("frames may stack only ['obs']")):
        jaxbuf.make_transition_buffer(2, 32, 4, frames={"action": 2})
    with pytest.raises(ValueError, match=re.escape("frames['obs'] must be in [1, 32]")):
        jaxbuf.make_episode_buffer(2, 32, 4, 4, done_fn=lambda s: s["d"], frames={"obs": 40})
    with pytest.raises(TypeError, match="frames must be a dict"):
        jaxbuf.make_trajectory_buffer(2, 32, 4, 2, frames=4)
    config = dict(stacked.config) | {"kind": "trajectory"}
    assert jaxbuf.io.buffer_from_config(config).config.frames == {"obs": 4}
