"""Fault injection: writers killed mid-save and mid-flush, a full disk, and
corrupted or truncated files. The previous checkpoint must always restore, a
dataset must never show a partial tail, and damage must give a `ValueError`
(never a crash, never wrong data)."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf.io import checkpoint as _checkpoint

KILLS = 6  # per target; each starts a fresh process
CAPACITY = 2**16


def buffer_and_state(tag):
    """A replay buffer of 8 MiB whose items all carry `tag`."""
    buffer = jaxbuf.make_replay_buffer(CAPACITY, 4)
    items = {"obs": jnp.full((CAPACITY, 32), tag, jnp.float32), "tag": jnp.full(CAPACITY, tag)}
    state = buffer.add(buffer.init(jax.tree.map(lambda x: x[0], items)), items)
    return buffer, state


SAVER = """
import sys, jax.numpy as jnp
sys.path.insert(0, {tests!r})
from test_faults import buffer_and_state
import jaxbuf
folder, ready = sys.argv[1], sys.argv[2]
for tag in range(1, 10**6):
    buffer, state = buffer_and_state(tag)
    jaxbuf.save(folder, state, buffer)
    if tag == 1:
        open(ready, "w").close()
"""

APPENDER = """
import sys, jax, jax.numpy as jnp
import jaxbuf
folder, ready = sys.argv[1], sys.argv[2]
buffer = jaxbuf.make_replay_buffer(4096, 4)
state = buffer.init({"id": jnp.int32(0), "obs": jnp.zeros(256)})
writer = jaxbuf.io.DatasetWriter(folder, state, chunk_items=1000)
add = jax.jit(buffer.add, donate_argnums=0)
for start in range(0, 10**9, 3000):
    ids = jnp.arange(start, start + 3000, dtype=jnp.int32)
    state = add(state, {"id": ids, "obs": jnp.broadcast_to(ids[:, None], (3000, 256)) * 1.0})
    writer.append(state)
    writer.flush()
    if start == 0:
        open(ready, "w").close()
"""


def kill_midway(script, folder, tmp_path, rng):
    """Starts `script`, waits until it has completed once, kills it (SIGKILL) at
    a random moment of its loop."""
    ready = tmp_path / f"ready-{rng.integers(1 << 30)}"
    code = script.replace("{tests!r}", repr(os.path.dirname(__file__)))
    process = subprocess.Popen([sys.executable, "-c", code, str(folder), str(ready)])
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert process.poll() is None, "the writer died on its own"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.4))
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_save_killed_at_any_moment_leaves_a_complete_checkpoint(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "ckpt"
    buffer, _ = buffer_and_state(0)
    template = jax.eval_shape(lambda: buffer_and_state(0)[1])
    for _ in range(KILLS):
        kill_midway(SAVER, folder, tmp_path, rng)
        restored = jaxbuf.restore(folder, template, buffer)
        tag = int(restored.experience["tag"][0])
        assert tag >= 1 and np.all(np.asarray(restored.experience["obs"]) == tag)
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".state")]
    jaxbuf.save(folder, buffer_and_state(7)[1], buffer)  # the next save cleans up
    assert [p.name for p in folder.iterdir() if p.name.startswith(".state")] == []
    assert len(list(folder.glob("state-*"))) == 1, leftovers


def test_a_flush_killed_at_any_moment_never_shows_a_partial_tail(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "data"
    for trial in range(KILLS):
        kill_midway(APPENDER, folder / str(trial), tmp_path, rng)
        data = jaxbuf.io.read_dataset(folder / str(trial))
        ids = data["id"]
        assert len(ids) >= 3000 and len(ids) % 3000 == 0
        np.testing.assert_array_equal(ids, np.arange(len(ids)))
        np.testing.assert_array_equal(data["obs"], np.broadcast_to(ids[:, None], (len(ids), 256)))


class _FullDisk:
    """A file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, file, room):
        self.file, self.room = file, room

    def write(self, data):
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.mark.parametrize("room", [0, 1000, 300_000, 8_000_000])
def test_a_full_disk_is_a_clear_error_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, room
):
    buffer, first = buffer_and_state(1)
    folder = jaxbuf.save(tmp_path / "ckpt", first, buffer)
    real_open = open

    def opening(path, mode="r", *args, **kwargs):
        file = real_open(path, mode, *args, **kwargs)
        return _FullDisk(file, room) if "w" in mode and ".tmp" in str(path) else file

    monkeypatch.setattr("builtins.open", opening)
    with pytest.raises(OSError, match=r"could not write .*No space left on device.* is kept"):
        jaxbuf.save(folder, buffer_and_state(2)[1], buffer)
    monkeypatch.undo()
    restored = jaxbuf.restore(folder, jax.eval_shape(lambda: first), buffer)
    assert int(restored.experience["tag"][0]) == 1
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def small_checkpoint(tmp_path):
    buffer = jaxbuf.make_replay_buffer(16, 4)
    example = {"obs": jnp.zeros(3), "id": jnp.int32(0)}
    items = {"obs": jnp.arange(30.0).reshape(10, 3), "id": jnp.arange(10, dtype=jnp.int32)}
    state = buffer.add(buffer.init(example), items)
    return buffer, state, jaxbuf.save(tmp_path / "ckpt", state, buffer)


def restores_exactly_or_raises(folder, state, buffer):
    try:
        restored = jaxbuf.restore(folder, jax.eval_shape(lambda: state), buffer)
    except ValueError:
        return "raised"
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
    return "exact"


def test_corrupting_any_byte_of_any_file_raises_or_changes_nothing(tmp_path):
    buffer, state, folder = small_checkpoint(tmp_path)
    outcomes = {"raised": 0, "exact": 0}
    for file in [folder / "metadata.json", folder / jaxbuf.io.load_metadata(folder)["data_file"]]:
        original = file.read_bytes()
        for offset in range(len(original)):
            for flip in (0x01, 0x10):  # two single-bit flips per byte
                damaged = bytearray(original)
                damaged[offset] ^= flip
                file.write_bytes(bytes(damaged))
                outcomes[restores_exactly_or_raises(folder, state, buffer)] += 1
        file.write_bytes(original)
    # Every flip of the data file is caught; in the metadata only fields that do
    # not shape the state (the version string, `size`, spacing) may change silently.
    assert outcomes["raised"] > 0.9 * sum(outcomes.values()), outcomes


def test_truncating_any_file_at_any_length_raises(tmp_path):
    buffer, state, folder = small_checkpoint(tmp_path)
    for file in [folder / "metadata.json", folder / jaxbuf.io.load_metadata(folder)["data_file"]]:
        original = file.read_bytes()
        for length in range(len(original)):
            file.write_bytes(original[:length])
            assert restores_exactly_or_raises(folder, state, buffer) == "raised", length
        file.write_bytes(original)


def test_a_format_flag_flipped_to_version_1_is_caught(tmp_path):
    buffer, state, folder = small_checkpoint(tmp_path)
    metadata = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps(metadata | {"format_version": 1}))
    with pytest.raises(ValueError, match=r"format 1 keeps its data in a \.msgpack file"):
        jaxbuf.restore(folder, jax.eval_shape(lambda: state), buffer)
    assert _checkpoint.FORMAT_VERSION == 2
