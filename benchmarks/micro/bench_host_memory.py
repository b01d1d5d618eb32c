"""Host-placed experience (`host_memory=`) against device-resident, inside jit.

At 1M Atari frames (84x84 uint8, 7 GB) in one array, per variant: the compile time,
then the median and fastest time per jitted call, the variants taking turns, and
the device memory in use (GPU and TPU report it; a CPU's memories are one RAM):

1. reads of B random rows into device memory, B in {256, 8192}, in each form a
   host array allows: unrolled row slices (jaxbuf's accelerator form), a loop of
   row slices, a gather computed on the host (`compute_on("device_host")`), and
   windows of 4 rows (a frame stack per item), against a gather from device memory;
2. a donated write of 4 rows (one frame of 4 environments);
3. jaxbuf itself: the transition buffer of 4 environments x 250k steps with
   `frames={"obs": 4}` (1M frames stored once), its `add_step` and its `sample`
   of 32, host-placed against device-resident;
4. a CleanRL DQN step (Nature CNN, batch 32, Adam) with that buffer's
   `add_step` and `sample` inside the same jitted function.

The storage is zeros with its counters set full: what a read costs does not
depend on the values. Results go to `host_memory_<backend>.json/.md` after
every row, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks.common import interleaved_times, write_results
from jaxbuf.core import assembly as _assembly

FRAME = (84, 84)
COLUMNS = [("part", "part", "{}"), ("variant", "variant", "{}"), ("B", "batch", "{}"),
           ("compile s", "compile_s", "{:.2f}"), ("median µs", "median_us", "{:,.1f}"),
           ("fastest µs", "fastest_us", "{:,.1f}"), ("/ device", "ratio", "{:.2f}"),
           ("device GiB", "device_gib", "{:.3f}"), ("note", "note", "{}")]  # fmt: skip


def device_bytes() -> int | None:
    """Bytes in use in the default device's own memory (None where not reported)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_in_use")


def host_zeros(shape: tuple, dtype) -> jax.Array:
    """Zeros made in host memory by a jitted call (as `jaxbuf`'s `init` makes them)."""
    return jax.jit(lambda: jax.device_put(jnp.zeros(shape, dtype), jax.memory.Space.Host))()


def to_device(x: jax.Array) -> jax.Array:
    return jax.device_put(x, jax.memory.Space.Device)


def rows_unrolled(column: jax.Array, index: jax.Array, width: int = 1) -> jax.Array:
    """`width` rows from each index, one slice each, unrolled."""
    return jnp.stack([to_device(jax.lax.dynamic_slice_in_dim(column, index[j], width))
                      for j in range(index.shape[0])])  # fmt: skip


def rows_looped(column: jax.Array, index: jax.Array, width: int = 1) -> jax.Array:
    """`rows_unrolled` as a `fori_loop`: one slice per iteration."""
    out = jnp.zeros((index.shape[0], width, *column.shape[1:]), column.dtype)

    def one(j, out):
        row = to_device(jax.lax.dynamic_slice_in_dim(column, index[j], width))
        return jax.lax.dynamic_update_slice_in_dim(out, row[None], j, 0)

    return jax.lax.fori_loop(0, index.shape[0], one, out)


def rows_host_gather(column: jax.Array, index: jax.Array, width: int = 1) -> jax.Array:
    """The gather computed by the host on host memory; its `[B, width, ...]` result
    moved to the device in one transfer."""
    import inspect

    from jax.experimental.compute_on import compute_on

    def gather(column, at):
        return column[at]

    if "out_memory_spaces" in inspect.signature(compute_on).parameters:  # JAX 0.11+
        gather = compute_on(jax.jit(gather), compute_type="device_host",
                            out_memory_spaces=jax.memory.Space.Host)  # fmt: skip
    else:
        gather = compute_on("device_host")(jax.jit(gather))
    at = index[:, None] + jnp.arange(width, dtype=index.dtype)[None]
    return to_device(gather(column, jax.device_put(at, jax.memory.Space.Host)))


def rows_device(column: jax.Array, index: jax.Array, width: int = 1) -> jax.Array:
    at = index[:, None] + jnp.arange(width, dtype=index.dtype)[None]
    return column[at]


def timed(fn: Callable, *args, repeats: int) -> tuple[float, Callable]:
    """Compile seconds, and a function doing one call."""
    jitted = jax.jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return time.perf_counter() - start, lambda: compiled(*args)


class Table:
    """Rows written to disk as they come."""

    def __init__(self, out: str):
        self.out, self.rows = out, []

    def add(self, **row) -> None:
        self.rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)  # fmt: skip
        write_results(self.out, "host_memory", self.rows, COLUMNS, __doc__)


