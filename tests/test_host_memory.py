"""Experience leaves in host memory (`host_memory=`): the same states and samples, bit for
bit, as device placement, with the named leaves kept in `pinned_host` memory through
donated adds and samples that come back in device memory (this CPU has JAX's memory
kinds, all the same RAM)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from helpers import assert_same

import jaxbuf
from jaxbuf.core import hosted as _hosted
from jaxbuf.core import lowering as _lowering
from jaxbuf.options import host_memory as _host_memory

pytestmark = pytest.mark.skipif(
    getattr(getattr(jax, "memory", None), "Space", None) is None,
    reason="JAX's memory spaces (jax.memory.Space) arrived in JAX 0.7",
)
EXAMPLE = {"obs": jnp.zeros((6, 5), jnp.uint8), "reward": jnp.float32(0), "id": jnp.int32(0)}


def random_items(rng, count: int) -> dict:
    return {"obs": rng.integers(0, 255, (count, 6, 5), dtype=np.uint8),
            "reward": rng.normal(size=count).astype(np.float32),
            "id": rng.integers(0, 1000, count).astype(np.int32)}  # fmt: skip


def memory_kind(leaf) -> str:
    return leaf.sharding.memory_kind


@pytest.mark.parametrize(
    "sampler", [jaxbuf.uniform(), jaxbuf.prioritized()], ids=["uniform", "prioritized"]
)
@pytest.mark.parametrize(
    ("capacity", "batch", "sizes"),
    [(37, 8, (1, 4, 11)), (151, 48, (1, 23, _lowering.FEW_ROWS, _lowering.FEW_ROWS + 1, 90))],
    ids=["rows", "blocks"],
)
def test_host_placement_equals_device_placement_over_wrap_arounds(
    sampler, capacity, batch, sizes, platform_path
):
    """Few rows: row slices both ways. Many: host-gathered reads, adds of up to 90 rows
    (two windows on accelerators and, past `FEW_ROWS` rows, on CPU). The adds take their
    sizes from `sizes` (both sides of each switch) in a random order, so that each size
    compiles once while the ring wraps at ever other places (the sizes sum to random
    positions of a ring whose length they do not divide)."""
    hosted = jaxbuf.make_replay_buffer(capacity, batch, sampler=sampler, host_memory=("obs",))
    plain = jaxbuf.make_replay_buffer(capacity, batch, sampler=sampler)
    host_state, device_state = hosted.init(EXAMPLE), plain.init(EXAMPLE)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"
    assert memory_kind(host_state.experience["reward"]) == "device"
    adds = [jax.jit(b.add, donate_argnums=0) for b in (hosted, plain)]
    samples = [jax.jit(b.sample) for b in (hosted, plain)]
    rng = np.random.default_rng(0)
    for i in range(40):  # 6 to 12 wrap-arounds
        items = random_items(rng, int(rng.choice(sizes)))
        host_state, device_state = adds[0](host_state, items), adds[1](device_state, items)
        key = jax.random.key(i)
        from_host, from_device = samples[0](host_state, key), samples[1](device_state, key)
        assert_same(from_host, from_device)
        assert memory_kind(from_host.experience["obs"]) == "device"
    assert_same(host_state, device_state)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"  # kept by donated adds


def test_reads_of_host_rows_take_any_index_shape(platform_path):
    column = jax.device_put(jnp.arange(60, dtype=jnp.int32).reshape(4, 5, 3),
                            jax.memory.Space.Host)  # fmt: skip
    rng = np.random.default_rng(3)
    for count in (2, _lowering.ROW_SLICES + 1):  # row slices; a host gather
        envs, times = rng.integers(0, 4, (count, 1)), rng.integers(0, 5, (count, 2))
        rows = jax.jit(_hosted.read_rows)(column, (jnp.asarray(envs), jnp.asarray(times)))
        expected = np.arange(60).reshape(4, 5, 3)[envs, times]
        assert np.array_equal(rows, expected) and memory_kind(rows) == "device"


def test_host_memory_is_checked():
    with pytest.raises(TypeError, match=r"host_memory must be a sequence of leaf names"):
        jaxbuf.make_replay_buffer(8, 2, host_memory="obs")
    buffer = jaxbuf.make_replay_buffer(8, 2, host_memory=("pixels",))
    with pytest.raises(ValueError, match=r"host_memory names \['pixels'\].*\['id', 'obs'"):
        buffer.init(EXAMPLE)


def test_a_device_without_host_memory_is_refused_at_make(monkeypatch):
    monkeypatch.setattr(_host_memory, "_memory_kinds", lambda: {"device"})
    with pytest.raises(ValueError, match=r"host_memory needs JAX's memory kinds.*offers"):
        jaxbuf.make_replay_buffer(8, 2, host_memory=("obs",))


def random_steps(rng, num_envs: int, length: int) -> dict:
    """Steps `[num_envs, length, ...]` with frequent episode ends."""
    return {"obs": rng.integers(0, 255, (num_envs, length, 5, 4), dtype=np.uint8),
            "action": rng.integers(0, 5, (num_envs, length)).astype(np.int32),
            "reward": rng.normal(size=(num_envs, length)).astype(np.float32),
            "terminated": rng.random((num_envs, length)) < 0.1,
            "truncated": rng.random((num_envs, length)) < 0.1}  # fmt: skip


LENGTHS = (2, 3, 8)  # steps per multi-step add: each compiles once, rings of 11 to 23 steps


def run_side_by_side(make, example: dict, steps_of, rounds: int = 30, time_axis: int = 1) -> None:
    """Donated adds (several steps, then one step, in turn) and samples of a host-placed
    buffer and a device-placed one, compared bit for bit after every call."""
    hosted, plain = make(host_memory=("obs",)), make()
    host_state, device_state = hosted.init(example), plain.init(example)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"
    calls = [(jax.jit(b.add, donate_argnums=0), jax.jit(b.add_step, donate_argnums=0),
              jax.jit(b.sample)) for b in (hosted, plain)]  # fmt: skip
    rng = np.random.default_rng(1)
    for i in range(rounds):
        length = 1 if i % 2 else int(rng.choice(LENGTHS))
        steps = steps_of(rng, length)
        one = jax.tree.map(lambda x: np.take(x, 0, axis=time_axis), steps)
        which, data = (1, one) if length == 1 else (0, steps)
        host_state = calls[0][which](host_state, data)
        device_state = calls[1][which](device_state, data)
        if plain.can_sample(device_state):
            key = jax.random.key(i)
            from_host = calls[0][2](host_state, key)
            assert_same(from_host, calls[1][2](device_state, key))
            assert memory_kind(jax.tree.leaves(from_host.experience)[0]) == "device"
    assert_same(host_state, device_state)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"


@pytest.mark.parametrize("envs", [3, 40], ids=["3 envs", "40 envs"])
@pytest.mark.parametrize("frames", [None, {"obs": 4}], ids=["no frames", "frames"])
def test_transition_buffer_with_host_observations_equals_device(frames, envs, platform_path):
    """23 steps per environment (about 10 wrap-arounds), n-step 3, a side ring of final
    observations so short (min_episode_length=4) that it overwrites its oldest too. With
    40 environments one step's final observations are more rows than `ROW_SLICES`: the
    accelerator path scatters them on the host, the CPU's writes them in a loop."""
    assert 3 <= _lowering.ROW_SLICES < 40

    def make(**host):
        return jaxbuf.make_transition_buffer(envs, 23, 16, n_step=3, frames=frames,
                                             min_episode_length=4, **host)  # fmt: skip

    example = {**{k: v[0, 0] for k, v in random_steps(np.random.default_rng(0), 1, 1).items()},
               "next_obs": np.zeros((5, 4), np.uint8)}  # fmt: skip

    def steps_of(rng, length):
        steps = random_steps(rng, envs, length)
        return {**steps, "next_obs": rng.integers(0, 255, (envs, length, 5, 4), dtype=np.uint8)}

    run_side_by_side(make, example, steps_of)
    state = make(host_memory=("obs",)).init(example)
    assert memory_kind(state.side.experience) == "pinned_host"  # final observations too


