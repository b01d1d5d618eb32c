"""States carried between Flashbax and the drop-in (`jaxbuf.flashbax`), both ways.

The uniform buffers' and the queue's states hold the same fields in both libraries: the
arrays move as they are. A prioritised state's sum tree is rebuilt leaf by leaf: Flashbax
numbers its items `row * (T // period) + t // period`, jaxbuf its slots `row * T + t`, and
both keep `priority ** priority_exponent` in the leaves; the largest priority set so far
moves as well (Flashbax keeps it raised to the exponent, jaxbuf as given).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core.samplers import PriorityState
from jaxbuf.core.sumtree import tree as _sumtree
from jaxbuf.flashbax.buffers.prioritised_trajectory_buffer import (
    Items,
    PrioritisedTrajectoryBuffer,
    PrioritisedTrajectoryBufferState,
)
from jaxbuf.flashbax.buffers.trajectory_buffer import TrajectoryBufferState
from jaxbuf.flashbax.buffers.trajectory_queue import TrajectoryQueueState


def _kind(state: Any) -> str:
    if hasattr(state, "sum_tree_state") and hasattr(state, "running_index"):
        return "prioritised"
    if hasattr(state, "write_index") and hasattr(state, "read_index"):
        return "queue"
    if all(hasattr(state, name) for name in ("experience", "current_index", "is_full")):
        return "trajectory"
    raise TypeError(f"state must be a Flashbax buffer or queue state, got {type(state).__name__}.")


def _items(state: Any, buffer: Any) -> Items:
    if not isinstance(buffer, PrioritisedTrajectoryBuffer):
        raise TypeError(
            "a prioritised state needs its drop-in buffer (buffer=, made by "
            f"jaxbuf.flashbax.make_prioritised_*), got {type(buffer).__name__}."
        )
    return Items(jax.tree.leaves(state.experience)[0].shape[1], buffer.period)


def from_flashbax(state: Any, buffer: Any = None) -> Any:
    """The drop-in's state holding what a Flashbax state holds.

    Args:
      state: a state made by Flashbax 0.1.x (a trajectory, flat or item buffer's, a queue's,
        or a prioritised buffer's).
      buffer: for a prioritised state, the drop-in buffer made with the same arguments.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_item_buffer(8, 1, 2, add_batches=True)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(3, dtype=jnp.int32))
      >>> again = fbx.from_flashbax(state)  # any record with Flashbax's fields
      >>> int(again.current_index), again.experience[0, :4].tolist()
      (3, [0, 1, 2, 0])
    """
    kind, arrays = _kind(state), jax.tree.map(jnp.asarray, state.experience)
    if kind == "queue":
        return TrajectoryQueueState(
            experience=arrays,
            write_index=_int(state.write_index),
            read_index=_int(state.read_index),
            is_full=jnp.asarray(state.is_full, bool),
        )
    common = {
        "experience": arrays,
        "current_index": _int(state.current_index),
        "is_full": jnp.asarray(state.is_full, bool),
    }
    if kind == "trajectory":
        return TrajectoryBufferState(**common)
    items, tree = _items(state, buffer), state.sum_tree_state
    count = int(tree.capacity)
    first_leaf = 2 ** int(tree.tree_depth) - 1
    values = jnp.asarray(tree.nodes, jnp.float32)[first_leaf : first_leaf + count]
    rows = jax.tree.leaves(arrays)[0].shape[0]
    ours = _sumtree.update(
        _sumtree.init(rows * items.length), items.slots_of(jnp.arange(count)), values
    )
    alpha = buffer.priority_exponent
    largest = jnp.asarray(tree.max_recorded_priority, jnp.float32)
    sampler = PriorityState(
        tree=ours,
        max_priority=largest ** (1 / alpha) if alpha else largest,
        rejected=jnp.zeros((), jnp.int32),
    )
    return PrioritisedTrajectoryBufferState(
        **common, sum_tree_state=sampler, running_index=_int(state.running_index)
    )


def _int(value: Any) -> jax.Array:
    return jnp.asarray(value).astype(jnp.int32)


def to_flashbax(state: Any, buffer: Any = None) -> Any:
    """A Flashbax 0.1.x state holding what a drop-in state holds (Flashbax must be
    installed: `pip install flashbax`).

    Args:
      state: a drop-in state.
      buffer: for a prioritised state, its drop-in buffer.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_item_buffer(8, 1, 2, add_batches=True)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(3, dtype=jnp.int32))
      >>> type(fbx.to_flashbax(state)).__module__
      'flashbax.buffers.trajectory_buffer'
    """
    from flashbax.buffers import (
        prioritised_trajectory_buffer,
        sum_tree,
        trajectory_buffer,
        trajectory_queue,
    )

    kind = _kind(state)
    if kind == "queue":
        return trajectory_queue.TrajectoryQueueState(
            experience=state.experience,
            write_index=state.write_index,
            read_index=state.read_index,
            is_full=state.is_full,
        )
    common = {
        "experience": state.experience,
        "current_index": state.current_index,
        "is_full": state.is_full,
    }
    if kind == "trajectory":
        return trajectory_buffer.TrajectoryBufferState(**common)
    items = _items(state, buffer)
    count = jax.tree.leaves(state.experience)[0].shape[0] * items.per_row
    values = _sumtree.leaves(state.sum_tree_state.tree, items.slots_of(jnp.arange(count)))
    theirs = sum_tree.set_batch_scan(sum_tree.init(count), jnp.arange(count), values)
    largest = state.sum_tree_state.max_priority**buffer.priority_exponent
    theirs = dataclasses.replace(theirs, max_recorded_priority=largest)
    return prioritised_trajectory_buffer.PrioritisedTrajectoryBufferState(
        **common, sum_tree_state=theirs, running_index=state.running_index
    )
