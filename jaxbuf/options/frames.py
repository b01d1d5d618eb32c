"""Frame stacking at sample time, with every frame stored once.

A buffer made with `frames={"obs": k}` returns the leaf `obs` of each sampled
step stacked over that step and the `k - 1` before it: `[..., k, *frame]`,
oldest first, the sampled step last. Frames never come from before the
episode's first step (that first frame is repeated in their place, as
Dopamine and Atari wrappers do at a reset) nor from before the oldest stored
step (repeated likewise), so a stack never reads across an episode start or
the write position. Storage keeps one frame per step.

The option is a layout wrapper (`stacking`), applied by the build step like every
other: the kind says where each stacked leaf's frames lie (its layout's `frame_reads`,
`StackRead` records: `core.time_ring.step_frames` for windows of steps, the transition
kind's own for `next_obs`), and the wrapper gathers and joins them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import time_ring as _time_ring
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Layout, Option, StackRead
from jaxbuf.core.records import PyTree


def check_frames(frames: Any, capacity: int, allowed: tuple[str, ...] | None = None) -> dict:
    """`frames` as a dict `{leaf name: k}`, checked (None gives `{}`)."""
    if frames is None:
        return {}
    if not isinstance(frames, Mapping) or not all(isinstance(k, str) for k in frames):
        raise TypeError(f"frames must be a dict {{leaf name: k}}, got {frames!r}.")
    if allowed is not None and set(frames) - set(allowed):
        raise ValueError(f"frames may stack only {list(allowed)}, got {sorted(frames)}.")
    return {name: _validation.check_int(f"frames[{name!r}]", k, maximum=capacity)
            for name, k in frames.items()}  # fmt: skip


def check_leaves(frames: dict, step: PyTree, what: str) -> None:
    """Raises unless every stacked name is a top-level key (or field) of the step,
    holding single frames (`check_single_frames`)."""
    fields = step if isinstance(step, Mapping) else getattr(step, "__dataclass_fields__", {})
    missing = [name for name in frames if name not in fields]
    if missing:
        keys = sorted(fields) if fields else type(step).__name__
        raise ValueError(f"frames names {missing}, which {what} lacks (it has {keys}).")
    for name, k in frames.items():
        if isinstance(step, Mapping):
            check_single_frames(name, k, step[name], f"{what}[{name!r}]")
        else:
            check_single_frames(name, k, getattr(step, name), f"{what}.{name}")


def check_single_frames(name: str, k: int, example: PyTree, what: str) -> None:
    """Refuses an example leaf that looks stacked already: a leading axis of `k`
    (Gymnasium's frame-stacking wrappers give `[k, *frame]`), which stacking would
    turn into `[B, k, k, *frame]`."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(example):
        shape = tuple(getattr(leaf, "shape", ()))
        if k > 1 and len(shape) >= 2 and shape[0] == k:
            raise ValueError(
                f"{what}{jax.tree_util.keystr(path)} has shape {shape}: a leading axis of "
                f"{k}, the frames that frames={{{name!r}: {k}}} stacks itself at sample time, so "
                f"it looks stacked already (Gymnasium's FrameStack, say). Give one frame: the "
                f"newest, [-1] of the example (shape {shape[1:]}) and [:, -1] of each step's "
                f"{name}; batches then hold [B, {k}, *{list(shape[1:])}]. A frame whose own "
                f"first axis has {k} entries (channels) must put that axis last."
            )


def option(stacks: dict, refuses: Mapping[str, str] | None = None) -> Option | None:
    """Frame stacking (`stacks`, from `check_frames`) as an option of the build step: a
    layout wrapper (`stacking`); `refuses` names the options it cannot be combined with
    in that kind, and why. None without frames."""
    if not stacks:
        return None
    wrap = functools.partial(stacking, stacks=stacks)
    return Option(name="frames", refuses=refuses or {}, layout=wrap)


def stacking(layout: Layout, stacks: dict[str, int]) -> Layout:
    """`layout` whose `init` refuses examples already stacked and whose `expand` returns
    each stacked leaf `[..., k, ...]` as the layout's `frame_reads` describe it."""
    if layout.frame_reads is None:
        raise ValueError(f"this kind stacks no frames; got frames={stacks}.")
    frame_reads, init, expand = layout.frame_reads, layout.init, layout.expand

    def stacked_init(example: PyTree) -> Any:
        check_leaves(stacks, example, "the example")
        return init(example)

    def stacked_expand(state: Any, where: Any) -> tuple[PyTree, Any, Any]:
        experience, mask, length = drawn = expand(state, where)
        made: dict[str, PyTree] = {}
        for name, read in frame_reads(state, where, drawn, stacks).items():
            made[name] = _stack(state.experience[read.leaf], read, made)
        if isinstance(experience, Mapping):
            return {**experience, **made}, mask, length
        return experience.replace(**made), mask, length

    return layout._replace(init=stacked_init, expand=stacked_expand)


def _stack(stored: PyTree, read: StackRead, made: dict[str, PyTree]) -> PyTree:
    """One stacked leaf: its gathered frames after the newest of `read.older`'s stack
    and before `read.newest`, zeroed where `read.keep` is false."""
    axis, times, parts = read.axis, read.times, []
    if read.older is not None:
        parts.append(jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 1, None, axis=axis),
                                  made[read.older]))  # fmt: skip
    if times is not None:
        parts.append(jax.tree.map(lambda x: _time_ring.gather(x, read.envs, times), stored))
    if read.newest is not None:
        parts.append(jax.tree.map(lambda x: jnp.expand_dims(x, axis), read.newest))
    frames = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=axis), *parts)
    if read.keep is None:
        return frames
    keep = read.keep

    def zeroed(x: jax.Array) -> jax.Array:
        rows = keep.reshape(*keep.shape, *[1] * (x.ndim - keep.ndim))
        return jnp.where(rows, x, jnp.zeros((), x.dtype))

    return jax.tree.map(zeroed, frames)
