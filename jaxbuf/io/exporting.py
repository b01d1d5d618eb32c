"""Getting data out: stored items as NumPy columns, files, and Torch tensors."""

from __future__ import annotations

import csv
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.records import PyTree

# Columns that exports and datasets add beside the user's leaves.
LABELS = ("buffer", "row", "env", "time", "advantage", "return", "final_obs", "priority_leaf")


def _key_text(key: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def column_name(path: tuple) -> str:
    """A leaf path as a column name, collision-free by construction.

    Each key is escaped (`%` as `%25`, `/` as `%2F`) and the keys are joined by
    `/` (`obs`, `extras/mask`, `a%2Fb` for the key `'a/b'`). A first key equal to
    one of the `LABELS` columns has its first letter escaped too (`time` becomes
    `%74ime`). `urllib.parse.unquote` of each part gives the key back.
    """
    parts = [_key_text(key).replace("%", "%25").replace("/", "%2F") for key in path]
    if parts and parts[0] in LABELS:
        parts[0] = f"%{ord(parts[0][0]):02X}{parts[0][1:]}"
    return "/".join(parts)


def columns(tree: PyTree, what: str = "state.experience") -> dict[str, Any]:
    """The leaves of `tree` by `column_name`; raises if two leaves would share one."""
    named: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = column_name(path)
        if name in named:
            raise ValueError(
                f"{what}{jax.tree_util.keystr(path)} and another leaf both become the column "
                f"{name!r}; give them distinct keys."
            )
        named[name] = leaf
    return named


def stored_items(state: Any) -> dict[str, np.ndarray]:
    """The valid stored items of a state, in storage order, as NumPy columns.

    - A replay state gives rows `[0, size)` of every leaf; a vectorized state
      gives each buffer's rows in turn, with `buffer` and `row` columns; a queue
      its queued items, oldest first.
    - A rollout state gives steps `[0, size)` time-major (time, then
      environment), with `time`, `env`, `advantage` and `return` columns.
    - A trajectory, transition or episode state gives its stored steps,
      environment after environment, each oldest first, with `env` and `time`
      (0 for the oldest stored step) columns. A transition state's final
      observations stay in `state.side.experience`.

    Column names are the leaf paths joined by `/` (`obs`, `extras/mask`), each
    key escaped so that no two leaves, and no leaf and label column, share a
    name (see `column_name`: `%` and `/` in keys become `%25` and `%2F`, and a
    leaf named like a label column, e.g. `time`, becomes `%74ime`).

    Args:
      state: the state of any jaxbuf buffer.

    Returns:
      A dict of arrays with a common leading axis.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(5, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> jaxbuf.io.stored_items(state)["x"].tolist()
      [0.0, 1.0, 2.0]
    """
    host = jax.device_get(state)
    if not hasattr(host, "stored_rows"):
        raise TypeError(f"stored_items takes a jaxbuf buffer state, got {type(state).__name__}.")
    labels, index, tree = host.stored_rows()
    return {**labels, **{k: np.asarray(v)[index] for k, v in columns(tree).items()}}


def _write_csv(path: pathlib.Path, table: dict[str, np.ndarray]) -> None:
    header, parts = [], []
    for name, column in table.items():
        flat = column.reshape(len(column), int(np.prod(column.shape[1:])))
        if column.ndim == 1:
            header.append(name)
        else:
            header.extend(f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(column.shape[1:]))
        parts.append(flat.astype(np.int8) if flat.dtype == np.bool_ else flat)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for row in zip(*(part.tolist() for part in parts), strict=True):
            writer.writerow([value for chunk in row for value in chunk])


def export(path: str | os.PathLike, state: Any) -> pathlib.Path:
    """Writes the valid stored items (see `stored_items`) to `.npz`, `.csv` or `.pt`.

    The format follows the file's suffix: `.npz` holds one array per column;
    `.csv` one row per item, multi-dimensional leaves spread over columns
    `name[i,j]`, booleans as 0/1; `.pt` a dict of tensors for `torch.load`
    (needs torch). Every dtype round-trips: bfloat16 and the other ml_dtypes,
    which NumPy lacks, are stored as their bits in `.npz` (read them back with
    `read_export`) and as native tensors in `.pt`. An empty state writes empty
    columns (a header only, in `.csv`).

    Args:
      path: the file to write.
      state: a jaxbuf buffer state.

    Returns:
      The path written.

    Examples:
      >>> import tempfile, numpy as np, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> path = jaxbuf.io.export(tempfile.mkdtemp() + "/items.npz", state)
      >>> np.load(path)["x"].tolist()
      [0.0, 1.0, 2.0]
    """
    path = pathlib.Path(path)
    if path.suffix not in (".npz", ".csv", ".pt"):
        raise ValueError(f"export writes .npz, .csv or .pt files, got {path.name!r}.")
    table = stored_items(state)
    if path.suffix == ".csv":
        _write_csv(path, table)
        return path
    # NumPy and Torch know no ml_dtypes (bfloat16, float8, int4): write their bits.
    special = {k: v.dtype.name for k, v in table.items() if v.dtype.kind == "V"}
    bits = {k: v.view(f"u{v.dtype.itemsize}") if k in special else v for k, v in table.items()}
    if path.suffix == ".npz":
        extra = {DTYPES: np.array(json.dumps(special))} if special else {}
        np.savez(path, allow_pickle=False, **bits, **extra)
    else:
        torch = _import_torch()
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in bits.items()}
        for name, dtype in special.items():
            tensors[name] = tensors[name].view(getattr(torch, dtype))
        torch.save(tensors, path)
    return path


