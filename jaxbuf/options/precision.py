"""Storage precision: float32 leaves kept in 2 bytes (bfloat16 or float16), returned as float32.

An opt-in, lossy trade of precision for memory, per leaf:
`storage_dtypes={"obs": "bfloat16"}` halves the bytes of every stored
observation. `add` takes the example's float32 (or the storage dtype itself),
rounds to nearest in the storage dtype, and `sample` returns float32 again:
the values a float32 buffer would return after `x.astype(storage).astype(float32)`.

- bfloat16 keeps float32's range with 8 bits of mantissa (about 2-3
  significant digits); float16 keeps 11 bits but only magnitudes up to 65504.
- **Overflow is a documented clamp, never a silent inf**: finite values beyond
  the storage dtype's largest finite value are stored as that value (with
  their sign); `inf` and `nan` stay what they are.
- Only float32 leaves can be narrowed: integer, bool (exact by nature) and
  other float leaves are refused, naming the leaf.
- bfloat16 is rounded on the bits (to nearest, ties to even), so float32
  subnormals keep their value as NumPy's `astype` does (XLA's CPU conversion
  flushes them to zero).
- Leaves are named by their first key (`"obs"` for `{"obs": ...}` items or a
  `Transition`'s `.obs`, every leaf below it included), each name its own
  leaf, with one exception: a transition buffer stores `next_obs` in the ring
  of `obs`, so there `"obs"` covers both (`Transition` or a dict with its
  field names) and `"next_obs"` may only repeat it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.core.contracts import Layout
from jaxbuf.core.records import PyTree

NARROW = {"bfloat16": jnp.dtype(jnp.bfloat16), "float16": jnp.dtype(jnp.float16)}


def check_storage_dtypes(storage_dtypes: Any) -> dict[str, str]:
    """`{name: "bfloat16" | "float16"}`, from a mapping of names to dtypes (or their
    names); raises naming the argument or the entry."""
    if storage_dtypes is None:
        return {}
    if not isinstance(storage_dtypes, Mapping):
        raise TypeError(
            "storage_dtypes must be a mapping of leaf names to 'bfloat16' or 'float16', got "
            f"{type(storage_dtypes).__name__}."
        )
    checked = {}
    for name, dtype in storage_dtypes.items():
        try:
            label = jnp.dtype(dtype).name
        except TypeError:
            label = repr(dtype)
        if not isinstance(name, str) or label not in NARROW:
            raise ValueError(
                f"storage_dtypes[{name!r}] must be 'bfloat16' or 'float16' (a float32 leaf "
                f"kept in 2 bytes), got {label}."
            )
        checked[name] = label
    return checked


def with_next_obs(dtypes: dict[str, str]) -> dict[str, str]:
    """A transition buffer's `dtypes`: `next_obs` stored as `obs` is (one ring
    holds both); raises if `storage_dtypes` names `next_obs` otherwise."""
    if "next_obs" in dtypes and dtypes.get("obs") != dtypes["next_obs"]:
        raise ValueError(
            f"storage_dtypes['next_obs']={dtypes['next_obs']!r}, but a transition buffer stores "
            f"next_obs with obs (storage_dtypes['obs']={dtypes.get('obs')!r}): give 'obs' "
            "alone, which covers both."
        )
    return {**dtypes, "next_obs": dtypes["obs"]} if "obs" in dtypes else dict(dtypes)


def _name(path: tuple) -> str:
    """A leaf's first key: `obs` for `['obs']`, `.obs` or `['obs']['pixels']`."""
    first = path[0] if path else None
    for attribute in ("key", "name", "idx"):
        if hasattr(first, attribute):
            return str(getattr(first, attribute))
    return ""


