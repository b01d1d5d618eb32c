"""A buffer's memory before it is allocated: bytes per leaf, per stored step, and
whether they fit the device.

`memory(buffer, example)` traces `init` without allocating (`jax.eval_shape`)
and reports every leaf of the state. Every `init` checks the same total against
the memory of the device it would land on, and refuses, before allocating,
a state that cannot fit: when it runs, or is traced by `jit` (whose program
would allocate it). What only describes a state never refuses: `memory`, and
`jax.eval_shape` of anything that calls `init` (a checkpoint's template).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxbuf.core import hosted as _hosted
from jaxbuf.core.records import PyTree

GIB = 2**30
_DESCRIBING = contextvars.ContextVar("jaxbuf_describing", default=False)
_EVAL_SHAPE = inspect.unwrap(jax.eval_shape).__code__


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """The bytes of a buffer's state.

    Attributes:
      leaves: bytes of every state leaf, by path (`.experience['obs']`, ...).
      total: their sum.
      stored_steps: the item (or step) slots of the storage: `capacity`, or
        `num_envs * capacity`, times `num_buffers` for a vectorized buffer.
      host: of `total`, the bytes in host memory (`host_memory=` leaves); the
        device holds `total - host` (`device`).
      sized_for_episodes: where the buffer keeps a side record per episode end (a
        transition buffer's final observations, an episode buffer's records), the
        average episode length in steps it holds them for (`min_episode_length`):
        shorter episodes leave the oldest stored steps unsampleable (a transition
        buffer counts them in `state.side.stale`). None where nothing depends on it.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> step = jaxbuf.Transition(jnp.zeros(64), jnp.int32(0), jnp.float32(0),
      ...     jnp.bool_(False), jnp.bool_(False), jnp.zeros(64))
      >>> buffer = jaxbuf.make_transition_buffer(4, 1000, 32, min_episode_length=100)
      >>> report = jaxbuf.memory(buffer, step)
      >>> report.stored_steps, round(report.per_stored_step / step.obs.nbytes, 3)
      (4000, 1.053)
    """

    leaves: dict[str, int]
    total: int
    stored_steps: int
    host: int = 0
    sized_for_episodes: int | None = None

    @property
    def device(self) -> int:
        """`total - host`: the bytes the device's own memory holds."""
        return self.total - self.host

    @property
    def per_stored_step(self) -> float:
        """`total / stored_steps`: what one stored step costs, side records included."""
        return self.total / max(self.stored_steps, 1)

    def __str__(self) -> str:
        rows = [f"{name}: {size:,} bytes" for name, size in self.leaves.items()]
        hosted = f" ({self.host:,} in host memory)" if self.host else ""
        steps = f"{self.stored_steps:,} stored steps"
        rows.append(f"total: {self.total:,} bytes{hosted}, {steps}, "
                    f"{self.per_stored_step:,.1f} bytes per stored step")  # fmt: skip
        if self.sized_for_episodes is not None:
            rows.append(f"sized for episodes of {self.sized_for_episodes} steps or more on "
                        "average: shorter ones leave the oldest stored steps unsampleable "
                        "(min_episode_length)")  # fmt: skip
        return "\n".join(rows)


def memory(buffer: Any, example: PyTree) -> MemoryReport:
    """The bytes `buffer.init(example)` would allocate, per leaf and per stored
    step, computed without allocating anything.

    Args:
      buffer: a sampled buffer (any `make_*_buffer`, `vectorize`d or not).
      example: what `buffer.init` takes.

    Returns:
      A `MemoryReport`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(capacity=1000, sample_batch_size=32)
      >>> report = jaxbuf.memory(buffer, {"obs": jnp.zeros(4), "action": jnp.int32(0)})
      >>> report.leaves[".experience['obs']"], report.stored_steps, report.per_stored_step
      (16000, 1000, 20.012)
    """
    with _describing():
        found = report(shapes(lambda: buffer.init(example)), example)
    sized_for = (getattr(buffer, "config", None) or {}).get("min_episode_length")
    return dataclasses.replace(found, sized_for_episodes=sized_for if sized_for != 1 else None)


