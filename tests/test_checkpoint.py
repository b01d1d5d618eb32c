"""Checkpoints: flax serialization, save/restore, atomicity, mismatches, Orbax."""

import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
import re
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import serialization, struct
from reference import prioritized_replay, prioritized_trajectory

import jaxbuf
from jaxbuf.io import checkpoint as _checkpoint
from jaxbuf.io import checkpoint_leaves as _checkpoint_leaves

EXAMPLE = {"obs": jnp.zeros(3), "action": jnp.int32(0), "done": jnp.bool_(False)}
STEP = {
    "obs": jnp.zeros(2),
    "reward": jnp.float32(0),
    "value": jnp.float32(0),
    "final_value": jnp.float32(0),
    "terminated": jnp.bool_(False),
    "truncated": jnp.bool_(False),
}


def items(batch, start=0, lead=()):
    count = int(np.prod(lead, dtype=int)) * batch
    ids = jnp.arange(start, start + count, dtype=jnp.int32).reshape(*lead, batch)
    return {
        "obs": jnp.stack([ids.astype(jnp.float32)] * 3, axis=-1),
        "action": ids,
        "done": ids % 3 == 0,
    }


@functools.cache
def states():
    """One filled state of every kind, with its buffer and a fresh template: made once per
    process (eager adds of eight buffers) and shared, as states are immutable and no test
    donates them."""
    replay = jaxbuf.make_replay_buffer(8, 4)
    state = replay.init(EXAMPLE)
    for start in range(0, 11, 3):
        state = replay.add(state, items(3, start))
    vectorized = jaxbuf.vectorize(replay, 2)
    vstate = vectorized.add(vectorized.init(EXAMPLE), items(5, 0, lead=(2,)))
    rollout = jaxbuf.make_rollout_buffer(4, 3, discount=0.9, gae_lambda=0.9)
    rstate = rollout.init(STEP)
    for t in range(4):
        rstate = rollout.add(
            rstate, jax.tree.map(lambda x, t=t: jnp.full((3, *x.shape), t, x.dtype), STEP)
        )
    rstate = rollout.finish(rstate, jnp.ones(3))
    trajectory = jaxbuf.make_trajectory_buffer(2, 6, 4, 2)
    tstate = trajectory.init(EXAMPLE)
    for start in (0, 10):  # wraps around
        tstate = trajectory.add(tstate, items(5, start, lead=(2,)))
    episodes = jaxbuf.make_episode_buffer(2, 6, 4, 3, done_fn=lambda step: step["done"])
    estate = episodes.add(episodes.init(EXAMPLE), items(5, 0, lead=(2,)))
    transitions = jaxbuf.make_transition_buffer(2, 6, 4, n_step=2)
    ids = items(5, 0, lead=(2,))
    steps = jaxbuf.Transition(
        obs=ids["obs"], action=ids["action"], reward=ids["obs"][..., 0],
        terminated=ids["done"], truncated=~ids["done"] & (ids["action"] % 4 == 0),
        next_obs=-ids["obs"],
    )  # fmt: skip
    example = jax.tree.map(lambda x: x[0, 0], steps)
    xstate = transitions.add(transitions.init(example), steps)
    prioritized = prioritized_replay(8, 4)
    pstate = prioritized.add(prioritized.init(EXAMPLE), items(5))
    pstate = prioritized.set_priorities(pstate, jnp.arange(5), jnp.arange(5.0))
    psequences = prioritized_trajectory(2, 6, 4, 2)
    qstate = psequences.add(psequences.init(EXAMPLE), items(5, 0, lead=(2,)))
    return [
        (replay, state, replay.init(EXAMPLE)),
        (vectorized, vstate, vectorized.init(EXAMPLE)),
        (rollout, rstate, rollout.init(STEP)),
        (trajectory, tstate, trajectory.init(EXAMPLE)),
        (episodes, estate, episodes.init(EXAMPLE)),
        (transitions, xstate, transitions.init(example)),
        (prioritized, pstate, prioritized.init(EXAMPLE)),
        (psequences, qstate, psequences.init(EXAMPLE)),
    ]


