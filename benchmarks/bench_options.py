"""What the epochs sampler and the rate limiter cost, against plain uniform replay.

- epochs: `next_batch` of a replay buffer with `sampler=jaxbuf.epochs()` against
  `sample` with the uniform sampler, capacity 1e5 full of {obs: float32[64]},
  B = 256. A pass of 1e5 items is 391 batches; the first of them sorts 1e5
  random keys, which the per-batch time includes on average (the calls run
  through whole passes).
- rate limiter: a jitted `lax.scan` of 1000 steps that adds 8 items and samples
  256, with and without `sample_to_insert_ratio(32, ...)` gating both through
  `lax.cond` (the limiter lets every step through, so the work is the same).

Both variants of a case take turns in every timed round; the table gives the
median and the fastest round.

Run: `python benchmarks/bench_options.py [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from common import command_line, interleaved_times, write_results

import jaxbuf

CAPACITY, BATCH, ADD = 100_000, 256, 8


def full(sampler):
    buffer = jaxbuf.make_replay_buffer(CAPACITY, BATCH, sampler=sampler)
    items = {"obs": jax.random.normal(jax.random.key(0), (CAPACITY, 64))}
    return buffer, buffer.add(buffer.init({"obs": jnp.zeros(64)}), items)


def epochs_case(calls: int, repeats: int) -> dict:
    uniform, ustate = full(jaxbuf.uniform())
    epochs, estate = full(jaxbuf.epochs())
    sample, next_batch = jax.jit(uniform.sample), jax.jit(epochs.next_batch, donate_argnums=0)
    keys = iter(jax.random.split(jax.random.key(1), 1_000_000))
    holder = [estate]

    def advance():
        holder[0], batch = next_batch(holder[0], next(keys))
        return batch

    cases = {"uniform sample": (lambda: sample(ustate, next(keys)), calls),
             "epochs next_batch": (advance, calls)}  # fmt: skip
    return interleaved_times(cases, repeats)


def limiter_case(calls: int, repeats: int) -> dict:
    buffer = jaxbuf.make_replay_buffer(CAPACITY, BATCH)
    limiter = jaxbuf.sample_to_insert_ratio(32.0, min_size_to_sample=1, error_buffer=1e6)
    items = {"obs": jnp.ones((ADD, 64))}

    def plain(carry, key):
        state, limits = carry
        state = buffer.add(state, items)
        return (state, limits), buffer.sample(state, key).experience["obs"].sum()

    def limited(carry, key):
        state, limits = carry
        state, limits = jax.lax.cond(
            limiter.can_insert(limits, ADD),
            lambda: (buffer.add(state, items), limiter.inserted(limits, ADD)),
            lambda: (state, limits),
        )
        total = jax.lax.cond(limiter.can_sample(limits, BATCH),
                             lambda: buffer.sample(state, key).experience["obs"].sum(),
                             lambda: jnp.float32(0))  # fmt: skip
        limits = limiter.sampled(limits, BATCH)
        return (state, limits), total

    runs = {}
    for name, body in (("no limiter", plain), ("rate limiter", limited)):
        loop = jax.jit(lambda c, ks, body=body: jax.lax.scan(body, c, ks), donate_argnums=0)
        holder = [(buffer.init({"obs": jnp.zeros(64)}), limiter.init())]
        keys = jax.random.split(jax.random.key(2), 1000)

        def run(loop=loop, holder=holder, keys=keys):
            holder[0], totals = loop(holder[0], keys)
            return totals

        runs[name] = run
    out = interleaved_times({n: (f, calls) for n, f in runs.items()}, repeats)
    return {name: (m / 1000, f / 1000) for name, (m, f) in out.items()}  # per step


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (20, 3) if args.quick else (391, 7)
    rows = []
    cases = {"epochs": epochs_case(calls, repeats),
             "rate limiter": limiter_case(2 if args.quick else 5, repeats)}  # fmt: skip
    for case, times in cases.items():
        base = next(iter(times.values()))
        for name, (median, fastest) in times.items():
            rows.append({"case": case, "variant": name, "median_us": median * 1e6,
                         "fastest_us": fastest * 1e6, "over_plain": median / base[0],
                         "fastest_over_plain": fastest / base[1]})  # fmt: skip
            print(rows[-1], flush=True)
    columns = [
        ("case", "case", "{}"),
        ("variant", "variant", "{}"),
        ("median (µs per call or step)", "median_us", "{:.1f}"),
        ("fastest (µs)", "fastest_us", "{:.1f}"),
        ("median / plain", "over_plain", "{:.2f}"),
        ("fastest / plain", "fastest_over_plain", "{:.2f}"),
    ]
    write_results(args.out, "options", rows, columns, __doc__)


if __name__ == "__main__":
    main()
