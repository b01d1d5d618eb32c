"""On-disk datasets: incremental appends across wrap-arounds, ranges, loading back."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

EXAMPLE = {"obs": jnp.zeros(2), "meta": {"id": jnp.int32(0), "done": jnp.bool_(False)}}


def items(start, count):
    ids = jnp.arange(start, start + count, dtype=jnp.int32)
    return {
        "obs": jnp.stack([ids, 2 * ids], -1).astype(jnp.float32),
        "meta": {"id": ids, "done": ids % 3 == 0},
    }


def test_appends_record_every_added_item_in_order_across_wrap_arounds(tmp_path):
    capacity = 7
    buffer = jaxbuf.make_replay_buffer(capacity, 2, truncate_ok=True)
    add = jax.jit(buffer.add, donate_argnums=0)
    state = buffer.init(EXAMPLE)
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, chunk_items=4)
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(30):
        # Between appends add up to `capacity` items: 1..7 per add, sometimes two adds.
        for batch in rng.integers(1, capacity + 1, size=rng.integers(1, 3)).tolist():
            if total - writer.length + batch > capacity:
                break
            state = add(state, items(total, batch))
            total += batch
        assert writer.append(state) >= 0
    state = add(
        state, items(total, capacity)
    )  # exactly `capacity` new items: the buffer is all new
    total += capacity
    assert writer.append(state) == capacity
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    assert data["meta"]["id"].tolist() == list(range(total))
    chex.assert_trees_all_equal(data, jax.device_get(items(0, total)))


def test_items_overwritten_before_an_append_are_an_error(tmp_path):
    buffer = jaxbuf.make_replay_buffer(4, 2)
    state = buffer.init(EXAMPLE)
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state)
    state = buffer.add(buffer.add(state, items(0, 3)), items(3, 3))
    message = (
        "6 items were added since the last append, but the buffer keeps only 4: 2 were overwritten"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        writer.append(state)
    assert writer.length == 0


def test_range_reads_touch_only_their_chunks(tmp_path):
    buffer = jaxbuf.make_replay_buffer(64, 2)
    state = buffer.add(buffer.init(EXAMPLE), items(0, 40))
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True, chunk_items=8)
    assert writer.append(state) == 40
    writer.flush()
    for chunk in (tmp_path / "data").rglob("*"):  # spoil every chunk outside items [8, 16)
        if chunk.is_file() and chunk.name[0].isdigit() and not chunk.name.startswith("1"):
            chunk.write_bytes(b"not a chunk")
    data = jaxbuf.io.read_dataset(tmp_path / "data", 8, 16)
    assert data["meta"]["id"].tolist() == list(range(8, 16))
    with pytest.raises(Exception):  # the spoiled chunks are really unreadable
        jaxbuf.io.read_dataset(tmp_path / "data", 0, 8)


def test_only_flushed_items_are_visible_to_readers(tmp_path):
    buffer = jaxbuf.make_replay_buffer(16, 2)
    state = buffer.init(EXAMPLE)
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state)
    state = buffer.add(state, items(0, 5))
    writer.append(state)
    writer.flush()
    state = buffer.add(state, items(5, 5))
    writer.append(state)
    assert jaxbuf.io.read_dataset(tmp_path / "data")["meta"]["id"].tolist() == list(range(5))
    writer.flush()
    assert jaxbuf.io.read_dataset(tmp_path / "data")["meta"]["id"].tolist() == list(range(10))


def test_a_dataset_loads_back_into_a_buffer_state(tmp_path):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    state = buffer.init(EXAMPLE)
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state)
    for start in range(0, 20, 5):
        state = buffer.add(state, items(start, 5))
        writer.append(state)
    writer.flush()
    target = jaxbuf.make_replay_buffer(16, 4)
    loaded = jaxbuf.io.dataset_to_state(tmp_path / "data", target, 3, 13)
    expected = target.add(target.init(EXAMPLE), items(3, 10))
    chex.assert_trees_all_equal(loaded, expected)
    with pytest.raises(
        ValueError, match=re.escape("the dataset range holds 20 items but the capacity is 16")
    ):
        jaxbuf.io.dataset_to_state(tmp_path / "data", target)
    newest = jaxbuf.io.dataset_to_state(tmp_path / "data", target, truncate_ok=True)
    assert sorted(np.asarray(newest.experience["meta"]["id"]).tolist()) == list(range(4, 20))


def test_dataset_errors_are_named(tmp_path):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    stacked = jaxbuf.vectorize(buffer, 2).init(EXAMPLE)
    with pytest.raises(
        TypeError, match=re.escape("follows the state of one sampled buffer (replay, trajectory")
    ):
        jaxbuf.io.DatasetWriter(tmp_path / "v", stacked)
    tuple_items = buffer.init((jnp.zeros(2), jnp.int32(0)))
    with pytest.raises(
        TypeError,
        match=re.escape("state.experience[0]: datasets store items that are (nested) dicts"),
    ):
        jaxbuf.io.DatasetWriter(tmp_path / "t", tuple_items)
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", buffer.init(EXAMPLE))
    writer.flush()
    with pytest.raises(ValueError, match=re.escape("the range [0, 3) is not within the 0 items")):
        jaxbuf.io.read_dataset(tmp_path / "data", 0, 3)
    with pytest.raises(FileNotFoundError, match="holds no jaxbuf dataset"):
        jaxbuf.io.read_dataset(tmp_path / "nothing")
    for other in (jaxbuf.vectorize(buffer, 2), jaxbuf.make_trajectory_buffer(2, 8, 2, 2)):
        with pytest.raises(TypeError, match=re.escape("dataset_to_state fills a replay buffer")):
            jaxbuf.io.dataset_to_state(tmp_path / "data", other)


def test_include_stored_on_a_wrapped_buffer_writes_the_stored_items_oldest_first(tmp_path):
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.add(buffer.init(EXAMPLE), items(0, 4)), items(4, 4))  # ids 3..7
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    assert writer.append(state) == 5
    state = buffer.add(state, items(8, 2))
    assert writer.append(state) == 2
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    assert data["meta"]["id"].tolist() == list(range(3, 10))
    chex.assert_trees_all_equal(data, jax.device_get(items(3, 7)))


class _FailedWrite:
    """A pending tensorstore write whose commit failed (a full disk, say)."""

    class commit:
        @staticmethod
        def result():
            raise OSError("no space left on device")


def test_a_failed_pending_write_makes_flush_raise_and_keeps_the_old_length(tmp_path):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    state = buffer.add(buffer.init(EXAMPLE), items(0, 3))
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    writer.append(state)
    writer.flush()
    state = buffer.add(state, items(3, 2))
    writer.append(state)
    writer._pending.insert(0, (_FailedWrite(), None))
    with pytest.raises(OSError, match="no space left"):
        writer.flush()
    assert jaxbuf.io.read_dataset(tmp_path / "data")["meta"]["id"].tolist() == [0, 1, 2]


def test_per_environment_kinds_write_env_time_final_observations_and_priority_leaves(tmp_path):
    num_envs, capacity = 2, 6
    buffer = jaxbuf.make_transition_buffer(
        num_envs, capacity, 4, n_step=1, sampler=jaxbuf.prioritized(priority_exponent=1.0)
    )
    ids = np.arange(20).reshape(num_envs, 10)

    def steps(lo, hi):
        chunk = ids[:, lo:hi]
        return jaxbuf.Transition(
            obs=chunk.astype(np.float32), action=chunk.astype(np.int32),
            reward=np.ones(chunk.shape, np.float32), terminated=chunk % 4 == 3,
            truncated=np.zeros(chunk.shape, bool), next_obs=-chunk.astype(np.float32),
        )  # fmt: skip

    state = buffer.init(jax.tree.map(lambda x: x[0, 0], steps(0, 1)))
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state)
    for lo, hi in ((0, 4), (4, 9), (9, 10)):  # wraps the 6-step rings
        state = buffer.add(state, steps(lo, hi))
        assert writer.append(state) == hi - lo
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    assert data["time"].tolist() == np.repeat(np.arange(10), num_envs).tolist()
    assert data["env"].tolist() == [0, 1] * 10
    np.testing.assert_array_equal(data["obs"], ids.T.ravel())  # time-major
    ended = data["terminated"]
    np.testing.assert_array_equal(data["final_obs"][ended], -data["obs"][ended])
    # a step whose successor was not stored yet at its append could not be drawn
    assert set(np.unique(data["priority_leaf"]).tolist()) <= {0.0, 1.0}
    assert data["priority_leaf"][:6].tolist() == [1.0] * 6  # steps 0..2 had successors


def test_item_leaves_named_like_dataset_columns_are_escaped_not_lost(tmp_path):
    buffer = jaxbuf.make_trajectory_buffer(2, 4, 2, 1)
    state = buffer.init({"env": jnp.int32(0), "a/b": jnp.int32(0)})
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state)
    steps = {"env": jnp.full((2, 3), 7, jnp.int32), "a/b": jnp.full((2, 3), 5, jnp.int32)}
    writer.append(buffer.add(state, steps))
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    assert data["env"].tolist() == [0, 1] * 3  # the label column
    assert data["%65nv"].tolist() == [7] * 6 and data["a/b"].tolist() == [5] * 6