KINDS = [
    "replay", "vectorized", "rollout", "trajectory", "episode", "transition", "prioritized",
    "prioritized_sequences",
]  # fmt: skip
OBS_PATH = ".experience['obs']"  # one name for the storage in every kind


@struct.dataclass
class TrainState:
    params: dict
    buffer: jaxbuf.types.RingState
    step: jax.Array


@pytest.mark.parametrize("index", range(len(KINDS)), ids=KINDS)
def test_every_state_round_trips_through_flax_serialization(index):
    _, state, template = states()[index]
    restored = serialization.from_bytes(template, serialization.to_bytes(state))
    chex.assert_trees_all_equal(restored, state)
    assert type(restored) is type(state)
    from_dict = serialization.from_state_dict(template, serialization.to_state_dict(state))
    chex.assert_trees_all_equal(from_dict, state)


def test_a_state_nested_in_a_training_state_round_trips(tmp_path):
    _, state, template = states()[0]
    train = TrainState(params={"w": jnp.arange(4.0)}, buffer=state, step=jnp.int32(7))
    empty = TrainState(params={"w": jnp.zeros(4)}, buffer=template, step=jnp.int32(0))
    chex.assert_trees_all_equal(
        serialization.from_bytes(empty, serialization.to_bytes(train)), train
    )
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "nested", train), empty)
    chex.assert_trees_all_equal(restored, train)


@pytest.mark.parametrize("index", range(len(KINDS)), ids=KINDS)
def test_save_restore_is_exact_and_records_metadata(tmp_path, index):
    buffer, state, template = states()[index]
    folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
    restored = jaxbuf.restore(folder, template)
    chex.assert_trees_all_equal(restored, state)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(restored))
    metadata = jaxbuf.io.load_metadata(folder)
    assert (
        metadata["kind"] == buffer.config.kind and metadata["jaxbuf_version"] == jaxbuf.__version__
    )
    assert metadata["config"] == {
        **_checkpoint._plain(buffer.config),
        **({"num_buffers": 2} if index == 1 else {}),
    }
    size = state.size
    assert metadata["size"] == np.asarray(size).tolist()
    obs = jax.tree_util.tree_flatten_with_path(state)[0]
    obs = next(x for path, x in obs if jax.tree_util.keystr(path) == OBS_PATH)
    leaf = metadata["leaves"][OBS_PATH]
    assert {k: leaf[k] for k in ("shape", "dtype")} == {
        "shape": list(obs.shape),
        "dtype": "float32",
    }
    assert leaf["nbytes"] == obs.nbytes
    abstract = jax.eval_shape(lambda: template)  # a template that allocates nothing
    chex.assert_trees_all_equal(jaxbuf.restore(folder, abstract), state)
    if index != 2:
        key = jax.random.key(3)
        chex.assert_trees_all_equal(buffer.sample(restored, key), buffer.sample(state, key))


def test_a_resumed_training_loop_continues_identically(tmp_path):
    buffer = jaxbuf.make_replay_buffer(50, 16)

    @functools.partial(jax.jit, static_argnums=2)
    def run(state, key, steps):
        def body(carry, k):
            state, total = carry
            add_key, sample_key = jax.random.split(k)
            new = jax.random.normal(add_key, (4, 3))
            ids = jax.random.randint(add_key, (4,), 0, 100, dtype=jnp.int32)
            state = buffer.add(state, {"obs": new, "action": ids, "done": ids > 50})
            batch = buffer.sample(state, sample_key).experience
            return (state, total + batch["obs"].sum()), None

        (state, total), _ = jax.lax.scan(
            body, (state, jnp.float32(0)), jax.random.split(key, steps)
        )
        return state, total

    first_key, second_key = jax.random.split(jax.random.key(0))
    midway, _ = run(buffer.init(EXAMPLE), first_key, 30)
    straight, straight_total = run(midway, second_key, 40)
    jaxbuf.save(tmp_path / "ckpt", midway, buffer)
    resumed, resumed_total = run(
        jaxbuf.restore(tmp_path / "ckpt", buffer.init(EXAMPLE)), second_key, 40
    )
    chex.assert_trees_all_equal(resumed, straight)
    assert float(resumed_total) == float(straight_total)


