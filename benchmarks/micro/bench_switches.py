"""The CPU's size switches of `jaxbuf.core.lowering`, timed on both sides of each threshold.

Each switch picks a form by a static size. Here every case runs once with the form the
switch picks and once with the other form forced (the constant patched while the
function is traced), taking turns in one process on a full buffer:

- `PAIRS` (1,024): uniform draws without replacement from 1M items (Floyd's loop and
  comparison of every pair, against pointer doubling and a sort) at 1,024, 8,192 and
  32,768 draws; and a donated `set_priorities` of 256 and 4,096 entries into a prioritized
  replay buffer of 1M (the last occurrence of a repeated index found by pairs or by a sort);
- `WIDE_ROW` (512 bytes): a donated replay `add` of 4 and of 128 84×84 uint8 frames at
  capacity 10k, written as slice copies against one scatter;
- `FEW_ROWS` (64 rows): the same add at capacities 10k and 300k, and an add of 128
  frames, row by row against two windows.

Run: `python -m benchmarks.micro.bench_switches [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import command_line, donated, interleaved_times, write_results
from jaxbuf.core import lowering

FRAME = (84, 84)


@contextlib.contextmanager
def patched(name: str, value: int):
    """`lowering.<name>` set to `value` while a function is traced."""
    saved = getattr(lowering, name)
    setattr(lowering, name, value)
    try:
        yield
    finally:
        setattr(lowering, name, saved)


def compiled(fn, args, switch: str | None, value: int | None):
    """`fn` jitted and traced once with the switch patched (None: as it is)."""
    with patched(switch, value) if switch else contextlib.nullcontext():
        jax.block_until_ready(fn(*args))
    return fn


def full_replay(capacity: int, batch: int, example, sampler=None):
    buffer = jaxbuf.make_replay_buffer(capacity, batch, **({"sampler": sampler} if sampler else {}))
    add, state = jax.jit(buffer.add, donate_argnums=0), buffer.init(example)
    chunk = min(capacity, 100_000)
    rows = jax.tree.map(lambda x: jnp.zeros((chunk, *x.shape), x.dtype), example)
    for _ in range(capacity // chunk):
        state = add(state, rows)
    return buffer, state


def pairs_cases(quick: bool) -> dict:
    capacity = 100_000 if quick else 1_000_000
    cases, key = {}, jax.random.key(0)
    for batch in (1024, 8192) if quick else (1024, 8192, 32768):
        buffer, state = full_replay(capacity, batch, {"x": jnp.float32(0)},
                                    jaxbuf.uniform(replacement=False))  # fmt: skip
        for form, value in (("pairs", 1 << 30), ("sort", 0)):
            fn = compiled(jax.jit(lambda s, k, b=buffer: b.sample(s, k).indices), (state, key),
                          "PAIRS", value)  # fmt: skip
            picked = "pairs" if batch <= lowering.PAIRS else "sort"
            cases["PAIRS", f"{batch:,} draws without replacement", form, form == picked] = (
                lambda fn=fn, s=state: fn(s, key),
                3 if batch > 8192 else 10,
            )
    for count in (256, 4096):
        indices = jax.random.randint(key, (count,), 0, capacity)
        priorities = jnp.ones(count)
        for form, value in (("pairs", 1 << 30), ("sort", 0)):
            buffer, state = full_replay(capacity, 256, {"x": jnp.float32(0)}, jaxbuf.prioritized())
            update = jax.jit(buffer.set_priorities, donate_argnums=0)
            one = donated(update, [state], indices, priorities)
            picked = "pairs" if count <= lowering.PAIRS else "sort"
            cases["PAIRS", f"donated set_priorities of {count:,}", form, form == picked] = (
                compiled(one, (), "PAIRS", value),
                20,
            )
    return cases


def frame_cases(quick: bool) -> dict:
    cases, example = {}, {"obs": jnp.zeros(FRAME, jnp.uint8)}
    shapes = [(10_000, 4), (10_000, 128)] + ([] if quick else [(300_000, 4)])
    for capacity, count in shapes:
        frames = {"obs": jnp.ones((count, *FRAME), jnp.uint8)}
        forms = [("FEW_ROWS", "rows", 1 << 30), ("FEW_ROWS", "windows", 0)]
        if capacity == 10_000:
            forms.append(("WIDE_ROW", "scatter", 1 << 30))
        for switch, form, value in forms:
            buffer, state = full_replay(capacity, 32, example)
            one = donated(jax.jit(buffer.add, donate_argnums=0), [state], frames)
            compiled(one, (), switch, value)
            picked = "rows" if count <= lowering.FEW_ROWS else "windows"
            name = f"add of {count} frames at capacity {capacity:,}"
            cases[switch, name, form, form == picked] = (one, 20)
    return cases


def main() -> None:
    args = command_line(__doc__)
    cases = pairs_cases(args.quick) | frame_cases(args.quick)
    times = interleaved_times(cases, 3 if args.quick else 7)
    rows = []
    for (switch, case, form, picked), (median, fastest) in times.items():
        picked_time = next(t for (_, c, _, p), (t, _) in times.items() if (c, p) == (case, True))
        rows.append({"switch": switch, "case": case, "form": form,
                     "picked": "yes" if picked else "", "median_us": median * 1e6,
                     "fastest_us": fastest * 1e6, "ratio": median / picked_time})  # fmt: skip
        print(rows[-1], flush=True)
    columns = [("switch", "switch", "{}"), ("case", "case", "{}"), ("form", "form", "{}"),
               ("the switch picks it", "picked", "{}"), ("median µs", "median_us", "{:,.1f}"),
               ("fastest µs", "fastest_us", "{:,.1f}"),
               ("/ the form picked", "ratio", "{:.2f}")]  # fmt: skip
    write_results(args.out, "switches", rows, columns, __doc__)


if __name__ == "__main__":
    main()