@pytest.mark.parametrize("kind", ["trajectory", "episode"])
def test_trajectory_and_episode_buffers_with_host_frames_equal_device(kind, platform_path):
    def done(step):
        return step["terminated"] | step["truncated"]

    def make(**host):
        if kind == "trajectory":
            return jaxbuf.make_trajectory_buffer(2, 19, 8, 5, done_fn=done,
                                                 frames={"obs": 3}, **host)  # fmt: skip
        return jaxbuf.make_episode_buffer(2, 19, 8, 6, done_fn=done, frames={"obs": 3}, **host)

    example = {k: v[0, 0] for k, v in random_steps(np.random.default_rng(0), 1, 1).items()}
    run_side_by_side(make, example, lambda rng, length: random_steps(rng, 2, length))


def test_transition_host_memory_names_stored_leaves():
    buffer = jaxbuf.make_transition_buffer(2, 8, 2, host_memory=("next_obs",))
    example = {**{k: v[0, 0] for k, v in random_steps(np.random.default_rng(0), 1, 1).items()},
               "next_obs": np.zeros((5, 4), np.uint8)}  # fmt: skip
    with pytest.raises(ValueError, match=r"host_memory names \['next_obs'\].*'obs'"):
        buffer.init(example)


def test_host_census_finds_no_whole_transfer_and_no_gather_in_device_code():
    """The host census (tests/census_host.py) of every host-placed kind, on cuda and tpu:
    rows move by slices or host-computed gathers, never the array; the page shows it."""
    import census_host
    from census import HOST_SECTION

    rows = census_host.table()
    for name, per_platform in rows.items():
        for platform, found in per_platform.items():
            where = f"{name} on {platform}"
            assert found["whole transfers"] == 0 and found["device gathers/scatters"] == 0, where
            assert found["while"] == 0 and found["case/if"] == 0, where
            assert found["row slices"] + found["host gathers/scatters"] > 0, where
    assert rows["replay/uniform B=16.sample"]["cuda"]["host gathers/scatters"] == 0  # 16 row slices
    assert rows["replay/uniform B=256.sample"]["cuda"]["row slices"] == 0  # a host gather
    page = (pathlib.Path(__file__).parents[1] / "docs" / "census.md").read_text()
    assert census_host.markdown(rows) in page.split(HOST_SECTION)[1], "regenerate the page"


