"""The host stage of a `HostLoop`: the `k` steps a Python loop adds between calls.

Two sets of preallocated NumPy arrays (`[k, *step]` per leaf) take turns: one
fills while the call that read the other may still be running (JAX reads host
memory asynchronously where it can alias it). Nothing is allocated per call,
so a step costs the copy of its bytes into memory already mapped, whatever `k`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxbuf.core.records import PyTree


class Stage:
    """Staged steps, leaves `[k, *step]` in the dtypes of the loop's first step.

    Attributes:
      count: the steps staged, `0 <= count <= k`.
      treedef: the first step's structure (None before it).
    """

    def __init__(self, k: int):
        self.k, self.count = k, 0
        self.treedef: Any = None
        self._arrays: list[np.ndarray] = []
        self._spare: list[np.ndarray] = []
        self._read_by: Any = None  # what the call that read `_spare` returns
        self._signature: list[tuple] = []

    def allocate(self, treedef: Any, specs: list[jax.ShapeDtypeStruct]) -> None:
        """Fixes the step's structure and allocates both stages."""
        self.treedef = treedef
        self._arrays, self._spare = _allocate(specs, self.k), _allocate(specs, self.k)
        self._signature = [(spec.shape, spec.dtype) for spec in specs]

    def fits(self, leaves: list[np.ndarray]) -> bool:
        """Whether a step's leaves have the stage's shapes and dtypes (the check of
        every step, kept to one comparison; `shape_error` says what differs)."""
        return [(leaf.shape, leaf.dtype) for leaf in leaves] == self._signature

    def put(self, leaves: list[np.ndarray]) -> None:
        """Copies one checked step's leaves into row `count`."""
        for staged, leaf in zip(self._arrays, leaves, strict=True):
            staged[self.count] = leaf
        self.count += 1

    def tree(self) -> PyTree:
        """The whole stage as the step's pytree, leaves `[k, *step]`."""
        return jax.tree.unflatten(self.treedef, self._arrays)

    def step(self, j: int) -> PyTree:
        """Staged step `j` as the step's pytree."""
        return jax.tree.unflatten(self.treedef, [leaf[j] for leaf in self._arrays])

    def turn(self, read_by: Any) -> None:
        """After a call that took the whole stage (and returned `read_by`): the
        other stage fills next, once the call that read it has finished."""
        jax.block_until_ready(self._read_by)
        self._arrays, self._spare, self._read_by = self._spare, self._arrays, read_by
        self.count = 0

    def drop_first(self, written: int, read_by: Any) -> None:
        """After the first `written` staged steps went one call each (the last
        returning `read_by`): the rest move to the front."""
        if written == 0:
            return
        jax.block_until_ready(read_by)
        rest = self.count - written
        for leaf in self._arrays:
            leaf[:rest] = leaf[written : self.count].copy()
        self.count = rest

    def shape_error(self, step: PyTree, leaves: list[np.ndarray]) -> str | None:
        """Why a step's leaves do not match the stage's, naming the leaf; None if
        they do."""
        for index, (staged, leaf) in enumerate(zip(self._arrays, leaves, strict=True)):
            if staged.shape[1:] != leaf.shape or staged.dtype != leaf.dtype:
                expected = f"{staged.dtype}{list(staged.shape[1:])}"
                return (
                    f"step{leaf_name(step, index)}: expected {expected} like the loop's first "
                    f"step, got {leaf.dtype}{list(leaf.shape)}; convert it "
                    "(nothing is cast silently)."
                )
        return None


def leaf_name(step: PyTree, index: int) -> str:
    """The key path of leaf `index` of `step`, as `jax.tree_util.keystr` writes it."""
    return jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(step)[0][index][0])


def _allocate(specs: list[jax.ShapeDtypeStruct], k: int) -> list[np.ndarray]:
    return [np.zeros((k, *spec.shape), spec.dtype) for spec in specs]
