"""On-disk datasets of experience for offline RL, appended to as training runs.

A dataset is a folder with one zarr array per item leaf (written and read by
tensorstore) and `dataset.json`, which records the leaves and how many items
are complete. `DatasetWriter.append(state)` writes the items added to a replay
buffer since the previous append: it copies just those rows to the host, hands
them to tensorstore, and returns while the disk writes go on; `flush` waits for
them and then commits the new length (atomically), so a reader never sees a
partly written tail. `read_dataset` reads whole datasets or ranges, touching
only the chunks asked for; `dataset_to_state` loads one into a buffer state.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf import _checkpoint, _config, _export, _storage, _validation
from jaxbuf._storage import RingState
from jaxbuf._types import Buffer

INDEX = "dataset.json"
FORMAT = "jaxbuf-dataset"


def _flat_columns(tree: Any, what: str) -> dict[str, Any]:
    """Leaves of a (nested) dict by '/'-joined key, the layout of a dataset."""
    columns = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not all(
            isinstance(key, jax.tree_util.DictKey) and isinstance(key.key, str) for key in path
        ):
            raise TypeError(
                f"{what}{jax.tree_util.keystr(path)}: datasets store items that are "
                "(nested) dicts with string keys."
            )
        columns[_export.column_name(path)] = leaf
    return columns


def _nest(columns: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in columns.items():
        *parents, leaf = name.split("/")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def _open(folder: pathlib.Path, name: str, spec: dict | None = None):
    import tensorstore as ts

    store = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder / name)}}
    if spec is None:
        return ts.open(store).result()
    return ts.open(store | {"metadata": spec}, create=True, delete_existing=True).result()


def _read_index(folder: pathlib.Path) -> dict:
    file = folder / INDEX
    if not file.exists():
        raise FileNotFoundError(f"{folder} holds no jaxbuf dataset (no {INDEX}).")
    index = json.loads(file.read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"{file} is not a jaxbuf dataset index.")
    return index


@jax.jit
def _take_rows(experience: Any, rows: jax.Array) -> Any:
    """The given rows of every leaf, gathered on the device in one call."""
    return jax.tree.map(lambda x: x[rows], experience)


class DatasetWriter:
    """Appends what a replay buffer receives to an on-disk dataset.

    Call `append(state)` at least once every `capacity` added items (between
    jitted training chunks, say); items overwritten in the buffer before an
    append are lost, and `append` raises rather than skipping them silently.

    Args:
      path: the dataset folder; an existing dataset there is replaced.
      state: a replay buffer state of the buffer to follow; the dataset takes its
        item structure (a dict of arrays, possibly nested) and the items it
        holds from now on. Items already stored are written only with
        `include_stored=True`.
      include_stored: whether the first `append` also writes the items the buffer
        already holds.
      chunk_items: items per zarr chunk.

    Example:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(4, 2)
      >>> state = buffer.init({"x": jnp.float32(0)})
      >>> writer = jaxbuf.DatasetWriter(tempfile.mkdtemp() + "/data", state)
      >>> for start in range(0, 9, 3):
      ...     state = buffer.add(state, {"x": jnp.arange(start, start + 3.0)})
      ...     _ = writer.append(state)
      >>> writer.flush()
      >>> jaxbuf.read_dataset(writer.path)["x"].tolist()
      [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    """

    def __init__(
        self,
        path: str | os.PathLike,
        state: RingState,
        *,
        include_stored: bool = False,
        chunk_items: int = 4096,
    ):
        if not isinstance(state, RingState) or np.ndim(state.size) != 0:
            raise TypeError("DatasetWriter follows one (not vectorized) replay buffer state.")
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        chunk_items = _validation.check_int("chunk_items", chunk_items)
        columns = _flat_columns(state.experience, "state.experience")
        self._arrays = {}
        for name, column in columns.items():
            item_shape = list(column.shape[1:])
            spec = {
                "dtype": np.dtype(column.dtype).str if column.dtype != jnp.bfloat16 else "bfloat16",
                "shape": [0, *item_shape],
                "chunks": [chunk_items, *item_shape],
            }
            self._arrays[name] = _open(self.path, name, spec)
        self._leaves = {
            k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype)} for k, v in columns.items()
        }
        self._length = 0  # items handed to tensorstore
        self._allocated = 0
        self._pending: list = []
        self._seen = int(state.added) - (int(state.size) if include_stored else 0)
        self._commit_index()

    @property
    def length(self) -> int:
        """The number of items appended so far (durable after `flush`)."""
        return self._length

    def append(self, state: RingState) -> int:
        """Writes the items added to `state` since the previous append; returns how many.

        Blocks only for copying those items from the device; the disk writes
        continue in the background until `flush`.
        """
        capacity = _storage.capacity_of(state.experience)
        added = int(state.added)
        new = (added - self._seen) % 2**32
        if new > capacity:
            raise ValueError(
                f"{new} items were added since the last append, but the buffer keeps only "
                f"{capacity}: {new - capacity} were overwritten before they could be written. "
                "Append at least once every `capacity` added items."
            )
        if new == 0:
            return 0
        rows = (int(state.position) - new + np.arange(new)) % capacity
        # Pad to a power of two (repeating valid rows) so that few sizes compile.
        padded = np.resize(rows, 1 << (new - 1).bit_length()).astype(np.int32)
        host = jax.tree.map(lambda x: x[:new], jax.device_get(_take_rows(state.experience, padded)))
        start, stop = self._length, self._length + new
        if stop > self._allocated:
            self._allocated = max(stop, 2 * self._allocated)
            for name, array in self._arrays.items():
                shape = [self._allocated, *array.shape[1:]]
                self._arrays[name] = array.resize(
                    exclusive_max=shape, resize_metadata_only=True
                ).result()
        for name, column in _flat_columns(host, "state.experience").items():
            column = np.asarray(column)  # kept alive with its write until flush
            self._pending.append((self._arrays[name][start:stop].write(column), column))
        self._length, self._seen = stop, added
        return new

    def flush(self) -> None:
        """Waits for the pending writes, then commits the dataset's new length."""
        for write, _ in self._pending:
            write.commit.result()
        self._pending.clear()
        self._commit_index()

    def _commit_index(self) -> None:
        index = {
            "format": FORMAT,
            "format_version": 1,
            "length": self._length,
            "leaves": self._leaves,
        }
        _checkpoint.write_atomic(self.path / INDEX, json.dumps(index, indent=2).encode())


def read_dataset(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> dict:
    """Reads items `[start, stop)` of a dataset (all by default) as NumPy arrays.

    Only the chunks holding those items are read.

    Args:
      path: the dataset folder.
      start: the first item.
      stop: one past the last item; the dataset's committed length when None.

    Returns:
      The items, a (nested) dict of arrays with leading axis `stop - start`.

    Example:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(5.0)})
      >>> writer = jaxbuf.DatasetWriter(tempfile.mkdtemp() + "/data", state, include_stored=True)
      >>> _ = writer.append(state)
      >>> writer.flush()
      >>> jaxbuf.read_dataset(writer.path, 1, 4)["x"].tolist()
      [1.0, 2.0, 3.0]
    """
    folder = pathlib.Path(path)
    index = _read_index(folder)
    length = index["length"]
    stop = length if stop is None else stop
    if not 0 <= start <= stop <= length:
        raise ValueError(
            f"the range [{start}, {stop}) is not within the {length} items of {folder}."
        )
    reads = {name: _open(folder, name)[start:stop].read() for name in index["leaves"]}
    return _nest({name: read.result() for name, read in reads.items()})


def dataset_to_state(
    path: str | os.PathLike,
    buffer: Buffer,
    start: int = 0,
    stop: int | None = None,
    *,
    truncate_ok: bool = False,
) -> RingState:
    """Loads items `[start, stop)` of a dataset into a state of `buffer`, in order.

    Args:
      path: the dataset folder.
      buffer: a replay buffer whose items have the dataset's structure.
      start: the first item.
      stop: one past the last item (the end by default).
      truncate_ok: keep the newest `capacity` items when more are asked for.

    Returns:
      A state holding the items, as if they had been added one by one.

    Example:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(5.0)})
      >>> writer = jaxbuf.DatasetWriter(tempfile.mkdtemp() + "/data", state, include_stored=True)
      >>> _ = writer.append(state)
      >>> writer.flush()
      >>> offline = jaxbuf.dataset_to_state(writer.path, jaxbuf.make_replay_buffer(4, 2), 2)
      >>> offline.experience["x"].tolist(), int(offline.size)
      ([2.0, 3.0, 4.0, 0.0], 3)
    """
    data = jax.tree.map(jnp.asarray, read_dataset(path, start, stop))
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), data)
    state = buffer.init(spec)
    (count,) = _validation.check_batch(spec, data, [("N", None)], what="the dataset")
    _storage.check_fits(count, buffer.config.capacity, truncate_ok, "the dataset range")
    filler = _config.buffer_from_config({**buffer.config, "truncate_ok": True})
    return filler.add(state, data)