def test_host_census_sees_a_whole_transfer():
    import census_host
    from census import lowered

    column = jax.device_put(jnp.zeros((64, 7), jnp.uint8), jax.memory.Space.Host)
    whole = lowered(lambda c: jax.device_put(c, jax.memory.Space.Device).sum(), (column,), "cuda")
    assert census_host.host_counts(whole)["whole transfers"] == 1


def test_vectorized_host_buffers_equal_device_ones(platform_path):
    """`vectorize` stacks host columns: writes and reads take the buffer as one more
    index (never a vmapped slice, which would be a gather on host memory)."""
    hosted = jaxbuf.vectorize(jaxbuf.make_replay_buffer(13, 8, host_memory=("obs",)), 3)
    plain = jaxbuf.vectorize(jaxbuf.make_replay_buffer(13, 8), 3)
    host_state, device_state = hosted.init(EXAMPLE), plain.init(EXAMPLE)
    adds = [jax.jit(b.add, donate_argnums=0) for b in (hosted, plain)]
    rng = np.random.default_rng(4)
    for i in range(12):  # about 5 wrap-arounds per buffer
        items = jax.tree.map(lambda x: x.reshape(3, -1, *x.shape[1:]), random_items(rng, 15))
        host_state, device_state = adds[0](host_state, items), adds[1](device_state, items)
        key = jax.random.key(i)
        from_host = jax.jit(hosted.sample)(host_state, key)
        assert_same(from_host, jax.jit(plain.sample)(device_state, key))
    assert_same(host_state, device_state)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"


def test_vectorized_transition_buffers_with_host_frames_equal_device(platform_path):
    def make(**host):
        return jaxbuf.vectorize(jaxbuf.make_transition_buffer(
            2, 11, 8, n_step=2, frames={"obs": 3}, min_episode_length=3, **host), 2)  # fmt: skip

    example = {**{k: v[0, 0] for k, v in random_steps(np.random.default_rng(0), 1, 1).items()},
               "next_obs": np.zeros((5, 4), np.uint8)}  # fmt: skip

    def steps_of(rng, length):
        steps = random_steps(rng, 4, length)
        steps["next_obs"] = rng.integers(0, 255, (4, length, 5, 4), dtype=np.uint8)
        return jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), steps)

    run_side_by_side(make, example, steps_of, rounds=16, time_axis=2)


