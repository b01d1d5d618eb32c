"""Checks at the boundary: configuration at construction, pytrees at trace time.

Every check raises before anything is computed, so a rejected call never touches
a (possibly donated) state. Messages name the argument or the leaf path
(`jax.tree_util.keystr`), what was expected and what came.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.records import PyTree

F = TypeVar("F", bound=Callable[..., Any])

# Largest count an int32 counter holds; buffers index storage with int32.
MAX_INT32 = int(np.iinfo(np.int32).max)


def check_int(name: str, value: Any, *, minimum: int = 1, maximum: int = MAX_INT32) -> int:
    """Returns `value` as an `int`, or raises naming the argument."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}.")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}."
        ) from None
    if not minimum <= number <= maximum:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {number}.")
    return number


def check_fraction(name: str, value: Any) -> float:
    """Returns a number in [0, 1] (a Python or NumPy real, not a bool) as a float,
    or raises naming the argument (NaN is out of range)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"{name} must be a number in [0, 1], got {value!r} of type {type(value).__name__}."
        )
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}.")
    return float(value)


def known(value: Any) -> np.ndarray | None:
    """`value` as a NumPy array, or None when it is traced (known only when run)."""
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def check_real(name: str, value: Any) -> float:
    """Returns a real number (Python or NumPy, not a bool, not NaN; infinite
    allowed) as a float, or raises naming the argument."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{name} must be a number, got {value!r} of type {type(value).__name__}.")
    if np.isnan(value):
        raise ValueError(f"{name} must be a number, got nan.")
    return float(value)


def count_up(counter: jax.Array, amount: Any) -> jax.Array:
    """`counter + amount` in int32, saturating at +-`MAX_INT32` instead of wrapping
    (an event counter with a non-negative `amount` never goes negative)."""
    amount = jnp.asarray(amount, jnp.int32)
    total = counter + amount
    wrapped = ((counter >= 0) == (amount >= 0)) & ((total >= 0) != (counter >= 0))
    bound = jnp.int32(MAX_INT32)
    return jnp.where(wrapped, jnp.where(counter >= 0, bound, -bound), total)


def check_bool(name: str, value: Any) -> bool:
    """Returns `value` if it is a bool, or raises naming the argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}.")
    return bool(value)


def check_where(where: Any, meaning: str) -> jax.Array | None:
    """An optional gate `where` as a bool scalar array (None stays None), or a
    `TypeError` saying what it gates (`meaning`) and what came."""
    if where is None:
        return None
    if getattr(where, "dtype", type(where)) not in (bool, jnp.bool_) or jnp.shape(where) != ():
        got = f"{getattr(where, 'dtype', type(where).__name__)}{list(jnp.shape(where))}"
        raise TypeError(f"where must be a bool scalar ({meaning}), got {got}.")
    return jnp.asarray(where)


def leaf_shape_dtype(what: str, path: Any, leaf: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and JAX dtype of an array-like leaf (float64 -> float32 without x64)."""
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)) or hasattr(
        leaf, "__jax_array__"
    ):
        shape, dtype = tuple(leaf.shape), leaf.dtype
    elif isinstance(leaf, (bool, int, float, complex)):
        shape, dtype = (), np.result_type(type(leaf))
    else:
        raise TypeError(
            f"{what}{jax.tree_util.keystr(path)} is a {type(leaf).__name__}; "
            "every leaf must be an array or a scalar."
        )
    return shape, jax.dtypes.canonicalize_dtype(dtype)


