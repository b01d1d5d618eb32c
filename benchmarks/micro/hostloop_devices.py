"""A buffer stored on the host feeding a learner on another device: `bench_hostloop`'s
host-storage case, run in its own process (two simulated CPU devices).

8 environments of 84x84 uint8 frames, a transition buffer of 8,000 steps, `HostLoop`
with `steps_per_call=K`, one batch of 256 per environment step for a jitted learner
(a linear map of the frames, one gradient step per batch) and, every step, an action
read back from the learner's parameters (as a DQN's policy does). Variants, taking
turns in every timed round:

- `one device`: state and learner on device 0 (`output="jax"`);
- `host storage, device=1`: state on device 0, blocks delivered on device 1;
- `host storage, device=1, prefetch`: the same, each block drawn one call ahead.

Run by `bench_hostloop.py` (or: `python -m benchmarks.micro.hostloop_devices [--quick]`);
prints one JSON row per variant.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf

ENVS, BATCH, K, CAPACITY = 8, 256, 8, 8_000


def learner():
    """`update(params, block, j)`: one gradient step on batch `j` of a block, and
    `act(params, frames)`: one action per environment."""

    def loss(w, obs, next_obs):
        flat = lambda x: x.reshape(x.shape[0], -1).astype(jnp.float32) / 255  # noqa: E731
        return jnp.mean((flat(obs) @ w - 0.9 * flat(next_obs) @ w) ** 2)

    @jax.jit
    def update(w, block, j):
        batch = jax.tree.map(lambda x: x[j], block.experience)
        return w - 1e-3 * jax.grad(loss)(w, batch.obs, batch.next_obs)

    @jax.jit
    def act(w, frames):
        return jnp.argmax(frames.reshape(ENVS, -1).astype(jnp.float32) @ w, axis=-1)

    return update, act


def variant(device, prefetch: bool, trace: list):
    """One variant's step function over recorded steps."""
    store = jax.devices()[0]
    on = store if device is None else device
    buffer = jaxbuf.make_transition_buffer(ENVS, CAPACITY // ENVS, BATCH)
    frame = jnp.zeros((84, 84), jnp.uint8)
    example = jaxbuf.Transition(frame, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), frame)  # fmt: skip
    with jax.default_device(store):
        state = buffer.init(example)
    loop = jaxbuf.HostLoop(buffer, state, jax.random.key(0), steps_per_call=K, output="jax",
                           device=device, prefetch=prefetch)  # fmt: skip
    update, act = learner()
    held = {"w": jax.device_put(jnp.zeros((84 * 84, 4)), on), "block": None, "j": 0}

    def step(fields):
        block = loop.add(jaxbuf.Transition(*fields))
        if block is not None:
            held["block"], held["j"] = block, 0
        if held["block"] is not None and held["j"] < K:
            held["w"] = update(held["w"], held["block"], held["j"])
            held["j"] += 1
        return np.asarray(act(held["w"], jax.device_put(fields[5], on)))

    return step


def main() -> None:
    quick = "--quick" in sys.argv
    from benchmarks.micro.bench_hostloop import frame_trace

    trace = frame_trace(100 if quick else 800)
    other = jax.devices()[1]
    steps = {"one device": variant(None, False, trace),
             "host storage, device=1": variant(other, False, trace),
             "host storage, device=1, prefetch": variant(other, True, trace)}  # fmt: skip
    for step in steps.values():
        for fields in trace:
            step(fields)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3 if quick else 5):
        for name, step in steps.items():
            start = time.perf_counter()
            for fields in trace:
                step(fields)
            times[name].append((time.perf_counter() - start) / len(trace))
    base = float(np.median(times["one device"]))
    for name, values in times.items():
        print(json.dumps({"env": "84x84 uint8, learner", "buffer": f"jaxbuf k={K}, {name}",
                          "median_us": float(np.median(values)) * 1e6,
                          "fastest_us": float(np.min(values)) * 1e6,
                          "vs_one_device": float(np.median(values)) / base}))  # fmt: skip


if __name__ == "__main__":
    main()
