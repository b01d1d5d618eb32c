"""Reading Flashbax Vaults: the on-disk datasets of Flashbax (and og-marl).

A Vault is a folder `<rel_dir>/<vault_name>/<vault_uid>` holding
`metadata.json` (the format version and every leaf's shape and dtype) and one
zarr array per leaf in an OCDBT key-value store, named by the leaf's keys each
followed by `.` (`obs.`, `extras.done.`), plus `vault_index`, the number of
time steps written. Each leaf is `[B, T, ...]`: `B` trajectories (Flashbax's
`add_batch_size`, environments or agents) of `T` steps.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core import storage as _storage
from jaxbuf.core.contracts import Layout
from jaxbuf.core.records import Buffer, PyTree
from jaxbuf.kinds import replay as _replay

SUPPORTED_MAJOR = 1  # Flashbax writes version 1.2; og-marl's Vaults are 1.x too


def _open(folder: pathlib.Path, name: str):
    import tensorstore as ts

    kvstore = {"driver": "ocdbt", "base": f"file://{folder}", "path": name}
    return ts.open({"driver": "zarr", "kvstore": kvstore}).result()


def _metadata(folder: pathlib.Path) -> dict:
    file = folder / "metadata.json"
    if not file.exists():
        raise FileNotFoundError(
            f"{folder} holds no Flashbax Vault (no metadata.json); pass the folder "
            "<rel_dir>/<vault_name>/<vault_uid>."
        )
    try:
        metadata = json.loads(file.read_text())
        version = metadata["version"]
        shapes, dtypes = metadata["structure_shape"], metadata["structure_dtype"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{file} is not a Flashbax Vault's metadata ({error!r}).") from None
    if not isinstance(version, (int, float)) or int(version) != SUPPORTED_MAJOR:
        raise ValueError(
            f"{folder} is a Flashbax Vault of version {version!r}; jaxbuf reads version "
            f"{SUPPORTED_MAJOR}.x."
        )
    return {"shapes": shapes, "dtypes": dtypes}


def _leaves(shapes: Any, dtypes: Any, keys: tuple = ()) -> Iterator[tuple[tuple, str, str]]:
    """`(keys, shape string, dtype name)` of every leaf of the nested structure."""
    if isinstance(shapes, dict):
        for key, shape in shapes.items():
            yield from _leaves(shape, dtypes[key], (*keys, key))
    else:
        yield keys, shapes, dtypes


def _nest(pairs: list[tuple[tuple, Any]]) -> dict:
    tree: dict = {}
    for keys, value in pairs:
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return tree


def read_vault(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> dict:
    """Reads time steps `[start, stop)` of a Flashbax Vault as NumPy arrays.

    Args:
      path: the Vault's folder, `<rel_dir>/<vault_name>/<vault_uid>` (the one
        holding its `metadata.json`).
      start: the first time step.
      stop: one past the last; the steps written by default.

    Returns:
      A nested dict (the Vault's structure) of arrays `[B, stop - start, ...]`
      with the dtypes the Vault records.

    Raises:
      ValueError: the folder is not a Vault of a supported version (1.x), the
        range is outside it, or a leaf does not have its recorded dtype.

    Examples:
      >>> import jaxbuf
      >>> jaxbuf.io.read_vault("/no/such/vault")
      Traceback (most recent call last):
      ...
      FileNotFoundError: /no/such/vault holds no Flashbax Vault (no metadata.json); ...
    """
    folder = pathlib.Path(path).absolute()
    structure = _metadata(folder)
    length = int(_open(folder, "vault_index").read().result()[0])
    stop = length if stop is None else stop
    if not 0 <= start <= stop <= length:
        raise ValueError(
            f"the range [{start}, {stop}) is not within the {length} steps of {folder}."
        )
    pairs = []
    for keys, _, dtype in _leaves(structure["shapes"], structure["dtypes"]):
        data = _open(folder, "".join(f"{key}." for key in keys))[:, start:stop].read().result()
        if np.dtype(data.dtype) != jnp.dtype(dtype):
            raise ValueError(f"{folder}: leaf {'/'.join(keys)} holds {data.dtype}, but the "
                             f"metadata says {dtype}.")  # fmt: skip
        pairs.append((keys, np.asarray(data)))
    return _nest(pairs)


def vault_to_state(
    path: str | os.PathLike,
    buffer: Buffer,
    start: int = 0,
    stop: int | None = None,
    *,
    truncate_ok: bool = False,
) -> Any:
    """Loads time steps `[start, stop)` of a Flashbax Vault into a state of `buffer`.

    A trajectory, transition or episode buffer with `num_envs = B` takes the
    Vault's `B` trajectories as its environments; a replay buffer takes every
    step as an item, time-major (step `t` of every trajectory, then `t + 1`).
    The Vault's structure must be the buffer's items (a transition buffer's:
    the `Transition` field names).

    Args:
      path: the Vault's folder (see `read_vault`).
      buffer: a sampled buffer (not vectorized).
      start: the first time step.
      stop: one past the last; the steps written by default.
      truncate_ok: keep the newest `capacity` steps (items) when more are read.

    Returns:
      A state holding the steps, as if they had been added in order.

    Examples:
      >>> import contextlib, io, tempfile, jax.numpy as jnp, flashbax, jaxbuf
      >>> from flashbax.vault import Vault
      >>> fbx = flashbax.make_trajectory_buffer(add_batch_size=2, sample_batch_size=2,
      ...     sample_sequence_length=2, period=1, min_length_time_axis=2, max_length_time_axis=8)
      >>> steps = {"x": jnp.arange(10, dtype=jnp.int32).reshape(2, 5)}
      >>> state = fbx.add(fbx.init({"x": jnp.int32(0)}), steps)
      >>> with contextlib.redirect_stdout(io.StringIO()):  # Flashbax prints
      ...     vault = Vault("demo", state.experience, rel_dir=tempfile.mkdtemp(), vault_uid="run")
      ...     _ = vault.write(state)
      >>> buffer = jaxbuf.make_trajectory_buffer(2, 16, 4, 2)
      >>> restored = jaxbuf.io.vault_to_state(vault._base_path, buffer)
      >>> restored.experience["x"][:, :5].tolist(), int(restored.size)
      ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], 5)
    """
    if not isinstance(getattr(buffer, "layout", None), Layout):
        kind = getattr(getattr(buffer, "config", None), "kind", None)
        raise TypeError(f"vault_to_state fills a sampled buffer, got {type(buffer).__name__} "
                        f"of kind {kind!r}.")  # fmt: skip
    data: PyTree = jax.tree.map(jnp.asarray, read_vault(path, start, stop))
    trajectories, steps = jax.tree.leaves(data)[0].shape[:2]
    capacity = buffer.config.get("steps_per_env", buffer.config.get("capacity"))
    if buffer.layout.steps_axis == 0:  # items, not steps per environment
        data = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), data)
        return _replay.fill(buffer, data, truncate_ok, "the Vault range")
    if trajectories != buffer.config.num_envs:
        raise ValueError(f"the Vault holds {trajectories} trajectories, but the buffer has "
                         f"num_envs={buffer.config.num_envs}.")  # fmt: skip
    _storage.check_fits(steps, capacity, truncate_ok, "the Vault range")
    data = jax.tree.map(lambda x: x[:, max(0, steps - capacity) :], data)
    return buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], data)), data)
