"""Prioritized replay: jaxbuf versus Flashbax's prioritized flat and trajectory buffers.

Capacity 1e6 steps, sample batch 256, priority exponent 0.6.
Items: {obs: float32[64], action: int32, reward: float32, done: bool}.
- item: jaxbuf's prioritized replay buffer against Flashbax's prioritized flat
  buffer (add batch 8; Flashbax's flat buffer samples pairs of consecutive
  items, jaxbuf single items).
- trajectory: 16 environments x 62,500 steps, sequences of 8, one step per
  environment per add, against Flashbax's prioritized trajectory buffer.
Standalone jitted calls (donated `add`, `sample`, donated `set_priorities` of
256 priorities at the sampled indices) and one jitted `lax.scan` of 1000
iterations of add + sample + set_priorities (a DQN-with-PER step). Flashbax's
sum tree runs with `device=` the backend's name, its path for that backend. jaxbuf's `sample`
includes the importance weights (beta 0.4); Flashbax returns none. All cases take
turns in every timed round.

Run: `python -m benchmarks.micro.bench_prioritized [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuf
from benchmarks.common import (
    command_line,
    donated,
    flashbax_device,
    interleaved_medians,
    run_scan,
    write_results,
)

CAPACITY, BATCH, ADD_BATCH, NUM_ENVS, LENGTH, SCAN_LENGTH = 1_000_000, 256, 8, 16, 8, 1000
EXAMPLE = {
    "obs": jnp.zeros(64, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "done": jnp.bool_(False),
}


def make_items(key: jax.Array, *lead: int) -> dict:
    return {
        "obs": jax.random.normal(key, (*lead, 64)),
        "action": jnp.zeros(lead, jnp.int32),
        "reward": jnp.ones(lead, jnp.float32),
        "done": jnp.zeros(lead, bool),
    }


class Impl:
    """add / sample / set_priorities of one buffer, behind one interface."""

    def __init__(self, name, buffer, new_items, flashbax: bool):
        self.name, self.buffer, self.new_items, self.flashbax = name, buffer, new_items, flashbax

    def add(self, state, items):
        return self.buffer.add(state, items)

    def sample(self, state, key):
        batch = self.buffer.sample(state, key)
        experience = batch.experience
        if self.flashbax and hasattr(experience, "first"):
            experience = experience.first
        reward = experience["reward"]
        if not self.flashbax:  # jaxbuf's weights come with the sample; use them
            reward = reward * batch.weights.reshape(-1, *[1] * (reward.ndim - 1))
        consumed = reward.sum() + experience["obs"][..., 0].sum()
        return batch.indices, consumed

    def set_priorities(self, state, indices, priorities):
        return self.buffer.set_priorities(state, indices, priorities)


def implementations() -> dict[str, list[Impl]]:
    import flashbax as fbx

    ours_items = jaxbuf.make_replay_buffer(CAPACITY, BATCH, sampler=jaxbuf.prioritized(0.6))
    theirs_items = fbx.make_prioritised_flat_buffer(
        max_length=CAPACITY, min_length=2, sample_batch_size=BATCH, add_batch_size=ADD_BATCH,
        priority_exponent=0.6, device=flashbax_device(),
    )  # fmt: skip
    per_env = CAPACITY // NUM_ENVS
    ours_seq = jaxbuf.make_trajectory_buffer(
        NUM_ENVS, per_env, BATCH, LENGTH, sampler=jaxbuf.prioritized(0.6)
    )
    theirs_seq = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=NUM_ENVS, sample_batch_size=BATCH, sample_sequence_length=LENGTH,
        period=1, min_length_time_axis=LENGTH, max_length_time_axis=per_env,
        priority_exponent=0.6, device=flashbax_device(),
    )  # fmt: skip
    item = lambda key: make_items(key, ADD_BATCH)  # noqa: E731
    step = lambda key: make_items(key, NUM_ENVS, 1)  # noqa: E731
    return {
        "item": [
            Impl("jaxbuf", ours_items, item, False),
            Impl("flashbax", theirs_items, item, True),
        ],
        "trajectory": [
            Impl("jaxbuf", ours_seq, step, False),
            Impl("flashbax", theirs_seq, step, True),
        ],
    }


def full_state(impl: Impl, kind: str):
    state, key = impl.buffer.init(EXAMPLE), jax.random.key(0)
    if kind == "trajectory":  # both take [num_envs, T, ...]
        return jax.jit(impl.add, donate_argnums=0)(
            state, make_items(key, NUM_ENVS, CAPACITY // NUM_ENVS)
        )
    if not impl.flashbax:
        return jax.jit(impl.add, donate_argnums=0)(state, make_items(key, CAPACITY))
    return _fill_flat(impl, state, make_items(key, ADD_BATCH, CAPACITY // ADD_BATCH))


def _fill_flat(impl: Impl, state, chunk):
    """Flashbax's flat buffer takes [add_batch_size, ...] per add; scan over time."""

    def body(state, items):
        return impl.add(state, items), None

    run = jax.jit(lambda s, c: jax.lax.scan(body, s, c)[0], donate_argnums=0)
    return run(state, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), chunk))


