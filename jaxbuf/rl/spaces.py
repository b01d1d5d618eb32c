"""Example items from Gymnasium and gymnax spaces (both optional imports)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.records import PyTree
from jaxbuf.core.validation import leaf_shape_dtype

_SUPPORTED = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")


def _space_kind(space: Any) -> str | None:
    """The space's class name if it is a Gymnasium/gym/gymnax space, else None."""
    for cls in type(space).__mro__:
        module = cls.__module__.split(".")[0]
        if module in ("gymnasium", "gym", "gymnax") and cls.__name__ in _SUPPORTED:
            return cls.__name__
    return None


def _convert(space: Any, path: str) -> PyTree:
    kind = _space_kind(space)
    if kind in ("Box", "Discrete", "MultiDiscrete", "MultiBinary"):
        return jnp.zeros(tuple(space.shape), jax.dtypes.canonicalize_dtype(space.dtype))
    if kind == "Dict" or isinstance(space, dict):
        items = space.items() if isinstance(space, dict) else space.spaces.items()
        return {k: _convert(v, f"{path}[{k!r}]") for k, v in items}
    if kind == "Tuple" or isinstance(space, (tuple, list)):
        members = space if isinstance(space, (tuple, list)) else space.spaces
        converted = [_convert(v, f"{path}[{i}]") for i, v in enumerate(members)]
        return list(converted) if isinstance(space, list) else tuple(converted)
    if isinstance(space, (jax.Array, np.ndarray, np.generic, int, float, bool)):
        return jnp.zeros(*leaf_shape_dtype("space", (), space))
    raise TypeError(
        f"space{path} is a {type(space).__module__}.{type(space).__name__}; "
        f"example_from_space supports the Gymnasium and gymnax spaces {', '.join(_SUPPORTED)}, "
        "dicts, tuples and lists of them, and arrays."
    )


def example_from_space(space: Any) -> PyTree:
    """An example item (zeros) for a Gymnasium or gymnax space, to pass to `init`.

    Box and MultiDiscrete give arrays of the space's shape and dtype, Discrete a
    scalar, MultiBinary an array of shape `n`; Dict and Tuple give a dict and a
    tuple of their members. A Python dict, tuple or list of spaces (and arrays)
    is converted member by member, so one call describes a whole transition.
    Dtypes follow JAX's canonical types: without `jax_enable_x64`, int64 and
    float64 spaces give int32 and float32 arrays (what JAX would store anyway).

    Args:
      space: a space, or a dict/tuple/list of spaces and arrays.

    Returns:
      A pytree of zero arrays with no batch axis.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> from gymnax.environments import spaces
      >>> example = jaxbuf.envs.example_from_space({
      ...     "obs": spaces.Box(-1.0, 1.0, (4,), jnp.float32),
      ...     "action": spaces.Discrete(2),
      ...     "reward": jnp.float32(0),
      ... })
      >>> {k: (v.shape, v.dtype.name) for k, v in example.items()}
      {'obs': ((4,), 'float32'), 'action': ((), 'int32'), 'reward': ((), 'float32')}
    """
    return _convert(space, "")
