"""On-disk datasets of experience for offline RL, appended to as training runs.

A dataset is a folder with one zarr array per item leaf (written and read by
tensorstore) and `dataset.json`, which records the leaves and how many items
are complete. `DatasetWriter.append(state)` writes what was added to a sampled
buffer (replay, trajectory, transition, episode) since the previous append: it
copies just those rows to the host, hands
them to tensorstore, and returns while the disk writes go on; `flush` waits for
them and then commits the new length (atomically), so a reader never sees a
partly written tail. `read_dataset` reads whole datasets or ranges, touching
only the chunks asked for; `dataset_to_state` loads one into a buffer state.
"""

from __future__ import annotations

import json
import os
import pathlib
import urllib.parse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Layout
from jaxbuf.core.records import Buffer
from jaxbuf.core.samplers import PriorityState
from jaxbuf.core.storage import RingState, TimeRingState
from jaxbuf.core.sumtree import tree as _sumtree
from jaxbuf.io import checkpoint as _checkpoint
from jaxbuf.io import exporting as _export
from jaxbuf.kinds import replay as _replay

INDEX = "dataset.json"
FORMAT = "jaxbuf-dataset"


def _flat_columns(tree: Any, what: str) -> dict[str, Any]:
    """The leaves of a (nested) dict with string keys by `_export.column_name`."""
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not all(
            isinstance(key, jax.tree_util.DictKey) and isinstance(key.key, str) for key in path
        ):
            raise TypeError(
                f"{what}{jax.tree_util.keystr(path)}: datasets store items that are "
                "(nested) dicts with string keys."
            )
    return _export.columns(tree, what)


def _keys(name: str, beside_labels: bool) -> list[str]:
    """The keys of a column name (see `_export.column_name`). Beside the label
    columns, a first key escaped because it is named like one stays escaped."""
    parts = name.split("/")
    keys = [urllib.parse.unquote(part) for part in parts]
    if beside_labels and keys[0] in _export.LABELS and parts[0] != keys[0]:
        keys[0] = parts[0]
    return keys


def _nest(columns: dict[str, Any], beside_labels: bool = True) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in columns.items():
        *parents, leaf = _keys(name, beside_labels)
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


def _ring_axis(state: Any) -> int:
    return 1 if isinstance(state, TimeRingState) else 0


@jax.jit
def _take_rows(state: Any, rows: jax.Array) -> dict[str, Any]:
    """The given rows (every environment's, for a time ring) of the stored leaves and,
    where the state keeps them, final observations and priority leaves."""
    if not isinstance(state, TimeRingState):
        columns = {"": _storage.read(state.experience, rows)}
        if isinstance(state.sampler, PriorityState):
            columns["priority_leaf"] = _sumtree.leaves(state.sampler.tree, rows)
        return columns
    envs = jnp.arange(jax.tree.leaves(state.experience)[0].shape[0])[:, None]
    where = envs, rows[None, :]
    columns = {"": _storage.read(state.experience, *where)}
    side_columns = getattr(state.side, "dataset_columns", None)
    if side_columns is not None:  # what the kind keeps beside its steps (final observations)
        columns |= side_columns(*where)
    if isinstance(state.sampler, PriorityState) and getattr(state.side, "priorities_by_step", True):
        slots = envs * _storage.capacity_of(state.experience, 1) + rows[None, :]
        columns["priority_leaf"] = _sumtree.leaves(state.sampler.tree, slots)
    # time-major rows: step after step, environment after environment
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), columns)


def _newest(state: Any, new: int, first_time: int = 0) -> dict[str, np.ndarray]:
    """The `new` newest items (or steps of every environment) as host columns."""
    capacity = _storage.capacity_of(state.experience, _ring_axis(state))
    rows = (int(state.position) - new + np.arange(new)) % capacity
    # Pad to a power of two (repeating valid rows) so that few sizes compile.
    padded = np.resize(rows, 1 << (new - 1).bit_length()).astype(np.int32)
    taken = jax.device_get(_take_rows(state, jnp.asarray(padded)))
    per_row = 1 if _ring_axis(state) == 0 else jax.tree.leaves(state.experience)[0].shape[0]
    taken = jax.tree.map(lambda x: np.asarray(x[: new * per_row]), taken)
    columns = _flat_columns(taken.pop(""), "state.experience")
    if per_row > 1:
        time, env = np.divmod(np.arange(new * per_row), per_row)
        columns |= {"env": env.astype(np.int32), "time": (first_time + time).astype(np.int64)}
    if "final_obs" in taken:
        final = _flat_columns(taken.pop("final_obs"), "final_obs")
        columns |= {"/".join(("final_obs", name)) if name else "final_obs": v
                    for name, v in final.items()}  # fmt: skip
    return columns | taken


