"""A buffer stored on one device feeding a learner on another (two simulated CPUs).

`test_host_delivery.py` runs this file in a fresh process, since the number of
simulated devices is fixed when JAX starts: `python tests/workers/host_device.py`.
It raises on a failed check and prints `ok` at the end.
"""

from __future__ import annotations

import os

# after the caller's flags (conftest.py's compile flags), so that this count wins
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"  # noqa: E501  # fmt: skip
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf

STEPS, K = 40, 4


def steps(rng) -> list[dict]:
    return [{"obs": rng.normal(size=(3, 5)).astype(np.float32), "id": np.full(3, t, np.int32)}
            for t in range(STEPS)]  # fmt: skip


def run(store, learner, prefetch: bool) -> tuple[list, object]:
    """Blocks delivered by a loop whose state lives on `store`, and its final state."""
    buffer = jaxbuf.make_replay_buffer(64, 8)
    with jax.default_device(store):
        state = buffer.init({"obs": jnp.zeros(5), "id": jnp.int32(0)})
    loop = jaxbuf.HostLoop(buffer, state, jax.random.key(1), steps_per_call=K, output="jax",
                           device=learner, prefetch=prefetch)  # fmt: skip
    blocks = []
    with loop:
        for step in steps(np.random.default_rng(0)):
            block = loop.add(step)
            if block is not None:
                learned = jax.jit(lambda b: b.experience["obs"].sum())(block)  # on the learner
                assert learned.devices() == {learner}, learned.devices()
                blocks.append(block)
    return blocks, loop.state


def main() -> None:
    store, learner = jax.devices()
    for prefetch in (False, True):
        apart, state = run(store, learner, prefetch)
        together, same_state = run(store, store, prefetch)
        assert state.size.devices() == {store}, "the state stays where it was stored"
        assert len(apart) == len(together) == STEPS // K
        for a, b in zip(apart, together, strict=True):
            assert all(x.devices() == {learner} for x in jax.tree.leaves(a))
            pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
            assert all(np.array_equal(x, y) for x, y in pairs)
        assert np.array_equal(state.experience["id"], same_state.experience["id"])
    print("ok")


if __name__ == "__main__":
    main()
