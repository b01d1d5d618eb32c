"""The composition matrix: every sampled kind × every sampler × every tool.

Each case fills a buffer with random adds that wrap around several times (jitted,
donated), checks what it stores against a plain NumPy history, and then puts the
state through every tool: `take`, `take_all`, `stored_items`, `export`,
`vectorize`, `mix`, `shard`, `save`/`restore`, flax serialization, Orbax and
`buffer_from_config`, and `jax.vmap` of the buffer's functions.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import serialization

import jaxbuf
from jaxbuf.core.time_ring import DoneKey

NUM_ENVS, CAPACITY = 2, 12


def steps(ids):
    """Steps with distinct ids, leaves `[*ids.shape, ...]`; an episode ends every 5th."""
    ids = np.asarray(ids, np.int32)
    return {"id": ids, "obs": np.stack([ids, -ids], -1).astype(np.float32),
            "done": ids % 5 == 4}  # fmt: skip


def transitions(ids):
    ids = np.asarray(ids, np.int32)
    step = steps(ids)
    return jaxbuf.Transition(
        obs=step["obs"], action=ids, reward=ids.astype(np.float32), terminated=step["done"],
        truncated=ids % 7 == 6, next_obs=-step["obs"],
    )  # fmt: skip


KINDS = {
    "replay": lambda s: jaxbuf.make_replay_buffer(CAPACITY, 8, sampler=s),
    "trajectory": lambda s: jaxbuf.make_trajectory_buffer(
        NUM_ENVS, CAPACITY, 8, 3, done_fn=DoneKey("done"), sampler=s
    ),
    "transition": lambda s: jaxbuf.make_transition_buffer(
        NUM_ENVS, CAPACITY, 8, n_step=2, discount=0.9, min_episode_length=1, sampler=s
    ),  # every final observation kept: episodes here are 5 steps
    "episode": lambda s: jaxbuf.make_episode_buffer(
        NUM_ENVS, CAPACITY, 8, 6, done_fn=DoneKey("done"), sampler=s
    ),
}
SAMPLERS = {"uniform": jaxbuf.uniform, "prioritized": jaxbuf.prioritized}
CASES = [(k, s) for k in KINDS for s in SAMPLERS]


def chunk(kind, start, length):
    """`length` new items (replay) or steps per environment, ids from `start`."""
    if kind == "replay":
        return steps(np.arange(start, start + length))
    ids = start + np.arange(NUM_ENVS * length).reshape(NUM_ENVS, length)
    return transitions(ids) if kind == "transition" else steps(ids)


def example(kind):
    return jax.tree.map(lambda x: x[(0,) * (1 if kind == "replay" else 2)], chunk(kind, 0, 1))


def fill(kind, buffer, seed=0, calls=9):
    """A state after random adds (several wraps) and the ids added, per row or env."""
    rng = np.random.default_rng(seed)
    add = jax.jit(buffer.add, donate_argnums=0)
    state, total, history = buffer.init(example(kind)), 1000 * seed, []
    for _ in range(calls):
        length = int(rng.choice([1, 5, 7]))
        data = chunk(kind, total, length)
        state = add(state, data)
        history.append(np.asarray(data.obs if kind == "transition" else data["obs"])[..., 0])
        total += NUM_ENVS * length if kind != "replay" else length
    return state, np.concatenate(history, axis=-1 if kind != "replay" else 0)


def expected_stored(kind, history):
    """The ids each kind stores: a replay ring's rows in storage order; otherwise the
    newest `CAPACITY` steps of each environment, oldest first."""
    if kind != "replay":
        return history[:, -CAPACITY:].ravel()
    rows, size = np.zeros(CAPACITY), min(len(history), CAPACITY)
    for i, value in enumerate(history):
        rows[i % CAPACITY] = value
    return rows[:size]


@pytest.fixture(params=CASES, ids=[f"{k}-{s}" for k, s in CASES], scope="module")
def case(request):
    kind, sampler = request.param
    buffer = KINDS[kind](SAMPLERS[sampler]())
    state, history = fill(kind, buffer)
    return kind, buffer, state, history


def test_stored_items_take_all_and_export_match_the_history(case, tmp_path):
    kind, _, state, history = case
    stored = jaxbuf.io.stored_items(state)
    obs = stored["obs"]
    np.testing.assert_array_equal(obs[:, 0], expected_stored(kind, history))
    everything = jaxbuf.io.take_all(state)
    np.testing.assert_array_equal(everything["obs"][:, 0], obs[:, 0])
    with np.load(jaxbuf.io.export(tmp_path / "items.npz", state)) as data:
        chex.assert_trees_all_equal({k: data[k] for k in data.files}, stored)


def test_samples_are_valid_stored_items_and_take_gives_them_back(case):
    kind, buffer, state, history = case
    batch = jax.jit(buffer.sample)(state, jax.random.key(1))
    assert bool(buffer.can_sample(state)) and bool(batch.valid.all())
    chex.assert_trees_all_equal(jax.jit(buffer.take)(state, batch.indices), batch.experience)
    first = batch.experience.obs if kind == "transition" else batch.experience["obs"]
    first = first[..., 0] if kind in ("replay", "transition") else first[:, 0, 0]
    assert set(np.asarray(first).tolist()) <= set(expected_stored(kind, history).tolist())
    if buffer.set_priorities is not None:
        assert batch.weights is not None and float(batch.weights.max()) <= 1.0
        raised = jax.jit(buffer.set_priorities)(state, batch.indices, jnp.full(8, 5.0))
        assert int(raised.sampler.rejected) == 0


def test_vmap_of_the_functions_equals_a_loop(case):
    kind, buffer, _, _ = case
    states = [fill(kind, buffer, seed)[0] for seed in (1, 2)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
    keys = jax.random.split(jax.random.key(3), 2)
    batches = jax.device_get(jax.jit(jax.vmap(buffer.sample))(stacked, keys))
    sample = jax.jit(buffer.sample)
    for i, state in enumerate(states):
        chex.assert_trees_all_equal(
            jax.tree.map(lambda x, i=i: x[i], batches), sample(state, keys[i])
        )


def test_vectorize_equals_independent_buffers(case):
    kind, buffer, _, _ = case
    vectorized = jaxbuf.vectorize(buffer, 2)
    rng = np.random.default_rng(4)
    state = vectorized.init(example(kind))
    singles = [buffer.init(example(kind)) for _ in range(2)]
    add, add_each = jax.jit(vectorized.add), jax.jit(buffer.add)
    for call in range(6):
        length = int(rng.choice([1, 5]))
        parts = [chunk(kind, 1000 * b + 50 * call, length) for b in range(2)]
        state = add(state, jax.tree.map(lambda *x: np.stack(x), *parts))
        singles = [add_each(s, p) for s, p in zip(singles, parts, strict=True)]
    stacked = jax.device_get(state.replace(sampler=None))
    for b, single in enumerate(singles):
        mine = jax.tree.map(lambda x, b=b: x[b], stacked)
        chex.assert_trees_all_equal(mine, single.replace(sampler=None))
    batch = jax.jit(vectorized.sample)(state, jax.random.key(5))
    assert bool(batch.valid.all()) and set(np.asarray(batch.source).tolist()) <= {0, 1}
    chex.assert_trees_all_equal(jax.jit(vectorized.take)(state, batch.indices), batch.experience)
    stored = jaxbuf.io.stored_items(state)
    assert len(stored["buffer"]) == sum(len(jaxbuf.io.stored_items(s)["obs"]) for s in singles)


def test_mix_of_two_buffers_keeps_each_items_source(case):
    kind, buffer, state, _ = case
    other = fill(kind, buffer, seed=6)[0]
    sample = jax.jit(jaxbuf.mix([buffer, buffer], [0.25, 0.75], 8))
    batch = jax.device_get(sample([state, other], jax.random.key(7)))
    assert batch.source.tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    take = jax.jit(buffer.take)
    for source, part in ((0, state), (1, other)):
        rows = np.flatnonzero(batch.source == source)
        got = jax.tree.map(lambda x, rows=rows: x[rows], batch.experience)
        chex.assert_trees_all_equal(take(part, batch.indices[rows]), got)


def test_checkpoints_serialization_and_orbax_restore_exactly(case, tmp_path):
    kind, buffer, state, _ = case
    template = buffer.init(example(kind))
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "ckpt", state, buffer), template)
    chex.assert_trees_all_equal(restored, state)
    assert jaxbuf.io.load_metadata(tmp_path / "ckpt")["config"]["sampler"]["kind"] in SAMPLERS
    chex.assert_trees_all_equal(
        serialization.from_bytes(template, serialization.to_bytes(state)), state
    )
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "orbax", state)
    checkpointer.wait_until_finished()
    chex.assert_trees_all_equal(checkpointer.restore(tmp_path / "orbax", template), state)


def test_buffer_from_config_rebuilds_the_same_buffer(case):
    _, buffer, state, _ = case
    rebuilt = jaxbuf.io.buffer_from_config(buffer.config.to_dict())
    assert rebuilt.config == buffer.config
    key = jax.random.key(8)
    chex.assert_trees_all_equal(jax.jit(rebuilt.sample)(state, key),
                                jax.jit(buffer.sample)(state, key))  # fmt: skip


def test_shard_over_a_one_device_mesh_equals_the_buffer(case):
    kind, buffer, _, _ = case
    mesh = jax.make_mesh((1,), ("data",))
    sharded = jaxbuf.shard(buffer, mesh)
    sstate = sharded.init(example(kind))
    data = chunk(kind, 0, 5)
    sstate = jax.jit(sharded.add)(sstate, data)
    single = jax.jit(buffer.add)(buffer.init(example(kind)), data)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[0], jax.device_get(sstate)), single)
    key = jax.random.key(9)
    chex.assert_trees_all_equal(
        jax.jit(sharded.sample)(sstate, key),
        jax.jit(buffer.sample)(single, jax.random.fold_in(key, 0)),
    )


def test_a_dataset_of_the_stored_items_holds_them_oldest_first(case, tmp_path):
    kind, _, state, history = case
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    writer.append(state)
    writer.flush()
    data = jaxbuf.io.read_dataset(tmp_path / "data")
    if kind == "replay":
        expected = history[-min(len(history), CAPACITY) :]  # oldest first
        np.testing.assert_array_equal(data["obs"][:, 0], expected)
    else:
        stored = history[:, -CAPACITY:]
        np.testing.assert_array_equal(data["obs"][:, 0], stored.T.ravel())  # time-major
        assert data["env"].tolist() == list(range(NUM_ENVS)) * stored.shape[1]
    assert ("priority_leaf" in data) == (state.sampler is not None and kind != "episode")
