"""Hostile values: extreme priorities and exponents, float16 rollouts, counters at
their limits, empty adds and unparsable configuration files. Each must give a
clear error or a documented, finite answer, never a silently wrong one."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf.core.samplers import PRIORITY_RANGE

MAX_INT32 = 2**31 - 1


def prioritized_state(n=16, alpha=1.0):
    buffer = jaxbuf.make_replay_buffer(n, 8, sampler=jaxbuf.prioritized(alpha))
    return buffer, buffer.add(buffer.init(jnp.int32(0)), jnp.arange(n, dtype=jnp.int32))


@pytest.mark.parametrize("huge", [[1e38] * 8, [3e38], [3.4e38] * 16])
def test_huge_priorities_are_clamped_and_the_total_stays_finite(huge):
    buffer, state = prioritized_state()
    state = buffer.set_priorities(state, jnp.arange(len(huge)), jnp.array(huge, jnp.float32))
    assert np.isfinite(float(state.sampler.tree.total))
    assert float(state.sampler.max_priority) == pytest.approx(PRIORITY_RANGE[1])
    assert int(state.sampler.rejected) == 0
    # Reset every priority: draws spread over all slots again.
    state = buffer.set_priorities(state, jnp.arange(16), jnp.ones(16))
    batch = jax.vmap(lambda k: buffer.sample(state, k).indices)(
        jax.random.split(jax.random.key(0), 64)
    )
    assert len(np.unique(np.asarray(batch))) == 16


@pytest.mark.parametrize("tiny", [1e-40, 1e-45, 1e-30])
def test_tiny_positive_priorities_stay_drawable(tiny):
    buffer, state = prioritized_state()
    state = buffer.set_priorities(state, jnp.arange(16), jnp.full(16, tiny, jnp.float32))
    assert float(state.sampler.tree.total) > 0 and int(state.sampler.rejected) == 0
    batch = buffer.sample(state, jax.random.key(0))
    assert bool(batch.valid.all()) and np.all(np.asarray(batch.weights) > 0)


def test_weights_of_extreme_priority_ratios_stay_in_the_unit_interval():
    buffer, state = prioritized_state()
    priorities = jnp.where(jnp.arange(16) < 2, 1e30, 1e-30).astype(jnp.float32)
    state = buffer.set_priorities(state, jnp.arange(16), priorities)
    for beta in (0.4, 1.0):
        batch = buffer.sample(state, jax.random.key(1), importance_exponent=beta)
        weights = np.asarray(batch.weights)
        assert np.all((weights > 0) & (weights <= 1))
        low, high = PRIORITY_RANGE
        expected = np.where(np.asarray(batch.indices) < 2, (low / high) ** beta, 1.0)
        np.testing.assert_allclose(weights, expected, rtol=1e-4)


@pytest.mark.parametrize("beta", [float("nan"), -0.5, 1.5, np.float32(2.0)])
def test_a_known_importance_exponent_outside_the_unit_interval_raises(beta):
    buffer, state = prioritized_state()
    with pytest.raises(ValueError, match=r"importance_exponent must be in \[0, 1\]"):
        buffer.sample(state, jax.random.key(0), importance_exponent=beta)


@pytest.mark.parametrize("beta, clamped", [(-3.0, 0.0), (7.0, 1.0), (float("nan"), 1.0)])
def test_a_traced_importance_exponent_is_clamped(beta, clamped):
    buffer, state = prioritized_state()
    state = buffer.set_priorities(state, jnp.arange(16), jnp.arange(1, 17, dtype=jnp.float32))
    traced = jax.jit(lambda s, b: buffer.sample(s, jax.random.key(0), importance_exponent=b))
    got = traced(state, jnp.float32(beta))
    want = buffer.sample(state, jax.random.key(0), importance_exponent=clamped)
    np.testing.assert_allclose(got.weights, want.weights, rtol=1e-6)
    assert np.all(np.asarray(got.weights) <= 1)


def test_float16_advantages_normalize_without_nan_or_overflow():
    buffer = jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9)
    example = {k: jnp.float16(0) for k in ("reward", "value", "final_value")}
    state = buffer.init(example | {"terminated": jnp.bool_(False), "truncated": jnp.bool_(False)})
    for advantages, expected in [(np.full((4, 2), 3.0), 0.0), (np.tile([300, -300], (4, 1)), None)]:
        state = state.replace(size=jnp.int32(4), advantages=jnp.asarray(advantages, jnp.float16))
        got = np.asarray(buffer.minibatches(state, jax.random.key(0), 1).advantages, np.float32)
        assert np.all(np.isfinite(got))
        if expected is None:
            np.testing.assert_allclose(np.sort(got.ravel()), [-1] * 4 + [1] * 4, atol=1e-3)
        else:
            np.testing.assert_array_equal(got, expected)


def test_event_counters_saturate_instead_of_wrapping():
    queue = jaxbuf.make_queue(4, 4, 4)
    state = queue.add(queue.init(jnp.int32(0)), jnp.arange(4, dtype=jnp.int32))
    state = state.replace(dropped=jnp.int32(MAX_INT32 - 2))
    for _ in range(3):
        state = queue.add(state, jnp.arange(4, dtype=jnp.int32))
    assert int(state.dropped) == MAX_INT32

    buffer, pstate = prioritized_state()
    pstate = pstate.replace(sampler=pstate.sampler.replace(rejected=jnp.int32(MAX_INT32 - 1)))
    pstate = buffer.set_priorities(pstate, jnp.arange(8), jnp.full(8, -1.0))
    assert int(pstate.sampler.rejected) == MAX_INT32

    rollout = jaxbuf.make_rollout_buffer(1, 1, discount=0.9, gae_lambda=0.9)
    step = {k: jnp.zeros(1) for k in ("reward", "value", "final_value")}
    step |= {"terminated": jnp.zeros(1, bool), "truncated": jnp.zeros(1, bool)}
    rstate = rollout.add(rollout.init(jax.tree.map(lambda x: x[0], step)), step)
    rstate = rollout.add(rstate.replace(dropped=jnp.int32(MAX_INT32)), step)
    assert int(rstate.dropped) == MAX_INT32


def empty_steps(kind):
    if kind == "transition":
        obs = jnp.zeros((2, 0, 3))
        return jaxbuf.Transition(obs, jnp.zeros((2, 0), jnp.int32), jnp.zeros((2, 0)),
                                 jnp.zeros((2, 0), bool), jnp.zeros((2, 0), bool), obs)  # fmt: skip
    return {"obs": jnp.zeros((2, 0, 3)), "done": jnp.zeros((2, 0), bool)}


@pytest.mark.parametrize("kind", ["trajectory", "transition", "episode"])
def test_adding_no_steps_is_a_clear_error(kind):
    if kind == "trajectory":
        buffer = jaxbuf.make_trajectory_buffer(2, 8, 2, 2)
    elif kind == "transition":
        buffer = jaxbuf.make_transition_buffer(2, 8, 2)
    else:
        buffer = jaxbuf.make_episode_buffer(2, 8, 2, 4, done_fn=lambda s: s["done"])
    state = buffer.init(jax.tree.map(lambda x: jnp.zeros(x.shape[2:], x.dtype), empty_steps(kind)))
    with pytest.raises(ValueError, match=re.escape("steps holds no steps (T=0)")):
        buffer.add(state, empty_steps(kind))


@pytest.mark.parametrize(
    "name, text", [("bad.yaml", "kind: [replay\n"), ("bad.json", "{kind"), ("bad.toml", "kind = ")]
)
def test_configuration_files_that_do_not_parse_raise_value_error(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name} is not valid")):
        jaxbuf.io.buffer_from_config(tmp_path / name)


def test_coefficients_are_checked_alike_for_python_and_numpy_numbers():
    rewards = jnp.ones((3, 2))
    done = jnp.zeros((3, 2), bool)
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\], got 1.5"):
        jaxbuf.gae(rewards, rewards, rewards, done, done, discount=np.float32(1.5), gae_lambda=0.9)
    with pytest.raises(ValueError, match=r"gae_lambda must be in \[0, 1\], got 2.0"):
        jaxbuf.gae(rewards, rewards, rewards, done, done, discount=0.9,
                   gae_lambda=np.array([0.5, 2.0]))  # fmt: skip
    buffer = jaxbuf.make_rollout_buffer(4, 2, discount=np.float32(0.9), gae_lambda=0.95)
    assert buffer.config.discount == pytest.approx(0.9)
    jaxbuf.make_transition_buffer(2, 8, 2, discount=np.float64(0.5))
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\], got nan"):
        jaxbuf.make_transition_buffer(2, 8, 2, discount=float("nan"))


def test_export_and_dataset_columns_never_collide_and_every_dtype_round_trips(tmp_path):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    example = {"time": jnp.float32(0), "a": {"b": jnp.int32(0)}, "a/b": jnp.int32(0),
               "bf": jnp.bfloat16(0), "p%2F": jnp.float32(0)}  # fmt: skip
    state = buffer.init(example)
    assert (tmp_path / "empty.csv").exists() is False
    header = jaxbuf.io.export(tmp_path / "empty.csv", state).read_text().strip().split(",")
    assert header == ["a/b", "a%2Fb", "bf", "p%252F", "%74ime"]
    items = {"time": jnp.arange(3.0), "a": {"b": jnp.arange(3, dtype=jnp.int32)},
             "a/b": -jnp.arange(3, dtype=jnp.int32), "bf": jnp.full(3, 1.5, jnp.bfloat16),
             "p%2F": jnp.ones(3)}  # fmt: skip
    state = buffer.add(state, items)
    columns = jaxbuf.io.read_export(jaxbuf.io.export(tmp_path / "items.npz", state))
    assert columns["bf"].dtype == jnp.bfloat16 and columns["bf"].tolist() == [1.5] * 3
    assert columns["a/b"].tolist() == [0, 1, 2] and columns["a%2Fb"].tolist() == [0, -1, -2]
    assert columns["%74ime"].tolist() == [0, 1, 2] and columns["p%252F"].tolist() == [1] * 3
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    writer.append(state)
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    assert data["a"]["b"].tolist() == [0, 1, 2] and data["a/b"].tolist() == [0, -1, -2]
    assert data["p%2F"].tolist() == [1] * 3 and data["bf"].dtype == jnp.bfloat16
    restored = jaxbuf.io.dataset_to_state(tmp_path / "data", buffer)
    assert jax.tree.structure(restored.experience) == jax.tree.structure(state.experience)
    np.testing.assert_array_equal(restored.experience["time"], state.experience["time"])


def test_rollout_columns_keep_a_leaf_named_like_a_computed_column():
    buffer = jaxbuf.make_rollout_buffer(2, 1, discount=0.9, gae_lambda=0.9)
    step = {k: jnp.ones(1) for k in ("reward", "value", "final_value", "advantage")}
    step |= {"terminated": jnp.zeros(1, bool), "truncated": jnp.zeros(1, bool)}
    state = buffer.add(buffer.init(jax.tree.map(lambda x: x[0], step)), step)
    state = buffer.finish(state, jnp.zeros(1))
    columns = jaxbuf.io.stored_items(state)
    assert columns["%61dvantage"].tolist() == [1.0]
    assert columns["advantage"].tolist() == np.asarray(state.advantages[:1, 0]).tolist()


class _Twice:
    """A pytree node whose two children carry keys that print alike."""

    def __init__(self, a, b):
        self.a, self.b = a, b


jax.tree_util.register_pytree_with_keys(
    _Twice,
    lambda t: (((jax.tree_util.DictKey(1), t.a), (jax.tree_util.DictKey("1"), t.b)), None),
    lambda _, children: _Twice(*children),
)


def test_two_leaves_that_would_share_a_column_raise():
    with pytest.raises(ValueError, match="both become the column '1'"):
        jaxbuf.io.stored_items(jaxbuf.core.storage.RingState(
            experience=_Twice(jnp.zeros(2), jnp.zeros(2)), position=jnp.int32(0),
            size=jnp.int32(2), added=jnp.uint32(2)))  # fmt: skip


@pytest.mark.parametrize(
    "config, message",
    [
        ({"kind": ["replay"], "capacity": 8, "sample_batch_size": 2},
         "config['kind'] must be one of"),
        ({"kind": "replay", 1: 2, "capacity": 8, "sample_batch_size": 2},
         "unknown key(s) [1] in the 'replay' configuration"),
        ({"kind": "replay", "capacity": 8, "sample_batch_size": 2, "sampler": {"kind": ["x"]}},
         "config['sampler']['kind'] must be one of"),
    ],
)  # fmt: skip
def test_odd_configuration_keys_and_kinds_are_named(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        jaxbuf.io.buffer_from_config(config)


def test_label_named_keys_are_escaped_at_every_depth(tmp_path):
    """A nested key named like a label column (`{"time": {"x": ...}}`) keeps its own column
    beside the per-environment `time` label, and comes back under its own key."""
    buffer = jaxbuf.make_trajectory_buffer(2, 4, 2, 2)
    example = {"time": {"x": jnp.int32(0)}, "env": jnp.float32(0)}
    steps = {"time": {"x": jnp.arange(6, dtype=jnp.int32).reshape(2, 3) + 10},
             "env": -jnp.ones((2, 3))}  # fmt: skip
    state = buffer.add(buffer.init(example), steps)
    columns = jaxbuf.io.read_export(jaxbuf.io.export(tmp_path / "steps.npz", state))
    assert sorted(columns) == ["%65nv", "%74ime/x", "env", "time"]
    assert columns["time"].tolist() == [0, 1, 2] * 2
    assert columns["env"].tolist() == [0] * 3 + [1] * 3
    assert columns["%74ime/x"].tolist() == [10, 11, 12, 13, 14, 15]
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    writer.append(state)
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")  # user keys named like labels stay escaped
    assert sorted(data) == ["%65nv", "%74ime", "env", "time"]
    assert sorted(data["%74ime"]["x"].tolist()) == list(range(10, 16))
    assert sorted(data["time"].tolist()) == [0, 0, 1, 1, 2, 2]
