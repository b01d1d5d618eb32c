"""A buffer's bytes before allocation, per leaf and per stored step, against NumPy
arithmetic; init refuses a state the device cannot hold, before allocating."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf import _memory

OBS = jnp.zeros(128, jnp.float32)
STEP = jaxbuf.Transition(OBS, jnp.int32(0), jnp.float32(0), jnp.bool_(False), jnp.bool_(False),
                         OBS)  # fmt: skip


def test_the_report_counts_every_leaf_as_numpy_would():
    buffer = jaxbuf.make_replay_buffer(1000, 32, sampler=jaxbuf.prioritized())
    example = {"obs": jnp.zeros((84, 84), jnp.uint8), "action": jnp.int32(0)}
    report = jaxbuf.memory(buffer, example)
    state = buffer.init(example)
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        assert report.leaves[jax.tree_util.keystr(path)] == np.asarray(leaf).nbytes
    assert report.total == sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
    assert report.stored_steps == 1000
    assert report.leaves[".experience['obs']"] == 1000 * 84 * 84
    assert "bytes per stored step" in str(report)


@pytest.mark.parametrize("min_episode_length, most", [(1, 2.01), (100, 1.02)])
def test_a_transition_buffer_holds_about_one_observation_per_stored_step(min_episode_length,
                                                                         most):  # fmt: skip
    buffer = jaxbuf.make_transition_buffer(16, 1000, 256, min_episode_length=min_episode_length)
    report = jaxbuf.memory(buffer, STEP)
    observations = sum(size for name, size in report.leaves.items() if "obs" in name)
    per_step = observations / report.stored_steps / OBS.nbytes
    assert report.stored_steps == 16 * 1000
    assert per_step <= most
    vectorized = jaxbuf.memory(jaxbuf.vectorize(buffer, 3), STEP)
    assert vectorized.stored_steps == 3 * 16 * 1000
    assert vectorized.per_stored_step == pytest.approx(report.per_stored_step, rel=1e-3)


def test_init_refuses_a_state_the_device_cannot_hold_before_allocating(monkeypatch):
    buffer = jaxbuf.make_transition_buffer(64, 10_000, 256)
    report = jaxbuf.memory(buffer, STEP)
    monkeypatch.setattr(_memory, "device_free_bytes", lambda device=None: report.total - 1)
    before = len(jax.live_arrays())
    with pytest.raises(
        ValueError,
        match=r"the buffer's state needs 0\.\d+ GiB .* bytes per "
        r"stored step over 640,000 steps; the largest leaf, \.experience\['obs'\]",
    ):
        buffer.init(STEP)
    assert len(jax.live_arrays()) == before  # nothing was allocated
    monkeypatch.setattr(_memory, "device_free_bytes", lambda device=None: report.total)
    assert jax.tree.leaves(buffer.init(STEP))[0].shape[0] == 64  # exactly enough fits


def test_free_bytes_of_this_cpu_is_its_memory():
    free = _memory.device_free_bytes()
    assert free is not None and free > 2**30
