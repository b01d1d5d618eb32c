"""Per-environment time rings, what every kind with one time line per environment shares:
its anchors (a window's first step, a transition's start, an episode record: slots
`outer * size + inner`, spans of consecutive stored steps that never cross the write
position: `place`, `flatten`, `window_times`, `valid_start`, `span_changes`), allocating the
ring (`init_steps`), checking and writing steps `[num_envs, T, ...]`
(`write_steps`) or one step per environment (`one_step`), an episode's steps from a
`done_fn` (`apply_done_fn`, `episode_mask`), and the file form of a `done_fn` (`DoneKey`,
`done_config`), and the stored frames a stacked step reads back to (`frame_times`,
`gather`, `step_frames`). The kinds (trajectory, transition, episode) are siblings over
it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import contracts as _contracts
from jaxbuf.core import draws as _draws
from jaxbuf.core import hosted as _hosted
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, StackRead
from jaxbuf.core.records import PyTree
from jaxbuf.core.storage import TimeRingState


def place(slots: jax.Array, *, size: int) -> tuple[jax.Array, jax.Array]:
    """`(outer, inner)` of slots `outer * size + inner` (a layout's `place`)."""
    return _storage.split(slots, size)


def flatten(where: tuple[jax.Array, jax.Array], *, size: int) -> jax.Array:
    """The slots `outer * size + inner` of `where = (outer, inner)` (a layout's `flatten`)."""
    return where[0] * size + where[1]


def window_times(starts: jax.Array, length: int, capacity: int) -> jax.Array:
    """int32 `[B, length]`: the storage times of the `length` steps from each start."""
    return (starts[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]) % capacity


def valid_start(state: Any, times: jax.Array, span: int, period: int = 1) -> jax.Array:
    """Whether storage times `times` start `span` stored, consecutive steps on the
    `period` grid (never crossing the write position)."""
    capacity = _storage.capacity_of(state.experience, 1)
    age = (state.position - 1 - times) % capacity  # 0: the newest step
    return (times % period == 0) & (age >= span - 1) & (age < state.size)


def span_changes(before: Any, after: Any, length: int, span: int, period: int = 1) -> Changes:
    """Slots `env * capacity + time` after `length` steps were written at
    `before.position`: the written rows are cleared (they are now the newest
    steps), and the `length` starts whose `span` the add completed are filled
    where they are valid starts. A row written at `position + j` is a completed start
    at `position + j'` only where `j' - j` is `span - 1` or `span - 1 - capacity`, so
    the two are disjoint where `length` stays under both (an `add_step` whenever
    `span > 1`)."""
    num_envs, capacity = jax.tree_util.tree_leaves(after.experience)[0].shape[:2]
    base = (jnp.arange(num_envs, dtype=jnp.int32) * capacity)[:, None]
    j = jnp.arange(length, dtype=jnp.int32)[None, :]
    completed = (before.position - span + 1 + j) % capacity
    keep = jnp.broadcast_to(valid_start(after, completed, span, period), (num_envs, length))
    return Changes(
        cleared=(base + (before.position + j) % capacity).ravel(),
        filled=(base + completed).ravel(),
        keep=keep.ravel(),
        disjoint=length <= min(span - 1, capacity - span + 1),
    )


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
        place=functools.partial(place, size=size),
        flatten=functools.partial(flatten, size=size),
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


def frame_times(
    state: TimeRingState, envs: jax.Array, times: jax.Array, k: int, done_at: Callable | None
) -> jax.Array:
    """int32 `[*times.shape, k]`: the storage times of the frames stacked for the
    steps at `times` (environments `envs`, broadcastable), oldest first.

    Going back from a step, a frame is used while it is stored and no step
    between ended an episode (`done_at(envs, times) -> bool`); the oldest usable
    frame stands in for the ones before it.
    """
    capacity = _storage.capacity_of(state.experience, 1)
    age = (state.position - 1 - times) % capacity  # 0: the newest step
    back = jnp.zeros(times.shape, jnp.int32)  # how far back frames may go
    open_ = jnp.ones(times.shape, bool)
    for distance in range(1, k):
        older = (times - distance) % capacity
        open_ = open_ & (age + distance < state.size)
        if done_at is not None:
            open_ = open_ & ~done_at(envs, older)
        back = back + open_.astype(jnp.int32)
    steps_back = jnp.arange(k - 1, -1, -1, dtype=jnp.int32).reshape(*[1] * times.ndim, k)
    offsets = jnp.minimum(steps_back, back[..., None])
    return (times[..., None] - offsets) % capacity


def gather(leaf: jax.Array, envs: jax.Array, times: jax.Array) -> jax.Array:
    """`leaf[envs, times]` for storage leaves `[num_envs, capacity, ...]`.

    One index into the flattened rows: on CPU about 1.5-2x faster than the
    two-index gather for whole frames.
    """
    if _hosted.on_host(leaf):  # row slices into device memory, never a gather
        return _hosted.read_rows(leaf, (envs, times))
    rows = leaf.reshape(-1, *leaf.shape[2:])
    return rows.at[envs * leaf.shape[1] + times].get(mode="promise_in_bounds")


def done_of(state: TimeRingState, done_fn: Callable | None) -> Callable | None:
    """`done_at(envs, times) -> bool` of a `done_fn` over the state's stored steps
    (XLA keeps only the reads `done_fn` uses)."""
    if done_fn is None:
        return None

    def done_at(envs: jax.Array, times: jax.Array) -> jax.Array:
        envs = jnp.broadcast_to(envs, times.shape)
        steps = jax.tree.map(lambda x: gather(x, envs, times), state.experience)
        flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[times.ndim :]), steps)
        return jax.vmap(done_fn)(flat).reshape(times.shape)

    return done_at


def step_frames(state: TimeRingState, where: Any, drawn: tuple, stacks: dict[str, int], *,
                read_times: Callable, done_fn: Callable | None,
                padded: bool = False) -> dict[str, StackRead]:  # fmt: skip
    """The frames of each drawn step of a kind that reads windows of stored steps: for
    each stacked leaf, its `k` frames back from the step (`frame_times`), episodes ended
    by `done_fn`. `read_times(state, where) -> (envs [B, 1], times [B, L])` says where
    the steps were read; `padded`: the steps past `drawn`'s mask are zeros."""
    envs, times = read_times(state, where)
    done_at = done_of(state, done_fn)
    keep = drawn[1] if padded else None
    return {name: StackRead(leaf=name, envs=envs[..., None], keep=keep, axis=times.ndim,
                            times=frame_times(state, envs, times, k, done_at))
            for name, k in stacks.items()}  # fmt: skip
