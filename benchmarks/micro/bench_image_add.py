"""A donated add of 84x84 uint8 frames against the capacity: does it cost what its bytes cost?

A jitted, donated `add` into a buffer filled beforehand (every page of its storage
written), at capacities of 10k, 100k and 300k frames (and 1M with `--million`, 7 GB):

- `replay add of 4 frames`: `make_replay_buffer`, items {obs: uint8[84, 84], action,
  reward, done}, 4 per add (the rows of a 4-environment Python loop);
- `transition add_step, 4 envs`: `make_transition_buffer(4, capacity / 4,
  frames={"obs": 4}, min_episode_length=20)`, one step of every environment.

Capacities take turns in every timed round; the table gives the median and fastest
microseconds per add and the ratio to the smallest capacity.

Run: `python -m benchmarks.micro.bench_image_add [--quick] [--million] [--out benchmarks/results]`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import interleaved_times, write_results

FRAME = jnp.zeros((84, 84), jnp.uint8)
ENVS = 4


def replay_case(capacity: int):
    buffer = jaxbuf.make_replay_buffer(capacity, 32)
    example = {"obs": FRAME, "action": jnp.int32(0), "reward": jnp.float32(0),
               "done": jnp.bool_(False)}  # fmt: skip
    items = jax.tree.map(lambda x: jnp.ones((ENVS, *x.shape), x.dtype), example)
    return buffer.init(example), jax.jit(buffer.add, donate_argnums=0), items


def transition_case(capacity: int):
    buffer = jaxbuf.make_transition_buffer(ENVS, capacity // ENVS, 32, frames={"obs": 4},
                                           min_episode_length=20)  # fmt: skip
    example = jaxbuf.Transition(FRAME, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), FRAME)  # fmt: skip
    step = jax.tree.map(lambda x: jnp.ones((ENVS, *x.shape), x.dtype), example)
    step = step.replace(terminated=jnp.arange(ENVS) == 0)  # an episode end every add
    return buffer.init(example), jax.jit(buffer.add_step, donate_argnums=0), step


def timed_add(case, capacity: int):
    """A function making one donated add (returning the state), after filling the
    buffer once over."""
    state, add, data = case(capacity)
    for _ in range(capacity // ENVS + 1):  # every row written once: every page touched
        state = add(state, data)
    held = {"state": jax.block_until_ready(state)}

    def once():
        held["state"] = add(held["state"], data)
        return held["state"]

    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--million", action="store_true", help="also 1M frames (7 GB)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    capacities = [10_000, 100_000, 300_000] + ([1_000_000] if args.million else [])
    calls, repeats = (50, 3) if args.quick else (200, 7)
    rows = []
    for name, case in [("replay add of 4 frames", replay_case),
                       ("transition add_step, 4 envs", transition_case)]:  # fmt: skip
        cases = {c: (timed_add(case, c), calls) for c in capacities}
        times = interleaved_times(cases, repeats)
        base = times[capacities[0]][0]
        rows += [{"case": name, "capacity": c, "median_us": m * 1e6, "fastest_us": f * 1e6,
                  "vs_smallest": m / base} for c, (m, f) in times.items()]  # fmt: skip
        del cases
    columns = [("case", "case", "{}"), ("capacity", "capacity", "{:,}"),
               ("µs per add (median)", "median_us", "{:.1f}"), ("fastest", "fastest_us", "{:.1f}"),
               ("/ at 10k", "vs_smallest", "{:.2f}")]  # fmt: skip
    write_results(args.out, "image_add", rows, columns, __doc__)
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