def compare(table: Table, part: str, batch: int, cases: dict, repeats: int, note=None) -> None:
    """Times `cases` (name -> (fn, args)) side by side; ratios to the `device` case."""
    ready, compiles = {}, {}
    for name, (fn, args) in cases.items():
        try:
            compiles[name], ready[name] = timed(fn, *args, repeats=repeats)
        except Exception as error:  # a form this platform refuses: recorded, not fatal
            table.add(part=part, variant=name, batch=batch, note=f"{type(error).__name__}: "
                      f"{str(error).splitlines()[0][:120]}")  # fmt: skip
    times = interleaved_times({name: (fn, 1) for name, fn in ready.items()}, repeats)
    base = times.get("device", (None,))[0]
    for name, (median, fastest) in times.items():
        table.add(part=part, variant=name, batch=batch, compile_s=compiles[name],
                  median_us=median * 1e6, fastest_us=fastest * 1e6,
                  ratio=None if base is None else median / base, note=note)  # fmt: skip


def reads(table: Table, host, device, batch: int, forms: list[str], repeats: int) -> None:
    index = jnp.asarray(np.random.default_rng(batch).integers(0, host.shape[0] - 4, batch),
                        jnp.int32)  # fmt: skip
    makers = {"unrolled": rows_unrolled, "looped": rows_looped, "host gather": rows_host_gather}
    for width in (1, 4):
        cases = {"device": (partial(rows_device, width=width), (device, index))}
        cases |= {f"host {f}": (partial(makers[f], width=width), (host, index)) for f in forms}
        compare(table, f"read {width} row{'s' if width > 1 else ''}", batch, cases, repeats)


def writes(table: Table, host, device, repeats: int) -> None:
    rows = jnp.ones((4, *FRAME), jnp.uint8)

    def write(column, rows, at):
        for j in range(rows.shape[0]):
            row = rows[j : j + 1]
            if jax.typeof(column).memory_space == jax.memory.Space.Host:
                row = jax.device_put(row, jax.memory.Space.Host)
            column = jax.lax.dynamic_update_slice_in_dim(column, row, (at + j) % 1000, 0)
        return column

    holders = {"device": [device], "host unrolled": [host]}
    calls = {}
    for name, holder in holders.items():
        jitted = jax.jit(write, donate_argnums=0)
        start = time.perf_counter()
        compiled = jitted.lower(holder[0], rows, jnp.int32(0)).compile()
        calls[name] = (time.perf_counter() - start,
                       partial(lambda h, c: h.__setitem__(0, c(h[0], rows, jnp.int32(7))) or h[0],
                               holder, compiled))  # fmt: skip
    times = interleaved_times({n: (c[1], 1) for n, c in calls.items()}, repeats)
    for name, (median, fastest) in times.items():
        table.add(part="write 4 rows", variant=name, batch=4, compile_s=calls[name][0],
                  median_us=median * 1e6, fastest_us=fastest * 1e6,
                  ratio=median / times["device"][0])  # fmt: skip


def transition(num_envs: int, capacity: int, batch: int, host: bool):
    buffer = jaxbuf.make_transition_buffer(
        num_envs, capacity, batch, frames={"obs": 4}, min_episode_length=100,
        host_memory=("obs",) if host else None,
    )  # fmt: skip
    frame = jnp.zeros(FRAME, jnp.uint8)
    example = jaxbuf.Transition(frame, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), frame)  # fmt: skip
    before = device_bytes()
    state = buffer.init(example)
    jax.block_until_ready(state)
    held = None if before is None else device_bytes() - before
    full = jnp.int32(capacity)
    state = state.replace(size=full, added=jnp.uint32(capacity))  # full of zeros
    step = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs, *x.shape)), example)
    return buffer, state, step, held


def sample_of(buffer, batch: int) -> Callable:
    """`buffer.sample` drawing `batch` items (the same state serves every batch size)."""
    return partial(_assembly.sample, buffer.layout, buffer.sampler, batch)


def replay_samples(table: Table, capacity: int, repeats: int) -> None:
    """A replay buffer of single 84x84 frames: sample 256 and 8,192, host against device."""
    example = {"obs": jnp.zeros(FRAME, jnp.uint8), "action": jnp.int32(0)}
    states = {}
    for name, host in (("device", False), ("host", True)):
        buffer = jaxbuf.make_replay_buffer(capacity, 256, host_memory=("obs",) if host else None)
        state = buffer.init(example)
        states[name] = (buffer, state.replace(size=jnp.int32(capacity)))
    for batch in (256, 8192):
        cases = {name: (sample_of(b, batch), (s, jax.random.key(0)))
                 for name, (b, s) in states.items()}  # fmt: skip
        compare(table, "replay sample", batch, cases, repeats, note="single frames")


