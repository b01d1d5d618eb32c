"""Checkpoints of buffer states: a folder with the raw leaves and JSON metadata.

Layout of a checkpoint folder:

- `metadata.json`: what was saved (buffer kind and configuration, jaxbuf
  version, state type, every leaf's shape, dtype and place in the data file,
  size) and the name and SHA-256 of the data file. Replacing it (atomically) is
  the commit point.
- `state-<token>.bin`: every leaf's bytes (C order, little-endian), one after
  the other (format 2). Format 1 folders (`state-<digest>.msgpack`, flax
  msgpack) still restore.

A save streams the leaves to a new data file in chunks of at most
`CHUNK_BYTES` (so it needs little host memory beyond the state: a 7 GB
buffer saves and restores on a machine that could not hold it twice), hashing
as it writes, fsyncs it, then, holding the folder's lock, renames it into
place, replaces `metadata.json` and removes the data files no longer
referenced. Every file is first written under a hidden temporary name unique
to the save, so any number of concurrent saves into one folder (threads or
processes) each complete or fail cleanly, the last to commit wins, and an
exception or a crash at any moment leaves a complete, readable checkpoint.
Loading parses only JSON (and, for format 1, msgpack): no code from the file
is ever executed (no pickle).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from jaxbuf._version import __version__
from jaxbuf.core import hosted as _hosted
from jaxbuf.core.records import Config
from jaxbuf.io import checkpoint_leaves as _checkpoint_leaves
from jaxbuf.options import host_memory as _host_memory

FORMAT = "jaxbuf-checkpoint"
FORMAT_VERSION = 2
METADATA = "metadata.json"
CHUNK_BYTES = 32 * 2**20  # host memory a save or restore holds beyond the state


def _plain(value: Any) -> Any:
    """A configuration as JSON data (functions by name)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if callable(value):
        return f"<{getattr(value, '__qualname__', type(value).__name__)}>"
    return value


def _describe(buffer: Any) -> tuple[str | None, dict | None]:
    """The kind and JSON configuration of a buffer (None, None without one)."""
    if buffer is None:
        return None, None
    config = getattr(buffer, "config", None)
    if not isinstance(config, Config):
        raise TypeError(f"buffer must be a jaxbuf buffer, got {type(buffer).__name__}.")
    return config.kind, json.loads(json.dumps(_plain(config)))


