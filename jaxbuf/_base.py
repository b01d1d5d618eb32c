"""Function signatures shared by every jaxbuf buffer.

A buffer is a `NamedTuple` of pure functions built by a `make_*` factory that
closes over the buffer's configuration (the optax pattern). Each signature is
documented once, here.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

PyTree = Any


class InitFn(Protocol):
    """`init(example) -> state`: every buffer's `init`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> init: jaxbuf.InitFn = buffer.init
      >>> init({"obs": jnp.zeros(3)}).experience["obs"].shape
      (8, 3)
    """

    def __call__(self, example: PyTree) -> Any:
        """Creates an empty buffer state.

        Args:
          example: ONE item, a pytree of arrays or scalars without a batch axis. Only
            its structure, shapes and dtypes are used; storage is preallocated and
            zero-filled.

        Returns:
          The initial state.
        """


class AddFn(Protocol):
    """`add(state, items) -> state`: every buffer's `add`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> add: jaxbuf.AddFn = buffer.add
      >>> int(add(buffer.init(jnp.float32(0)), jnp.ones(3)).size)
      3
    """

    def __call__(self, state: Any, items: PyTree) -> Any:
        """Adds a batch of items and returns the new state.

        Args:
          state: the current state. Donate it (`jax.jit(add, donate_argnums=0)`)
            so that the write happens in place.
          items: the items to add, every leaf of shape `[B, *item_shape]` with the
            dtype of the example the state was made from.

        Returns:
          The new state.
        """


class SampleFn(Protocol):
    """`sample(state, key) -> sample`: every buffer's `sample`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> sample: jaxbuf.SampleFn = buffer.sample
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.ones(3))
      >>> sample(state, jax.random.key(0)).experience.shape
      (2,)
    """

    def __call__(self, state: Any, key: jax.Array) -> Any:
        """Draws a batch of stored items.

        Args:
          state: the buffer state.
          key: a PRNG key (typed `jax.random.key` or raw `jax.random.PRNGKey`).

        Returns:
          A sample record whose `experience` leaves have shape
          `[sample_batch_size, *item_shape]`.
        """


class CanSampleFn(Protocol):
    """`can_sample(state) -> bool array`: every buffer's `can_sample`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2, min_size=4)
      >>> can_sample: jaxbuf.CanSampleFn = buffer.can_sample
      >>> bool(can_sample(buffer.add(buffer.init(jnp.float32(0)), jnp.ones(3))))
      False
    """

    def __call__(self, state: Any) -> jax.Array:
        """Returns a boolean scalar array: whether the buffer holds `min_size` items."""