def test_blocks_host_loop_checkpoints_take_epochs_and_export_with_host_leaves(tmp_path):
    """The Python loop's blocks, a checkpoint's round trip (back into host memory, from
    either template), `take`, the epochs sampler and `export` see the same data."""
    found = {}
    for name, host in (("host", ("obs",)), ("device", None)):
        buffer = jaxbuf.make_replay_buffer(23, 8, host_memory=host)
        loop = jaxbuf.HostLoop(buffer, buffer.init(EXAMPLE), jax.random.key(0), steps_per_call=4)
        rng, blocks = np.random.default_rng(5), []
        for _ in range(30):
            block = loop.add(random_items(rng, 3))
            blocks += [] if block is None else [jax.tree.map(np.asarray, block)]
        state = loop.state
        epochs = jaxbuf.make_replay_buffer(23, 8, host_memory=host, sampler=jaxbuf.epochs())
        epoch_state = epochs.add(epochs.init(EXAMPLE), random_items(rng, 20))
        found[name] = (blocks, buffer.take(state, jnp.arange(5)),
                       epochs.next_batch(epoch_state, jax.random.key(1))[1],
                       dict(np.load(jaxbuf.io.export(tmp_path / f"{name}.npz",
                                                     state))))  # fmt: skip
        if host:
            folder = jaxbuf.save(tmp_path / "ckpt", state, buffer)
            for template in (buffer.init(EXAMPLE), jax.eval_shape(buffer.init, EXAMPLE)):
                restored = jaxbuf.restore(folder, template, buffer)
                assert_same(restored, state)
                assert memory_kind(restored.experience["obs"]) == "pinned_host"
    assert_same(found["host"][:3], found["device"][:3])
    assert found["host"][3].keys() == found["device"][3].keys()
    for column in found["host"][3]:
        assert np.array_equal(found["host"][3][column], found["device"][3][column]), column


def test_goal_relabeling_with_host_observations_is_refused():
    goals = jaxbuf.hindsight(lambda achieved, desired: jnp.float32(0), achieved="a", desired="d")
    with pytest.raises(ValueError, match=r"host_memory and goals cannot be combined"):
        jaxbuf.make_transition_buffer(2, 16, 4, goals=goals, host_memory=("obs",))
    with pytest.raises(ValueError, match=r"host_memory and goals cannot be combined"):
        jaxbuf.make_episode_buffer(2, 16, 4, 8, done_fn=lambda s: s["d"], goals=goals,
                                   host_memory=("obs",))  # fmt: skip


def test_datasets_from_data_and_configs_keep_host_placement(tmp_path):
    data = random_items(np.random.default_rng(6), 20)
    buffer, state = jaxbuf.io.from_data(data, 32, sample_batch_size=4, host_memory=("obs",))
    assert memory_kind(state.experience["obs"]) == "pinned_host"
    writer = jaxbuf.io.DatasetWriter(tmp_path / "data", state, include_stored=True)
    writer.append(state)
    writer.flush()
    again = jaxbuf.io.dataset_to_state(writer.path, buffer)
    assert_same(again, state)
    assert memory_kind(again.experience["obs"]) == "pinned_host"
    rebuilt = jaxbuf.io.buffer_from_config(dict(buffer.config))
    assert memory_kind(rebuilt.init(EXAMPLE).experience["obs"]) == "pinned_host"


class Learner(struct.PyTreeNode):  # a flax TrainState-like record
    params: dict
    replay: object
    step: jax.Array


@pytest.mark.parametrize("kind", ["replay", "transition"])
def test_a_whole_training_state_restores_its_host_leaves_into_host_memory(kind, tmp_path):
    """Buffer states nested in dicts, lists and records, from `jax.eval_shape`'s template
    (no memory kinds): the host leaves come back in host memory, the others on the device."""
    if kind == "replay":
        buffer, example = jaxbuf.make_replay_buffer(20, 4, host_memory=("obs",)), EXAMPLE
        hosted = [lambda s: s.experience["obs"]]
        state = buffer.add(buffer.init(example), random_items(np.random.default_rng(0), 15))
    else:
        buffer = jaxbuf.make_transition_buffer(2, 8, 4, min_episode_length=2,
                                               host_memory=("obs",))  # fmt: skip
        obs = jnp.zeros((6, 5), jnp.uint8)
        example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                    jnp.bool_(False), obs)  # fmt: skip
        hosted = [lambda s: s.experience["obs"], lambda s: s.side.experience]
        state = buffer.init(example)

    def whole(state, step):
        return {
            "learner": Learner({"w": jnp.ones(3)}, [state, {"again": state}], step),
            "key": jax.random.key_data(jax.random.key(0)),
        }

    folder = jaxbuf.save(tmp_path / "ckpt", whole(state, jnp.int32(12)), buffer)
    template = jax.eval_shape(lambda: whole(buffer.init(example), jnp.int32(0)))
    restored = jaxbuf.restore(folder, template, buffer)
    assert_same(restored, whole(state, jnp.int32(12)))
    for replay in (restored["learner"].replay[0], restored["learner"].replay[1]["again"]):
        for leaf in hosted:
            assert memory_kind(leaf(replay)) == "pinned_host"
        assert memory_kind(replay.experience["reward"]) == "device"
    assert memory_kind(restored["learner"].params["w"]) == "device"