def _pending_name(name: str) -> str:
    """A hidden temporary name unique to this process, thread and call."""
    return f".{name}.{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}.tmp"


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Writes `data` to `path` through a unique temporary file, fsynced, then renamed
    into place: readers see the old file or the new one, never a part."""
    pending = path.with_name(_pending_name(path.name))
    try:
        with open(pending, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(pending, path)
    finally:
        pending.unlink(missing_ok=True)


def _fsync_folder(folder: pathlib.Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a folder
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def _locked(folder: pathlib.Path) -> Iterator[None]:
    """Holds the folder's lock (`.lock`, POSIX `flock`) for a commit and its cleanup."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): commits rely on the atomic rename alone
        yield
        return
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _chunks(leaf: Any) -> Iterator[np.ndarray]:
    """The bytes of a leaf in C order, as host arrays of at most `CHUNK_BYTES`
    (whole rows; one row if a row is larger)."""
    if not isinstance(leaf, jax.Array) or leaf.ndim == 0:
        yield np.ascontiguousarray(np.asarray(leaf))
        return
    rows = max(1, CHUNK_BYTES // max(1, leaf.nbytes // max(1, leaf.shape[0])))
    for start in range(0, leaf.shape[0], rows):
        yield np.ascontiguousarray(jax.device_get(leaf[start : start + rows]))


def _write_data(file: Any, leaves: list, hasher: Any) -> dict[str, dict]:
    """Streams the encoded leaves (`_checkpoint_leaves.encoded`) into `file`, hashing
    while writing (two threads: both release the GIL); returns each leaf's shape,
    dtype, offset, size and what else restores it."""
    placed, offset = {}, 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for path, leaf, extra in leaves:
            for chunk in _chunks(leaf):
                data = chunk.reshape(-1).view(np.uint8).data
                hashing = pool.submit(hasher.update, data)
                file.write(data)
                hashing.result()
            nbytes = int(np.dtype(leaf.dtype).itemsize * np.prod(np.shape(leaf), dtype=np.int64))
            placed[jax.tree_util.keystr(path)] = {
                "shape": list(np.shape(leaf)), "dtype": str(leaf.dtype), "offset": offset,
                "nbytes": nbytes, **extra,
            }  # fmt: skip
            offset += nbytes
    return placed


def _check_addressable(state: Any) -> None:
    for key, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise ValueError(
                f"state{jax.tree_util.keystr(key)} is spread over several processes; "
                "jaxbuf.save writes one host's copy. Save sharded states with Orbax "
                "(each process writes its shards; see the README)."
            )


def save(path: str | os.PathLike, state: Any, buffer: Any = None, *,
         extra: dict | None = None) -> pathlib.Path:  # fmt: skip
    """Saves a buffer state, or a whole training state holding one, to the folder `path`,
    atomically.

    A state may hold arrays of every dtype, typed PRNG keys (`jax.random.key`,
    saved as their key data and implementation), Python `bool`, `int` and
    `float` scalars (restored as the same type), `None`, and any nesting of
    dicts, lists, tuples, NamedTuples (optax states) and `flax.struct`
    dataclasses. Anything else (a string, an object) is refused with a
    `TypeError` naming the leaf before a byte is written.

    The leaves are streamed to disk in chunks of at most `CHUNK_BYTES`: the host
    memory a save needs beyond the state is about two chunks, whatever its size.
    Concurrent saves into one folder each complete or fail cleanly; the last to
    commit is the checkpoint.

    Args:
      path: the checkpoint folder; created if needed. A previous checkpoint there
        stays readable until the new one is complete, then is replaced.
      state: the state to save.
      buffer: the buffer the state belongs to (optional); its kind and
        configuration go into the metadata, and `restore(..., buffer=...)`
        checks them.
      extra: a JSON-ready dict saved in the metadata with the state, in the same
        commit (`load_metadata(path)["extra"]`): what belongs with the state but is
        not an array, such as `jaxbuf.ray`'s per-writer ledger.

    Returns:
      The folder.

    Examples:
      >>> import tempfile, jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> folder = jaxbuf.save(tempfile.mkdtemp() + "/ckpt", state, buffer)
      >>> restored = jaxbuf.restore(folder, buffer.init({"x": jnp.float32(0)}), buffer)
      >>> restored.experience["x"].tolist(), int(restored.size)
      ([0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], 3)
    """
    _check_addressable(state)
    _checkpoint_leaves.check_storable(state)
    leaves = _checkpoint_leaves.encoded(state)  # refuses what it cannot hold before a write
    kind, config = _describe(buffer)
    extra = _check_extra(extra)
    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    data_file = f"state-{uuid.uuid4().hex}.bin"
    pending = folder / _pending_name(data_file)
    try:
        hasher = hashlib.sha256()
        with _saving(folder), open(pending, "wb") as file:
            placed = _write_data(file, leaves, hasher)
            file.flush()
            os.fsync(file.fileno())
        size = getattr(state, "size", None)
        metadata = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "jaxbuf_version": __version__,
            "kind": kind, "config": config, "state_type": type(state).__name__,
            "size": None if size is None else np.asarray(size).tolist(),
            "leaves": placed, "data_file": data_file, "sha256": hasher.hexdigest(),
            "extra": extra,
        }  # fmt: skip
        with _saving(folder):
            _commit(folder, pending, metadata)
    finally:
        pending.unlink(missing_ok=True)
    return folder


