"""The drop-in `jaxbuf.flashbax` against Flashbax itself: every factory's add and sample.

Each case builds the same buffer with `import flashbax as fbx` and with `import
jaxbuf.flashbax as fbx` (the same call), fills both with the same steps, and times
standalone jitted calls on the filled buffer, the two libraries taking turns in every
round (the table gives the median and the fastest round, and their ratios):

- add: a donated `add` of one batch; sample: a `sample` whose every leaf is summed (so the
  whole gather happens); set: a donated `set_priorities` at a sample's indices; the
  queue's add and sample run together in one call (each frees what the other fills).
- Shapes, as Flashbax's users run them: PureJaxRL's DQN (flat buffer, 10 CartPole
  environments, 10,000 steps, batches of 128), items of 64 floats (100,000, batches of
  256), Stoix-style sequences (16 environments of 10,000 steps, sequences of 20, adds of
  10 steps), Rainbow-style prioritised flat and item buffers (100,000 steps, batches of
  256), a queue of 16 rows (adds and samples of 16 steps), and Flashbax issue #62's
  prioritised trajectory buffer (16 environments, 2M steps, sequences of 11, adds of 100
  steps of 100 floats, batches of 256; `--quick`: 160,000 steps).

Flashbax runs with `device=` the backend's name, and with JAX's default rank promotion
(its code relies on it). Run: `python -m benchmarks.micro.bench_flashbax_dropin [--quick]
[--out benchmarks/results]`.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from benchmarks.common import (
    command_line,
    donated,
    flashbax_device,
    interleaved_times,
    write_results,
)

CARTPOLE = {"obs": jnp.zeros(4), "action": jnp.int32(0), "reward": jnp.float32(0),
            "done": jnp.bool_(False)}  # fmt: skip
VECTOR = {"obs": jnp.zeros(64), "reward": jnp.float32(0)}
ISSUE_62 = {"obs": jnp.zeros(100), "reward": jnp.float32(0)}


def cases(quick: bool) -> dict:
    """name -> (factory, arguments, example, the leading shape of one add)."""
    steps_62 = 160_000 if quick else 2_000_000
    return {
        "flat (PureJaxRL DQN)": ("make_flat_buffer", dict(max_length=10_000, min_length=128,
                                 sample_batch_size=128, add_batch_size=10), CARTPOLE, (10,)),
        "item": ("make_item_buffer", dict(max_length=100_000, min_length=1, sample_batch_size=256,
                 add_batches=True), VECTOR, (256,)),
        "trajectory": ("make_trajectory_buffer", dict(add_batch_size=16, sample_batch_size=32,
                       sample_sequence_length=20, period=1, min_length_time_axis=20,
                       max_length_time_axis=10_000), VECTOR, (16, 10)),
        "queue": ("make_trajectory_queue", dict(max_length_time_axis=1024, add_batch_size=16,
                  add_sequence_length=16, sample_sequence_length=16), VECTOR, (16, 16)),
        "prioritised flat": ("make_prioritised_flat_buffer", dict(max_length=100_000,
                             min_length=256, sample_batch_size=256, add_batch_size=16),
                             VECTOR, (16,)),
        "prioritised item": ("make_prioritised_item_buffer", dict(max_length=100_000,
                             min_length=1, sample_batch_size=256, add_batches=True), VECTOR,
                             (256,)),
        "prioritised trajectory (#62)": ("make_prioritised_trajectory_buffer", dict(
            add_batch_size=16, sample_batch_size=256, sample_sequence_length=11, period=1,
            min_length_time_axis=11, max_length_time_axis=steps_62 // 16), ISSUE_62, (16, 100)),
    }  # fmt: skip


def allowed(fn):
    """`fn` under JAX's default rank promotion (Flashbax's code relies on it)."""

    def run(*args):
        with jax.numpy_rank_promotion("allow"):
            return fn(*args)

    return run


def data(example: dict, lead: tuple, key: jax.Array) -> dict:
    return {k: jax.random.normal(key, (*lead, *v.shape)).astype(v.dtype) if v.dtype != bool
            else jnp.zeros((*lead, *v.shape), bool) for k, v in example.items()}  # fmt: skip


def filled(buffer, example: dict, lead: tuple, capacity_steps: int):
    """The buffer's state after adds of steps covering its capacity (at least 2 adds); a
    queue's, empty."""
    add, state = jax.jit(buffer.add, donate_argnums=0), buffer.init(example)
    if hasattr(buffer, "can_add"):
        return state
    per_row = capacity_steps // lead[0]
    chunk_lead = (lead[0], min(lead[1] * 125, 12_500, per_row)) if len(lead) == 2 else lead
    per_add = int(jnp.prod(jnp.asarray(chunk_lead)))
    for i in range(max(2, capacity_steps // per_add + 1)):
        state = add(state, data(example, chunk_lead, jax.random.key(i)))
    return state


def timed_calls(name: str, buffer, example: dict, lead: tuple, capacity: int) -> dict:
    holder, key = [filled(buffer, example, lead, capacity)], jax.random.key(1)
    new = data(example, lead, key)
    if hasattr(buffer, "can_add"):  # the queue: an add and a sample per call

        @jax.jit
        def cycle(state, new):
            state, _batch = buffer.sample(buffer.add(state, new))
            return state

        return {(name, "add + sample"): donated(jax.jit(cycle, donate_argnums=0), holder, new)}

    @jax.jit
    def sample(state, key):
        batch = buffer.sample(state, key)
        total = jax.tree.reduce(lambda a, x: a + x.astype(jnp.float32).sum(), batch.experience, 0.0)
        return getattr(batch, "indices", None), total

    calls = {(name, "add"): donated(jax.jit(buffer.add, donate_argnums=0), holder, new),
             (name, "sample"): lambda: sample(holder[0], key)}  # fmt: skip
    if hasattr(buffer, "set_priorities"):
        indices, _ = sample(holder[0], key)
        priorities = jax.random.uniform(key, indices.shape, minval=0.1, maxval=2.0)
        set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)
        calls[name, "set"] = donated(set_priorities, holder, indices, priorities)
    return calls


def make(library, factory: str, kwargs: dict):
    if factory.startswith("make_prioritised"):
        kwargs = {**kwargs, "device": flashbax_device()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buffer = getattr(library, factory)(**kwargs)
    names = ("init", "add", "sample", "can_sample", "set_priorities", "can_add")
    return buffer.replace(**{n: allowed(getattr(buffer, n)) for n in names if hasattr(buffer, n)})


def capacity_of(kwargs: dict) -> int:
    if "max_length" in kwargs:
        return kwargs["max_length"]
    return kwargs["max_length_time_axis"] * kwargs["add_batch_size"]


def main() -> None:
    import flashbax

    import jaxbuf.flashbax

    args = command_line(__doc__)
    repeats, calls = (3, 5) if args.quick else (11, 20)
    rows = []
    for case, (factory, kwargs, example, lead) in cases(args.quick).items():
        timed = {}
        for label, library in (("jaxbuf", jaxbuf.flashbax), ("flashbax", flashbax)):
            buffer = make(library, factory, kwargs)
            for (_, what), fn in timed_calls(case, buffer, example, lead,
                                             capacity_of(kwargs)).items():  # fmt: skip
                timed[label, what] = (fn, calls)
        times = interleaved_times(timed, repeats)
        for what in dict.fromkeys(what for _, what in timed):
            (ours, ours_fast), (theirs, theirs_fast) = (
                times["jaxbuf", what],
                times["flashbax", what],
            )
            rows.append({"case": case, "operation": what, "jaxbuf_us": ours * 1e6,
                         "flashbax_us": theirs * 1e6, "ratio": ours / theirs,
                         "fastest_ratio": ours_fast / theirs_fast})  # fmt: skip
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()})
    columns = [("buffer", "case", "{}"), ("operation", "operation", "{}"),
               ("drop-in median (µs)", "jaxbuf_us", "{:.0f}"),
               ("Flashbax median (µs)", "flashbax_us", "{:.0f}"),
               ("median: drop-in / Flashbax", "ratio", "{:.2f}"),
               ("fastest: drop-in / Flashbax", "fastest_ratio", "{:.2f}")]  # fmt: skip
    write_results(args.out, "flashbax_dropin", rows, columns, __doc__)


if __name__ == "__main__":
    main()