def item_spec(example: PyTree, what: str = "example") -> PyTree:
    """The `jax.ShapeDtypeStruct` of every leaf of one example item."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(example)
    if not leaves:
        raise ValueError(f"{what} has no array leaves; a buffer needs at least one.")
    specs = [jax.ShapeDtypeStruct(*leaf_shape_dtype(what, p, x)) for p, x in leaves]
    return jax.tree_util.tree_unflatten(treedef, specs)


def _check_structure(spec: PyTree, tree: PyTree, what: str) -> None:
    expected = jax.tree_util.tree_structure(spec)
    got = jax.tree_util.tree_structure(tree)
    if expected == got:
        return
    want = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(spec)[0]}
    have = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}
    missing, extra = sorted(want - have), sorted(have - want)
    if missing or extra:
        detail = f"missing leaves {', '.join(missing) or 'none'}; "
        detail += f"unexpected leaves {', '.join(extra) or 'none'}"
    else:
        detail = f"expected the structure {expected}, got {got}"
    raise ValueError(
        f"{what} does not have the tree structure of the buffer's items: {detail}. "
        "Pass a pytree with the same keys and container types as the example given to init."
    )


def _shape_text(axes: Sequence[tuple[str, int | None]], item_shape: tuple[int, ...]) -> str:
    """E.g. `(num_buffers, B, 3)` for a leaf with two leading axes and item shape (3,)."""
    parts = [*(name for name, _ in axes), *map(str, item_shape)]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def check_batch(
    spec: PyTree,
    tree: PyTree,
    axes: Sequence[tuple[str, int | None]],
    what: str = "items",
) -> tuple[int, ...]:
    """Checks `tree` against one item's `spec` with leading batch axes.

    Args:
      spec: `jax.ShapeDtypeStruct` leaves of one item.
      tree: the pytree to check; each leaf has shape `[*axes, *item_shape]`.
      axes: `(name, size)` of each leading axis; a size of None means any size,
        the same across leaves.
      what: how the argument is called in messages.

    Returns:
      The size of every leading axis.
    """
    _check_structure(spec, tree, what)
    names = ", ".join(name for name, _ in axes)
    sizes: list[int | None] = [size for _, size in axes]
    first_path: list[str | None] = [None] * len(axes)
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for (path, leaf), want in zip(leaves, jax.tree_util.tree_leaves(spec), strict=True):
        where = f"{what}{jax.tree_util.keystr(path)}"
        shape, dtype = leaf_shape_dtype(what, path, leaf)
        lead, rest = shape[: len(axes)], shape[len(axes) :]
        if len(shape) != len(axes) + len(want.shape) or rest != want.shape:
            detail = f": the leading axes {names}, then the item shape {want.shape}" if axes else ""
            raise ValueError(
                f"{where} has shape {shape}; expected {_shape_text(axes, want.shape)}{detail}."
            )
        for i, (name, size) in enumerate(axes):
            if sizes[i] is None:
                sizes[i], first_path[i] = lead[i], where
            elif lead[i] != sizes[i]:
                source = (
                    f"{first_path[i]} has {sizes[i]}" if first_path[i] else f"it must be {size}"
                )
                raise ValueError(
                    f"{where} has {name}={lead[i]} (shape {shape}), but {source}. "
                    f"Every leaf needs the same leading axes [{names}]."
                )
        if dtype != want.dtype:
            raise TypeError(
                f"{where} has dtype {dtype}; expected {want.dtype}. jaxbuf never casts "
                f"silently: convert with .astype({want.dtype.name!r}) if that is intended."
            )
    return tuple(int(s) for s in sizes)  # type: ignore[arg-type]


def check_leading(tree: PyTree, count: int, what: str, expected: str, fix: str) -> None:
    """Raises unless every leaf of `tree` has a leading axis of `count`, naming the leaf."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = tuple(np.shape(leaf))
        if not shape or shape[0] != count:
            raise ValueError(
                f"{what}{jax.tree_util.keystr(path)} has shape {shape}; expected {expected}. {fix}"
            )


def steps_per_env_not_capacity(factory: F) -> F:
    """Refuses 0.3's `capacity=` keyword of a per-environment kind's factory, which 0.4
    names `steps_per_env=` (`capacity` counts items over all environments, as in
    `make_replay_buffer`): a `TypeError` that says what to write, never other memory."""

    @functools.wraps(factory)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        if "capacity" in kwargs:
            value = kwargs["capacity"]
            raise TypeError(
                f"{factory.__name__} takes steps_per_env=, the steps stored per environment "
                f"(jaxbuf 0.3 called it capacity=, with the same meaning): write "
                f"steps_per_env={value!r}. For a number of steps over all environments, "
                f"give steps_per_env=that // num_envs."
            )
        return factory(*args, **kwargs)

    return refusing  # type: ignore[return-value]