@pytest.mark.parametrize("stage", ["data", "metadata", "commit"])
def test_an_interrupted_save_leaves_the_previous_checkpoint_readable(tmp_path, monkeypatch, stage):
    buffer, state, template = states()[0]
    folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
    newer = buffer.add(state, items(5, 100))

    real_open, real_replace = open, os.replace
    target = "state-" if stage == "data" else "metadata"

    class HalfWritten:  # a file that stops halfway, as a crash would leave it
        def __init__(self, path, mode):
            self.file = real_open(path, mode)

        def write(self, data):
            self.file.write(data[: len(data) // 2])
            self.file.close()
            raise KeyboardInterrupt("interrupted")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    def crashing_open(path, mode="r", *args, **kwargs):
        if stage != "commit" and target in str(path) and "w" in mode:
            return HalfWritten(path, mode)
        return real_open(path, mode, *args, **kwargs)

    def failing_replace(source, destination):
        if stage == "commit" and str(destination).endswith("metadata.json"):
            raise KeyboardInterrupt("interrupted")
        real_replace(source, destination)

    monkeypatch.setattr("builtins.open", crashing_open)
    monkeypatch.setattr(_checkpoint.os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        jaxbuf.save(folder, newer, buffer)
    monkeypatch.undo()
    chex.assert_trees_all_equal(jaxbuf.restore(folder, template), state)
    jaxbuf.save(folder, newer, buffer)  # the next save succeeds and cleans up
    chex.assert_trees_all_equal(jaxbuf.restore(folder, template), newer)
    assert len(list(folder.glob("state-*.bin"))) == 1 and not list(folder.glob(".*.tmp"))


def test_restoring_into_another_configuration_names_the_mismatch(tmp_path):
    buffer, state, _ = states()[0]
    folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
    bigger = jaxbuf.make_replay_buffer(16, 4).init(EXAMPLE)
    message = (
        "leaf .experience['action'] was saved with shape (8,) and dtype int32, but the "
        "template has shape (16,) and dtype int32 (another configuration?)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        jaxbuf.restore(folder, bigger)
    other_dtype = jaxbuf.make_replay_buffer(8, 4).init(EXAMPLE | {"action": jnp.int8(0)})
    with pytest.raises(
        ValueError, match=re.escape("dtype int32, but the template has shape (8,) and dtype int8")
    ):
        jaxbuf.restore(folder, other_dtype)
    other_keys = jaxbuf.make_replay_buffer(8, 4).init(EXAMPLE | {"reward": jnp.float32(0)})
    with pytest.raises(
        ValueError, match=re.escape("the checkpoint lacks [\".experience['reward']\"]")
    ):
        jaxbuf.restore(folder, other_keys)
    rollout = jaxbuf.make_rollout_buffer(4, 3, discount=0.9, gae_lambda=0.9).init(STEP)
    with pytest.raises(
        ValueError, match="holds a RingState, but the template is a RolloutBufferState"
    ):
        jaxbuf.restore(folder, rollout)


def test_damaged_checkpoints_raise_clear_errors(tmp_path):
    buffer, state, template = states()[0]
    folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
    data_file = folder / jaxbuf.io.load_metadata(folder)["data_file"]
    original = data_file.read_bytes()
    data_file.write_bytes(original[:-10])
    with pytest.raises(ValueError, match="is corrupted or truncated: it ends inside a leaf"):
        jaxbuf.restore(folder, template)
    data_file.write_bytes(original + b"extra")
    with pytest.raises(ValueError, match="is corrupted or truncated: its SHA-256 does not match"):
        jaxbuf.restore(folder, template)
    data_file.write_bytes(original[:20] + bytes([original[20] ^ 1]) + original[21:])
    with pytest.raises(ValueError, match="is corrupted or truncated"):
        jaxbuf.restore(folder, template)
    data_file.unlink()
    with pytest.raises(ValueError, match=r"is incomplete: state-.*\.bin is missing"):
        jaxbuf.restore(folder, template)
    (folder / "metadata.json").write_text('{"format": "jaxbuf-checkpoint", "form')
    with pytest.raises(
        ValueError, match=re.escape("metadata.json is corrupted: it is not valid JSON")
    ):
        jaxbuf.restore(folder, template)
    (folder / "metadata.json").write_text(
        json.dumps({"format": "jaxbuf-checkpoint", "format_version": 99})
    )
    with pytest.raises(
        ValueError, match="has format version 99; this jaxbuf reads versions 1 and 2"
    ):
        jaxbuf.restore(folder, template)
    (folder / "metadata.json").write_text(json.dumps({"something": "else"}))
    with pytest.raises(ValueError, match="is not a jaxbuf checkpoint's metadata"):
        jaxbuf.restore(folder, template)
    with pytest.raises(FileNotFoundError, match="holds no jaxbuf checkpoint"):
        jaxbuf.restore(tmp_path / "nowhere", template)
    with pytest.raises(TypeError, match="buffer must be a jaxbuf buffer"):
        jaxbuf.save(tmp_path / "other", state, buffer=object())


@pytest.mark.parametrize("index", range(len(KINDS)), ids=KINDS)
def test_states_work_with_orbax_standard_checkpointing(tmp_path, index):
    _, state, template = states()[index]
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "orbax", state)
    checkpointer.wait_until_finished()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    restored = checkpointer.restore(tmp_path / "orbax", abstract)
    chex.assert_trees_all_equal(restored, state)
    assert type(restored) is type(state)
    checkpointer.close()


def format_1_folder(folder, buffer, state, data=None):
    """A folder as jaxbuf 0.1 wrote it: flax msgpack data and version-1 metadata (whose
    SHA-256 is that of the state's bytes, whatever `data` is written)."""
    host = jax.device_get(state)
    saved = serialization.to_bytes(host)
    digest = hashlib.sha256(saved).hexdigest()
    folder.mkdir()
    (folder / f"state-{digest[:16]}.msgpack").write_bytes(saved if data is None else data)
    metadata = {
        "format": "jaxbuf-checkpoint", "format_version": 1, "jaxbuf_version": "0.1.0",
        "kind": "replay", "config": _checkpoint._plain(buffer.config), "state_type": "RingState",
        "size": 8, "leaves": {name: {"shape": leaf["shape"], "dtype": leaf["dtype"]}
                              for name, leaf in _checkpoint_leaves.wanted(host).items()},
        "data_file": f"state-{digest[:16]}.msgpack", "sha256": digest,
    }  # fmt: skip
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return saved


def test_format_1_folders_still_restore(tmp_path):
    buffer, state, template = states()[0]
    format_1_folder(tmp_path / "v1", buffer, state)
    chex.assert_trees_all_equal(jaxbuf.restore(tmp_path / "v1", template, buffer), state)


def test_a_format_1_folder_whose_data_changed_is_refused(tmp_path):
    """Its data still parses (one stored value changed), but the checksum says no."""
    buffer, state, template = states()[0]
    saved = serialization.to_bytes(jax.device_get(state))
    largest = max(jax.tree.leaves(jax.device_get(state)), key=lambda x: x.nbytes)
    at = saved.index(np.asarray(largest).tobytes())  # that leaf's raw bytes in the msgpack
    changed = bytearray(saved)
    changed[at + largest.nbytes // 2] ^= 1
    format_1_folder(tmp_path / "v1", buffer, state, bytes(changed))
    assert serialization.msgpack_restore(bytes(changed)) is not None  # still valid msgpack
    with pytest.raises(ValueError, match="is corrupted or truncated: its SHA-256"):
        jaxbuf.restore(tmp_path / "v1", template, buffer)


def test_restore_with_the_buffer_names_every_differing_field(tmp_path):
    saved = jaxbuf.make_trajectory_buffer(2, 8, 4, sequence_length=4)
    state = saved.add(saved.init(EXAMPLE), items(6, 0, lead=(2,)))
    folder = jaxbuf.save(tmp_path / "ckpt", state, saved)
    other = jaxbuf.make_trajectory_buffer(2, 8, 4, sequence_length=8, period=2)
    template = other.init(EXAMPLE)
    chex.assert_trees_all_equal(jaxbuf.restore(folder, template), state)  # shapes agree
    message = (
        "holds a state of another configuration than the buffer's: min_size: saved 4, buffer 8; "
        "period: saved 1, buffer 2; sequence_length: saved 4, buffer 8."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        jaxbuf.restore(folder, template, other)
    chex.assert_trees_all_equal(jaxbuf.restore(folder, template, saved), state)
    jaxbuf.save(tmp_path / "bare", state)
    with pytest.raises(ValueError, match="was saved without its buffer"):
        jaxbuf.restore(tmp_path / "bare", template, saved)


def test_a_rollout_restores_whatever_its_gae_method(tmp_path):
    """The method solves GAE; it is not in the state. A rollout saved with 0.2's default
    (scan) restores into a buffer with today's (auto), and the other way round, while a
    field that shapes the data (normalize_advantages) still has to agree."""
    scan = jaxbuf.make_rollout_buffer(4, 3, discount=0.9, gae_lambda=0.9, method="scan")
    auto = jaxbuf.make_rollout_buffer(4, 3, discount=0.9, gae_lambda=0.9)
    state = scan.init(STEP)
    folder = jaxbuf.save(tmp_path / "rollout", state, scan)
    chex.assert_trees_all_equal(jaxbuf.restore(folder, auto.init(STEP), auto), state)
    unnormalized = jaxbuf.make_rollout_buffer(4, 3, discount=0.9, gae_lambda=0.9,
                                              normalize_advantages=False)  # fmt: skip
    with pytest.raises(ValueError, match="normalize_advantages: saved True, buffer False"):
        jaxbuf.restore(folder, auto.init(STEP), unnormalized)


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1000])
def test_leaves_stream_in_chunks_and_restore_exactly(tmp_path, monkeypatch, chunk_bytes):
    monkeypatch.setattr(_checkpoint, "CHUNK_BYTES", chunk_bytes)
    for buffer, state, template in states():
        folder = jaxbuf.save(tmp_path / buffer.config.kind, state, buffer)
        chex.assert_trees_all_equal(jaxbuf.restore(folder, template, buffer), state)


def test_metadata_without_its_fields_is_a_clear_error(tmp_path):
    buffer, state, template = states()[0]
    folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
    metadata = json.loads((folder / "metadata.json").read_text())
    for key in ("leaves", "data_file", "sha256", "state_type"):
        broken = {k: v for k, v in metadata.items() if k != key}
        (folder / "metadata.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=f"is corrupted: '{key}' is missing"):
            jaxbuf.restore(folder, template)
    metadata["leaves"][OBS_PATH]["offset"] += 4
    (folder / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match=r"the place of leaf .* in the data file is wrong"):
        jaxbuf.restore(folder, template)


def _save_many(folder, seed, count):
    buffer = jaxbuf.make_replay_buffer(8, 4)
    state = buffer.init(EXAMPLE)
    for i in range(count):
        state = buffer.add(state, items(8, 1000 * seed + 10 * i))
        jaxbuf.save(folder, state, buffer)


def _restore_all_along(folder, stop):
    """Restores again and again while saves go on; every restore must succeed."""
    buffer = jaxbuf.make_replay_buffer(8, 4)
    template, count = jax.eval_shape(buffer.init, EXAMPLE), 0
    while not stop.is_set():
        if (folder / "metadata.json").exists():
            restored = jaxbuf.restore(folder, template, buffer)
            first = int(restored.experience["action"][0])
            assert restored.experience["action"].tolist() == list(range(first, first + 8))
            count += 1
    return count


def test_concurrent_saves_into_one_folder_each_complete(tmp_path):
    folder, stop = tmp_path / "shared", threading.Event()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        readers = [pool.submit(_restore_all_along, folder, stop) for _ in range(2)]
        list(pool.map(lambda seed: _save_many(folder, seed, 8), range(6)))
        stop.set()
        assert all(reader.result() > 0 for reader in readers)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_save_many, args=(folder, 10 + i, 3)) for i in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    buffer = jaxbuf.make_replay_buffer(8, 4)
    restored = jaxbuf.restore(folder, buffer.init(EXAMPLE), buffer)
    first = int(restored.experience["action"][0])
    assert restored.experience["action"].tolist() == list(range(first, first + 8))
    assert len(list(folder.glob("state-*"))) == 1 and not list(folder.glob(".*.tmp"))
