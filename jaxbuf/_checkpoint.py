"""Checkpoints of buffer states: a folder with flax msgpack data and JSON metadata.

Layout of a checkpoint folder:

- `metadata.json`: what was saved (buffer kind and configuration, jaxbuf
  version, state type, every leaf's shape and dtype, size) and the name and
  SHA-256 of the data file. Replacing it (atomically) is the commit point.
- `state-<digest>.msgpack`: the state, `flax.serialization.to_bytes`.

A save writes and fsyncs a new data file under a new name, then atomically
replaces `metadata.json`, then removes the old data file. Every file is written
to a hidden temporary name and renamed into place, so a file under its final
name is always complete. An exception or a
crash at any moment leaves either the previous checkpoint or the new one
complete and readable. Loading parses only JSON and msgpack: no code from the
file is ever executed (no pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import serialization

from jaxbuf._types import Config
from jaxbuf._version import __version__

FORMAT = "jaxbuf-checkpoint"
FORMAT_VERSION = 1
METADATA = "metadata.json"


def _leaves(state: Any) -> dict[str, dict]:
    return {
        jax.tree_util.keystr(path): {"shape": list(np.shape(leaf)), "dtype": str(leaf.dtype)}
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
    }


def _plain(value: Any) -> Any:
    """A configuration value as JSON data; a callable (a `done_fn`) by its name."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if callable(value):
        return f"<{getattr(value, '__qualname__', type(value).__name__)}>"
    return value


