"""Plain Python/NumPy reference models that jaxbuf is compared against."""

from __future__ import annotations

import numpy as np


class RingBuffer:
    """A FIFO ring of items, one Python-level write per item.

    Items are dicts of NumPy arrays; `add` takes leaves `[B, ...]`.
    """

    def __init__(self, capacity: int, example: dict[str, np.ndarray]):
        self.capacity = capacity
        self.storage = {k: np.zeros((capacity, *np.shape(v)), np.asarray(v).dtype)
                        for k, v in example.items()}  # fmt: skip
        self.position = 0
        self.size = 0

    def add(self, items: dict[str, np.ndarray]) -> None:
        batch = len(next(iter(items.values())))
        for j in range(batch):
            for k, column in self.storage.items():
                column[self.position] = items[k][j]
            self.position = (self.position + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def stored(self) -> dict[str, np.ndarray]:
        """The stored items, oldest first."""
        start = self.position if self.size == self.capacity else 0
        order = (start + np.arange(self.size)) % self.capacity
        return {k: v[order] for k, v in self.storage.items()}


def np_gae(r, v, nv, term, trunc, gamma, lam):
    """GAE by a Python loop over time; arrays `[T, ...]`, coefficients full-shaped."""
    advantages, following = np.zeros_like(r), np.zeros_like(r[0])
    for t in reversed(range(len(r))):
        delta = r[t] + gamma[t] * (1 - term[t]) * nv[t] - v[t]
        following = delta + gamma[t] * lam[t] * (1 - (term[t] | trunc[t])) * following
        advantages[t] = following
    return advantages, advantages + v


def rejects_and_keeps_state(wrap, fn, state, *args, error, match):
    """Calls `fn(state, *args)` eagerly, jitted with the state donated, or under vmap
    (a batch of one), expecting `error` matching `match`; then checks the state is
    intact and not deleted."""
    import re

    import chex
    import jax
    import pytest

    before = jax.tree.map(np.asarray, state)
    with pytest.raises(error, match=re.escape(match)):
        if wrap == "eager":
            fn(state, *args)
        elif wrap == "jit":
            jax.jit(fn, donate_argnums=0)(state, *args)
        else:
            jax.vmap(fn)(*jax.tree.map(lambda x: x[None], (state, *args)))
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, state), before)


def prioritized_replay(capacity, batch, *, priority_exponent=0.6, stratified=True, **kwargs):
    """`make_replay_buffer` with the prioritized sampler."""
    import jaxbuf

    sampler = jaxbuf.prioritized(priority_exponent, stratified)
    return jaxbuf.make_replay_buffer(capacity, batch, sampler=sampler, **kwargs)


def prioritized_trajectory(*args, priority_exponent=0.6, stratified=True, **kwargs):
    """`make_trajectory_buffer` with the prioritized sampler."""
    import jaxbuf

    sampler = jaxbuf.prioritized(priority_exponent, stratified)
    return jaxbuf.make_trajectory_buffer(*args, sampler=sampler, **kwargs)


def prioritized_transition(*args, priority_exponent=0.6, stratified=True, **kwargs):
    """`make_transition_buffer` with the prioritized sampler."""
    import jaxbuf

    sampler = jaxbuf.prioritized(priority_exponent, stratified)
    return jaxbuf.make_transition_buffer(*args, sampler=sampler, **kwargs)


def env_time(batch, capacity):
    """The (env, time) of each item of a per-environment sample, from its indices."""
    indices = np.asarray(batch.indices)
    return indices // capacity, indices % capacity


def add_size(rng: np.random.Generator, most: int) -> int:
    """A random add size out of those that tell the cases apart: 1, 2, one that does not
    divide a ring of `most`, `most - 1` and `most`. Each size is one compiled program
    (a new shape traces and compiles anew, about 0.3 s), and random sizes drawn from
    these few still end the adds at ever other places of the ring."""
    return int(rng.choice(sorted({1, 2, max(1, most // 2 - 1), max(1, most - 1), most})))
