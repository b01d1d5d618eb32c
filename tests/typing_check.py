"""Checked by pyright (tests/test_typing.py), never run: every kind is a BufferLike."""

import jax
import jax.numpy as jnp

import jaxbuf


def every_kind_is_buffer_like() -> list[jaxbuf.types.BufferLike]:
    sampled = jaxbuf.make_replay_buffer(8, 2, sampler=jaxbuf.prioritized())
    return [
        sampled,
        jaxbuf.make_trajectory_buffer(2, 8, 2, 2),
        jaxbuf.make_transition_buffer(2, 8, 2),
        jaxbuf.make_episode_buffer(2, 8, 2, 4, done_fn=lambda step: step["done"]),
        jaxbuf.vectorize(sampled, 2),
        jaxbuf.make_queue(8, 2, 2),
        jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9),
        sampled.replace(add=jax.jit(sampled.add, donate_argnums=0)),
    ]


def a_sample_is_typed(buffer: jaxbuf.Buffer) -> jax.Array:
    batch: jaxbuf.Sample = buffer.sample(buffer.init(jnp.float32(0)), jax.random.key(0))
    return batch.indices
