"""Frame stacking: frames stored once and stacked at sample time, against stacks stored.

Atari-style observations, uint8 84x84 frames stacked k=4, in an n-step (n=3)
transition buffer of 8 environments (`min_episode_length=100`, so final
observations add 1%). "stored once" keeps one frame per step and stacks at
`sample` (`frames={"obs": 4}`); "stacks stored" keeps the 4-frame stack of
every step, as a buffer without the option must. Memory is the state's bytes
per stored step; `sample` draws B=32 transitions (obs and next_obs stacks), both
variants taking turns in every timed round (median and fastest of the rounds).

Run: `python -m benchmarks.micro.bench_frames [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks.common import command_line, interleaved_times, write_results

ENVS, K, BATCH, FRAME = 8, 4, 32, (84, 84)


def filled(stored_once: bool, per_env: int):
    frames = {"obs": K} if stored_once else None
    buffer = jaxbuf.make_transition_buffer(ENVS, per_env, BATCH, n_step=3,
                                           min_episode_length=100, frames=frames)  # fmt: skip
    shape = FRAME if stored_once else (K, *FRAME)
    obs = jnp.zeros(shape, jnp.uint8)
    example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), obs)  # fmt: skip
    add = jax.jit(buffer.add, donate_argnums=0)
    state = buffer.init(example)
    chunk = 500
    for start in range(0, per_env, chunk):
        key = jax.random.key(start)
        pixels = jax.random.randint(key, (ENVS, chunk, *shape), 0, 255).astype(jnp.uint8)
        done = jax.random.uniform(key, (ENVS, chunk)) < 0.005
        steps = jaxbuf.Transition(pixels, jnp.zeros((ENVS, chunk), jnp.int32),
                                  jnp.ones((ENVS, chunk)), done, jnp.zeros((ENVS, chunk), bool),
                                  pixels)  # fmt: skip
        state = add(state, steps)
    return buffer, jax.block_until_ready(state)


def main() -> None:
    args = command_line(__doc__)
    per_env = 1000 if args.quick else 6000
    cases = {
        name: filled(name == "stored once", per_env) for name in ("stored once", "stacks stored")
    }
    frame_bytes = int(np.prod(FRAME))
    samplers = {}
    for name, (buffer, state) in cases.items():
        sample = jax.jit(buffer.sample)
        keys = iter(jax.random.split(jax.random.key(1), 100_000))
        samplers[name] = lambda sample=sample, state=state, keys=keys: sample(state, next(keys))
    calls, repeats = (20, 3) if args.quick else (100, 9)
    times = interleaved_times({n: (f, calls) for n, f in samplers.items()}, repeats)
    rows = []
    for name, (_, state) in cases.items():
        nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
        batch = samplers[name]()
        assert batch.experience.obs.shape == (BATCH, K, *FRAME)
        rows.append({
            "variant": name, "steps_stored": ENVS * per_env,
            "bytes_per_step": nbytes / (ENVS * per_env),
            "frames_per_step": nbytes / (ENVS * per_env) / frame_bytes,
            "sample_us": times[name][0] * 1e6, "sample_fastest_us": times[name][1] * 1e6,
        })  # fmt: skip
    for row in rows:
        row["memory_over_stacks_stored"] = row["bytes_per_step"] / rows[1]["bytes_per_step"]
        row["sample_over_stacks_stored"] = row["sample_us"] / rows[1]["sample_us"]
        print(row, flush=True)
    columns = [
        ("variant", "variant", "{}"),
        ("steps stored", "steps_stored", "{:,}"),
        ("bytes per step", "bytes_per_step", "{:,.0f}"),
        ("frames per step", "frames_per_step", "{:.2f}"),
        ("memory / stacks stored", "memory_over_stacks_stored", "{:.2f}"),
        ("sample B=32 median (µs)", "sample_us", "{:.0f}"),
        ("sample fastest (µs)", "sample_fastest_us", "{:.0f}"),
        ("sample / stacks stored", "sample_over_stacks_stored", "{:.2f}"),
    ]
    write_results(args.out, "frames", rows, columns, __doc__)


if __name__ == "__main__":
    main()
