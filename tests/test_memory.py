"""A buffer's bytes before allocation, per leaf and per stored step, against NumPy
arithmetic; init refuses a state the device cannot hold, before allocating."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf.core import footprint as _footprint

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
    monkeypatch.setattr(_footprint, "device_free_bytes", lambda device=None: report.total - 1)
    before = len(jax.live_arrays())
    with pytest.raises(
        ValueError,
        match=r"the buffer's state needs 0\.\d+ GiB .* bytes per "
        r"stored step over 640,000 steps; the largest leaf, \.experience\['obs'\]",
    ):
        buffer.init(STEP)
    assert len(jax.live_arrays()) == before  # nothing was allocated
    monkeypatch.setattr(_footprint, "device_free_bytes", lambda device=None: report.total)
    assert jax.tree.leaves(buffer.init(STEP))[0].shape[0] == 64  # exactly enough fits


def test_free_bytes_of_this_cpu_is_its_memory():
    free = _footprint.device_free_bytes()
    assert free is not None and free > 2**30


HUGE = {"obs": jnp.zeros(64), "a": jnp.int32(0)}  # 260 bytes per item


def test_describing_a_state_never_refuses_it_and_allocating_one_does():
    """`memory` and `jax.eval_shape` (a checkpoint's template, alone or inside a
    training state) trace `init` for shapes only; `init` and `jit(init)` allocate."""
    buffer = jaxbuf.make_replay_buffer(2**30 - 1, 32)
    report = jaxbuf.memory(buffer, HUGE)
    assert report.stored_steps == 2**30 - 1 and report.total > 250 * 2**30
    assert jax.eval_shape(buffer.init, HUGE).experience["obs"].shape == (2**30 - 1, 64)
    nested = jax.eval_shape(lambda: {"buffer": buffer.init(HUGE), "step": jnp.int32(0)})
    assert nested["buffer"].experience["a"].shape == (2**30 - 1,)
    message = r"needs 260\.00 GiB .* jaxbuf\.memory\(buffer, example\) reports every leaf"
    with pytest.raises(ValueError, match=message):
        buffer.init(HUGE)
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda example: buffer.init(example))(HUGE)


def brax_transition():
    from jaxbuf.brax import BraxReplay

    fields = "observation action reward discount next_observation extras"
    transition = __import__("collections").namedtuple("Transition", fields)
    obs = jnp.zeros(64)
    dummy = transition(obs, jnp.zeros(8), jnp.float32(0), jnp.float32(0), obs, {})
    return lambda: BraxReplay(2**20, dummy, 256, num_envs=4).init(jax.random.key(0))


ROLLOUT_STEP = {"obs": jnp.zeros(64), "reward": jnp.float32(0), "value": jnp.float32(0),
                "terminated": jnp.bool_(False), "truncated": jnp.bool_(False),
                "final_value": jnp.float32(0)}  # fmt: skip


@pytest.mark.parametrize(
    "make",
    [
        lambda: jaxbuf.make_queue(2**20, 2, 4).init(HUGE),
        lambda: jaxbuf.make_rollout_buffer(2**10, 2**10, discount=0.9, gae_lambda=0.9).init(
            ROLLOUT_STEP
        ),
        brax_transition(),
    ],
    ids=["queue", "rollout", "brax"],
)
def test_every_kind_refuses_a_state_that_does_not_fit(make, monkeypatch):
    monkeypatch.setattr(_footprint, "device_free_bytes", lambda device=None: 10_000)
    before = len(jax.live_arrays())
    with pytest.raises(ValueError, match=r"the buffer's state needs .* Nothing was allocated"):
        make()
    assert len(jax.live_arrays()) == before
    monkeypatch.setattr(_footprint, "device_free_bytes", lambda device=None: 2**40)
    assert jax.tree.leaves(make())


def test_host_bytes_count_on_a_cpu_whose_memories_are_one(monkeypatch):
    """Host leaves are the same RAM on a CPU: they count against its free memory."""
    buffer = jaxbuf.make_replay_buffer(1000, 4, host_memory=("obs",))
    report = jaxbuf.memory(buffer, HUGE)
    assert 0 < report.host < report.total and report.device < report.total
    monkeypatch.setattr(_footprint, "device_free_bytes", lambda device=None: report.device + 1)
    with pytest.raises(ValueError, match="the buffer's state needs"):
        buffer.init(HUGE)


class FakeDevice:
    platform = "gpu"

    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_free_bytes_are_the_limit_less_what_is_in_use():
    assert _footprint.device_free_bytes(FakeDevice({"bytes_limit": 100, "bytes_in_use": 60})) == 40
    assert _footprint.device_free_bytes(FakeDevice({"bytes_limit": 100})) == 100
    assert _footprint.device_free_bytes(FakeDevice(None)) is None


def test_stored_steps_come_from_the_leaf_with_fewest_dimensions():
    """Any leaf order: the item's scalar reward tells the leading axes, not `obs`."""
    for example in ({"obs": jnp.zeros(4), "reward": jnp.float32(0)},
                    {"a_reward": jnp.float32(0), "obs": jnp.zeros(4)}):  # fmt: skip
        assert jaxbuf.memory(jaxbuf.make_replay_buffer(10, 2), example).stored_steps == 10
