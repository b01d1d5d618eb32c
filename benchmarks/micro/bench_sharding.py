"""Weak scaling of a sharded trajectory buffer over 1, 2 and 4 devices, against Flashbax under pmap.

Each device holds the same work at every device count: 16 environments x 10,000
steps of {obs: float32[64], reward: float32}, one step per environment per
`add`, and batches of 256 sequences of 8 per `sample`. jaxbuf runs
`jaxbuf.shard(buffer, mesh)` under `jax.jit` (donated `add`); Flashbax, which has
no sharded buffer, runs its trajectory buffer under `jax.pmap`, the way its
README spreads a buffer over devices. Timed: standalone `add` and `sample`, and
one jitted scan of 100 iterations of add + sample per call. The control is a
buffer-free scan of the same shape (per shard: draw random rows with
jax.random.randint, write 16 rows, gather 256 x 8 rows of 64 floats), not a
lower bound on time: its scaling shows what this machine gives any sharded
program, to tell the machine's limits from ours.

"scaling" is the time at N devices over the time at 1 device for the same
per-device work: 1.0 is perfect weak scaling (the issue's target: at most 1.3
at 4 devices). Devices are simulated on the CPU
(`--xla_force_host_platform_device_count`), one fresh process per device count;
where the machine has fewer cores than devices, the devices share them, and
perfect scaling is not possible for either library.

Run: `python -m benchmarks.micro.bench_sharding [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.common import ROOT, command_line, write_results

ENVS, CAPACITY, BATCH, LENGTH, SCAN = 16, 10_000, 256, 8, 100
DEVICE_COUNTS = (1, 2, 4)


def _items(n_envs: int, steps: int, seed: int = 0):
    import jax
    import jax.numpy as jnp

    key = jax.random.key(seed)
    return {
        "obs": jax.random.normal(key, (n_envs, steps, 64)),
        "reward": jnp.ones((n_envs, steps), jnp.float32),
    }


def _jaxbuf_cases(n: int) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxbuf

    mesh = jax.make_mesh((n,), ("data",))
    split = NamedSharding(mesh, P("data"))
    sharded = jaxbuf.shard(jaxbuf.make_trajectory_buffer(ENVS, CAPACITY, BATCH, LENGTH), mesh)
    example = {"obs": jnp.zeros(64), "reward": jnp.float32(0)}
    add = jax.jit(sharded.add, donate_argnums=0)
    sample = jax.jit(sharded.sample)
    step = jax.device_put(_items(n * ENVS, 1, 1), split)

    def filled():
        return add(sharded.init(example), jax.device_put(_items(n * ENVS, CAPACITY), split))

    def body(carry, key):
        state, total = carry
        state = sharded.add(state, step)
        total = total + sharded.sample(state, key).experience["obs"][:, 0, 0]  # stays local
        return (state, total), None

    scan = jax.jit(lambda c, k: jax.lax.scan(body, c, k)[0], donate_argnums=0)
    keys = jax.random.split(jax.random.key(0), SCAN)
    sample_key = jax.random.key(1)
    holder = [filled()]
    scanned = [(filled(), jax.device_put(jnp.zeros(n * BATCH), split))]

    def one_add():
        holder[0] = add(holder[0], step)
        return holder[0]

    def one_scan():
        scanned[0] = scan(scanned[0], keys)
        return scanned[0]

    control = _control_case(mesh, split, n)
    return {
        "control_scan": control,
        "jaxbuf_add": (one_add, 20),
        "jaxbuf_sample": (lambda: sample(holder[0], sample_key), 20),
        "jaxbuf_scan": (one_scan, 1),
    }


def _control_case(mesh, split, n: int):
    """A buffer-free scan of the same shape: per shard, write one row per environment
    and gather 256 x 8 random rows of 64 floats."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    rows = ENVS * CAPACITY

    @jax.shard_map(mesh=mesh, in_specs=(P("data"), P("data"), P()), out_specs=(P("data"),) * 2)
    def iteration(table, total, key):
        key = jax.random.fold_in(key, jax.lax.axis_index("data"))
        start = jax.random.randint(key, (BATCH, 1), 0, rows - LENGTH)
        at = jax.random.randint(key, (), 0, rows - ENVS)
        table = jax.lax.dynamic_update_slice(table, jnp.ones((ENVS, 64)), (at, 0))
        window = table[start + jnp.arange(LENGTH)[None, :]]
        return table, total + window[:, 0, 0]

    def body(carry, key):
        return iteration(*carry, key), None

    scan = jax.jit(lambda c, k: jax.lax.scan(body, c, k)[0], donate_argnums=0)
    keys = jax.random.split(jax.random.key(2), SCAN)
    held = [
        (
            jax.device_put(jnp.zeros((n * rows, 64)), split),
            jax.device_put(jnp.zeros(n * BATCH), split),
        )
    ]

    def once():
        held[0] = scan(held[0], keys)
        return held[0]

    return (once, 1)


