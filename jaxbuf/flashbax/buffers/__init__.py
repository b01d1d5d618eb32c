"""Flashbax's `flashbax.buffers`: the factories, and the modules its users import records
from (`jaxbuf.flashbax.buffers.trajectory_buffer.TrajectoryBufferState`, ...)."""

from jaxbuf.flashbax.buffers.flat_buffer import make_flat_buffer
from jaxbuf.flashbax.buffers.item_buffer import make_item_buffer
from jaxbuf.flashbax.buffers.mixer import make_mixer
from jaxbuf.flashbax.buffers.prioritised_flat_buffer import make_prioritised_flat_buffer
from jaxbuf.flashbax.buffers.prioritised_item_buffer import make_prioritised_item_buffer
from jaxbuf.flashbax.buffers.prioritised_trajectory_buffer import (
    make_prioritised_trajectory_buffer,
)
from jaxbuf.flashbax.buffers.trajectory_buffer import make_trajectory_buffer
from jaxbuf.flashbax.buffers.trajectory_queue import make_trajectory_queue

__all__ = [
    "make_flat_buffer",
    "make_item_buffer",
    "make_mixer",
    "make_prioritised_flat_buffer",
    "make_prioritised_item_buffer",
    "make_prioritised_trajectory_buffer",
    "make_trajectory_buffer",
    "make_trajectory_queue",
]
