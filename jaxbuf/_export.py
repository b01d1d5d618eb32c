"""Getting data out: stored items as NumPy columns, files, and Torch tensors."""

from __future__ import annotations

import csv
import os
import pathlib
from typing import Any

import jax
import numpy as np

from jaxbuf._types import PyTree


def column_name(path: tuple) -> str:
    """A leaf path as a column name: its keys joined by '/' (`obs`, `extras/mask`)."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
    return "/".join(parts)


def _columns(tree: PyTree) -> dict[str, np.ndarray]:
    return {
        column_name(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


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

    Column names are the leaf paths joined by `/` (`obs`, `extras/mask`).

    Args:
      state: the state of any jaxbuf buffer.

    Returns:
      A dict of arrays with a common leading axis.

    Example:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(5, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> jaxbuf.stored_items(state)["x"].tolist()
      [0.0, 1.0, 2.0]
    """
    host = jax.device_get(state)
    if not hasattr(host, "stored_rows"):
        raise TypeError(f"stored_items takes a jaxbuf buffer state, got {type(state).__name__}.")
    labels, index, tree = host.stored_rows()
    return {**labels, **{k: v[index] for k, v in _columns(tree).items()}}


def _write_csv(path: pathlib.Path, columns: dict[str, np.ndarray]) -> None:
    header, parts = [], []
    for name, column in columns.items():
        flat = column.reshape(len(column), -1)
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
    (needs torch).

    Args:
      path: the file to write.
      state: a jaxbuf buffer state.

    Returns:
      The path written.

    Example:
      >>> import tempfile, numpy as np, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0)})
      >>> path = jaxbuf.export(tempfile.mkdtemp() + "/items.npz", state)
      >>> np.load(path)["x"].tolist()
      [0.0, 1.0, 2.0]
    """
    path = pathlib.Path(path)
    columns = stored_items(state)
    if path.suffix == ".npz":
        np.savez(path, allow_pickle=False, **columns)
    elif path.suffix == ".csv":
        _write_csv(path, columns)
    elif path.suffix == ".pt":
        torch = _import_torch()
        torch.save({k: torch.from_numpy(np.array(v)) for k, v in columns.items()}, path)
    else:
        raise ValueError(f"export writes .npz, .csv or .pt files, got {path.name!r}.")
    return path


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

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> state = buffer.add(buffer.init({"x": jnp.zeros(3)}), {"x": jnp.ones((4, 3))})
      >>> tensors = jaxbuf.to_torch(buffer.sample(state, jax.random.key(0)).experience)
      >>> type(tensors["x"]).__name__, tuple(tensors["x"].shape), str(tensors["x"].dtype)
      ('Tensor', (2, 3), 'torch.float32')
    """
    torch = _import_torch()
    return jax.tree.map(torch.from_dlpack, tree)
