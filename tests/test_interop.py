"""Getting data out (stored items, exports, Torch) and building from configuration."""

import csv
import json
import re
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxbuf

EXAMPLE = {"obs": jnp.zeros(2), "action": jnp.int32(0), "done": jnp.bool_(False)}


def items(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {
        "obs": jnp.stack([ids, -ids], -1).astype(jnp.float32),
        "action": ids,
        "done": ids % 2 == 0,
    }


def test_stored_items_of_a_wrapped_replay_buffer_are_the_valid_rows_in_storage_order():
    buffer = jaxbuf.make_replay_buffer(5, 2)
    state = buffer.add(buffer.add(buffer.init(EXAMPLE), items([0, 1, 2])), items([3, 4, 5, 6]))
    columns = jaxbuf.io.stored_items(state)
    assert columns["action"].tolist() == [5, 6, 2, 3, 4]  # rows 0..4 as stored
    partial = jaxbuf.io.stored_items(buffer.add(buffer.init(EXAMPLE), items([7, 8])))
    assert partial["action"].tolist() == [7, 8] and partial["obs"].shape == (2, 2)


def test_stored_items_of_vectorized_and_rollout_states():
    replay = jaxbuf.make_replay_buffer(4, 2)
    single = [replay.add(replay.init(EXAMPLE), items(ids)) for ids in ([1, 2, 3], [4])]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *single)
    columns = jaxbuf.io.stored_items(stacked)
    assert columns["buffer"].tolist() == [0, 0, 0, 1] and columns["row"].tolist() == [0, 1, 2, 0]
    assert columns["action"].tolist() == [1, 2, 3, 4]
    rollout = jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9)
    step = {"obs": jnp.zeros(3), "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}
    step |= {key: jnp.float32(0) for key in ("reward", "value", "final_value")}
    state = rollout.init(step)
    for t in range(3):
        state = rollout.add(
            state, jax.tree.map(lambda x, t=t: jnp.full((2, *x.shape), t, x.dtype), step)
        )
    state = rollout.finish(state, jnp.zeros(2))
    columns = jaxbuf.io.stored_items(state)
    assert columns["time"].tolist() == [0, 0, 1, 1, 2, 2] and columns["env"].tolist() == [0, 1] * 3
    assert columns["obs"].shape == (6, 3) and columns["reward"].tolist() == [0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal(columns["advantage"], np.asarray(state.advantages[:3]).ravel())
    with pytest.raises(TypeError, match="stored_items takes a jaxbuf buffer state, got dict"):
        jaxbuf.io.stored_items({"a": 1})


@pytest.fixture
def state():
    buffer = jaxbuf.make_replay_buffer(6, 2)
    return buffer.add(buffer.add(buffer.init(EXAMPLE), items([0, 1, 2, 3])), items([4, 5, 6]))


def test_npz_export_holds_the_stored_items(tmp_path, state):
    path = jaxbuf.io.export(tmp_path / "items.npz", state)
    with np.load(path) as data:
        loaded = {k: data[k] for k in data.files}
    chex.assert_trees_all_equal(loaded, jaxbuf.io.stored_items(state))


def test_csv_export_has_one_row_per_item(tmp_path, state):
    path = jaxbuf.io.export(tmp_path / "items.csv", state)
    with open(path) as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["action", "done", "obs[0]", "obs[1]"]
    expected = jaxbuf.io.stored_items(state)
    assert [int(r[0]) for r in rows[1:]] == expected["action"].tolist() == [6, 1, 2, 3, 4, 5]
    assert [int(r[1]) for r in rows[1:]] == expected["done"].astype(int).tolist()
    assert [float(r[3]) for r in rows[1:]] == expected["obs"][:, 1].tolist()


def test_torch_export_loads_without_pickled_code(tmp_path, state):
    path = jaxbuf.io.export(tmp_path / "items.pt", state)
    loaded = torch.load(path, weights_only=True)
    expected = jaxbuf.io.stored_items(state)
    assert set(loaded) == set(expected)
    for name, column in expected.items():
        np.testing.assert_array_equal(loaded[name].numpy(), column)
    with pytest.raises(
        ValueError, match=re.escape("export writes .npz, .csv or .pt files, got 'items.h5'")
    ):
        jaxbuf.io.export(tmp_path / "items.h5", state)


def test_to_torch_shares_memory_with_the_sampled_batch(state):
    buffer = jaxbuf.make_replay_buffer(6, 4)
    batch = jax.jit(buffer.sample)(state, jax.random.key(0))
    tensors = jaxbuf.io.to_torch(batch.experience)
    assert set(tensors) == set(batch.experience)
    for name, tensor in tensors.items():
        array = batch.experience[name]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == getattr(torch, array.dtype.name)
        assert tensor.data_ptr() == array.unsafe_buffer_pointer()  # no copy
        # on the array's own device (a CUDA tensor for a GPU array): compare on the host
        assert tensor.device.type == next(iter(array.devices())).platform.replace("gpu", "cuda")
        np.testing.assert_array_equal(tensor.cpu().numpy(), np.asarray(array))


def test_torch_is_optional(monkeypatch, state):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(
        ImportError, match=re.escape("this needs PyTorch; install it with `pip install torch`")
    ):
        jaxbuf.io.to_torch({"x": jnp.zeros(2)})


KIND_NAMES = "['episode', 'queue', 'replay', 'rollout', 'trajectory', 'transition']"
CONFIGS = {
    "replay": {"kind": "replay", "capacity": 1000, "sample_batch_size": 32, "min_size": 10},
    "vectorized": {"kind": "replay", "capacity": 100, "sample_batch_size": 8, "num_buffers": 4},
    "vectorized trajectory": {
        "kind": "trajectory",
        "num_envs": 2,
        "steps_per_env": 16,
        "sample_batch_size": 4,
        "sequence_length": 3,
        "num_buffers": 3,
    },
    "rollout": {
        "kind": "rollout",
        "num_steps": 128,
        "num_envs": 4,
        "discount": 0.99,
        "gae_lambda": 0.95,
    },
    "trajectory": {
        "kind": "trajectory",
        "num_envs": 8,
        "steps_per_env": 1000,
        "sample_batch_size": 16,
        "sequence_length": 20,
        "period": 10,
    },
    "transition": {
        "kind": "transition",
        "num_envs": 8,
        "steps_per_env": 1000,
        "sample_batch_size": 64,
        "n_step": 3,
        "discount": 0.97,
        "min_episode_length": 50,
    },
    "prioritized": {
        "kind": "replay",
        "capacity": 1000,
        "sample_batch_size": 32,
        "sampler": {"kind": "prioritized", "priority_exponent": 0.7, "stratified": False},
    },
    "episode": {
        "kind": "episode",
        "num_envs": 2,
        "steps_per_env": 100,
        "sample_batch_size": 4,
        "max_length": 20,
        "done_key": "info/done",
        "sampler": {"kind": "prioritized"},
    },
    "queue": {"kind": "queue", "capacity": 64, "add_batch_size": 8, "sample_batch_size": 16},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_buffers_build_from_dicts_and_files(tmp_path, name):
    import yaml

    config = CONFIGS[name]
    expected = jaxbuf.io.buffer_from_config(config)
    built_config = expected.config.to_dict()
    for key, value in config.items():  # every given value, and the sampler's
        if isinstance(value, dict):
            assert built_config[key].items() >= value.items()
        else:
            assert built_config[key] == value
    assert jaxbuf.io.buffer_from_config(expected.config).config == expected.config
    (tmp_path / "c.json").write_text(json.dumps(config))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "c.toml").write_text("\n".join(f"{k} = {toml(v)}" for k, v in config.items()))
    for suffix in ("json", "yaml", "toml"):
        built = jaxbuf.io.buffer_from_config(tmp_path / f"c.{suffix}")
        assert type(built) is type(expected) and built.config == expected.config


def toml(value):
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


@pytest.mark.parametrize(
    "config, error, message",
    [
        (
            {"capacity": 10},
            ValueError,
            f"config['kind'] must be one of {KIND_NAMES}, got None",
        ),
        (
            {"kind": "heap"},
            ValueError,
            f"config['kind'] must be one of {KIND_NAMES}, got 'heap'",
        ),
        (
            CONFIGS["replay"] | {"capacityy": 5},
            ValueError,
            "unknown key(s) ['capacityy'] in the 'replay' configuration",
        ),
        (
            {"kind": "rollout", "num_steps": 8, "num_envs": 2, "discount": 0.9},
            ValueError,
            "the 'rollout' configuration lacks the required key(s) ['gae_lambda']",
        ),
        (
            CONFIGS["replay"] | {"capacity": "1000"},
            TypeError,
            "capacity must be an integer, got '1000'",
        ),
        (
            CONFIGS["replay"] | {"capacity": 1e3},
            TypeError,
            "capacity must be an integer, got 1000.0",
        ),
        (CONFIGS["rollout"] | {"discount": "0.99"}, TypeError, "discount must be a number in"),
        (CONFIGS["vectorized"] | {"num_buffers": 0}, ValueError, "num_buffers must be in [1,"),
        (CONFIGS["queue"] | {"num_buffers": 2}, TypeError, "vectorize takes a sampled buffer"),
        ([1, 2], TypeError, "a buffer configuration is a mapping, got list"),
    ],
)
def test_bad_configurations_name_the_key(config, error, message):
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.io.buffer_from_config(config)


def test_bad_configuration_files_are_named(tmp_path):
    (tmp_path / "c.ini").write_text("[buffer]")
    with pytest.raises(ValueError, match=re.escape("is .json, .toml, .yaml or .yml, got 'c.ini'")):
        jaxbuf.io.buffer_from_config(tmp_path / "c.ini")
    (tmp_path / "c.yaml").write_text("!!python/object/apply:os.system ['echo unsafe']")
    # safe_load refuses to build Python objects; the error is a ValueError naming the file.
    with pytest.raises(ValueError, match=r"c\.yaml is not valid YAML: could not determine"):
        jaxbuf.io.buffer_from_config(tmp_path / "c.yaml")


def test_csv_export_spreads_a_multi_dimensional_leaf_over_indexed_columns(tmp_path):
    buffer = jaxbuf.make_replay_buffer(4, 2)
    m = np.arange(3 * 2 * 3, dtype=np.float32).reshape(3, 2, 3)
    state = buffer.add(buffer.init({"m": jnp.zeros((2, 3))}), {"m": jnp.asarray(m)})
    with open(jaxbuf.io.export(tmp_path / "items.csv", state)) as file:
        rows = list(csv.reader(file))
    header = [f"m[{i},{j}]" for i in range(2) for j in range(3)]
    assert rows[0] == header
    for item, row in zip(m, rows[1:], strict=True):
        for name, value in zip(header, row, strict=True):
            i, j = map(int, name[2:-1].split(","))
            assert float(value) == item[i, j]
