"""Flashbax issue #62: a MuZero-style prioritized trajectory buffer, jaxbuf against Flashbax.

https://github.com/instadeepai/flashbax/issues/62 (open upstream): a user found Flashbax's
prioritised trajectory buffer too slow on CPU for 16 environments, 2M steps in all
(125,000 per environment), sequences of 11 steps drawn at every step (period 1), adds of
100 steps per environment ([16, 100, ...]: observations of 100 floats and a reward), 256
sequences per sample, priority exponent 0.6. Both buffers are filled first; then each
operation is timed as a standalone jitted call on the full buffer:

- add: a donated add of [16, 100] steps (1,600 new sequence starts get the largest
  priority, and the 1,600 overwritten ones leave the tree);
- sample: 256 sequences of 11 steps with their indices, every leaf of the experience
  summed (so the whole [256, 11, 100] gather happens); jaxbuf's includes the importance
  weights;
- set: a donated `set_priorities` of 256 priorities at a sample's indices.

Flashbax runs with `device=` the backend's name (its CPU path on a CPU). The two
libraries take turns in every timed round; the table gives the median and the fastest
round and their ratios.

Run: `python -m benchmarks.micro.bench_flashbax62 [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import (
    command_line,
    donated,
    flashbax_device,
    interleaved_times,
    write_results,
)

ENVS, STEPS, LENGTH, ADD, OBS, BATCH = 16, 2_000_000, 11, 100, 100, 256
EXAMPLE = {"obs": jnp.zeros(OBS, jnp.float32), "reward": jnp.float32(0)}


def steps(key: jax.Array, count: int) -> dict:
    return {"obs": jax.random.normal(key, (ENVS, count, OBS)),
            "reward": jax.random.uniform(key, (ENVS, count))}  # fmt: skip


def buffers(total: int) -> dict:
    import flashbax as fbx

    per_env = total // ENVS
    ours = jaxbuf.make_trajectory_buffer(ENVS, per_env, BATCH, LENGTH,
                                         sampler=jaxbuf.prioritized(0.6))  # fmt: skip
    theirs = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=ENVS, sample_batch_size=BATCH, sample_sequence_length=LENGTH, period=1,
        min_length_time_axis=LENGTH, max_length_time_axis=per_env, priority_exponent=0.6,
        device=flashbax_device(),
    )  # fmt: skip
    return {"jaxbuf": ours, "flashbax": theirs}


def filled(buffer, per_env: int):
    add, state = jax.jit(buffer.add, donate_argnums=0), buffer.init(EXAMPLE)
    chunk = min(per_env, 12_500)
    for i in range(per_env // chunk):
        state = add(state, steps(jax.random.key(i), chunk))
    return state


def cases(name: str, buffer, total: int) -> dict:
    holder, key = [filled(buffer, total // ENVS)], jax.random.key(1)
    new = steps(key, ADD)
    add = jax.jit(buffer.add, donate_argnums=0)
    set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)

    @jax.jit
    def sample(state, key):
        batch = buffer.sample(state, key)
        return batch.indices, jax.tree.reduce(lambda a, x: a + x.sum(), batch.experience, 0.0)

    indices, _ = sample(holder[0], key)
    priorities = jax.random.uniform(key, (BATCH,), minval=0.1, maxval=2.0)

    return {(name, "add"): donated(add, holder, new),
            (name, "sample"): lambda: sample(holder[0], key),
            (name, "set"): donated(set_priorities, holder, indices, priorities)}  # fmt: skip


def main() -> None:
    args = command_line(__doc__)
    total, calls, repeats = (160_000, 5, 3) if args.quick else (STEPS, 20, 15)
    timed = {}
    for name, buffer in buffers(total).items():
        timed |= {case: (fn, calls) for case, fn in cases(name, buffer, total).items()}
    times = interleaved_times(timed, repeats)
    rows = []
    for what in ("add", "sample", "set"):
        (ours, ours_fast), (theirs, theirs_fast) = times["jaxbuf", what], times["flashbax", what]
        rows.append({"operation": what, "jaxbuf_us": ours * 1e6, "flashbax_us": theirs * 1e6,
                     "ratio": ours / theirs, "jaxbuf_fastest_us": ours_fast * 1e6,
                     "flashbax_fastest_us": theirs_fast * 1e6,
                     "fastest_ratio": ours_fast / theirs_fast})  # fmt: skip
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()})
    columns = [("operation", "operation", "{}"),
               ("jaxbuf median (µs)", "jaxbuf_us", "{:.0f}"),
               ("Flashbax median (µs)", "flashbax_us", "{:.0f}"),
               ("median: jaxbuf / Flashbax", "ratio", "{:.2f}"),
               ("jaxbuf fastest (µs)", "jaxbuf_fastest_us", "{:.0f}"),
               ("Flashbax fastest (µs)", "flashbax_fastest_us", "{:.0f}"),
               ("fastest: jaxbuf / Flashbax", "fastest_ratio", "{:.2f}")]  # fmt: skip
    write_results(args.out, "flashbax62", rows, columns, __doc__)


if __name__ == "__main__":
    main()
