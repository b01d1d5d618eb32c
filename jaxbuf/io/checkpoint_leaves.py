"""The leaves of a checkpoint: what each holds, and what comes back on restore.

A leaf is saved as an array (its bytes, in its own dtype) and what else
restores it:

- arrays of numbers (JAX or NumPy, every dtype, 64-bit ones included);
- typed PRNG keys, as their key data and `{"key_impl": name}`;
- Python `bool`, `int` and `float`, as 64-bit values and `{"python": "int"}`.

On restore, the template's leaf says what comes back:

| template leaf | restored as |
|---|---|
| Python scalar | the same Python type (the saved leaf must be one) |
| typed PRNG keys | keys of the saved implementation |
| NumPy array or scalar | NumPy, in the template's dtype (int64 stays int64) |
| JAX array, `jax.ShapeDtypeStruct` | a JAX array in the template's dtype |

The template's dtype is the saved one, or, for a saved 64-bit leaf or Python
scalar, its 32-bit counterpart (`NARROWER`): what JAX makes of it without
`jax_enable_x64` (`jax.eval_shape` of a state holding `np.int64` or a Python
`int` says int32). Such a leaf restores only if every value survives the
conversion: integers exactly, floats without leaving float32's range (they
round to nearest, as JAX's own conversion does); otherwise `restore` raises
naming the leaf. Nothing is ever narrowed silently.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Python scalars a training state holds (a step count, a learning rate): saved as
# 64-bit values, restored as the same Python type.
PYTHON_SCALARS = {bool: np.bool_, int: np.int64, float: np.float64}

# The 32-bit dtype JAX gives a 64-bit one without jax_enable_x64.
NARROWER = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}


def encode(path: tuple, leaf: Any) -> tuple[Any, dict]:
    """A leaf as the array its bytes are written from, and what else restores it:
    `{"python": "int"}` for a Python scalar, `{"key_impl": name}` for typed PRNG
    keys (stored as their key data). Raises, naming the leaf, for anything else
    than arrays, keys and Python `bool`/`int`/`float`."""
    name = f"state{jax.tree_util.keystr(path)}"
    if type(leaf) in PYTHON_SCALARS:
        if type(leaf) is int and not -(2**63) <= leaf < 2**63:
            raise ValueError(f"{name}: the int {leaf} does not fit in 64 bits.")
        return np.asarray(leaf, PYTHON_SCALARS[type(leaf)]), {"python": type(leaf).__name__}
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        raise TypeError(
            f"{name} is a {type(leaf).__name__}; a checkpoint holds arrays, typed PRNG keys, "
            "Python bool/int/float and None (in dicts, lists, tuples, NamedTuples and "
            "flax.struct dataclasses). Nothing was written."
        )
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        if isinstance(leaf, jax.ShapeDtypeStruct):  # a template's (`jax.eval_shape`)
            impl: list[str] = []
            data = jax.eval_shape(lambda k: (impl.append(str(jax.random.key_impl(k))),
                                             jax.random.key_data(k))[1], leaf)  # fmt: skip
            return data, {"key_impl": impl[0]}
        keys: Any = leaf
        return jax.random.key_data(keys), {"key_impl": str(jax.random.key_impl(keys))}
    if np.dtype(leaf.dtype).kind not in "biufcV":  # numbers and ml_dtypes (bfloat16 is "V")
        raise TypeError(f"{name} has dtype {leaf.dtype}, which a checkpoint does not hold.")
    return leaf, {}


def stored_dtype(path: tuple, leaf: Any) -> np.dtype:
    """The dtype a leaf is stored in (its key data's, for typed keys)."""
    return jnp.dtype(encode(path, leaf)[0].dtype)


def encoded(state: Any) -> list[tuple[tuple, Any, dict]]:
    """`(path, array, extra)` of every leaf (see `encode`); raises before any write."""
    return [(path, *encode(path, leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]]  # fmt: skip


def check_storable(state: Any) -> None:
    """Raises, naming the leaf, for a leaf that has a shape and dtype but no values:
    a template's `jax.ShapeDtypeStruct` or a deleted (donated) array."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = f"state{jax.tree_util.keystr(path)}"
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(
                f"{name} is a jax.ShapeDtypeStruct (a template from jax.eval_shape?), which "
                "holds no values; save the state itself. Nothing was written."
            )
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise ValueError(
                f"{name} is a deleted array: it was donated to a jitted call (or deleted); "
                "save the state that call returned. Nothing was written."
            )


def holder(leaf: Any) -> str:
    """What a template leaf restores as: `"python"`, `"key"`, `"numpy"` or `"jax"`."""
    if type(leaf) in PYTHON_SCALARS:
        return "python"
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return "key"
    return "numpy" if isinstance(leaf, (np.ndarray, np.generic)) else "jax"


def wanted(template: Any) -> dict[str, dict]:
    """Each template leaf's shape, dtype, kind (`python`, `key_impl`) and `holder`,
    by its path."""
    described = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
        array, extra = encode(path, leaf)
        entry = {"shape": list(array.shape), "dtype": str(array.dtype), **extra}
        described[jax.tree_util.keystr(path)] = {**entry, "holder": holder(leaf)}
    return described


def what(entry: dict) -> str:
    """A saved or wanted leaf's kind, in words."""
    if "python" in entry:
        return f"a Python {entry['python']}"
    if "key_impl" in entry:
        return f"PRNG keys ({entry['key_impl']})"
    return "an array"


def mismatch(got: dict, want: dict) -> str | None:
    """Why a saved leaf (`got`, its metadata) cannot restore into a template leaf
    (`want`, from `wanted`), or None if it can."""
    arrays_take_scalars = "python" in got and want["holder"] in ("numpy", "jax")
    if not arrays_take_scalars and any(got.get(f) != want.get(f) for f in ("python", "key_impl")):
        return f"was saved as {what(got)}, but the template holds {what(want)}"
    saved, dtype = got.get("dtype"), want["dtype"]
    narrower = NARROWER.get(np.dtype(jnp.dtype(saved))) if _is_dtype(saved) else None
    if got.get("shape") != want["shape"] or dtype not in (saved, str(narrower)):
        return (
            f"was saved with shape {tuple(got.get('shape') or ())} and dtype {saved}, but "
            f"the template has shape {tuple(want['shape'])} and dtype {dtype} (another "
            "configuration?)"
        )
    if want["holder"] == "jax" and jax.dtypes.canonicalize_dtype(dtype) != np.dtype(dtype):
        return (
            f"is {dtype}, and the template asks for a JAX {dtype} array, which JAX makes "
            f"{jax.dtypes.canonicalize_dtype(dtype)} while jax_enable_x64 is off; turn x64 on, "
            "or give the template a NumPy leaf"
        )
    return None


def _is_dtype(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    try:
        jnp.dtype(name)
    except TypeError:
        return False
    return True


def convert(values: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """`values` (a saved leaf, or rows of it) in `dtype`, the template's: the same,
    or the 32-bit counterpart of a 64-bit dtype if every value survives (integers
    exactly, floats within range); else a `ValueError` naming the leaf."""
    if values.dtype == dtype:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(dtype)
    if values.dtype.kind in "fc":
        lost = np.isfinite(values) & ~np.isfinite(cast)
    else:
        lost = cast.astype(values.dtype) != values
    if np.any(lost):
        example = values[lost].reshape(-1)[0].item()
        raise ValueError(
            f"leaf {name} holds {example} ({values.dtype}), which the template's {dtype} "
            f"cannot represent; restore it into a leaf of dtype {values.dtype} (a NumPy array, "
            "or a JAX array with jax_enable_x64 on). Nothing was restored."
        )
    return cast


def decode(entry: dict, array: np.ndarray | jax.Array, template_leaf: Any) -> Any:
    """A leaf back from its stored array (see `encode`), as the template's leaf says
    (see the module docstring); `array` is already in the template's dtype."""
    kind = holder(template_leaf)
    if kind == "python":
        return type(template_leaf)(np.asarray(array).item())
    if kind == "key":
        return jax.random.wrap_key_data(jnp.asarray(array), impl=entry["key_impl"])
    if kind == "numpy":
        restored = np.asarray(array)
        return restored[()] if isinstance(template_leaf, np.generic) else restored
    return jnp.asarray(array)
