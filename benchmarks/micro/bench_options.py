"""What the epochs sampler, the rate limiter and goal relabeling cost, against plain buffers.

- epochs: `next_batch` of a replay buffer with `sampler=jaxbuf.epochs()` against
  `sample` with the uniform sampler, capacity 1e5 (and 1e6: `epochs at 1e6`) full
  of {obs: float32[64]}, B = 256. A pass of 1e5 items is 391 batches; the calls
  run through whole passes, so a pass's beginning is included on average. A call
  evaluates the pass's permutation at its 256 positions only, so its cost does not
  grow with the capacity.
- rate limiter: a jitted `lax.scan` of 1000 steps that adds 8 items and samples
  256, without and with `sample_to_insert_ratio(32, ...)` gating both: by masked
  writes (`add(..., where=)`, the documented way) and through `lax.cond` (the
  limiter lets every step through, so the work is the same).
- hindsight: `sample` of a transition buffer with `goals=jaxbuf.hindsight(...,
  strategy="future", ratio=0.8)` against the same buffer without, 16
  environments x 2**14 steps of bit-flipping observations (two bool[50] goals)
  with episodes of 50 steps, B = 256. Relabeling adds a binary search over the
  side ring per item, a read of the source's achieved goal and the reward_fn.

Both variants of a case take turns in every timed round; the table gives the
median and the fastest round.

Run: `python -m benchmarks.micro.bench_options [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, interleaved_times, write_results

CAPACITY, BATCH, ADD = 100_000, 256, 8


def full(sampler, capacity: int = CAPACITY):
    buffer = jaxbuf.make_replay_buffer(capacity, BATCH, sampler=sampler)
    items = {"obs": jax.random.normal(jax.random.key(0), (capacity, 64))}
    return buffer, buffer.add(buffer.init({"obs": jnp.zeros(64)}), items)


def epochs_case(calls: int, repeats: int, capacity: int = CAPACITY) -> dict:
    uniform, ustate = full(jaxbuf.uniform(), capacity)
    epochs, estate = full(jaxbuf.epochs(), capacity)
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

    def masked(carry, key):  # the documented way: masked writes and gated counts
        state, limits = carry
        allowed = limiter.can_insert(limits, ADD)
        state = buffer.add(state, items, where=allowed)
        limits = limiter.inserted(limits, ADD, where=allowed)
        learn = limiter.can_sample(limits, BATCH)
        total = jnp.where(learn, buffer.sample(state, key).experience["obs"].sum(), 0.0)
        return (state, limiter.sampled(limits, BATCH, where=learn)), total

    def by_cond(carry, key):  # the same gates through lax.cond
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
    variants = [
        ("no limiter", plain),
        ("rate limiter", masked),
        ("rate limiter, lax.cond", by_cond),
    ]
    for name, body in variants:
        loop = jax.jit(lambda c, ks, body=body: jax.lax.scan(body, c, ks), donate_argnums=0)
        holder = [(buffer.init({"obs": jnp.zeros(64)}), limiter.init())]
        keys = jax.random.split(jax.random.key(2), 1000)

        def run(loop=loop, holder=holder, keys=keys):
            holder[0], totals = loop(holder[0], keys)
            return totals

        runs[name] = run
    out = interleaved_times({n: (f, calls) for n, f in runs.items()}, repeats)
    return {name: (m / 1000, f / 1000) for name, (m, f) in out.items()}  # per step


def hindsight_case(calls: int, repeats: int) -> dict:
    from jaxbuf.examples import her_bitflip

    bits, num_envs, capacity = 50, 16, 2**14
    goals = jaxbuf.hindsight(her_bitflip.reward_fn, terminal_fn=her_bitflip.success)
    obs = {"achieved_goal": jnp.zeros(bits, bool), "desired_goal": jnp.zeros(bits, bool)}
    example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), obs)  # fmt: skip
    key = jax.random.key(3)
    shape = (num_envs, capacity)
    bit_leaves = {
        name: jax.random.bernoulli(jax.random.fold_in(key, i), 0.5, (*shape, bits))
        for i, name in enumerate(obs)
    }
    truncated = jnp.broadcast_to(jnp.arange(capacity) % bits == bits - 1, shape)
    steps = jaxbuf.Transition(
        obs=bit_leaves,
        action=jnp.zeros(shape, jnp.int32),
        reward=-jnp.ones(shape, jnp.float32),
        terminated=jnp.zeros(shape, bool),
        truncated=truncated,
        next_obs=jax.tree.map(jnp.logical_not, bit_leaves),
    )
    cases = {}
    for name, option in (("plain transition sample", None), ("hindsight sample", goals)):
        buffer = jaxbuf.make_transition_buffer(num_envs, capacity, BATCH, goals=option)
        state = buffer.add(buffer.init(example), steps)
        sample, keys = jax.jit(buffer.sample), iter(jax.random.split(key, 100_000))
        cases[name] = (lambda s=sample, st=state, k=keys: s(st, next(k)), calls)
    return interleaved_times(cases, repeats)


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (20, 3) if args.quick else (391, 7)
    rows = []
    cases = {"epochs": epochs_case(calls, repeats),
             "epochs at 1e6": epochs_case(calls, repeats, 10 * CAPACITY),
             "rate limiter": limiter_case(2 if args.quick else 5, repeats),
             "hindsight": hindsight_case(calls, repeats)}  # fmt: skip
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