@contextlib.contextmanager
def _describing() -> Iterator[None]:
    token = _DESCRIBING.set(True)
    try:
        yield
    finally:
        _DESCRIBING.reset(token)


def describing() -> bool:
    """Whether `init` is being traced only for its shapes: by `memory`, or inside
    `jax.eval_shape` (found on the call stack; `eval_shape` traces as `jit`
    does, so nothing else tells them apart)."""
    if _DESCRIBING.get():
        return True
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _EVAL_SHAPE:
            return True
        frame = frame.f_back
    return False


def refuse_unfit(make: Callable[[], Any], example: PyTree, stored: Any = None) -> None:
    """Raises a `ValueError` (see `check_fits`) if the state `make()` would allocate
    cannot fit, unless only its shapes are wanted (`describing`). `stored`: the
    state's stored steps (default `state.experience`)."""
    if not describing():
        check_fits(shapes(make), example, stored)


def shapes(make: Any) -> Any:
    """The abstract values `make()` would return, with their memory spaces where
    this JAX has them (JAX 0.7+: traced by `jit`); nothing is allocated."""
    try:
        return jax.jit(make).trace().out_avals
    except AttributeError:  # an older JAX: shapes and dtypes only
        return jax.eval_shape(make)


def report(state: Any, example: PyTree, stored: Any = None) -> MemoryReport:
    """The `MemoryReport` of a state's abstract values (`shapes` of `init`);
    `stored(state)`: its storage of steps (default `state.experience`)."""
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    leaves = {
        jax.tree_util.keystr(path): math.prod(leaf.shape) * leaf.dtype.itemsize
        for path, leaf in flat
    }
    host = sum(leaves[jax.tree_util.keystr(path)] for path, leaf in flat
               if _hosted.on_host(leaf))  # fmt: skip
    # every item leaf is stored behind the same leading axes: the fewest dimensions
    # of a stored leaf less the fewest of an item leaf is their number
    storage = state.experience if stored is None else stored(state)
    fewest = min(jax.tree.leaves(storage), key=lambda leaf: leaf.ndim)
    leading = fewest.ndim - min(np.ndim(leaf) for leaf in jax.tree.leaves(example))
    stored_steps = math.prod(fewest.shape[:leading])
    return MemoryReport(leaves=leaves, total=sum(leaves.values()), stored_steps=stored_steps,
                        host=host)  # fmt: skip


def device_free_bytes(device: Any = None) -> int | None:
    """The bytes a new allocation can take on `device` (default: JAX's default
    device): its allocator's limit less what is in use (GPU, TPU), or the
    machine's physical memory for a CPU; None where neither is known."""
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics raise various errors
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform == "cpu" and hasattr(os, "sysconf"):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def check_fits(state: Any, example: PyTree, stored: Any = None) -> None:
    """Raises a `ValueError` (before anything is allocated) if the state of these
    shapes cannot fit the default device's free memory (leaves in host memory
    aside, except on a CPU, whose memories are one)."""
    needed = report(state, example, stored)
    free = device_free_bytes()
    own = needed.total if jax.devices()[0].platform == "cpu" else needed.device
    if free is None or own <= free:
        return
    largest = max(needed.leaves, key=needed.leaves.__getitem__)
    raise ValueError(
        f"the buffer's state needs {needed.total / GIB:.2f} GiB ({needed.per_stored_step:,.0f} "
        f"bytes per stored step over {needed.stored_steps:,} steps; the largest leaf, "
        f"{largest}, {needed.leaves[largest] / GIB:.2f} GiB), but {jax.devices()[0]} has "
        f"{free / GIB:.2f} GiB free. Lower the capacity, store observations once (the "
        "transition buffer) or in fewer bytes, or place the buffer on the host; "
        "jaxbuf.memory(buffer, example) reports every leaf. Nothing was allocated."
    )
