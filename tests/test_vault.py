"""Flashbax Vaults, written by Flashbax itself, read into jaxbuf."""

import contextlib
import io
import json
import re

import flashbax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flashbax.vault import Vault

import jaxbuf

TRAJECTORIES, LENGTH = 3, 8


def steps(start, count):
    """`count` steps of every trajectory; step `t` of trajectory `b` has id 100 b + t."""
    ids = 100 * jnp.arange(TRAJECTORIES)[:, None] + start + jnp.arange(count)[None]
    return {
        "obs": jnp.stack([ids, -ids], axis=-1).astype(jnp.bfloat16),
        "action": ids.astype(jnp.int32),
        "extras": {"done": ids % 4 == 3, "value": ids.astype(jnp.float32) / 2},
    }


def write_vault(tmp_path, total, per_add=3, uid="run"):
    """A Vault written by Flashbax while its buffer (of 8 steps) wraps around."""
    fbx = flashbax.make_trajectory_buffer(
        add_batch_size=TRAJECTORIES, sample_batch_size=2, sample_sequence_length=2, period=1,
        min_length_time_axis=2, max_length_time_axis=LENGTH,
    )  # fmt: skip
    state = fbx.init(jax.tree.map(lambda x: x[0, 0], steps(0, 1)))
    with contextlib.redirect_stdout(io.StringIO()):
        vault = Vault("vault", state.experience, rel_dir=str(tmp_path), vault_uid=uid)
        for start in range(0, total, per_add):
            state = fbx.add(state, steps(start, min(per_add, total - start)))
            vault.write(state)
    return tmp_path / "vault" / uid


def test_read_vault_gives_every_step_with_structure_and_dtypes(tmp_path):
    folder = write_vault(tmp_path, 20)
    data = jaxbuf.io.read_vault(folder)
    expected = jax.tree.map(np.asarray, steps(0, 20))
    assert jax.tree.structure(data) == jax.tree.structure(expected)
    jax.tree.map(np.testing.assert_array_equal, data, expected)
    assert data["obs"].dtype == jnp.bfloat16 and data["extras"]["done"].dtype == np.bool_
    part = jaxbuf.io.read_vault(folder, 5, 12)
    np.testing.assert_array_equal(part["action"], expected["action"][:, 5:12])


@pytest.mark.parametrize("kind", ["replay", "trajectory", "episode"])
def test_vault_to_state_fills_a_buffer_as_adds_would(tmp_path, kind):
    folder = write_vault(tmp_path, 20)
    expected = steps(0, 20)
    if kind == "replay":
        buffer = jaxbuf.make_replay_buffer(64, 4)
        state = jaxbuf.io.vault_to_state(folder, buffer)
        items = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), expected)
        direct = buffer.add(buffer.init(jax.tree.map(lambda x: x[0], items)), items)
    else:
        if kind == "trajectory":
            buffer = jaxbuf.make_trajectory_buffer(TRAJECTORIES, 16, 4, 2)
        else:
            buffer = jaxbuf.make_episode_buffer(TRAJECTORIES, 16, 4, 6,
                                                done_fn=lambda s: s["extras"]["done"])  # fmt: skip
        with pytest.raises(ValueError, match="holds 20 items but the capacity is 16"):
            jaxbuf.io.vault_to_state(folder, buffer)
        state = jaxbuf.io.vault_to_state(folder, buffer, truncate_ok=True)
        newest = jax.tree.map(lambda x: x[:, 4:], expected)
        direct = buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], expected)), newest)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), jax.device_get(direct))


def test_transition_vaults_load_into_transition_buffers(tmp_path):
    fbx = flashbax.make_trajectory_buffer(
        add_batch_size=2, sample_batch_size=2, sample_sequence_length=2, period=1,
        min_length_time_axis=2, max_length_time_axis=8,
    )  # fmt: skip
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
    obs = ids.astype(jnp.float32)[..., None]
    data = {"obs": obs, "action": ids, "reward": obs[..., 0], "terminated": ids % 3 == 2,
            "truncated": jnp.zeros((2, 6), bool), "next_obs": obs + 0.5}  # fmt: skip
    state = fbx.add(fbx.init(jax.tree.map(lambda x: x[0, 0], data)), data)
    with contextlib.redirect_stdout(io.StringIO()):
        vault = Vault("t", state.experience, rel_dir=str(tmp_path), vault_uid="u")
        vault.write(state)
    buffer = jaxbuf.make_transition_buffer(2, 8, 4)
    restored = jaxbuf.io.vault_to_state(tmp_path / "t" / "u", buffer)
    direct = buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], data)), data)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(direct))


def test_unsupported_versions_and_mismatches_are_clear_errors(tmp_path):
    folder = write_vault(tmp_path, 6)
    with pytest.raises(ValueError, match=re.escape("the buffer has num_envs=2")):
        jaxbuf.io.vault_to_state(folder, jaxbuf.make_trajectory_buffer(2, 16, 4, 2))
    with pytest.raises(ValueError, match=re.escape("the range [4, 9) is not within the 6 steps")):
        jaxbuf.io.read_vault(folder, 4, 9)
    with pytest.raises(TypeError, match="vault_to_state fills a sampled buffer"):
        jaxbuf.io.vault_to_state(folder, jaxbuf.make_queue(8, 2, 2))
    metadata = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps(metadata | {"version": 2.0}))
    with pytest.raises(
        ValueError, match=re.escape("Vault of version 2.0; jaxbuf reads version 1.x")
    ):
        jaxbuf.io.read_vault(folder)
    (folder / "metadata.json").write_text(json.dumps({"version": 1.2}))
    with pytest.raises(ValueError, match="is not a Flashbax Vault's metadata"):
        jaxbuf.io.read_vault(folder)
    with pytest.raises(FileNotFoundError, match="holds no Flashbax Vault"):
        jaxbuf.io.read_vault(tmp_path)


def test_a_vault_flashbax_wrote_fills_the_flashbax_drop_in(tmp_path):
    """`read_vault`'s arrays `[add_batch_size, T, ...]` are what the drop-in's trajectory
    buffer adds: its sequences are then the Vault's steps, consecutive, of one trajectory."""
    import jaxbuf.flashbax

    folder = write_vault(tmp_path, 20)
    buffer = jaxbuf.flashbax.make_trajectory_buffer(
        add_batch_size=TRAJECTORIES, sample_batch_size=16, sample_sequence_length=3, period=1,
        min_length_time_axis=3, max_length_time_axis=LENGTH,
    )  # fmt: skip
    state = buffer.init(jax.tree.map(lambda x: x[0, 0], steps(0, 1)))
    state = buffer.add(state, jax.tree.map(jnp.asarray, jaxbuf.io.read_vault(folder, 12, 20)))
    ids = np.asarray(buffer.sample(state, jax.random.key(0)).experience["action"])
    assert (np.diff(ids, axis=1) == 1).all() and ((ids % 100 >= 12) & (ids % 100 < 20)).all()