def _describe(buffer: Any) -> tuple[str | None, dict | None]:
    """The kind and configuration of a buffer made by a jaxbuf factory, if given."""
    if buffer is None:
        return None, None
    config = getattr(buffer, "config", None)
    if not isinstance(config, Config):
        raise TypeError(f"buffer must be a jaxbuf buffer, got {type(buffer).__name__}.")
    return config.kind, _plain(config)


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Writes `data` durably to `path`, atomically: a file under its final name is
    always complete (a crash leaves at most a hidden `.tmp` file behind)."""
    pending = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(pending, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(pending, path)


def _fsync_folder(folder: pathlib.Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a folder
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def save(path: str | os.PathLike, state: Any, buffer: Any = None) -> pathlib.Path:
    """Saves a buffer state (or any pytree holding one) to the folder `path`, atomically.

    Args:
      path: the checkpoint folder; created if needed. A previous checkpoint there
        stays readable until the new one is complete, then is replaced.
      state: the state to save.
      buffer: the buffer the state belongs to (optional); its kind and
        configuration go into the metadata.

    Returns:
      The folder.

    Example:
      >>> import tempfile, jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> folder = jaxbuf.save(tempfile.mkdtemp() + "/ckpt", state, buffer)
      >>> restored = jaxbuf.restore(folder, buffer.init({"x": jnp.float32(0)}))
      >>> restored.experience["x"].tolist(), int(restored.size)
      ([0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], 3)
    """
    for key, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise ValueError(
                f"state{jax.tree_util.keystr(key)} is spread over several processes; "
                "jaxbuf.save writes one host's copy. Save sharded states with Orbax "
                "(each process writes its shards; see the README)."
            )
    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    host = jax.device_get(state)
    data = serialization.to_bytes(host)
    digest = hashlib.sha256(data).hexdigest()
    kind, config = _describe(buffer)
    size = getattr(host, "size", None)
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "jaxbuf_version": __version__,
        "kind": kind,
        "config": config,
        "state_type": type(host).__name__,
        "size": None if size is None else np.asarray(size).tolist(),
        "leaves": _leaves(host),
        "data_file": f"state-{digest[:16]}.msgpack",
        "sha256": digest,
    }
    write_atomic(folder / metadata["data_file"], data)
    write_atomic(folder / METADATA, json.dumps(metadata, indent=2).encode())  # the commit point
    _fsync_folder(folder)
    for stale in [*folder.glob("state-*.msgpack"), *folder.glob(".*.tmp")]:
        if stale.name != metadata["data_file"]:  # the previous data, crash leftovers
            stale.unlink(missing_ok=True)
    return folder


def _read_metadata(folder: pathlib.Path) -> dict:
    file = folder / METADATA
    if not file.exists():
        raise FileNotFoundError(f"{folder} holds no jaxbuf checkpoint (no {METADATA}).")
    try:
        metadata = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{file} is corrupted: it is not valid JSON ({error}).") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{file} is not a jaxbuf checkpoint's metadata.")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{file} has format version {metadata.get('format_version')}; this jaxbuf "
            f"reads version {FORMAT_VERSION}."
        )
    return metadata


def load_metadata(path: str | os.PathLike) -> dict:
    """The metadata of the checkpoint in the folder `path` (see `save`).

    Example:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> metadata = jaxbuf.load_metadata(jaxbuf.save(tempfile.mkdtemp() + "/c", state, buffer))
      >>> metadata["kind"], metadata["config"]["capacity"], metadata["size"]
      ('replay', 8, 3)
      >>> metadata["leaves"][".experience['x']"]
      {'shape': [8], 'dtype': 'float32'}
    """
    return _read_metadata(pathlib.Path(path))


def _check_template(metadata: dict, template: Any, folder: pathlib.Path) -> None:
    if metadata["state_type"] != type(template).__name__:
        raise ValueError(
            f"{folder} holds a {metadata['state_type']}, but the template is a "
            f"{type(template).__name__}."
        )
    saved, wanted = metadata["leaves"], _leaves(template)
    if saved.keys() != wanted.keys():
        missing, extra = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
        raise ValueError(
            f"{folder} does not match the template's structure: the checkpoint lacks "
            f"{missing or 'nothing'} and has extra leaves {extra or 'none'}."
        )
    for key, want in wanted.items():
        if saved[key] != want:
            raise ValueError(
                f"{folder}: leaf {key} was saved with shape {tuple(saved[key]['shape'])} and "
                f"dtype {saved[key]['dtype']}, but the template has shape "
                f"{tuple(want['shape'])} and dtype {want['dtype']} (another configuration?)."
            )


def restore(path: str | os.PathLike, template: Any) -> Any:
    """Restores a state saved by `save` into the structure of `template`.

    Args:
      path: the checkpoint folder.
      template: a state of the same configuration, whose structure, shapes and
        dtypes must match the saved ones: `buffer.init(example)`, or, allocating
        nothing, `jax.eval_shape(buffer.init, example)`.

    Returns:
      The restored state, with JAX arrays.

    Raises:
      ValueError: the checkpoint does not match the template (the message names the
        leaf), or its files are truncated or corrupted.

    Example:
      >>> import tempfile, jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> example = {"x": jnp.float32(0)}
      >>> state = buffer.add(buffer.init(example), {"x": jnp.arange(3.0)})
      >>> folder = jaxbuf.save(tempfile.mkdtemp() + "/ckpt", state)
      >>> restored = jaxbuf.restore(folder, jax.eval_shape(buffer.init, example))
      >>> restored.experience["x"][:4].tolist(), int(restored.size)
      ([0.0, 1.0, 2.0, 0.0], 3)
    """
    folder = pathlib.Path(path)
    metadata = _read_metadata(folder)
    _check_template(metadata, template, folder)
    data_file = folder / metadata["data_file"]
    try:
        data = data_file.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{folder} is incomplete: {data_file.name} is missing.") from None
    if hashlib.sha256(data).hexdigest() != metadata["sha256"]:
        raise ValueError(
            f"{data_file} is corrupted or truncated: its SHA-256 does not match the metadata."
        )
    saved: Any = serialization.msgpack_restore(data)
    restored = serialization.from_state_dict(template, saved)
    return jax.tree.map(jax.numpy.asarray, restored)
