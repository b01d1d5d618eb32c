"""Helpers the test files share (the NumPy references are in `reference.py`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def accelerators_form(*args: Any, cpu: Any, accelerator: Any) -> Any:
    """`jaxbuf.core.lowering.choose` as a program lowered for a GPU or TPU runs it: patched
    in, a test runs the accelerators' forms on this CPU."""
    return accelerator(*args)


def items(ids: Any) -> dict[str, jax.Array]:
    """Replay items named by their ids: `{"id": ids, "obs": [ids, -ids]}` (int32, float32)."""
    ids = jnp.asarray(ids, jnp.int32)
    return {"id": ids, "obs": jnp.stack([ids, -ids], -1).astype(jnp.float32)}


def assert_same(a: Any, b: Any, what: str = "") -> None:
    """Two pytrees equal leaf for leaf, bit for bit (typed PRNG keys by their data); a
    difference names the leaf's path and `what`."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                            strict=True):  # fmt: skip
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        message = f"{what} {jax.tree_util.keystr(path)}".strip()
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=message)


PUBLIC_NAMESPACES = ("jaxbuf", "jaxbuf.types", "jaxbuf.io", "jaxbuf.rl", "jaxbuf.envs",
                     "jaxbuf.ray", "jaxbuf.brax", "jaxbuf.flashbax")  # fmt: skip


def public_names() -> list[str]:
    """Every public name, dotted (`jaxbuf.io.from_data`), from each namespace's `__all__`."""
    import importlib

    return [f"{namespace}.{name}" for namespace in PUBLIC_NAMESPACES
            for name in importlib.import_module(namespace).__all__]  # fmt: skip


def resolve(dotted: str) -> Any:
    """The object a dotted public name (`jaxbuf.io.from_data`) names."""
    import importlib

    namespace, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(namespace), name)