def _check_extra(extra: Any) -> dict | None:
    """`extra` as JSON will read it back; a `TypeError` before anything is written."""
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}.")
    try:
        return json.loads(json.dumps(extra, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"extra must be JSON-ready (dicts, lists, str, int, finite float, "
                        f"bool, None): {error}") from error  # fmt: skip


@contextlib.contextmanager
def _saving(folder: pathlib.Path) -> Iterator[None]:
    """Re-raises an `OSError` (a full disk, say) saying that the previous
    checkpoint is kept."""
    try:
        yield
    except OSError as error:
        raise OSError(
            error.errno,
            f"jaxbuf.save could not write {folder}: {error.strerror or error}; the previous "
            "checkpoint there is kept",
        ) from error


def _commit(folder: pathlib.Path, pending: pathlib.Path, metadata: dict) -> None:
    """Under the folder's lock: the data file into place, then the metadata (the
    commit point), then the data files and dead temporaries nothing refers to."""
    with _locked(folder):
        os.replace(pending, folder / metadata["data_file"])
        write_atomic(folder / METADATA, json.dumps(metadata, indent=2).encode())
        _fsync_folder(folder)
        for stale in [*folder.glob("state-*"), *folder.glob(".*.tmp")]:
            if stale.name != metadata["data_file"] and not _in_progress(stale):
                stale.unlink(missing_ok=True)


def _in_progress(file: pathlib.Path) -> bool:
    """Whether a temporary file may still be written: its process is alive."""
    if not file.name.endswith(".tmp"):
        return False
    try:
        pid = int(file.name.rsplit(".", 2)[-2].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


_REQUIRED = {"state_type": str, "leaves": dict, "data_file": str, "sha256": str}


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
    if metadata.get("format_version") not in (1, FORMAT_VERSION):
        raise ValueError(
            f"{file} has format version {metadata.get('format_version')}; this jaxbuf "
            f"reads versions 1 and {FORMAT_VERSION}."
        )
    for key, kind in _REQUIRED.items():
        if not isinstance(metadata.get(key), kind):
            raise ValueError(f"{file} is corrupted: {key!r} is missing or not a {kind.__name__}.")
    suffix = ".msgpack" if metadata["format_version"] == 1 else ".bin"
    if not metadata["data_file"].endswith(suffix):
        raise ValueError(
            f"{file} is corrupted: format {metadata['format_version']} keeps its data in a "
            f"{suffix} file, not {metadata['data_file']!r}."
        )
    return metadata


def load_metadata(path: str | os.PathLike) -> dict:
    """The metadata of the checkpoint in the folder `path` (see `save`).

    Examples:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> metadata = jaxbuf.io.load_metadata(jaxbuf.save(tempfile.mkdtemp() + "/c", state, buffer))
      >>> metadata["kind"], metadata["config"]["capacity"], metadata["size"]
      ('replay', 8, 3)
      >>> metadata["leaves"][".experience['x']"]
      {'shape': [8], 'dtype': 'float32', 'offset': 0, 'nbytes': 32}
    """
    return _read_metadata(pathlib.Path(path))


def _check_template(metadata: dict, template: Any, folder: pathlib.Path) -> None:
    if metadata["state_type"] != type(template).__name__:
        raise ValueError(
            f"{folder} holds a {metadata['state_type']}, but the template is a "
            f"{type(template).__name__}."
        )
    saved, wanted = metadata["leaves"], _checkpoint_leaves.wanted(template)
    if saved.keys() != wanted.keys():
        missing, extra = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
        raise ValueError(
            f"{folder} does not match the template's structure: the checkpoint lacks "
            f"{missing or 'nothing'} and has extra leaves {extra or 'none'}."
        )
    for key, want in wanted.items():
        why = _checkpoint_leaves.mismatch(saved[key] if isinstance(saved[key], dict) else {}, want)
        if why is not None:
            raise ValueError(f"{folder}: leaf {key} {why}.")


# Configuration fields that choose how results are computed, not what the state holds
# (the rollout buffer's GAE `method`): a state restores whatever they are.
HOW_ONLY = frozenset({"method"})


def _check_config(metadata: dict, buffer: Any, folder: pathlib.Path) -> None:
    """Raises naming every field where the saved configuration and the buffer's differ."""
    kind, config = _describe(buffer)
    saved = {"kind": metadata.get("kind"), **(metadata.get("config") or {})}
    wanted = {"kind": kind, **(config or {})}
    if "capacity" in saved and "steps_per_env" in wanted and "capacity" not in wanted:
        saved["steps_per_env"] = saved.pop("capacity")  # jaxbuf 0.3's name, the same number
    if metadata.get("config") is None:
        raise ValueError(
            f"{folder} was saved without its buffer, so its configuration cannot be "
            "checked; restore it without `buffer=` (shapes and dtypes are still checked)."
        )
    differing = [
        f"{name}: saved {saved.get(name, '(absent)')!r}, buffer {wanted.get(name, '(absent)')!r}"
        for name in sorted(saved.keys() | wanted.keys())
        if saved.get(name, "(absent)") != wanted.get(name, "(absent)") and name not in HOW_ONLY
    ]
    if differing:
        raise ValueError(
            f"{folder} holds a state of another configuration than the buffer's: "
            + "; ".join(differing) + "."
        )  # fmt: skip


def restore(path: str | os.PathLike, template: Any, buffer: Any = None) -> Any:
    """Restores a state saved by `save` into the structure of `template`.

    What is checked: always, that the saved state has the template's type,
    structure, and every leaf's shape and dtype, and that the data is complete
    and matches its SHA-256. With `buffer`, also that the saved buffer kind and
    configuration equal the buffer's, field by field (a trajectory buffer's
    `sequence_length` or `period`, say, which no shape shows). Without `buffer`,
    a state of another configuration with the same shapes restores silently:
    pass the buffer whenever you have it.

    The leaves are read in chunks of at most `CHUNK_BYTES` into arrays
    allocated once, so a restore needs little host memory beyond the state.

    Args:
      path: the checkpoint folder.
      template: a state of the same configuration, whose structure, shapes and
        dtypes must match the saved ones: `buffer.init(example)`, or, allocating
        nothing, `jax.eval_shape(buffer.init, example)`. Each leaf says what
        comes back (`_checkpoint_leaves`): a Python scalar the same Python type
        (the saved leaf must be one), typed keys keys, a NumPy leaf a NumPy
        array in its dtype (64 bits stay 64 bits), a JAX array or
        `jax.ShapeDtypeStruct` a JAX array in its dtype. A saved Python scalar
        restores into a scalar array; a saved 64-bit leaf into the 32-bit dtype
        that JAX gives it without x64, if every value survives (integers
        exactly, floats within range), else `restore` raises naming the leaf.
      buffer: the buffer the state is for (optional); see above. For a buffer
        with `host_memory=` leaves, pass it (or a template from `init`): those
        leaves then come back in host memory, chunk by chunk, never whole on the
        device; `jax.eval_shape` keeps no memory kinds.

    Returns:
      The restored state, as the template's leaves say.

    Raises:
      ValueError: the checkpoint does not match the template or the buffer (the
        message names every differing leaf or field), or its files are truncated
        or corrupted.

    Examples:
      >>> import tempfile, jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> example = {"x": jnp.float32(0)}
      >>> state = buffer.add(buffer.init(example), {"x": jnp.arange(3.0)})
      >>> folder = jaxbuf.save(tempfile.mkdtemp() + "/ckpt", state, buffer)
      >>> restored = jaxbuf.restore(folder, jax.eval_shape(buffer.init, example), buffer)
      >>> restored.experience["x"][:4].tolist(), int(restored.size)
      ([0.0, 1.0, 2.0, 0.0], 3)
    """
    folder = pathlib.Path(path)
    metadata, file = _open_current(folder)
    with file:
        _check_template(metadata, template, folder)
        if buffer is not None:
            _check_config(metadata, buffer, folder)
        data_file = folder / metadata["data_file"]
        if metadata["format_version"] == 1:
            return _restore_msgpack(file.read(), metadata, template, data_file)
        hosted = _host_memory.hosted_paths(template, buffer)
        return _read_leaves(file, metadata, template, data_file, hosted)


def _open_current(folder: pathlib.Path) -> tuple[dict, Any]:
    """The committed metadata and its data file, opened. A concurrent save may
    replace both between the two reads; then the newer pair is taken (an open
    file stays readable after a later save removes it)."""
    metadata = _read_metadata(folder)
    for _ in range(8):
        try:
            return metadata, open(folder / metadata["data_file"], "rb")
        except FileNotFoundError:
            newer = _read_metadata(folder)
            if newer["data_file"] == metadata["data_file"]:
                break
            metadata = newer
    raise ValueError(f"{folder} is incomplete: {metadata['data_file']} is missing.")


def _restore_msgpack(data: bytes, metadata: dict, template: Any, data_file: pathlib.Path):
    """Format 1: the whole state as flax msgpack."""
    if hashlib.sha256(data).hexdigest() != metadata["sha256"]:
        raise ValueError(
            f"{data_file} is corrupted or truncated: its SHA-256 does not match the metadata."
        )
    try:
        saved: Any = serialization.msgpack_restore(data)
        restored = serialization.from_state_dict(template, saved)
    except Exception as error:  # msgpack and flax raise many kinds
        raise ValueError(f"{data_file} does not hold the template's state: {error}") from error
    return jax.tree.map(jnp.asarray, restored)


def _read_leaves(
    file: Any, metadata: dict, template: Any, data_file: pathlib.Path, hosted: set[str]
) -> Any:
    """Format 2: each leaf read in chunks into an array allocated once, in the
    template leaf's dtype and kind (`_checkpoint_leaves.decode`); the leaves named
    in `hosted` into host memory, chunk by chunk, never whole on the device."""
    hasher = hashlib.sha256()
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    restored, offset = [], 0
    for path, template_leaf in leaves:
        name = jax.tree_util.keystr(path)
        entry = metadata["leaves"][name]
        saved = jnp.dtype(entry["dtype"])
        nbytes = saved.itemsize * int(np.prod(entry["shape"], dtype=np.int64))
        if entry.get("offset") != offset or entry.get("nbytes") != nbytes:
            raise ValueError(f"{data_file.parent / METADATA} is corrupted: the place of leaf "
                             f"{name} in the data file is wrong.")  # fmt: skip
        want = _checkpoint_leaves.stored_dtype(path, template_leaf)
        reading = _Reading(file, hasher, data_file, name, saved, want)
        on_device = _checkpoint_leaves.holder(template_leaf) == "jax"
        if name in hosted:
            restored.append(_read_host_leaf(reading, tuple(entry["shape"])))
        else:
            array = _read_leaf(reading, tuple(entry["shape"]), on_device=on_device)
            restored.append(_checkpoint_leaves.decode(entry, array, template_leaf))
        offset += nbytes
    if file.read(1) or hasher.hexdigest() != metadata["sha256"]:
        raise ValueError(
            f"{data_file} is corrupted or truncated: its SHA-256 does not match the metadata."
        )
    return jax.tree_util.tree_unflatten(treedef, restored)


@dataclasses.dataclass(frozen=True)
class _Reading:
    """One leaf being read: the open data file, its running hash, and the leaf's
    name, saved dtype and the template's dtype."""

    file: Any
    hasher: Any
    data_file: pathlib.Path
    name: str
    saved: np.dtype
    want: np.dtype

    def rows(self, count: int, shape: tuple) -> np.ndarray:
        """The next `count` rows of `shape[1:]` (all of a scalar leaf for `count`
        1 and `shape` ()), in the template's dtype."""
        nbytes = self.saved.itemsize * count * int(np.prod(shape[1:], dtype=np.int64))
        data = _read_exactly(self.file, nbytes, self.hasher, self.data_file)
        values = np.frombuffer(data, self.saved).reshape(shape and (count, *shape[1:]))
        return _checkpoint_leaves.convert(values, self.want, self.name)


def _read_exactly(file: Any, nbytes: int, hasher: Any, data_file: pathlib.Path) -> bytearray:
    data = bytearray(nbytes)
    if file.readinto(data) != nbytes:
        raise ValueError(f"{data_file} is corrupted or truncated: it ends inside a leaf.")
    hasher.update(data)
    return data


@functools.partial(jax.jit, donate_argnums=0)
def _put_rows(array: jax.Array, rows: jax.Array, start: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice_in_dim(array, rows, start, 0)


@functools.partial(jax.jit, donate_argnums=0)
def _put_host_rows(array: jax.Array, rows: jax.Array, start: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice_in_dim(array, _hosted.to_host(rows), start, 0)


def _read_host_leaf(reading: _Reading, shape: tuple) -> jax.Array:
    """A leaf kept in host memory (`host_memory=`): zeros made there, then its rows
    written chunk by chunk (each chunk alone crosses to the device and back)."""
    array = _hosted.zeros(shape, reading.want)
    row_bytes = reading.saved.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, shape[0], rows):
        chunk = reading.rows(min(rows, shape[0] - start), shape)
        array = _put_host_rows(array, chunk, np.int32(start))
    return array


def _read_leaf(reading: _Reading, shape: tuple, *, on_device: bool) -> Any:
    """One leaf: a host array, or, for a JAX leaf larger than a chunk, chunk by
    chunk into an array of zeros on the device (updated in place)."""
    row_bytes = reading.saved.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    if not on_device or not shape or row_bytes * shape[0] <= CHUNK_BYTES:
        return reading.rows(shape[0] if shape else 1, shape)
    array = jnp.zeros(shape, reading.want)
    rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, shape[0], rows):
        chunk = reading.rows(min(rows, shape[0] - start), shape)
        array = _put_rows(array, chunk, np.int32(start))
    return array