def buffer_ops(table: Table, capacity: int, repeats: int) -> dict:
    """The transition buffer's sample (stacks of 4 frames) at B=32 and 256, and a replay
    buffer's sample of single frames at 256 and 8,192, host-placed against
    device-resident; returns the transition buffers (B=32) for the DQN step."""
    made = {}
    for name, host in (("device", False), ("host", True)):
        buffer, state, step, held = transition(4, capacity // 4, 32, host)
        made[name] = (buffer, state, step)
        table.add(part="init 1M frames", variant=name, device_gib=None if held is None
                  else held / 2**30, note="device bytes the state holds")  # fmt: skip
    for batch in (32, 256):
        cases = {}
        for name, (buffer, state, _) in made.items():
            cases[name] = (sample_of(buffer, batch), (state, jax.random.key(0)))
        compare(table, "transition sample", batch, cases, repeats, note="stacks of 4 frames")
    replay_samples(table, capacity, repeats)
    return made


def dqn_step(table: Table, made: dict, repeats: int) -> None:
    import flax.linen as nn
    import optax

    class QNetwork(nn.Module):  # CleanRL's Nature CNN
        @nn.compact
        def __call__(self, x):
            x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
            x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID")(x))
            x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID")(x))
            x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID")(x))
            x = nn.relu(nn.Dense(512)(x.reshape((x.shape[0], -1))))
            return nn.Dense(4)(x)

    network, optimizer = QNetwork(), optax.adam(1e-4)
    params = network.init(jax.random.key(0), jnp.zeros((1, 4, *FRAME)))
    opt_state = optimizer.init(params)

    def step(buffer, state, params, opt_state, frame, key):
        state = buffer.add_step(state, frame)
        batch = buffer.sample(state, key).experience

        def loss(params):
            target = batch.reward + 0.99 * batch.discount * network.apply(
                params, batch.next_obs).max(-1)  # fmt: skip
            q = network.apply(params, batch.obs)[jnp.arange(32), batch.action]
            return jnp.mean((q - jax.lax.stop_gradient(target)) ** 2)

        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return state, optax.apply_updates(params, updates), opt_state

    calls, compiles = {}, {}
    for name, (buffer, state, frame) in made.items():
        jitted = jax.jit(partial(step, buffer), donate_argnums=0)
        start = time.perf_counter()
        compiled = jitted.lower(state, params, opt_state, frame, jax.random.key(1)).compile()
        compiles[name] = time.perf_counter() - start
        holder = [state]

        def once(holder=holder, compiled=compiled, frame=frame):
            holder[0], _, _ = compiled(holder[0], params, opt_state, frame, jax.random.key(1))
            return holder[0]

        calls[name] = (once, 1)
    times = interleaved_times(calls, repeats)
    for name, (median, fastest) in times.items():
        table.add(part="DQN step", variant=name, batch=32, compile_s=compiles[name],
                  median_us=median * 1e6, fastest_us=fastest * 1e6,
                  ratio=median / times["device"][0],
                  note="add_step 4 envs + sample 32 + Nature CNN Adam")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000, help="frames stored")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--parts", default="read256,write,buffer,dqn,read8192")
    parser.add_argument(
        "--forms",
        default="unrolled,looped,host gather",
        help="host read forms at B=256 (8192 takes the last two)",
    )
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    table, parts = Table(args.out), args.parts.split(",")
    before = device_bytes()
    host = host_zeros((args.capacity, *FRAME), jnp.uint8)
    jax.block_until_ready(host)
    table.add(part="allocate", variant="host array", device_gib=None if before is None
              else (device_bytes() - before) / 2**30, note=f"{args.capacity:,} frames")  # fmt: skip
    device = jnp.zeros((args.capacity, *FRAME), jnp.uint8)
    if "read256" in parts:
        reads(table, host, device, 256, args.forms.split(","), args.repeats)
    if "write" in parts:
        writes(table, host, device, args.repeats)
    del host, device
    if "buffer" in parts or "dqn" in parts:
        made = buffer_ops(table, args.capacity, args.repeats)
        if "dqn" in parts:
            dqn_step(table, made, args.repeats)
        del made
    if "read8192" in parts:  # last: the forms whose cost is least known
        host = host_zeros((args.capacity, *FRAME), jnp.uint8)
        device = jnp.zeros((args.capacity, *FRAME), jnp.uint8)
        forms = [f for f in args.forms.split(",") if f != "unrolled"]
        reads(table, host, device, 8192, forms, max(args.repeats // 3, 5))


if __name__ == "__main__":
    main()