# The .npz entry naming the ml_dtypes columns; `column_name` never makes it ('%'
# followed by two hex digits only).
DTYPES = "%dtypes"


def read_export(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads an `.npz` file written by `export` back, with every dtype restored.

    NumPy has no bfloat16 (nor the other ml_dtypes), so `export` stores such
    columns as their bits and notes their dtypes; `np.load` alone gives those
    columns as unsigned integers.

    Args:
      path: an `.npz` file written by `export`.

    Returns:
      The columns, as `stored_items` gave them.

    Examples:
      >>> import tempfile, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.bfloat16(0)}), {"x": jnp.ones(2, jnp.bfloat16)})
      >>> path = jaxbuf.io.export(tempfile.mkdtemp() + "/items.npz", state)
      >>> columns = jaxbuf.io.read_export(path)
      >>> columns["x"].dtype, columns["x"].tolist()
      (dtype(bfloat16), [1.0, 1.0])
    """
    with np.load(path, allow_pickle=False) as data:
        table = {name: data[name] for name in data.files}
    special = json.loads(str(table.pop(DTYPES))) if DTYPES in table else {}
    for name, dtype in special.items():
        table[name] = table[name].view(jnp.dtype(dtype))
    return table


def _import_torch():
    try:
        import torch
    except ImportError:
        raise ImportError(
            "this needs PyTorch; install it with `pip install torch` (on CPU machines "
            "`pip install torch==2.13.0` takes the local CPU build)."
        ) from None
    return torch


def to_torch(tree: PyTree) -> PyTree:
    """Turns the arrays of a pytree (a sampled batch, say) into Torch tensors.

    Uses DLPack, so a tensor shares the JAX array's memory where the two
    frameworks' devices agree (always on CPU): nothing is copied. Do not write
    into the tensors: JAX arrays are immutable. A sampled batch is a fresh array;
    tensors made from a buffer state's own storage, though, see it change when a
    donated `add` writes in place.

    Args:
      tree: a pytree of JAX arrays, such as `sample(state, key).experience`.

    Returns:
      The same pytree with `torch.Tensor` leaves.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.zeros(3)}), {"x": jnp.ones((4, 3))})
      >>> tensors = jaxbuf.io.to_torch(buffer.sample(state, jax.random.key(0)).experience)
      >>> type(tensors["x"]).__name__, tuple(tensors["x"].shape), str(tensors["x"].dtype)
      ('Tensor', (2, 3), 'torch.float32')
    """
    torch = _import_torch()
    return jax.tree.map(torch.from_dlpack, tree)
