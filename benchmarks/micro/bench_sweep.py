"""add and sample of every buffer kind against capacity and batch size, with peers.

Kinds and peers (where they have the same operation):
- replay: jaxbuf, Flashbax's item buffer, cpprb's ReplayBuffer, and a NumPy ring
  buffer as Stable-Baselines3 writes one (preallocated arrays, a position, a
  fancy-index sample); add 8 items, sample B.
- prioritized: jaxbuf, Flashbax's prioritised item buffer (`device=` the backend),
  cpprb's PrioritizedReplayBuffer; add 8, sample B with importance weights.
- trajectory: jaxbuf and Flashbax's trajectory buffer, 16 environments, one step
  each per add, B sequences of 8.
- transition (jaxbuf; 3-step, 16 environments) and episode (jaxbuf; whole
  episodes of at most 32 steps): no peer has the operation.
- queue: jaxbuf's queue and Flashbax's trajectory queue (8 streams, popped as
  8 sequences of B / 8); add 8 items, take B. Both add to a full queue (the items
  are dropped after the same checks) and take from the same full state.
Items are {obs: float32[64], action: int32, reward: float32, done: bool}.
Capacity sweeps 1e3 to 1e6 at B = 256; the batch sweep takes B in {32, 256,
2048} at capacity 1e5. JAX calls are jitted (donated `add`); Python peers are
called as their users call them. The donation rows time jaxbuf's replay `add`
jitted without `donate_argnums`: XLA then copies the whole storage per call.
Memory is the bytes of a state (or the peer's arrays) per stored item, over the
bytes of one item; cpprb does not expose its arrays, so its figure is their
nominal size (one array per field), not a measurement. All implementations of a case take
turns in every timed round; read the ratios.

Run: `python -m benchmarks.micro.bench_sweep [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks.common import command_line, flashbax_device, interleaved_medians, write_results

ADD, ENVS, LENGTH = 8, 16, 8
CAPACITIES = (1_000, 10_000, 100_000, 1_000_000)
BATCHES = (32, 256, 2048)
ITEM_BYTES = 64 * 4 + 4 + 4 + 1
EXAMPLE = {
    "obs": jnp.zeros(64, jnp.float32),
    "action": jnp.int32(0),
    "reward": jnp.float32(0),
    "done": jnp.bool_(False),
}


def items(*lead: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(*lead, 64)).astype(np.float32),
        "action": rng.integers(0, 4, lead).astype(np.int32),
        "reward": rng.normal(size=lead).astype(np.float32),
        "done": rng.random(lead) < 0.05,
    }


def state_bytes(tree) -> int:
    return sum(int(np.asarray(x).nbytes) for x in jax.tree.leaves(tree))


class JaxCase:
    """A JAX buffer: a filled state, a donated jitted add, a jitted sample."""

    def __init__(self, buffer, fill, new, sample=None, donate=True):
        self.buffer = buffer
        state = jax.jit(buffer.add, donate_argnums=0)(buffer.init(EXAMPLE), fill)
        self.holder = [state]
        self.bytes = state_bytes(state)
        self.new = jax.tree.map(jnp.asarray, new)
        self.add_fn = jax.jit(buffer.add, donate_argnums=0 if donate else ())
        self.sample_fn = jax.jit(sample or (lambda s, k: buffer.sample(s, k)))
        self.keys = iter(list(jax.random.split(jax.random.key(0), 100_000)))

    def add(self):
        self.holder[0] = self.add_fn(self.holder[0], self.new)
        return self.holder[0]

    def sample(self):
        return self.sample_fn(self.holder[0], next(self.keys))


class NumpyRing:
    """A replay buffer as Stable-Baselines3 writes one: NumPy arrays and a position."""

    def __init__(self, capacity: int, batch: int, fill: dict, new: dict):
        self.capacity, self.batch, self.new = capacity, batch, new
        self.arrays = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in fill.items()}
        self.position, self.full, self.rng = 0, False, np.random.default_rng(0)
        for start in range(0, capacity, 10_000):  # fill as a user would, in chunks
            self._put({k: v[start : start + 10_000] for k, v in fill.items()})
        self.bytes = sum(a.nbytes for a in self.arrays.values())

    def _put(self, batch: dict) -> None:
        count = len(next(iter(batch.values())))
        rows = (self.position + np.arange(count)) % self.capacity
        for key, value in batch.items():
            self.arrays[key][rows] = value
        self.full = self.full or self.position + count >= self.capacity
        self.position = (self.position + count) % self.capacity

    def add(self):
        self._put(self.new)

    def sample(self):
        rows = self.rng.integers(0, self.capacity if self.full else self.position, self.batch)
        return {key: array[rows] for key, array in self.arrays.items()}


class CpprbCase:
    def __init__(self, capacity: int, batch: int, fill: dict, new: dict, prioritized: bool):
        import cpprb

        env = {
            "obs": {"shape": 64, "dtype": np.float32},
            "action": {"dtype": np.int32},
            "reward": {"dtype": np.float32},
            "done": {"dtype": np.bool_},
        }
        kind = cpprb.PrioritizedReplayBuffer if prioritized else cpprb.ReplayBuffer
        self.rb = kind(capacity, env, **({"alpha": 0.6} if prioritized else {}))
        for start in range(0, capacity, 10_000):
            self.rb.add(**{k: v[start : start + 10_000] for k, v in fill.items()})
        self.batch, self.new, self.prioritized = batch, new, prioritized
        self.bytes = capacity * ITEM_BYTES  # cpprb keeps one array per field of that size

    def add(self):
        self.rb.add(**self.new)

    def sample(self):
        if self.prioritized:
            return self.rb.sample(self.batch, beta=0.4)
        return self.rb.sample(self.batch)


def cases(kind: str, capacity: int, batch: int) -> dict:
    """name -> an object with add(), sample() and bytes."""
    import flashbax as fbx

    per_env = capacity // ENVS
    flat, step = items(capacity), items(ADD, seed=1)
    by_env, env_step = items(ENVS, per_env), items(ENVS, 1, seed=1)
    done = lambda s: s["done"]  # noqa: E731
    if kind == "replay":
        return {
            "jaxbuf": lambda: JaxCase(jaxbuf.make_replay_buffer(capacity, batch), flat, step),
            "flashbax": lambda: JaxCase(
                fbx.make_item_buffer(capacity, 1, batch, add_batches=True), flat, step
            ),
            "cpprb": lambda: CpprbCase(capacity, batch, flat, step, prioritized=False),
            "numpy": lambda: NumpyRing(capacity, batch, flat, step),
        }
    if kind == "prioritized":
        return {
            "jaxbuf": lambda: JaxCase(
                jaxbuf.make_replay_buffer(capacity, batch, sampler=jaxbuf.prioritized()), flat, step
            ),
            "flashbax": lambda: JaxCase(
                fbx.make_prioritised_item_buffer(
                    capacity, 1, batch, add_batches=True, device=flashbax_device()
                ),
                flat,
                step,
            ),
            "cpprb": lambda: CpprbCase(capacity, batch, flat, step, prioritized=True),
        }
    if kind == "trajectory":
        return {
            "jaxbuf": lambda: JaxCase(
                jaxbuf.make_trajectory_buffer(ENVS, per_env, batch, LENGTH), by_env, env_step
            ),
            "flashbax": lambda: JaxCase(
                fbx.make_trajectory_buffer(
                    add_batch_size=ENVS, sample_batch_size=batch, sample_sequence_length=LENGTH,
                    period=1, min_length_time_axis=LENGTH, max_length_time_axis=per_env,
                ),
                by_env, env_step,
            ),
        }  # fmt: skip
    if kind == "transition":
        to = lambda t: jaxbuf.Transition(  # noqa: E731
            t["obs"], t["action"], t["reward"], t["done"], np.zeros_like(t["done"]), t["obs"]
        )
        buffer = jaxbuf.make_transition_buffer(ENVS, per_env, batch, n_step=3)
        return {"jaxbuf": lambda: _transition_case(buffer, to(by_env), to(env_step))}
    if kind == "episode":
        buffer = jaxbuf.make_episode_buffer(ENVS, per_env, batch, 32, done_fn=done)
        return {"jaxbuf": lambda: JaxCase(buffer, by_env, env_step)}
    if kind == "queue":
        return {
            "jaxbuf": lambda: _queue_case(jaxbuf.make_queue(capacity, ADD, batch), flat, step),
            "flashbax": lambda: _fbx_queue_case(fbx, capacity, batch),
        }
    raise ValueError(kind)


def _transition_case(buffer, fill, new):
    example = jax.tree.map(lambda x: jnp.asarray(x)[0, 0], fill)
    case = JaxCase.__new__(JaxCase)
    state = jax.jit(buffer.add, donate_argnums=0)(buffer.init(example), fill)
    case.holder, case.bytes = [state], state_bytes(state)
    case.new = jax.tree.map(jnp.asarray, new)
    case.add_fn = jax.jit(buffer.add, donate_argnums=0)
    case.sample_fn = jax.jit(buffer.sample)
    case.keys = iter(list(jax.random.split(jax.random.key(0), 100_000)))
    return case


class _QueueCase:
    """A queue: add to a full queue (dropped, same work) and take a batch from a fixed
    full one (the batch only: returning the new state, undonated, would copy it)."""

    def __init__(self, add, pop, state, new):
        self.add_fn, self.pop_fn, self.new = add, pop, new
        self.holder, self.full = [state], jax.tree.map(jnp.copy, state)  # add donates
        self.bytes = state_bytes(state)

    def add(self):
        self.holder[0] = self.add_fn(self.holder[0], self.new)
        return self.holder[0]

    def sample(self):
        return self.pop_fn(self.full)


def _queue_case(queue, fill, new):
    rows = queue.config.capacity - queue.config.capacity % ADD
    chunks = jax.tree.map(lambda x: jnp.asarray(x[:rows]).reshape(-1, ADD, *x.shape[1:]), fill)
    state = jax.jit(
        lambda s, c: jax.lax.scan(lambda s, x: (queue.add(s, x), None), s, c)[0]
    )(queue.init(EXAMPLE), chunks)  # fmt: skip
    return _QueueCase(
        jax.jit(queue.add, donate_argnums=0),
        jax.jit(lambda s: queue.pop(s)[1]),
        state,
        jax.tree.map(jnp.asarray, new),
    )


def _fbx_queue_case(fbx, capacity, batch):
    queue = fbx.make_trajectory_queue(
        max_length_time_axis=capacity // ADD, add_batch_size=ADD, add_sequence_length=1,
        sample_sequence_length=batch // ADD,
    )  # fmt: skip
    fill = jax.tree.map(jnp.asarray, items(ADD, capacity // ADD))
    steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1)[:, :, None], fill)  # [T, 8, 1, ...]
    state = jax.jit(  # its add takes one time step of the 8 streams
        lambda s, c: jax.lax.scan(lambda s, x: (queue.add(s, x), None), s, c)[0]
    )(queue.init(EXAMPLE), steps)
    step = jax.tree.map(jnp.asarray, items(ADD, 1, seed=1))
    take = jax.jit(lambda s: queue.sample(s)[1])
    return _QueueCase(jax.jit(queue.add, donate_argnums=0), take, state, step)


def sweep(kind: str, capacity: int, batch: int, calls: int, repeats: int) -> dict:
    made = {name: make() for name, make in cases(kind, capacity, batch).items()}
    timed = {}
    for name, case in made.items():
        timed[f"{name}_add"] = (case.add, calls)
        timed[f"{name}_sample"] = (case.sample, calls)
    times = interleaved_medians(timed, repeats)
    row = {"kind": kind, "capacity": capacity, "batch": batch}
    for name, case in made.items():
        row[f"{name}_add_us"] = times[f"{name}_add"] * 1e6
        row[f"{name}_sample_us"] = times[f"{name}_sample"] * 1e6
        row[f"{name}_bytes_per_item"] = case.bytes / capacity / ITEM_BYTES
    for name in made:
        if name != "jaxbuf":
            for what in ("add", "sample"):
                row[f"{what}_jaxbuf_over_{name}"] = (
                    row[f"jaxbuf_{what}_us"] / row[f"{name}_{what}_us"]
                )
    return row


def donation(capacity: int, calls: int, repeats: int) -> dict:
    buffer = jaxbuf.make_replay_buffer(capacity, 256)
    donated = JaxCase(buffer, items(capacity), items(ADD, seed=1))
    copied = JaxCase(buffer, items(capacity), items(ADD, seed=1), donate=False)
    times = interleaved_medians({"donated": (donated.add, calls), "copied": (copied.add, calls)},
                                repeats)  # fmt: skip
    return {
        "kind": "replay add, donation", "capacity": capacity, "batch": ADD,
        "donated_us": times["donated"] * 1e6, "copied_us": times["copied"] * 1e6,
        "copied_over_donated": times["copied"] / times["donated"],
    }  # fmt: skip


KINDS = ("replay", "prioritized", "trajectory", "transition", "episode", "queue")
PEERS = ("flashbax", "cpprb", "numpy")


def main() -> None:
    args = command_line(__doc__)
    calls, repeats = (5, 3) if args.quick else (20, 7)
    capacities = CAPACITIES[:3] if args.quick else CAPACITIES
    rows = []
    for kind in KINDS:
        points = [(c, 256) for c in capacities] + [(100_000, b) for b in BATCHES if b != 256]
        for capacity, batch in points:
            rows.append(sweep(kind, capacity, batch, calls, repeats))
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()},
                  flush=True)  # fmt: skip
    donations = [donation(c, calls, repeats) for c in capacities]
    for row in donations:
        print(row, flush=True)
    columns = [("kind", "kind", "{}"), ("capacity", "capacity", "{:,}"), ("batch", "batch", "{}")]
    for what in ("add", "sample"):
        columns += [(f"{what} jaxbuf (µs)", f"jaxbuf_{what}_us", "{:.1f}")]
        columns += [(f"{what}: jaxbuf / {p}", f"{what}_jaxbuf_over_{p}", "{:.2f}") for p in PEERS]
    columns += [("jaxbuf bytes / item bytes", "jaxbuf_bytes_per_item", "{:.3f}")]
    columns += [(f"{p} bytes / item bytes", f"{p}_bytes_per_item", "{:.3f}") for p in PEERS]
    write_results(args.out, "sweep", rows, columns, __doc__)
    write_results(
        args.out, "donation", donations,
        [("capacity", "capacity", "{:,}"), ("add donated (µs)", "donated_us", "{:.1f}"),
         ("add not donated (µs)", "copied_us", "{:.1f}"),
         ("not donated / donated", "copied_over_donated", "{:.1f}")],
        "jaxbuf replay add (8 items) with and without donate_argnums.\n\n" + __doc__,
    )  # fmt: skip


if __name__ == "__main__":
    main()
