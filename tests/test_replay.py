"""The uniform replay buffer against the NumPy reference ring, and its contract."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import RingBuffer, add_size
from scipy import stats

import jaxbuf

EXAMPLE = {"obs": np.zeros(3, np.float32), "action": np.int32(0), "done": np.bool_(False)}


def random_items(rng: np.random.Generator, batch: int, start: int) -> dict:
    """Items whose `action` numbers them from `start`, so every item is traceable."""
    return {
        "obs": rng.normal(size=(batch, 3)).astype(np.float32),
        "action": np.arange(start, start + batch, dtype=np.int32),
        "done": rng.random(batch) < 0.1,
    }


def assert_matches(state: jaxbuf.types.RingState, ref: RingBuffer) -> None:
    chex.assert_trees_all_equal(jax.device_get(state.experience), ref.storage)
    assert int(state.position) == ref.position
    assert int(state.size) == ref.size


@pytest.mark.parametrize(
    "capacity, batches",
    [
        (1, [1, 1, 1]),  # single-item buffer
        (7, [3, 3, 3, 3, 3, 1, 7, 2]),  # B does not divide capacity; B == capacity
        (10, [10, 10, 4, 10]),
        (13, "random"),  # many wrap-arounds with random batch sizes
    ],
)
def test_add_matches_reference_ring(capacity, batches, variant):
    rng = np.random.default_rng(capacity)
    if batches == "random":
        batches = [add_size(rng, capacity) for _ in range(40)]
    buffer = jaxbuf.make_replay_buffer(capacity, 4)
    add = variant(buffer.add)
    state, ref = buffer.init(EXAMPLE), RingBuffer(capacity, EXAMPLE)
    count = 0
    for batch in batches:
        items = random_items(rng, batch, count)
        count += batch
        state = add(state, items)
        ref.add(items)
        assert_matches(state, ref)


def test_the_added_counter_wraps_around_instead_of_overflowing():
    buffer = jaxbuf.make_replay_buffer(4, 2, truncate_ok=True)
    rng = np.random.default_rng(0)
    state = buffer.init(EXAMPLE).replace(added=jnp.uint32(2**32 - 3))
    before = int(state.added)
    state = jax.jit(buffer.add)(state, random_items(rng, 7, 0))
    assert int(state.added) == 4 and (int(state.added) - before) % 2**32 == 7
    assert state.added.dtype == jnp.uint32


def test_add_of_more_than_capacity_keeps_the_newest_when_allowed():
    rng = np.random.default_rng(0)
    buffer = jaxbuf.make_replay_buffer(5, 2, truncate_ok=True)
    state, ref = buffer.init(EXAMPLE), RingBuffer(5, EXAMPLE)
    for batch, start in [(3, 0), (12, 3), (5, 15), (6, 20)]:
        items = random_items(rng, batch, start)
        state = jax.jit(buffer.add)(state, items)
        ref.add(items)
        assert_matches(state, ref)
    assert ref.stored()["action"].tolist() == [21, 22, 23, 24, 25]


def test_state_is_a_flax_dataclass_of_explicitly_typed_arrays():
    state = jaxbuf.make_replay_buffer(4, 2).init(
        {"x": 0.0, "i": np.int32(1), "s": jax.ShapeDtypeStruct((2,), jnp.uint8)}
    )
    for counter in (state.position, state.size):
        assert counter.shape == () and counter.dtype == jnp.int32 and not counter.weak_type
    assert state.added.dtype == jnp.uint32 and not state.added.weak_type
    assert state.experience["x"].dtype == jnp.float32 and not state.experience["x"].weak_type
    assert state.experience["s"].shape == (4, 2) and state.experience["s"].dtype == jnp.uint8
    assert state.experience["i"].shape == (4,) and int(state.experience["i"].sum()) == 0
    restored = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(state), jax.tree_util.tree_leaves(state)
    )
    assert isinstance(restored, jaxbuf.types.RingState)


def filled(capacity=20, total=33, **options):
    buffer = jaxbuf.make_replay_buffer(capacity, **options)
    rng = np.random.default_rng(1)
    state = buffer.init(EXAMPLE)
    state = (
        buffer.add(state, random_items(rng, total % capacity or capacity, 0)) if total else state
    )
    for start in range(total % capacity or capacity, total, capacity):
        state = buffer.add(state, random_items(rng, capacity, start))
    return buffer, state


def test_sample_returns_stored_rows_and_flags_validity(variant):
    buffer, state = filled(capacity=20, total=33, sample_batch_size=64, min_size=10)
    sample = variant(buffer.sample)
    batch = sample(state, jax.random.key(0))
    chex.assert_shape(batch.experience["obs"], (64, 3))
    chex.assert_trees_all_equal(
        batch.experience, jax.tree.map(lambda x: x[batch.indices], state.experience)
    )
    assert batch.indices.dtype == jnp.int32 and bool(batch.valid.all())
    assert int(batch.indices.min()) >= 0 and int(batch.indices.max()) < 20


def test_sample_below_min_size_is_real_data_flagged_invalid():
    buffer, state = filled(capacity=20, total=5, sample_batch_size=64, min_size=10)
    batch = jax.jit(buffer.sample)(state, jax.random.key(0))
    assert not bool(buffer.can_sample(state)) and not bool(batch.valid.any())
    assert set(np.asarray(batch.indices).tolist()) <= set(range(5))
    chex.assert_trees_all_equal(
        batch.experience, jax.tree.map(lambda x: x[batch.indices], state.experience)
    )


@pytest.mark.parametrize("replacement", [True, False])
def test_sample_from_an_empty_buffer_is_zeros_flagged_invalid(replacement):
    buffer = jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.uniform(replacement=replacement))
    batch = jax.jit(buffer.sample)(buffer.init(EXAMPLE), jax.random.key(0))
    assert not bool(batch.valid.any()) and np.all(np.asarray(batch.indices) == 0)
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(batch.experience))


def test_can_sample_follows_min_size():
    buffer = jaxbuf.make_replay_buffer(10, 2, min_size=3)
    state = buffer.init(EXAMPLE)
    seen = []
    for start in range(5):
        seen.append(bool(jax.jit(buffer.can_sample)(state)))
        state = buffer.add(state, random_items(np.random.default_rng(start), 1, start))
    assert seen == [False, False, False, True, True]


def draw_counts(buffer, state, num_batches: int, num_rows: int) -> np.ndarray:
    keys = jax.random.split(jax.random.key(42), num_batches)
    indices = jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0)))(state, keys).indices
    return np.bincount(np.asarray(indices).ravel(), minlength=num_rows)


@pytest.mark.parametrize("total", [13, 57])  # partly filled; wrapped around
def test_sampling_with_replacement_is_uniform(total):
    buffer, state = filled(capacity=20, total=total, sample_batch_size=32)
    stored = min(total, 20)
    counts = draw_counts(buffer, state, 500, 20)
    assert counts[stored:].sum() == 0
    assert stats.chisquare(counts[:stored]).pvalue > 1e-3


def test_sampling_without_replacement_is_distinct_and_uniform(platform_path):
    buffer, state = filled(
        capacity=40, total=70, sample_batch_size=16, sampler=jaxbuf.uniform(replacement=False)
    )
    keys = jax.random.split(jax.random.key(7), 800)
    indices = np.asarray(jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0)))(state, keys).indices)
    assert all(len(set(row)) == 16 for row in indices.tolist())
    assert stats.chisquare(np.bincount(indices.ravel(), minlength=40)).pvalue > 1e-3
    # Each position of the batch is uniform too (the order is random).
    assert stats.chisquare(np.bincount(indices[:, -1], minlength=40)).pvalue > 1e-3


def test_sampling_without_replacement_takes_everything_when_size_equals_batch():
    buffer, state = filled(
        capacity=16, total=16, sample_batch_size=16, sampler=jaxbuf.uniform(replacement=False)
    )
    batch = buffer.sample(state, jax.random.key(3))
    assert sorted(np.asarray(batch.indices).tolist()) == list(range(16))


def test_sampling_without_replacement_below_batch_size_repeats_evenly(platform_path):
    buffer, state = filled(
        capacity=30, total=7, sample_batch_size=30, sampler=jaxbuf.uniform(replacement=False)
    )
    counts = np.bincount(np.asarray(buffer.sample(state, jax.random.key(3)).indices))
    assert set(counts.tolist()) <= {30 // 7, 30 // 7 + 1} and counts.sum() == 30


def member(tree, index: int):
    """The `index`-th member of a pytree stacked along its leading axis."""
    return jax.tree.map(lambda x: x[index], tree)


def test_vmap_over_buffers_equals_a_python_loop():
    buffer = jaxbuf.make_replay_buffer(6, 5)
    rng = np.random.default_rng(3)
    items = [[random_items(rng, 4, 100 * b + 4 * t) for t in range(3)] for b in range(3)]
    states = jax.vmap(buffer.init, axis_size=3, in_axes=None)(EXAMPLE)
    add, sample = jax.jit(jax.vmap(buffer.add)), jax.jit(jax.vmap(buffer.sample))
    for t in range(3):
        states = add(states, jax.tree.map(lambda *x: np.stack(x), *[row[t] for row in items]))
    keys = jax.random.split(jax.random.key(0), 3)
    batches = sample(states, keys)
    for b in range(3):
        state = buffer.init(EXAMPLE)
        for t in range(3):
            state = buffer.add(state, items[b][t])
        chex.assert_trees_all_equal(member(states, b), state)
        chex.assert_trees_all_equal(member(batches, b), buffer.sample(state, keys[b]))


def test_jitted_add_and_sample_never_retrace():
    buffer = jaxbuf.make_replay_buffer(9, 4)
    rng = np.random.default_rng(0)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def add(state, items):
        return buffer.add(state, items)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def sample(state, key):
        return buffer.sample(state, key)

    state = buffer.init(EXAMPLE)
    key = jax.random.key(0)
    for start in range(0, 60, 4):
        state = add(state, random_items(rng, 4, start))
        key, sample_key = jax.random.split(key)
        sample(state, sample_key)


def test_donated_add_aliases_the_state_and_updates_in_place():
    buffer = jaxbuf.make_replay_buffer(1000, 4)
    state = buffer.init(EXAMPLE)
    items = random_items(np.random.default_rng(0), 8, 0)
    add = jax.jit(buffer.add, donate_argnums=0)
    text = add.lower(state, items).as_text()
    num_state_leaves = len(jax.tree.leaves(state))
    assert text.count("tf.aliasing_output") == num_state_leaves
    old = jax.tree.leaves(state)
    state = add(state, items)
    assert all(leaf.is_deleted() for leaf in old)
    assert int(state.size) == 8


def test_from_data_equals_init_then_add():
    rng = np.random.default_rng(5)
    data = random_items(rng, 11, 0)
    buffer, state = jaxbuf.io.from_data(data, capacity=16, sample_batch_size=3, min_size=2)
    assert dict(buffer.config) == dict(
        kind="replay", capacity=16, sample_batch_size=3, min_size=2, truncate_ok=False,
        sampler=jaxbuf.uniform().config,
    )  # fmt: skip
    ref = RingBuffer(16, EXAMPLE)
    ref.add(data)
    assert_matches(state, ref)
    _, exact = jaxbuf.io.from_data(data, sample_batch_size=3)
    assert int(exact.size) == 11 and exact.experience["obs"].shape == (11, 3)


def test_from_data_keeps_the_newest_only_when_allowed():
    data = random_items(np.random.default_rng(5), 11, 0)
    with pytest.raises(ValueError, match=r"data holds 11 items but the capacity is 4.*truncate_ok"):
        jaxbuf.io.from_data(data, capacity=4, sample_batch_size=2)
    _, state = jaxbuf.io.from_data(data, capacity=4, sample_batch_size=2, truncate_ok=True)
    ref = RingBuffer(4, EXAMPLE)
    ref.add(data)
    assert_matches(state, ref)
    assert ref.stored()["action"].tolist() == [7, 8, 9, 10]


def test_from_data_rejects_bad_data():
    with pytest.raises(ValueError, match=r"data\['b'\] has N=3 .* but data\['a'\] has 4"):
        jaxbuf.io.from_data({"a": np.zeros(4), "b": np.zeros(3)}, sample_batch_size=1)
    with pytest.raises(ValueError, match=r"data\['a'\] has shape \(\); from_data needs"):
        jaxbuf.io.from_data({"a": np.float32(1)}, sample_batch_size=1)