def cases_for(impl: Impl, kind: str, calls: int, repeats: int) -> dict:
    key = jax.random.key(1)
    new = impl.new_items(key)
    add = jax.jit(impl.add, donate_argnums=0)
    sample = jax.jit(impl.sample)
    set_priorities = jax.jit(impl.set_priorities, donate_argnums=0)
    holder = [full_state(impl, kind)]
    keys = iter(list(jax.random.split(key, calls * (repeats + 1) + 1)))
    indices, _ = sample(holder[0], key)
    priorities = jax.random.uniform(key, (BATCH,), minval=0.1, maxval=2.0)

    one_add = donated(add, holder, new)
    one_set = donated(set_priorities, holder, indices, priorities)

    def body(carry, step_key):
        state, total = carry
        state = impl.add(state, new)
        drawn, consumed = impl.sample(state, step_key)
        fresh = jax.random.uniform(step_key, (BATCH,), minval=0.1, maxval=2.0)
        state = impl.set_priorities(state, drawn, fresh)
        return (state, total + consumed), None

    scan = run_scan(
        body, (full_state(impl, kind), jnp.float32(0)), jax.random.split(key, SCAN_LENGTH)
    )
    return {
        f"{impl.name}_add": (one_add, calls),
        f"{impl.name}_sample": (lambda: sample(holder[0], next(keys)), calls),
        f"{impl.name}_set": (one_set, calls),
        f"{impl.name}_scan": (scan, 1),
    }


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (10, 3) if args.quick else (100, 11)
    rows = []
    for kind, impls in implementations().items():
        cases = {}
        for impl in impls:
            cases |= cases_for(impl, kind, calls, repeats)
        times = interleaved_medians(cases, repeats)
        row = {"buffer": kind}
        for name, seconds in times.items():
            row[f"{name}_us"] = seconds * 1e6 / (SCAN_LENGTH if name.endswith("scan") else 1)
        for what in ("add", "sample", "set", "scan"):
            row[f"{what}_ratio"] = row[f"jaxbuf_{what}_us"] / row[f"flashbax_{what}_us"]
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    columns = [("buffer", "buffer", "{}")]
    for what, title in (("add", "add"), ("sample", "sample"), ("set", "set_priorities"),
                        ("scan", "scan (per iteration)")):  # fmt: skip
        columns += [
            (f"{title} jaxbuf (µs)", f"jaxbuf_{what}_us", "{:.1f}"),
            (f"{title} Flashbax (µs)", f"flashbax_{what}_us", "{:.1f}"),
            (f"{title}: jaxbuf / Flashbax", f"{what}_ratio", "{:.2f}"),
        ]
    write_results(args.out, "prioritized", rows, columns, __doc__)


if __name__ == "__main__":
    main()