def _flashbax_cases(n: int) -> dict:
    import flashbax as fbx
    import jax
    import jax.numpy as jnp

    buffer = fbx.make_trajectory_buffer(
        add_batch_size=ENVS, sample_batch_size=BATCH, sample_sequence_length=LENGTH, period=1,
        min_length_time_axis=LENGTH, max_length_time_axis=CAPACITY,
    )  # fmt: skip
    example = {"obs": jnp.zeros((n, 64)), "reward": jnp.zeros(n, jnp.float32)}
    add = jax.pmap(buffer.add, donate_argnums=0)
    sample = jax.pmap(buffer.sample)
    per_device = lambda tree: jax.tree.map(lambda x: x.reshape(n, ENVS, *x.shape[1:]), tree)  # noqa: E731
    step = per_device(_items(n * ENVS, 1, 1))

    def filled():
        return add(jax.pmap(buffer.init)(example), per_device(_items(n * ENVS, CAPACITY)))

    def scan_fn(carry, keys, step):
        def body(carry, key):
            state, total = carry
            state = buffer.add(state, step)
            total = total + buffer.sample(state, key).experience["obs"][:, 0, 0]
            return (state, total), None

        return jax.lax.scan(body, carry, keys)[0]

    scan = jax.pmap(scan_fn, donate_argnums=0)
    keys = jax.random.split(jax.random.key(0), n * SCAN).reshape(n, SCAN)
    sample_keys = jax.random.split(jax.random.key(1), n)
    holder = [filled()]
    scanned = [(filled(), jnp.zeros((n, BATCH)))]

    def one_add():
        holder[0] = add(holder[0], step)
        return holder[0]

    def one_scan():
        scanned[0] = scan(scanned[0], keys, step)
        return scanned[0]

    return {
        "flashbax_add": (one_add, 20),
        "flashbax_sample": (lambda: sample(holder[0], sample_keys), 20),
        "flashbax_scan": (one_scan, 1),
    }


def worker(n: int, quick: bool) -> None:
    from benchmarks.common import interleaved_medians

    cases = _jaxbuf_cases(n) | _flashbax_cases(n)
    times = interleaved_medians(cases, 3 if quick else 11)
    print("RESULT " + json.dumps({name: seconds * 1e6 for name, seconds in times.items()}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), "--quick" in sys.argv)
        return
    args = command_line(__doc__)
    measured = {}
    for n in DEVICE_COUNTS:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        run = [sys.executable, "-m", "benchmarks.micro.bench_sharding", "--worker", str(n)]
        command = run + ["--quick"] * args.quick
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, check=False, cwd=ROOT
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            raise SystemExit(f"worker for {n} devices failed:\n{done.stdout}\n{done.stderr}")
        measured[n] = json.loads(lines[0].removeprefix("RESULT "))
        print(n, {k: round(v, 1) for k, v in measured[n].items()}, flush=True)
    rows = []
    for n, times in measured.items():
        row = {"devices": n}
        for name, micros in times.items():
            row[f"{name}_us"] = micros
            row[f"{name}_scaling"] = micros / measured[1][name]
        scan_steps = SCAN
        for lib in ("jaxbuf", "flashbax", "control"):
            row[f"{lib}_scan_us"] = times[f"{lib}_scan"] / scan_steps
        for what in ("add", "sample", "scan"):
            row[f"{what}_ratio"] = times[f"jaxbuf_{what}"] / times[f"flashbax_{what}"]
        rows.append(row)
    columns = [("devices", "devices", "{}")]
    for what, title in (("add", "add"), ("sample", "sample"), ("scan", "scan (per iteration)")):
        columns += [
            (f"{title} jaxbuf (µs)", f"jaxbuf_{what}_us", "{:.1f}"),
            (f"{title} jaxbuf scaling", f"jaxbuf_{what}_scaling", "{:.2f}"),
            (f"{title} Flashbax pmap (µs)", f"flashbax_{what}_us", "{:.1f}"),
            (f"{title} Flashbax scaling", f"flashbax_{what}_scaling", "{:.2f}"),
            (f"{title}: jaxbuf / Flashbax", f"{what}_ratio", "{:.2f}"),
        ]
    columns += [
        ("control scan (µs)", "control_scan_us", "{:.1f}"),
        ("control scan scaling", "control_scan_scaling", "{:.2f}"),
    ]
    write_results(args.out, "sharding", rows, columns, __doc__)


if __name__ == "__main__":
    main()
