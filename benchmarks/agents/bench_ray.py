"""Actor processes feeding a learner on a local Ray cluster: jaxbuf.ray, echo, TorchRL.

Four tables, each on a local Ray cluster of this machine's cores:

- `ray_transport`: each of 1 to 16 actor processes sends `2 * STEPS / actors` (at least
  1,024; whole blocks) CartPole transitions, `ROUNDS` times, the paths taking turns (a
  path's row: the median and the fastest of its rounds; one round of one row once ran at a
  third of the rate the same code ran before and after it)
  (obs and next_obs float32[4], action, reward, discount: 44 bytes), made in advance, as
  fast as the path takes them, into a learner that writes them into a replay buffer:
  `jaxbuf.ray` (`Writer` blocks of 32 or 256 steps, 4 in flight; `Ingest.poll`), echo
  (`id-echo`: one `TcpClient.send` per step; the learner's `Server.sample` batches of 32
  or 256, each added to the same jaxbuf replay buffer), TorchRL's `RayReplayBuffer`
  (blocks `extend`ed into the buffer's own Ray actor; the learner holds nothing). Steps per
  second from the first send to the last step stored; the learner's CPU time per step
  (its process's CPU seconds over the run, all its threads); bytes sent per step
  (jaxbuf: a block's pickled size over its steps; echo: its payload; TorchRL: a
  TensorDict block's pickled size). Echo's `sample` waits for ever where steps never come
  (one run stalled so, 16 senders of blocks of 32): a row not ended after `ECHO_STALL`
  seconds is cut short and shows the steps that arrived, and no rate.
- `ray_calls`: the ceiling of Ray's actor calls on this machine: 1 to 16 caller processes
  call one async actor's no-op method, each call waited for (what an inbox message costs
  before any work of its own).
- `ray_store`: Ray's object store between two processes of this machine: an actor puts
  blocks of 1 KiB to 16 MiB, the driver gets them: microseconds per block and MB/s,
  what predicts a cluster's throughput per step size (see docs/ray.md).
- `ray_apex`: the Ape-X agent (`jaxbuf.examples.apex_cartpole`, 100k steps) with 1 and 2
  actor processes against the same agent in one process (`--actors 0`), seeds 0-5 (one
  seed with 1 actor), the agents interleaved seed by seed: steps per second into the
  learner (from the start of training: the actors' start-up and the learner's compiling
  included), updates per second, steps per second from the first update on (the
  learning phase, after the first `learning_starts` steps), the CPU seconds the whole
  machine ran meanwhile (`/proc/stat`: the learner, the actors, the inbox and Ray's own
  processes; the evaluation excluded) and where it went (the learner's process, the
  actor processes' runs, the inbox's, the rest: Ray's own processes, the actors'
  start-ups, the machine's others), the inbox's calls per block (256 steps), and the
  greedy return (gymnax CartPole, 64 episodes).
- `ray_soak`: two actors sending while the learner samples under a rate limiter; one of
  them killed at 20 random moments (Ray restarts it): steps written twice, steps a
  writer was told are written but missing, and the limiter's bounds checked after
  every sample.

Run: `python -m benchmarks.agents.bench_ray [--quick] [--parts transport,calls,store,apex,soak]`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import pickle
import random
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks.common import ROOT, write_results

STEPS = 20_000  # per actor
ROUNDS = 3  # of each transport row, the paths taking turns
ECHO_STALL = 120.0  # seconds after which an echo row that has not ended is cut short
BLOCK = 32  # the learner's batch


def step_example() -> dict:
    return {"obs": np.zeros(4, np.float32), "action": np.zeros((), np.int32),
            "reward": np.zeros((), np.float32), "discount": np.zeros((), np.float32),
            "next_obs": np.zeros(4, np.float32)}  # fmt: skip


def made_steps(index: int, count: int) -> list[dict]:
    """Distinct steps (the obs carries the actor and the step's number)."""
    rng = np.random.default_rng(index)
    return [{"obs": np.array([index, i, 0, 0], np.float32), "action": np.array(i % 2, np.int32),
             "reward": np.array(1, np.float32), "discount": np.array(0.99, np.float32),
             "next_obs": rng.normal(size=4).astype(np.float32)} for i in range(count)]  # fmt: skip


class JaxbufSender:
    """Sends made steps with `jaxbuf.ray.Writer` (an actor process; imports, steps and the
    connection made before the timed `run`)."""

    def __init__(self, inbox: str, index: int, count: int, block: int, namespace: str) -> None:
        from jaxbuf.ray import Writer

        self.steps = made_steps(index, count)
        self.writer = Writer(inbox, f"sender-{index}", block_size=block, window=4,
                             namespace=namespace)  # fmt: skip

    def run(self) -> float:
        start = time.perf_counter()
        for step in self.steps:
            self.writer.append(step)
        self.writer.flush()
        self.writer.wait(timeout=300)
        return time.perf_counter() - start


class EchoSender:
    """Sends made steps with echo's `TcpClient`, one `send` per step (an actor process)."""

    def __init__(self, port: int, index: int, count: int) -> None:
        from echo import TcpClient

        self.steps = made_steps(index, count)
        self.client = TcpClient("127.0.0.1", port, step_example(), max_inflight_msgs=32)

    def run(self) -> float:
        start = time.perf_counter()
        for step in self.steps:
            self.client.send(step)
        self.client.wait()  # every step acknowledged by the server
        self.client.close()
        return time.perf_counter() - start


class TorchrlSender:
    """Extends TorchRL's remote buffer by blocks of `block` steps (an actor process)."""

    def __init__(self, handle, index: int, count: int, block: int) -> None:
        import torch
        from tensordict import TensorDict

        steps = made_steps(index, count)
        self.handle, self.blocks = handle, []
        for i in range(0, count, block):
            part = steps[i : i + block]
            tensors = {k: torch.as_tensor(np.stack([s[k] for s in part])) for k in steps[0]}
            self.blocks.append(TensorDict(tensors, batch_size=[len(part)]))

    def run(self) -> float:
        import ray

        start = time.perf_counter()
        for block in self.blocks:
            ray.get(self.handle.extend.remote(block))
        return time.perf_counter() - start


def transport_jaxbuf(ray, actors: int, count: int, block: int) -> dict:
    import jaxbuf
    from jaxbuf.ray import Ingest

    name, namespace = f"bench-{actors}-{block}", ray.get_runtime_context().namespace
    buffer = jaxbuf.make_replay_buffer(block + actors * count, BLOCK)
    ingest = Ingest(buffer, buffer.init(step_example()), inbox=name, capacity=16)
    sender = ray.remote(num_cpus=0)(JaxbufSender)
    warmer = sender.remote(name, 99, block, block, namespace)  # its block compiles the write
    warm = warmer.run.remote()
    while int(ingest.state.size) < block:
        ingest.poll(timeout=0.5)
    senders = [sender.remote(name, i, count, block, namespace) for i in range(actors)]
    ray.get([warm, *(s.__ray_ready__.remote() for s in senders)])
    cpu, start = time.process_time(), time.perf_counter()
    runs = [s.run.remote() for s in senders]
    while int(ingest.state.size) < block + actors * count:
        ingest.poll(timeout=0.5)
    row = {"seconds": time.perf_counter() - start, "learner_cpu": time.process_time() - cpu}
    ray.get(runs)
    made = {k: np.stack([s[k] for s in made_steps(0, block)]) for k in step_example()}
    row["bytes_per_step"] = len(pickle.dumps((made, None), protocol=5)) / block
    ingest.close()
    for actor in (warmer, *senders):  # no process of this row runs on into the next
        ray.kill(actor)
    return row


def transport_echo(ray, actors: int, count: int, block: int) -> dict:
    import jax
    from echo import Server, TcpTransport

    import jaxbuf

    buffer = jaxbuf.make_replay_buffer(block + actors * count, BLOCK)
    state, add = buffer.init(step_example()), jax.jit(buffer.add, donate_argnums=0)
    state = add(state, {k: np.stack([v] * block) for k, v in step_example().items()})  # compiles
    server = Server(step_example(), batch_size=block, transport=TcpTransport(0, num_threads=2))
    server.start()
    sender = ray.remote(num_cpus=0)(EchoSender)
    senders = [sender.remote(server.port, i, count) for i in range(actors)]
    ray.get([s.__ray_ready__.remote() for s in senders])
    cpu, start = time.process_time(), time.perf_counter()
    runs = [s.run.remote() for s in senders]
    # echo's `sample` waits for ever where steps never come (it stalled once, 16 senders of
    # blocks of 32): the server closed after ECHO_STALL seconds ends the wait with None
    watchdog = threading.Timer(ECHO_STALL, server.close)
    watchdog.start()
    arrived = 0
    while arrived < actors * count and (sample := server.sample()) is not None:
        state, arrived = add(state, sample.batch), arrived + block
    int(state.size)
    row = {"seconds": time.perf_counter() - start, "learner_cpu": time.process_time() - cpu,
           "arrived": arrived / (actors * count)}  # fmt: skip
    watchdog.cancel()
    if arrived == actors * count:
        ray.get(runs)
    server.close()
    for actor in senders:
        ray.kill(actor)
    row["bytes_per_step"] = sum(np.asarray(v).nbytes for v in step_example().values())
    return row


def transport_torchrl(ray, actors: int, count: int, block: int) -> dict:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, RayReplayBuffer

    buffer = RayReplayBuffer(storage=LazyTensorStorage(actors * count), batch_size=BLOCK)
    sender = ray.remote(num_cpus=0)(TorchrlSender)
    senders = [sender.remote(buffer._rb, i, count, block) for i in range(actors)]
    ray.get([s.__ray_ready__.remote() for s in senders])
    cpu, start = time.process_time(), time.perf_counter()
    ray.get([s.run.remote() for s in senders])
    assert len(buffer) == actors * count, len(buffer)
    row = {"seconds": time.perf_counter() - start, "learner_cpu": time.process_time() - cpu}
    import torch

    made = made_steps(0, block)
    tensors = {k: torch.as_tensor(np.stack([s[k] for s in made])) for k in step_example()}
    row["bytes_per_step"] = len(pickle.dumps(TensorDict(tensors, batch_size=[block]))) / block
    ray.kill(buffer._rb)
    for actor in senders:
        ray.kill(actor)
    return row


def transport(ray, quick: bool) -> list[dict]:
    paths = {"jaxbuf.ray": transport_jaxbuf, "echo": transport_echo,
             "torchrl RayReplayBuffer": transport_torchrl}  # fmt: skip
    rows = []
    for block, actors in [(b, a) for b in (32, 256) for a in (1, 2, 4, 8, 16)]:
        # steps per actor: whole blocks (a shorter last block would compile a write of its
        # own shape inside the timed run)
        count = max(1_024, (4_096 if quick else 2 * STEPS) // actors) // block * block
        runs: dict[str, list[dict]] = {name: [] for name in paths}
        for _ in range(1 if quick else ROUNDS):  # the paths in turn, round after round
            for name, measure in paths.items():
                runs[name].append(measure(ray, actors, count, block))
                print(name, actors, block, runs[name][-1], flush=True)
        for name, measured in runs.items():
            rows.append({"path": name, "actors": actors, "block": block,
                         **summary(measured, actors * count)})  # fmt: skip
    return rows


def summary(measured: list[dict], sent: int) -> dict:
    """One row of a path's rounds: steps/s (median and fastest of the rounds that ended;
    echo may stall), the learner's CPU per step (median), bytes per step, steps arrived."""
    arrived = [round(m.get("arrived", 1.0) * sent) for m in measured]
    rates = [sent / m["seconds"] for m, a in zip(measured, arrived, strict=True) if a == sent]
    cpu = [m["learner_cpu"] / max(a, 1) * 1e6 for m, a in zip(measured, arrived, strict=True)]
    return {"steps_per_second": statistics.median(rates) if rates else None,
            "fastest": max(rates, default=None), "learner_cpu_us": statistics.median(cpu),
            "bytes_per_step": measured[0]["bytes_per_step"],
            "arrived": f"{sum(arrived):,} of {sent * len(measured):,}"}  # fmt: skip


class Caller:
    """Calls a no-op method of an async actor, one call after another (an actor process)."""

    def __init__(self, target) -> None:
        self.target = target

    def run(self, count: int) -> float:
        import ray

        start = time.perf_counter()
        for i in range(count):
            ray.get(self.target.echo.remote(i))
        return time.perf_counter() - start


class NoOp:
    """An async actor whose method does nothing (the inbox's shape, without its work)."""

    async def echo(self, value: int) -> int:
        return value


def calls(ray, quick: bool) -> list[dict]:
    """The ceiling of Ray actor calls on this machine: callers in their own processes
    calling one async actor's no-op method, each call waited for."""
    target = ray.remote(num_cpus=0, max_concurrency=1000)(NoOp).remote()
    rows = []
    for callers in (1, 2, 4, 8, 16):
        count = max(200, (2_000 if quick else 8_000) // callers)
        actors = [ray.remote(num_cpus=0)(Caller).remote(target) for _ in range(callers)]
        ray.get([a.__ray_ready__.remote() for a in actors] + [target.echo.remote(0)])
        start = time.perf_counter()
        ray.get([a.run.remote(count) for a in actors])
        seconds = time.perf_counter() - start
        rows.append({"callers": callers, "calls_per_second": callers * count / seconds})
        print(rows[-1], flush=True)
        for actor in actors:
            ray.kill(actor)
    ray.kill(target)
    return rows


class Putter:
    """Puts blocks into the object store from an actor process."""

    def put(self, nbytes: int, count: int) -> list:
        import ray

        return [[ray.put(np.full(nbytes, i, np.uint8))] for i in range(count)]


def store(ray, quick: bool) -> list[dict]:
    putter = ray.remote(num_cpus=0)(Putter).remote()
    rows = []
    for nbytes in (1 << 10, 1 << 16, 1 << 20, 1 << 24):
        count = max(4, min(200, (64 << 20) // nbytes)) // (4 if quick else 1)
        boxed = ray.get(putter.put.remote(nbytes, count))
        start = time.perf_counter()
        for (ref,) in boxed:
            ray.get(ref)
        seconds = (time.perf_counter() - start) / count
        rows.append(
            {"bytes": nbytes, "us_per_block": seconds * 1e6, "mb_per_s": nbytes / seconds / 1e6}
        )
        print(rows[-1], flush=True)
    ray.kill(putter)
    return rows


def apex(ray, quick: bool) -> list[dict]:
    from jaxbuf.examples import apex_cartpole

    config = {**apex_cartpole.CONFIG, "total_timesteps": 20_000 if quick else 100_000}
    if quick:
        config["learning_starts"] = 2_000
    rows = []  # the agents interleaved seed by seed (a shared machine drifts)
    runs = [(seed, actors) for seed in range(6) for actors in ((0, 2, 1) if seed == 0 else (0, 2))]
    for seed, actors in runs if not quick else [(0, 0), (0, 2)]:
        start, busy, own = time.perf_counter(), machine_cpu_seconds(), time.process_time()
        if actors:
            params, network, counts = apex_cartpole.train(seed, actors, config=config, quiet=True)
        else:
            params, network, counts = apex_cartpole.train_one_process(seed, config=config)
        row = {"agent": "one process" if actors == 0 else f"{actors} actor processes",
               "seed": seed, "steps": counts["steps"], "updates": counts["updates"],
               "seconds": counts["seconds"], "wall": time.perf_counter() - start,
               "machine_cpu": machine_cpu_seconds() - busy,
               "learner_cpu": time.process_time() - own}  # fmt: skip
        row.update(cpu_parts(row, counts, config["block_size"]))
        row["return"] = evaluate(network, params)
        row["steps_per_second"] = row["steps"] / row["seconds"]
        row["updates_per_second"] = row["updates"] / row["seconds"]
        phase = counts["learning"]
        row["learning_steps_per_second"] = phase["steps"] / phase["seconds"]
        rows.append(row)
        print(row, flush=True)
    return rows


def cpu_parts(row: dict, counts: dict, block: int) -> dict:
    """Where the machine's CPU went: the actor processes', the inbox's, the rest (Ray's
    own processes, the rest of the machine), and the inbox's calls per block."""
    actors = sum(a["cpu_seconds"] for a in counts.get("actors", []))
    inbox = counts["inbox"]["cpu_seconds"] if "inbox" in counts else 0.0
    calls = sum(counts["inbox"]["calls"].values()) if "inbox" in counts else 0
    rest = row["machine_cpu"] - row["learner_cpu"] - actors - inbox
    return {"actors_cpu": actors, "inbox_cpu": inbox, "rest_cpu": rest,
            "inbox_calls_per_block": calls / (row["steps"] / block)}  # fmt: skip


def machine_cpu_seconds() -> float:
    """CPU seconds every process of this machine has run (Linux `/proc/stat`: user, nice,
    system), so that a run's count takes in Ray's processes as well as the learner's."""
    import os

    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:4]
    return sum(int(x) for x in fields) / os.sysconf("SC_CLK_TCK")


def evaluate(network, params) -> float:
    import gymnax
    import jax
    import jax.numpy as jnp

    from jaxbuf.examples._common import make_evaluate

    env, env_params = gymnax.make("CartPole-v1")
    greedy = lambda p, obs: jnp.argmax(network.apply(p, obs), axis=1)  # noqa: E731
    return float(make_evaluate(greedy, env, env_params, 64)(params, jax.random.key(1)))


def soak(ray, quick: bool) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests" / "workers"))
    sys.path.insert(0, str(ROOT / "tests"))
    import jax
    import jax.numpy as jnp
    import test_ray  # the test's checks, run longer
    from ray_producer import Producer

    from jaxbuf.ray import Ingest  # noqa: F401

    kills_wanted, rng = (5 if quick else 20), random.Random(0)
    producer = ray.remote(num_cpus=0, max_restarts=-1)(Producer)
    ingest = test_ray._limited_ingest("soak")
    logs = [pathlib.Path(tempfile.mkdtemp()) / f"actor{i}.log" for i in range(2)]
    namespace = ray.get_runtime_context().namespace
    actors = [producer.remote("soak", i, str(logs[i]), 8, 3, 0.001, namespace) for i in range(2)]
    key, kills, samples, outside = jax.random.key(0), 0, 0, 0
    start = time.perf_counter()
    while kills < kills_wanted:
        assert ingest.wait_until_can_sample(timeout=60), ingest.stats()
        key, draw = jax.random.split(key)
        ingest.sample(draw)
        samples += 1
        outside += not test_ray._within_bounds(ingest)
        if rng.random() < 0.02:
            test_ray._kill(actors[rng.randrange(2)])
            kills += 1
    stopping = [test_ray._alive(a).stop.remote() for a in actors]
    while ray.wait(stopping, num_returns=2, timeout=0)[1]:
        ingest.poll(timeout=0.1)
        if ingest.pending and ingest.can_sample():
            ingest.sample(key)
            outside += not test_ray._within_bounds(ingest)
    ray.get(stopping)
    held = test_ray._held(ingest)
    twice = sum(c - 1 for c in held.values() if c > 1)
    missing = 0
    for index, log in enumerate(logs):
        for incarnation, last in test_ray._acknowledged(log).items():
            missing += sum(held.get((index, incarnation, b, s), 0) == 0
                           for b in range(last + 1) for s in range(8))  # fmt: skip
    stats = ingest.stats()
    ingest.close()
    del jnp
    restarts = sum(stats["inbox"]["incarnations"].values()) - 2
    return [{"kills": kills, "restarts": restarts, "steps": len(held), "twice": twice,
             "missing": missing, "samples": samples, "outside": outside,
             "lost_blocks": stats["lost"], "seconds": time.perf_counter() - start}]  # fmt: skip


COLUMNS = {
    "ray_transport": [("path", "path", "{}"), ("actor processes", "actors", "{}"),
                      ("steps per block (echo: per batch)", "block", "{}"),
                      ("steps arrived (all rounds)", "arrived", "{}"),
                      ("steps/s into the learner's buffer (median)", "steps_per_second",
                       "{:,.0f}"),
                      ("steps/s (fastest)", "fastest", "{:,.0f}"),
                      ("learner CPU µs per step (median)", "learner_cpu_us", "{:.1f}"),
                      ("bytes sent per step", "bytes_per_step", "{:.1f}")],
    "ray_calls": [("caller processes", "callers", "{}"),
                  ("calls per second into one actor", "calls_per_second", "{:,.0f}")],
    "ray_store": [("block bytes", "bytes", "{:,}"), ("µs per block", "us_per_block", "{:.0f}"),
                  ("MB/s", "mb_per_s", "{:,.0f}")],
    "ray_apex": [("agent", "agent", "{}"), ("seed", "seed", "{}"),
                 ("steps written", "steps", "{:,}"), ("updates", "updates", "{:,}"),
                 ("seconds", "seconds", "{:.1f}"),
                 ("steps/s into the learner", "steps_per_second", "{:,.0f}"),
                 ("updates/s", "updates_per_second", "{:.1f}"),
                 ("steps/s from the first update", "learning_steps_per_second", "{:,.0f}"),
                 ("machine CPU s (all processes)", "machine_cpu", "{:.1f}"),
                 ("learner process CPU s", "learner_cpu", "{:.1f}"),
                 ("actor processes CPU s", "actors_cpu", "{:.1f}"),
                 ("inbox CPU s", "inbox_cpu", "{:.1f}"),
                 ("the rest (Ray's processes, start-ups) CPU s", "rest_cpu", "{:.1f}"),
                 ("inbox calls per block", "inbox_calls_per_block", "{:.1f}"),
                 ("greedy return (64 episodes)", "return", "{:.1f}")],
    "ray_soak": [("kills", "kills", "{}"), ("restarts seen", "restarts", "{}"),
                 ("steps stored", "steps", "{:,}"), ("steps written twice", "twice", "{}"),
                 ("acknowledged steps missing", "missing", "{}"),
                 ("samples", "samples", "{:,}"), ("samples outside the bounds", "outside", "{}"),
                 ("blocks lost with a killed writer (never acknowledged)", "lost_blocks", "{}"),
                 ("seconds", "seconds", "{:.0f}")],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--parts", default="transport,store,apex,soak")
    args = parser.parse_args()
    import ray

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # the soak's actors are the tests' (tests/workers/ray_producer.py)
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "workers")])
    workers = {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": workers})  # fmt: skip
    parts = {"transport": transport, "calls": calls, "store": store, "apex": apex, "soak": soak}
    for part in args.parts.split(","):
        rows = parts[part](ray, args.quick)
        write_results(args.out, f"ray_{part}", rows, COLUMNS[f"ray_{part}"], __doc__)
    ray.shutdown()


if __name__ == "__main__":
    main()
