"""At the scale of Brax and MuJoCo Playground: thousands of environments, batches of 8k-32k.

A jitted, donated `lax.scan` of (add one step of E environments + sample B
transitions) on a FULL buffer of `E * 256` transitions (256 steps per
environment; Brax's queue then rolls at every insert), observations float32[D],
actions float32[8], rewards and done flags. Variants, taking turns in every
timed round of one process:

- `jaxbuf replay`: `make_replay_buffer` of full transitions (obs and next_obs);
- `jaxbuf transition n=1`, `n=3`: `make_transition_buffer`, observations once
  (`min_episode_length=100`), and `prioritized` n=1;
- `jaxbuf brax`: `jaxbuf.brax.BraxReplay`, Brax's interface, observations once;
- `flashbax flat`, `flashbax prioritised flat`: Flashbax's flat buffers (pairs
  of consecutive steps; no true final observation);
- `brax queue`: Brax's `UniformSamplingQueue` (one float32 row per transition,
  next observation stored twice).

Time per step (median and fastest of the rounds) and bytes of the whole state
per stored transition. Configurations over `--max-gib` of state are skipped.
`--apart` also times the add alone and the sample alone (each its own scan on a
full buffer, the ratio to Flashbax's same part); `--users` runs the shapes users
run (4096 environments, batches of 8,192 and 32,768, 64 and 512 floats; 512
environments of 128 floats, batch 8,192), apart too.

`--sac`: Brax's own SAC (`inverted_pendulum`, positional backend, 64 envs or `--sac-envs`,
batch 256, 8 updates per step) with `jaxbuf.brax` and with Brax's queue, once
with a queue that never fills (1M) and once with a 1M queue that Brax's prefill
fills before training, so that every insert rolls it (`--sac-full-size`; 65,536 with
`--quick`):
steps per second between the last two evaluations (compiled by then) and the
buffer's bytes. `--sac-env` picks another Brax environment, `--sac-obs D` repeats its
observation to D floats (a Playground-sized observation on a cheap CPU simulation),
`--sac-seeds` runs seeds 0, 1, ... (the buffers taking turns seed by seed), `--sac-steps`
sets the steps after the prefill and `--sac-table` the table's name; `--sac-keep` keeps
the table's rows of other cases, so that one run per configuration fills one table.

Needs brax and flashbax (Brax 0.14 runs on JAX <= 0.9). Run:
`python -m benchmarks.micro.bench_scale [--quick] [--sac] [--out benchmarks/results]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
import time
import warnings

import jax
import jax.numpy as jnp

import jaxbuf
import jaxbuf.brax
from benchmarks.common import interleaved_times, run_scan, write_results

STEPS_PER_ENV, ACTION = 256, 8
SAC_ENV = ["inverted_pendulum"]  # --sac-env


def nbytes(state) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))


def step_data(base: jax.Array, t: jax.Array) -> dict:
    """One step of every environment: cheap to make (a shift of fixed noise), ends every
    100 steps per environment, staggered."""
    envs = base.shape[0]
    done = (jnp.arange(envs) + t) % 100 == 99
    return {"obs": base + t.astype(jnp.float32), "action": base[:, :ACTION],
            "reward": base[:, 0], "done": done}  # fmt: skip


def jaxbuf_transition(envs, batch, obs_dim, **options):
    buffer = jaxbuf.make_transition_buffer(envs, STEPS_PER_ENV, batch, min_episode_length=100,
                                           **options)  # fmt: skip
    example = jaxbuf.Transition(jnp.zeros(obs_dim), jnp.zeros(ACTION), jnp.float32(0),
                                jnp.bool_(False), jnp.bool_(False), jnp.zeros(obs_dim))  # fmt: skip

    def add(state, d):
        step = jaxbuf.Transition(d["obs"], d["action"], d["reward"], d["done"] & False,
                                 d["done"], d["obs"] + 1)  # fmt: skip
        return buffer.add_step(state, step)

    def sample(state, key):
        t = buffer.sample(state, key).experience
        return t.obs.sum() + t.next_obs.sum() + t.reward.sum()

    return buffer.init(example), add, sample


def jaxbuf_replay(envs, batch, obs_dim):
    buffer = jaxbuf.make_replay_buffer(envs * STEPS_PER_ENV, batch)
    example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(ACTION), "reward": jnp.float32(0),
               "done": jnp.bool_(False), "next_obs": jnp.zeros(obs_dim)}  # fmt: skip

    def add(state, d):
        return buffer.add(state, {**d, "next_obs": d["obs"] + 1})

    def sample(state, key):
        t = buffer.sample(state, key).experience
        return t["obs"].sum() + t["next_obs"].sum() + t["reward"].sum()

    return buffer.init(example), add, sample


def brax_transition(obs_dim):
    from brax.training.types import Transition

    obs = jnp.zeros(obs_dim)
    return Transition(obs, jnp.zeros(ACTION), 0.0, 0.0, obs,
                      {"state_extras": {"truncation": 0.0}, "policy_extras": {}})  # fmt: skip


def brax_like(queue, obs_dim):
    def add(state, d):
        step = brax_transition(obs_dim)._replace(
            observation=d["obs"], action=d["action"], reward=d["reward"],
            discount=1.0 - d["done"].astype(jnp.float32), next_observation=d["obs"] + 1,
            extras={"state_extras": {"truncation": d["reward"] * 0}, "policy_extras": {}},
        )  # fmt: skip
        return queue.insert_internal(state, step)

    def sample(state, key):  # the step's key, as the others take (a scan that samples
        # alone would otherwise draw from the same state every step, which XLA hoists)
        state, t = queue.sample_internal(state.replace(key=key))
        return t.observation.sum() + t.next_observation.sum() + t.reward.sum()

    return queue.init(jax.random.key(0)), add, sample


def brax_queue(envs, batch, obs_dim):
    from brax.training import replay_buffers

    queue = replay_buffers.UniformSamplingQueue(envs * STEPS_PER_ENV, brax_transition(obs_dim),
                                                batch)  # fmt: skip
    return brax_like(queue, obs_dim)


def jaxbuf_brax(envs, batch, obs_dim):
    replay = jaxbuf.brax.BraxReplay(envs * STEPS_PER_ENV, brax_transition(obs_dim), batch,
                                    num_envs=envs)  # fmt: skip
    return brax_like(replay, obs_dim)


def flashbax_flat(envs, batch, obs_dim, prioritised=False):
    import flashbax as fbx

    make = fbx.make_prioritised_flat_buffer if prioritised else fbx.make_flat_buffer
    options = {"device": jax.default_backend()} if prioritised else {}
    buffer = make(max_length=envs * STEPS_PER_ENV, min_length=2 * envs, sample_batch_size=batch,
                  add_batch_size=envs, **options)  # fmt: skip
    example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(ACTION), "reward": jnp.float32(0),
               "done": jnp.bool_(False)}  # fmt: skip

    def sample(state, key):
        t = buffer.sample(state, key).experience
        return t.first["obs"].sum() + t.second["obs"].sum() + t.first["reward"].sum()

    return buffer.init(example), buffer.add, sample


VARIANTS = {
    "jaxbuf replay": jaxbuf_replay,
    "jaxbuf transition n=1": jaxbuf_transition,
    "jaxbuf transition n=3": lambda e, b, d: jaxbuf_transition(e, b, d, n_step=3),
    "jaxbuf prioritized transition": lambda e, b, d: jaxbuf_transition(
        e, b, d, sampler=jaxbuf.prioritized()),
    "jaxbuf brax": jaxbuf_brax,
    "flashbax flat": flashbax_flat,
    "flashbax prioritised flat": lambda e, b, d: flashbax_flat(e, b, d, prioritised=True),
    "brax queue": brax_queue,
}  # fmt: skip


def available() -> dict:
    """The variants whose libraries are installed (Brax needs JAX <= 0.9)."""
    import importlib.util

    missing = [name for name in ("brax", "flashbax") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"not installed, left out: {', '.join(missing)}")
    return {name: make for name, make in VARIANTS.items()
            if not any(lib in name for lib in missing)}  # fmt: skip


def filled(state, add, base):
    """The state after `STEPS_PER_ENV` steps: full."""

    def fill(state):
        return jax.lax.fori_loop(0, STEPS_PER_ENV, lambda t, s: add(s, step_data(base, t)), state)

    return jax.jit(fill, donate_argnums=0)(state)


PARTS = ("add+sample", "add", "sample")  # --apart times each alone too


def scan_bodies(add, sample, base) -> dict:
    """The scanned steps of each part: add one step of every environment and sample, or
    one of them alone (the other's carry passed through)."""

    def both(carry, t):
        state, total = carry
        state = add(state, step_data(base, t + STEPS_PER_ENV))
        return (state, total + sample(state, jax.random.fold_in(jax.random.key(2), t))), None

    def add_alone(carry, t):
        return (add(carry[0], step_data(base, t + STEPS_PER_ENV)), carry[1]), None

    def sample_alone(carry, t):
        state, total = carry
        return (state, total + sample(state, jax.random.fold_in(jax.random.key(2), t))), None

    return {"add+sample": both, "add": add_alone, "sample": sample_alone}


def measure(envs: int, batch: int, obs_dim: int, length: int, repeats: int,
            parts: tuple = PARTS[:1]) -> list[dict]:  # fmt: skip
    base = jax.random.normal(jax.random.key(1), (envs, obs_dim))
    cases, sizes = {}, {}
    for name, make in available().items():
        state, add, sample = make(envs, batch, obs_dim)
        state = filled(state, add, base)
        sizes[name] = nbytes(state) / (envs * STEPS_PER_ENV)
        times = jnp.arange(length, dtype=jnp.int32)
        bodies = scan_bodies(add, sample, base)
        for part in parts:  # each scan donates its own copy of the full state
            carry = (jax.tree.map(jnp.copy, state), jnp.float32(0))
            cases[name, part] = (run_scan(bodies[part], carry, times), 1)
        del state
    timed = interleaved_times(cases, repeats)
    flat = {part: timed.get(("flashbax flat", part), (float("nan"),))[0] for part in parts}
    return [{"envs": envs, "batch": batch, "obs": obs_dim, "variant": name, "part": part,
             "us_per_step": median / length * 1e6, "fastest_us": fastest / length * 1e6,
             "vs_flashbax": median / flat[part], "bytes_per_step": sizes[name]}
            for (name, part), (median, fastest) in timed.items()]  # fmt: skip


def sac_environment(obs_size: int = 0):
    """`SAC_ENV[0]` (positional backend); with `obs_size`, its observation repeated to
    that many floats (`jnp.resize`), as wide as MuJoCo Playground's state plus privileged
    state, at the cost of a cheap CPU simulation."""
    from brax import envs

    env = envs.get_environment(SAC_ENV[0], backend="positional")
    if not obs_size:
        return env

    class Widened(envs.Wrapper):
        observation_size = obs_size

        def reset(self, rng):
            state = self.env.reset(rng)
            return state.replace(obs=jnp.resize(state.obs, obs_size))

        def step(self, state, action):
            state = self.env.step(state, action)
            return state.replace(obs=jnp.resize(state.obs, obs_size))

    return Widened(env)


def sac_run(
    use_jaxbuf: bool, max_replay_size: int, prefill: int, steps: int, num_envs: int,
    seed: int = 0, obs_size: int = 0,
) -> dict:  # fmt: skip
    from brax.training.agents.sac import train as sac

    metrics, clock = [], []

    def progress(step, m):
        metrics.append(m)
        clock.append((step, time.perf_counter()))

    config = dict(environment=sac_environment(obs_size),
                  num_timesteps=prefill + steps, episode_length=1000, num_envs=num_envs,
                  batch_size=256, grad_updates_per_step=8, max_replay_size=max_replay_size,
                  min_replay_size=prefill, num_evals=3, num_eval_envs=16, seed=seed,
                  learning_rate=6e-4, discounting=0.97, progress_fn=progress)  # fmt: skip
    if use_jaxbuf:
        with jaxbuf.brax.use_in_brax(num_envs=num_envs):
            sac.train(**config)
    else:
        sac.train(**config)
    # steps/s between the last two evaluations: compiled already, an evaluation included
    (first, start), (last, end) = clock[-2], clock[-1]
    return {"sps": (last - first) / (end - start),
            "return": float(metrics[-1]["eval/episode_reward"])}  # fmt: skip


def measure_sac(
    steps: int, full_size: int, num_envs: int = 64, seeds: int = 1, obs_size: int = 0,
    full_only: bool = False,
) -> list[dict]:  # fmt: skip
    """Brax's SAC with either buffer: a queue that never fills, and one that Brax's own
    prefill (`min_replay_size`) fills before training, so that every insert of the run
    rolls it (as in Brax's long runs). Seed by seed, the two buffers take turns."""
    env = sac_environment(obs_size)
    obs, act = env.observation_size, env.action_size
    dummy = brax_transition(obs)._replace(action=jnp.zeros(act))
    cases = [("queue not full (1M)", 1_048_576, 2048),
             (f"queue full ({full_size:,}, prefilled)", full_size, full_size)]  # fmt: skip
    name = f"{SAC_ENV[0]}" + (f" (obs widened to {obs_size})" if obs_size else "")
    rows = []
    for label, size, prefill in cases[1:] if full_only else cases:
        per_buffer = {True: jaxbuf.brax.BraxReplay(size, dummy, 256, num_envs=num_envs)
                      .bytes_per_transition(), False: 4 * (2 * obs + act + 3)}  # fmt: skip
        for seed in range(seeds):
            for use in (True, False):
                result = sac_run(use, size, prefill, steps, num_envs, seed, obs_size)
                rows.append({"case": f"{name}: {label}, {num_envs} envs", "seed": seed,
                             "buffer": "jaxbuf.brax" if use else "brax queue", **result,
                             "buffer_mib": per_buffer[use] * size / 2**20})  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (about 5 minutes)")
    parser.add_argument("--sac", action="store_true", help="also Brax's SAC end to end")
    parser.add_argument("--sac-only", action="store_true", help="only Brax's SAC")
    parser.add_argument("--sac-full-size", type=int, default=1_048_576)
    parser.add_argument("--sac-envs", type=int, default=64)
    parser.add_argument("--sac-env", default="inverted_pendulum", help="a Brax environment")
    parser.add_argument("--sac-obs", type=int, default=0, help="widen observations to this")
    parser.add_argument("--sac-seeds", type=int, default=1, help="seeds 0, 1, ...")
    parser.add_argument("--sac-full-only", action="store_true", help="only the full queue")
    parser.add_argument("--sac-table", default="scale_sac", help="name of the SAC table")
    parser.add_argument("--sac-steps", type=int, default=40_000, help="steps after the prefill")
    parser.add_argument("--sac-keep", action="store_true",
                        help="keep the rows of cases this run does not measure")  # fmt: skip
    parser.add_argument("--max-gib", type=float, default=4.0)
    parser.add_argument("--apart", action="store_true", help="also add alone and sample alone")
    parser.add_argument("--shapes", nargs="+", help="envs,batch,obs triples (the whole grid)")
    parser.add_argument("--users", action="store_true",
                        help="the shapes users run: 4096 envs x batches 8k, 32k x 64, 512 floats "
                        "and 512 envs x 128 floats x 8k, add and sample apart too")  # fmt: skip
    parser.add_argument("--envs", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--batches", type=int, nargs="+", default=[512, 8192, 32768])
    parser.add_argument("--obs", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--table", default="scale", help="name of the grid's table")
    args = parser.parse_args()
    SAC_ENV[0] = args.sac_env
    grid = (
        [(128, 512, 64), (512, 8192, 128)]
        if args.quick
        else list(itertools.product(args.envs, args.batches, args.obs))
    )
    if args.users:
        grid = [*itertools.product([4096], [8192, 32768], [64, 512]), (512, 8192, 128)]
    if args.shapes:  # E,B,D triples
        grid = [tuple(map(int, shape.split(","))) for shape in args.shapes]
    parts = PARTS if args.apart or args.users else PARTS[:1]
    rows = []
    for envs, batch, obs_dim in [] if args.sac_only else grid:
        full_pairs = envs * STEPS_PER_ENV * (2 * obs_dim + ACTION + 3) * 4
        if full_pairs > args.max_gib * 2**30:
            print(f"skipped E={envs} B={batch} D={obs_dim}: {full_pairs / 2**30:.1f} GiB")
            continue
        print(f"E={envs} B={batch} D={obs_dim}", flush=True)
        rows += measure(envs, batch, obs_dim, 8 if args.quick else 16, 3 if args.quick else 4,
                        parts)  # fmt: skip
    columns = [("envs", "envs", "{}"), ("batch", "batch", "{}"), ("obs", "obs", "{}"),
               ("variant", "variant", "{}"), ("timed", "part", "{}"),
               ("µs per step (median)", "us_per_step", "{:.0f}"),
               ("fastest", "fastest_us", "{:.0f}"), ("/ flashbax flat", "vs_flashbax", "{:.2f}"),
               ("bytes per stored step", "bytes_per_step", "{:.0f}")]  # fmt: skip
    if rows:
        write_results(args.out, args.table, rows, columns, __doc__)
    if args.sac or args.sac_only:
        sac_columns = [("case", "case", "{}"), ("seed", "seed", "{}"), ("buffer", "buffer", "{}"),
                       ("steps/s", "sps", "{:.0f}"), ("eval return", "return", "{:.1f}"),
                       ("buffer MiB", "buffer_mib", "{:.1f}")]  # fmt: skip
        sac = (measure_sac(20_000, 65_536) if args.quick
               else measure_sac(args.sac_steps, args.sac_full_size, args.sac_envs, args.sac_seeds,
                                args.sac_obs, args.sac_full_only))  # fmt: skip
        write_results(args.out, args.sac_table, kept_rows(args, sac) + sac, sac_columns, __doc__)


def kept_rows(args, rows: list[dict]) -> list[dict]:
    """With `--sac-keep`, the rows of the SAC table already in `--out` whose case `rows`
    does not measure (so that several runs, one per configuration, fill one table)."""
    import jax

    path = pathlib.Path(args.out) / f"{args.sac_table}_{jax.default_backend()}.json"
    if not args.sac_keep or not path.exists():
        return []
    cases = {row["case"] for row in rows}
    return [row for row in json.loads(path.read_text())["results"] if row["case"] not in cases]


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Brax warns about its own pipelines
        main()