def _narrowed(tree: PyTree, dtypes: dict[str, str]) -> dict[str, str]:
    """The storage dtype of each narrowed leaf of `tree`, by its path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): dtypes[_name(path)]
            for path, _ in leaves if _name(path) in dtypes}  # fmt: skip


def _dtype(leaf: Any) -> np.dtype:
    """A leaf's dtype: arrays' and `jax.ShapeDtypeStruct`s' own, a Python scalar's as JAX
    makes it."""
    return jnp.dtype(leaf.dtype) if hasattr(leaf, "dtype") else jnp.result_type(leaf)


def check_example(example: PyTree, dtypes: dict[str, str]) -> None:
    """Raises unless every name of `dtypes` names float32 leaves of `example`."""
    leaves = jax.tree_util.tree_flatten_with_path(example)[0]
    named = {_name(path) for path, _ in leaves}
    unknown = sorted(set(dtypes) - named)
    if unknown:
        raise ValueError(
            f"storage_dtypes names {unknown}, which the example does not hold (its leaves: "
            f"{sorted(named)}); nothing would be narrowed."
        )
    for path, leaf in leaves:
        dtype = _dtype(leaf)
        if _name(path) in dtypes and dtype != jnp.float32:
            raise TypeError(
                f"storage_dtypes[{_name(path)!r}]: example{jax.tree_util.keystr(path)} is "
                f"{dtype}; only float32 leaves can be stored in fewer bytes (integers and "
                "bools are exact as they are)."
            )


def store(tree: PyTree, dtypes: dict[str, str]) -> PyTree:
    """`tree` with its narrowed leaves in their storage dtype: float32 values rounded
    to nearest, finite ones beyond the range clamped to its largest value; a leaf
    already in the storage dtype as it is. Any other dtype raises, naming the leaf."""
    narrowed = _narrowed(tree, dtypes)

    def one(path, leaf):
        target = narrowed.get(jax.tree_util.keystr(path))
        if target is None or _dtype(leaf) == NARROW[target]:
            return leaf
        if _dtype(leaf) != jnp.float32:
            raise TypeError(
                f"{jax.tree_util.keystr(path)} is {_dtype(leaf)}; it is stored as "
                f"{target} from float32 (storage_dtypes): give float32 or {target}."
            )
        if target == "bfloat16":
            return _to_bfloat16(jnp.asarray(leaf))
        largest = float(jnp.finfo(NARROW[target]).max)
        clamped = jnp.where(jnp.isfinite(leaf), jnp.clip(leaf, -largest, largest), leaf)
        return clamped.astype(NARROW[target])

    return jax.tree_util.tree_map_with_path(one, tree)


# float32 bit patterns: the exponent's all-ones (inf, nan), bfloat16's largest finite
# value, and the quiet bit of a bfloat16 nan
_INF_BITS, _BF16_MAX_BITS, _QUIET = 0x7F800000, 0x7F7F0000, 0x0040


def _to_bfloat16(x: jax.Array) -> jax.Array:
    """float32 -> bfloat16 on the bits: the high 16 rounded to nearest, ties to even
    (`bits + 0x7FFF + lsb`, which carries into the exponent where it should);
    finite magnitudes above bfloat16's largest clamped to it; nan kept quiet.
    Exact for subnormals, which arithmetic on a flushing CPU would zero."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    magnitude = bits & jnp.uint32(0x7FFFFFFF)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    clamped = (bits & jnp.uint32(0x80000000) | _BF16_MAX_BITS) >> 16
    high = jnp.where(magnitude > _BF16_MAX_BITS, clamped, rounded)
    high = jnp.where(magnitude >= _INF_BITS, bits >> 16, high)  # inf as it is
    high = jnp.where(magnitude > _INF_BITS, (bits >> 16) | _QUIET, high)  # nan
    return jax.lax.bitcast_convert_type(high.astype(jnp.uint16), jnp.bfloat16)


def _from_bfloat16(x: jax.Array) -> jax.Array:
    """bfloat16 -> float32 on the bits (exact, subnormals included)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def restore(tree: PyTree, dtypes: dict[str, str]) -> PyTree:
    """`tree` with its narrowed leaves back in float32 (exact: every bfloat16 and
    float16 value is a float32 value)."""
    narrowed = _narrowed(tree, dtypes)

    def one(path, leaf):
        if jax.tree_util.keystr(path) not in narrowed:
            return leaf
        if jnp.asarray(leaf).dtype == jnp.bfloat16:
            return _from_bfloat16(jnp.asarray(leaf))
        return jnp.asarray(leaf).astype(jnp.float32)

    return jax.tree_util.tree_map_with_path(one, tree)


def spec(example: PyTree, dtypes: dict[str, str]) -> PyTree:
    """The example as storage holds it: narrowed leaves as `jax.ShapeDtypeStruct`s
    of their storage dtype, the others as they are."""
    narrowed = _narrowed(example, dtypes)

    def one(path, leaf):
        target = narrowed.get(jax.tree_util.keystr(path))
        return leaf if target is None else jax.ShapeDtypeStruct(np.shape(leaf), NARROW[target])

    return jax.tree_util.tree_map_with_path(one, example)


def seen_as_stored(done_fn: Any, dtypes: dict[str, str]) -> Any:
    """`done_fn` of a step as the buffer stores it, given the step in storage dtypes:
    it sees the narrowed leaves as float32 again (a float32 buffer fed rounded values
    sees the same)."""
    if not dtypes or done_fn is None:
        return done_fn
    return lambda step: done_fn(restore(step, dtypes))


def narrowed_layout(layout: Layout, dtypes: dict[str, str]) -> Layout:
    """`layout` storing the named leaves in their storage dtypes: `init` checks the
    example and allocates them narrow, `write` and `one_step` store, `expand`
    gives them back as float32."""
    if not dtypes:
        return layout

    def init(example: PyTree) -> Any:
        check_example(example, dtypes)
        return layout.init(spec(example, dtypes))

    def write(state: Any, data: PyTree, where: Any = None) -> Any:
        return layout.write(state, store(data, dtypes), where)

    def expand(state: Any, where: Any) -> Any:
        experience, mask, length = layout.expand(state, where)
        return restore(experience, dtypes), mask, length

    inner_step = layout.one_step
    one_step = None if inner_step is None else (lambda s, step: inner_step(s, store(step, dtypes)))
    return layout._replace(init=init, write=write, expand=expand, one_step=one_step)
