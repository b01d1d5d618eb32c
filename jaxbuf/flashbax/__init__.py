"""Flashbax 0.1.x's API on jaxbuf: change `import flashbax as fbx` to
`import jaxbuf.flashbax as fbx`, and nothing else.

The eight factories take Flashbax's arguments, with its defaults and checks, and return
records with its functions (`init`, `add`, `sample`, `can_sample`, `set_priorities`,
`can_add`), pure and jit-compatible; the states and samples have Flashbax's names and
fields, importable from the module paths Flashbax's users import them from
(`jaxbuf.flashbax.buffers.trajectory_buffer.TrajectoryBufferState`, ...). The uniform
buffers (flat, item, trajectory, queue, mixer) give Flashbax's samples bit for bit for the
same adds and keys. The prioritised ones draw with the same probabilities from jaxbuf's
float32-safe sum tree, not Flashbax's random stream (see `prioritised_trajectory_buffer`).
`from_flashbax` and `to_flashbax` carry states across.

Examples:
  >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
  >>> buffer = fbx.make_flat_buffer(max_length=1000, min_length=2, sample_batch_size=8)
  >>> state = buffer.init({"obs": jnp.zeros(4), "reward": jnp.float32(0)})
  >>> state = buffer.add(state, {"obs": jnp.ones(4), "reward": jnp.float32(1)})
  >>> state = buffer.add(state, {"obs": jnp.ones(4), "reward": jnp.float32(2)})
  >>> batch = buffer.sample(state, jax.random.key(0)).experience
  >>> batch.first["reward"].tolist(), batch.second["reward"].tolist()
  ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
"""

from jaxbuf.flashbax import buffers
from jaxbuf.flashbax.buffers import (
    flat_buffer,
    item_buffer,
    mixer,
    prioritised_flat_buffer,
    prioritised_item_buffer,
    prioritised_trajectory_buffer,
    trajectory_buffer,
    trajectory_queue,
)
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
from jaxbuf.flashbax.states import from_flashbax, to_flashbax

__all__ = [
    "from_flashbax",
    "make_flat_buffer",
    "make_item_buffer",
    "make_mixer",
    "make_prioritised_flat_buffer",
    "make_prioritised_item_buffer",
    "make_prioritised_trajectory_buffer",
    "make_trajectory_buffer",
    "make_trajectory_queue",
    "to_flashbax",
]
_MODULES = (
    buffers,
    flat_buffer,
    item_buffer,
    mixer,
    prioritised_flat_buffer,
    prioritised_item_buffer,
    prioritised_trajectory_buffer,
    trajectory_buffer,
    trajectory_queue,
)
