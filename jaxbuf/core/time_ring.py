"""Per-environment time rings, what every kind with one time line per environment shares:
allocating the ring (`init_steps`), checking and writing steps `[num_envs, T, ...]`
(`write_steps`) or one step per environment (`one_step`), an episode's steps from a
`done_fn` (`apply_done_fn`, `episode_mask`), and the file form of a `done_fn` (`DoneKey`,
`done_config`). The kinds (trajectory, transition, episode) are siblings over it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import anchors as _anchors
from jaxbuf.core import contracts as _contracts
from jaxbuf.core import draws as _draws
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import PyTree
from jaxbuf.core.storage import TimeRingState


def write_steps(state: TimeRingState, steps: PyTree, where=None, *, num_envs: int,
                capacity: int) -> tuple[TimeRingState, int]:  # fmt: skip
    """Checks steps `[num_envs, T, ...]` against the ring's and writes them; returns
    `(state, T)`."""
    spec = _storage.item_spec(state.experience, 1)
    length = _storage.check_steps(spec, steps, num_envs, capacity)
    return _storage.append_steps(state, steps, where), length


def one_step(state: TimeRingState, step: PyTree, *, num_envs: int) -> PyTree:
    """One step per environment `[num_envs, ...]` as steps `[num_envs, 1, ...]`, checked."""
    return _storage.one_step(_storage.item_spec(state.experience, 1), step, num_envs)


def init_steps(example_step: PyTree, *, num_envs: int, capacity: int) -> TimeRingState:
    """An empty ring of `capacity` steps per environment shaped like `example_step`."""
    spec = _validation.item_spec(example_step, "example_step")
    experience = _storage.allocate(spec, num_envs, capacity)
    return TimeRingState(experience=experience, **_storage.counters())


def ring_layout(*, num_envs: int, size: int, **parts: Any) -> _contracts.Layout:
    """The layout of a kind with `size` anchors per environment (steps or episode
    records): slots `env * size + anchor`, one group per environment, and one step per
    environment written as steps `[num_envs, 1, ...]` unless `parts` gives `one_step`;
    `parts` gives the kind's own functions (init, write, counts, slot, usable, expand,
    ready)."""
    parts.setdefault("one_step", functools.partial(one_step, num_envs=num_envs))
    return _contracts.Layout(
        num_slots=num_envs * size,
        groups=num_envs,
        place=functools.partial(_anchors.place, size=size),
        flatten=functools.partial(_anchors.flatten, size=size),
        **parts,
    )


def apply_done_fn(done_fn: Callable[[PyTree], jax.Array], steps: PyTree) -> jax.Array:
    """`done_fn` over steps with leaves `[batch, T, ...]`: bool `[batch, T]`."""
    leading = jax.tree_util.tree_leaves(steps)[0].shape[:2]
    done = jax.vmap(jax.vmap(done_fn))(steps)
    if not hasattr(done, "dtype") or done.shape != leading or done.dtype != jnp.bool_:
        got = (
            f"dtype {done.dtype} and shape {done.shape[2:]}"
            if hasattr(done, "dtype")
            else type(done).__name__
        )
        raise TypeError(f"done_fn must return a bool scalar per step, got {got}.")
    return jnp.asarray(done)


def episode_mask(done: jax.Array) -> jax.Array:
    """True up to and including the first true of each row of `done` `[batch, L]`."""
    done = done.astype(jnp.int32)
    return (_draws.running_sum(done, axis=1) - done) == 0


class DoneKey:
    """A `done_fn` that reads the bool leaf at a `/`-separated key path of a step
    (`"done"`, `"extras/done"`): the file form of a `done_fn` (`done_key`)."""

    def __init__(self, key: str):
        if not isinstance(key, str) or not key:
            raise TypeError(f"done_key must be a non-empty string, got {key!r}.")
        self.key = key

    def __call__(self, step: PyTree) -> jax.Array:
        for part in self.key.split("/"):
            try:
                step = step[part]
            except (KeyError, TypeError, IndexError):
                raise ValueError(
                    f"done_key {self.key!r}: the step has no key {part!r} on that path."
                ) from None
        return step

    def __repr__(self) -> str:
        return f"DoneKey({self.key!r})"


def done_config(done_fn: Any) -> dict[str, Any]:
    """How a `done_fn` appears in a configuration: `done_key` when it is one."""
    if isinstance(done_fn, DoneKey):
        return {"done_key": done_fn.key}
    return {"done_key": None} if done_fn is None else {"done_fn": done_fn}