class DatasetWriter:
    """Appends what a sampled buffer receives to an on-disk dataset.

    Call `append(state)` at least once every `capacity` added items (or steps
    per environment) (between jitted training chunks, say); items overwritten in
    the buffer before an append are lost, and `append` raises rather than
    skipping them silently.

    A row is one item of a replay buffer, or one step of one environment of the
    per-environment kinds, written time-major (each step of every environment in
    turn) with `env` (int32) and `time` (int64, steps since the writer's first)
    columns. A transition buffer's rows add `final_obs/...`: the final
    observation where the step ended an episode (what storage holds elsewhere).
    Under a prioritized sampler (but for episode buffers, whose priorities are
    per episode) rows add `priority_leaf`: the item's (or window start's) sum-tree
    leaf `priority ** priority_exponent` when appended, 0 where it could not be
    drawn yet. Column names escape the item keys (see `jaxbuf.io.stored_items`):
    `%` and `/` in a key become `%25` and `%2F`, and a leaf named like one of
    these columns (`time`, say) becomes `%74ime`; `read_dataset` gives the keys
    back, but for those, which it leaves escaped beside the columns they are
    named like (`dataset_to_state` restores them).

    Args:
      path: the dataset folder; an existing dataset there is replaced.
      state: the state of the (not vectorized) buffer to follow; the dataset
        takes its item structure (a dict of arrays, possibly nested) and what it
        receives from now on. What is already stored is written only with
        `include_stored=True`.
      include_stored: whether the first `append` also writes the items the buffer
        already holds.
      chunk_items: items per zarr chunk.

    Examples:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(4, 2)
      >>> state = buffer.init({"x": jnp.float32(0)})
      >>> writer = jaxbuf.io.DatasetWriter(tempfile.mkdtemp() + "/data", state)
      >>> for start in range(0, 9, 3):
      ...     state = buffer.add(state, {"x": jnp.arange(start, start + 3.0)})
      ...     _ = writer.append(state)
      >>> writer.flush()
      >>> jaxbuf.io.read_dataset(writer.path)["x"].tolist()
      [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    """

    def __init__(
        self,
        path: str | os.PathLike,
        state: RingState | TimeRingState,
        *,
        include_stored: bool = False,
        chunk_items: int = 4096,
    ):
        if not isinstance(state, (RingState, TimeRingState)) or np.ndim(state.size) != 0:
            raise TypeError(
                "DatasetWriter follows the state of one sampled buffer (replay, trajectory, "
                f"transition or episode; not vectorized), got {type(state).__name__}."
            )
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        chunk_items = _validation.check_int("chunk_items", chunk_items)
        columns = _newest(state, 1)  # one row of every column, for the layout
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
        self._length = 0  # rows handed to tensorstore
        self._allocated = 0
        self._pending: list = []
        self._seen = int(state.added) - (int(state.size) if include_stored else 0)
        self._commit_index()

    @property
    def length(self) -> int:
        """The number of rows appended so far (durable after `flush`)."""
        return self._length

    def append(self, state: RingState | TimeRingState) -> int:
        """Writes what was added to `state` since the previous append; returns how many
        items (or steps per environment) that was.

        Blocks only for copying those rows from the device; the disk writes
        continue in the background until `flush`.
        """
        capacity = _storage.capacity_of(state.experience, _ring_axis(state))
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
        columns = _newest(state, new, first_time=self._seen)
        count = len(next(iter(columns.values())))
        start, stop = self._length, self._length + count
        if stop > self._allocated:
            self._allocated = max(stop, 2 * self._allocated)
            for name, array in self._arrays.items():
                shape = [self._allocated, *array.shape[1:]]
                self._arrays[name] = array.resize(
                    exclusive_max=shape, resize_metadata_only=True
                ).result()
        for name, column in columns.items():  # kept alive with its write until flush
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

    Examples:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(5.0)})
      >>> writer = jaxbuf.io.DatasetWriter(tempfile.mkdtemp() + "/data", state, include_stored=True)
      >>> _ = writer.append(state)
      >>> writer.flush()
      >>> jaxbuf.io.read_dataset(writer.path, 1, 4)["x"].tolist()
      [1.0, 2.0, 3.0]
    """
    return _nest(_read_columns(path, start, stop))


def _read_columns(path: str | os.PathLike, start: int, stop: int | None) -> dict[str, Any]:
    """Columns `[start, stop)` of a dataset by name."""
    folder = pathlib.Path(path)
    index = _read_index(folder)
    length = index["length"]
    stop = length if stop is None else stop
    if not 0 <= start <= stop <= length:
        raise ValueError(
            f"the range [{start}, {stop}) is not within the {length} items of {folder}."
        )
    reads = {name: _open(folder, name)[start:stop].read() for name in index["leaves"]}
    return {name: read.result() for name, read in reads.items()}


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
      buffer: a replay buffer whose items have the dataset's structure (the
        dataset's label columns, such as `priority_leaf`, are left out).
      start: the first item.
      stop: one past the last item (the end by default).
      truncate_ok: keep the newest `capacity` items when more are asked for.

    Returns:
      A state holding the items, as if they had been added one by one.

    Examples:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(5.0)})
      >>> writer = jaxbuf.io.DatasetWriter(tempfile.mkdtemp() + "/data", state, include_stored=True)
      >>> _ = writer.append(state)
      >>> writer.flush()
      >>> offline = jaxbuf.io.dataset_to_state(writer.path, jaxbuf.make_replay_buffer(4, 2), 2)
      >>> offline.experience["x"].tolist(), int(offline.size)
      ([2.0, 3.0, 4.0, 0.0], 3)
    """
    layout = getattr(buffer, "layout", None)
    if not isinstance(layout, Layout) or layout.steps_axis != 0:  # a buffer of items
        raise TypeError(
            f"dataset_to_state fills a replay buffer, got {type(buffer).__name__} of kind "
            f"{getattr(getattr(buffer, 'config', None), 'kind', None)!r}."
        )
    columns = _read_columns(path, start, stop)
    items = {name: v for name, v in columns.items() if name.split("/")[0] not in _export.LABELS}
    data = jax.tree.map(jnp.asarray, _nest(items, beside_labels=False))
    return _replay.fill(buffer, data, truncate_ok, "the dataset range")
