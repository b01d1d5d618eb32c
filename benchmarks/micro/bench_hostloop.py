"""Python-loop users: a buffer fed from a Gymnasium loop, against a NumPy ring, cpprb, TorchRL.

The loop Stable-Baselines3, cpprb and TorchRL users write: a Gymnasium vector
environment of 8 envs steps in Python; every environment step adds the step
(obs, action, reward, terminated, truncated, next_obs with the final
observation at episode ends) and the learner receives one batch of 256
transitions. Two environments: CartPole-v1, and a synthetic one with 84x84
uint8 frames (the buffer's work grows with the frames, the environment's is a
copy of ready frames).

Buffers, all fed the same recorded steps:
- "NumPy ring": Stable-Baselines3's layout (obs and next_obs rows, `rng.integers`
  and fancy indexing), the baseline of the ratios;
- "cpprb": `cpprb.ReplayBuffer` with the same fields;
- "TorchRL": `ReplayBuffer(storage=LazyTensorStorage)` fed TensorDicts;
- "jaxbuf per call": a jitted, donated `add_step` and `sample` every step;
- "jaxbuf k=K": `jaxbuf.HostLoop` with `steps_per_call=K`: one call writes K
  staged steps and draws K batches; the learner takes batch j of the block.
A second table puts the learner on the accelerator (the default device: a GPU where
there is one, else the CPU itself): each step folds its batch into the learner's
parameters with a jitted call on that device and reads them back (as a policy's
action is). There the NumPy ring and cpprb send each batch with one
`jax.device_put` ("+ device_put", the ring is the baseline), and `HostLoop`
delivers blocks on the device as JAX arrays (`output="jax"`, the learner takes batch
`j` of the block) or Torch tensors (`output="torch"`, a Torch learner).
In the first table batches reach the learner as NumPy arrays (TorchRL's as tensors). The
environment's own step is timed apart; "share" is the buffer's part of an
environment-plus-buffer step (`report.py` plots it against k). Variants take
turns in every timed round over the recorded steps; the table gives the median
and fastest round, in microseconds per environment step.

Run: `python -m benchmarks.micro.bench_hostloop [--quick] [--learner] [--out benchmarks/results]`
(`--learner`: the second table alone, `hostloop_learner_<platform>.md`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import json
import os
import subprocess
import sys
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode

import jaxbuf
from benchmarks.common import ROOT, command_line, resident_bytes, write_results

ENVS, BATCH = 8, 256
BLOCKS = (1, 2, 4, 8, 32, 128)
FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")


def cartpole_trace(steps: int) -> list[tuple]:
    """Recorded CartPole steps: (obs, action, reward, terminated, truncated,
    next_obs with the final observation where an episode ended)."""
    envs = gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})  # fmt: skip
    obs, _ = envs.reset(seed=0)
    trace = []
    for _ in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        final = next_obs.copy()
        for i in np.flatnonzero(terminated | truncated):
            final[i] = info["final_obs"][i]
        trace.append((obs, action.astype(np.int32), reward.astype(np.float32), terminated,
                      truncated, final))  # fmt: skip
        obs = next_obs
    return trace


def cartpole_env_time(steps: int) -> float:
    """Seconds per step of the 8 CartPole environments alone."""
    envs = gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})  # fmt: skip
    envs.reset(seed=1)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    return (time.perf_counter() - start) / steps


class FrameEnv:
    """A synthetic environment of 84x84 uint8 frames: a step copies ready frames."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.frames = self.rng.integers(0, 255, (64, ENVS, 84, 84), dtype=np.uint8)
        self.t = 0

    def step(self) -> tuple:
        self.t += 1
        obs = self.frames[self.t % 64].copy()
        done = self.rng.random(ENVS) < 0.01
        return obs, np.zeros(ENVS, np.int32), np.ones(ENVS, np.float32), done, np.zeros(ENVS, bool)


def frame_trace(steps: int) -> list[tuple]:
    env, trace = FrameEnv(0), []
    obs = env.step()[0]
    for _ in range(steps):
        next_obs, action, reward, terminated, truncated = env.step()
        trace.append((obs, action, reward, terminated, truncated, next_obs))
        obs = next_obs
    return trace


def frame_env_time(steps: int) -> float:
    env = FrameEnv(1)
    start = time.perf_counter()
    for _ in range(steps):
        env.step()
    return (time.perf_counter() - start) / steps


class NumpyRing:
    """Stable-Baselines3's replay layout: rows of obs and next_obs, sampled with replacement."""

    def __init__(self, capacity: int, obs_shape: tuple, obs_dtype):
        self.obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.action = np.zeros(capacity, np.int32)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, bool)
        self.position, self.full, self.rng = 0, False, np.random.default_rng(0)

    def add(self, obs, action, reward, terminated, truncated, next_obs) -> None:
        rows = (self.position + np.arange(len(action))) % len(self.action)
        self.obs[rows], self.next_obs[rows] = obs, next_obs
        self.action[rows], self.reward[rows], self.done[rows] = action, reward, terminated
        self.position = (self.position + len(action)) % len(self.action)
        self.full |= self.position < len(action)

    def sample(self) -> tuple:
        rows = self.rng.integers(0, len(self.action) if self.full else self.position, BATCH)
        return (self.obs[rows], self.action[rows], self.reward[rows], self.done[rows],
                self.next_obs[rows])  # fmt: skip


def numpy_ring(capacity: int, obs):
    ring = NumpyRing(capacity, obs.shape[1:], obs.dtype)

    def step(obs, action, reward, terminated, truncated, next_obs):
        ring.add(obs, action, reward, terminated, truncated, next_obs)
        return ring.sample()

    return step


def cpprb_buffer(capacity: int, obs):
    import cpprb

    frame = {"shape": obs.shape[1:], "dtype": obs.dtype}
    fields = {"obs": frame, "act": {"dtype": np.int32}, "rew": {}, "done": {}, "next_obs": frame}
    buffer = cpprb.ReplayBuffer(capacity, fields)

    def step(obs, action, reward, terminated, truncated, next_obs):
        buffer.add(obs=obs, act=action, rew=reward, done=terminated, next_obs=next_obs)
        return buffer.sample(BATCH)

    return step


def torchrl_buffer(capacity: int, obs):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=BATCH)

    def step(obs, action, reward, terminated, truncated, next_obs):
        data = {"obs": obs, "action": action, "reward": reward, "done": terminated,
                "next_obs": next_obs}  # fmt: skip
        buffer.extend(TensorDict({k: torch.from_numpy(v) for k, v in data.items()}, [ENVS]))
        return buffer.sample()

    return step


def jaxbuf_buffer(capacity: int, obs):
    return jaxbuf.make_transition_buffer(ENVS, capacity // ENVS, BATCH)


def example_of(obs) -> jaxbuf.Transition:
    zeros = jnp.zeros(obs.shape[1:], obs.dtype)
    return jaxbuf.Transition(zeros, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                             jnp.bool_(False), zeros)  # fmt: skip


def jaxbuf_per_call(capacity: int, obs):
    buffer = jaxbuf_buffer(capacity, obs)
    add_step, sample = jax.jit(buffer.add_step, donate_argnums=0), jax.jit(buffer.sample)
    held = {"state": buffer.init(example_of(obs)), "key": jax.random.key(0), "t": 0}

    def step(*fields):
        held["state"] = add_step(held["state"], jaxbuf.Transition(*fields))
        held["t"] += 1
        batch = sample(held["state"], jax.random.fold_in(held["key"], held["t"])).experience
        return tuple(np.asarray(x) for x in (batch.obs, batch.action, batch.reward,
                                             batch.discount, batch.next_obs))  # fmt: skip

    return step


def batch_taker(loop: jaxbuf.HostLoop, k: int):
    """`take(fields)`: adds a step to the loop and returns `(block, j)`, the learner's
    batch `j` of the newest block's experience (None before the first block)."""
    held: dict = {"block": None, "j": 0}

    def take(fields):
        block = loop.add(jaxbuf.Transition(*fields))
        if block is not None:
            held["block"], held["j"] = block.experience, 0
        if held["block"] is None or held["j"] >= k:
            return None
        held["j"] += 1
        return held["block"], held["j"] - 1

    return take


def jaxbuf_host_loop(k: int):
    def make(capacity: int, obs):
        buffer = jaxbuf_buffer(capacity, obs)
        loop = jaxbuf.HostLoop(buffer, buffer.init(example_of(obs)), jax.random.key(0),
                               steps_per_call=k)  # fmt: skip
        take = batch_taker(loop, k)

        def step(*fields):
            if (taken := take(fields)) is None:
                return None
            batch, j = taken
            return (batch.obs[j], batch.action[j], batch.reward[j], batch.discount[j],
                    batch.next_obs[j])  # fmt: skip

        return step

    return make


def variants() -> dict:
    found = {"NumPy ring": numpy_ring, "cpprb": cpprb_buffer}
    try:
        import torchrl  # noqa: F401

        found["TorchRL"] = torchrl_buffer
    except ImportError:
        print("TorchRL is not installed here: its column is left out.")
    found["jaxbuf per call"] = jaxbuf_per_call
    found.update({f"jaxbuf k={k}": jaxbuf_host_loop(k) for k in BLOCKS})
    return found


def learner_step():
    """A jitted learner on the device of its inputs: `learn(w, obs, reward)` folds one
    batch into the parameters `w`; `learn_block(w, obs, reward, j)` takes batch `j` of a block.
    After each step the loop reads `w` back (as a policy's action is), so every
    variant waits for the learner's use of its batch."""

    def fold(w, obs, reward):
        return 0.99 * w + jnp.mean(obs.astype(jnp.float32)) + jnp.mean(reward)

    learn = jax.jit(fold)
    learn_block = jax.jit(lambda w, obs, reward, j: fold(w, obs[j], reward[j]))
    return learn, learn_block


def to_device_ring(make_peer, device):
    """A NumPy-side buffer (the NumPy ring, cpprb) whose batch goes to the learner's
    device with one `jax.device_put` per batch."""

    def make(capacity: int, obs):
        peer, (learn, _) = make_peer(capacity, obs), learner_step()
        held = {"w": jax.device_put(jnp.float32(0), device)}

        def step(*fields):
            batch = peer(*fields)
            cpprb = isinstance(batch, dict)
            obs, reward = (batch["obs"], batch["rew"]) if cpprb else (batch[0], batch[2])
            held["w"] = learn(held["w"], *jax.device_put((obs, reward), device))
            return np.asarray(held["w"])

        return step

    return make


def jaxbuf_to_learner(k: int, output: str, device):
    """HostLoop delivering blocks on the learner's device (`output="jax"` or
    `"torch"`); the learner takes batch `j` of the block at step `j`."""

    def make(capacity: int, obs):
        buffer = jaxbuf_buffer(capacity, obs)
        state = jax.device_put(buffer.init(example_of(obs)), device)
        loop = jaxbuf.HostLoop(buffer, state, jax.random.key(0), steps_per_call=k, output=output)
        _, learn_block = learner_step()
        take, held = batch_taker(loop, k), {"w": jax.device_put(jnp.float32(0), device)}

        def step(*fields):
            if (taken := take(fields)) is None:
                return None
            batch, j = taken
            if output == "torch":  # a Torch learner on the same device
                held["w"] = 0.99 * held["w"] + batch.obs[j].float().mean() + batch.reward[j].mean()
                return float(held["w"])
            held["w"] = learn_block(held["w"], batch.obs, batch.reward, j)
            return np.asarray(held["w"])

        if output == "torch":
            import torch

            held["w"] = torch.zeros((), device="cuda" if device.platform == "gpu" else "cpu")
        return step

    return make


def learner_variants() -> dict:
    """The learner on the accelerator (here: the default device, a GPU where there is
    one): batches must reach it as device arrays."""
    device = jax.devices()[0]
    found = {"NumPy ring + device_put": to_device_ring(numpy_ring, device),
             "cpprb + device_put": to_device_ring(cpprb_buffer, device)}  # fmt: skip
    found.update({f"jaxbuf k={k}, jax": jaxbuf_to_learner(k, "jax", device)
                  for k in (1, 8, 32, 128)})  # fmt: skip
    if importlib.util.find_spec("torch") is not None:
        found["jaxbuf k=32, torch"] = jaxbuf_to_learner(32, "torch", device)
    return found


def trimmed_resident() -> int:
    """Resident bytes after freed heap memory is handed back (glibc `malloc_trim`),
    so that one variant's freed memory does not count for the next."""
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return resident_bytes()


def per_step_times(trace: list, capacity: int, repeats: int,
                   made: dict | None = None) -> tuple[dict, dict]:  # fmt: skip
    """Seconds per environment step of every variant (`variants()`, or `made`), one
    list entry per round, and the resident bytes each variant added (made, filled,
    compiled, a round run)."""
    steps, resident = {}, {}
    for name, make in (made or variants()).items():
        before = trimmed_resident()
        steps[name] = make(capacity, trace[0][0])
        for _ in range(2):  # compile, fill, and one round as timed
            for fields in trace:
                steps[name](*fields)
        resident[name] = trimmed_resident() - before
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for fields in trace:
                step(*fields)
            times[name].append((time.perf_counter() - start) / len(trace))
    return times, resident


def rows_of(env_name: str, measured: tuple[dict, dict], env_seconds: float,
            base_name: str = "NumPy ring") -> list[dict]:  # fmt: skip
    times, resident = measured
    base = float(np.median(times[base_name]))
    rows = []
    for name, values in times.items():
        median = float(np.median(values))
        rows.append({
            "env": env_name, "buffer": name, "median_us": median * 1e6,
            "fastest_us": float(np.min(values)) * 1e6, "env_us": env_seconds * 1e6,
            "ratio": median / base, "share": median / (median + env_seconds),
            "resident_mib": resident[name] / 2**20,
        })  # fmt: skip
    return rows


def host_storage_rows(quick: bool) -> list[dict]:
    """`hostloop_devices.py`'s rows: a host-stored buffer feeding a learner on a second
    (simulated) device, run in its own process since JAX fixes its devices at start."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    module = [sys.executable, "-m", "benchmarks.micro.hostloop_devices"]
    done = subprocess.run([*module, *(["--quick"] if quick else [])], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=True)  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


COLUMNS = [("environment", "env", "{}"), ("buffer", "buffer", "{}"),
           ("median µs/step", "median_us", "{:.1f}"), ("fastest", "fastest_us", "{:.1f}"),
           ("/ NumPy ring", "ratio", "{:.2f}"), ("env µs/step", "env_us", "{:.1f}"),
           ("buffer's share", "share", "{:.2f}"),
           ("resident MiB added", "resident_mib", "{:.0f}"),
           ("/ one device", "vs_one_device", "{:.2f}")]  # fmt: skip


def learner_rows(steps: int, repeats: int) -> list[dict]:
    """The learner on the accelerator: CartPole, and 84x84 frames over a trace of at
    least 1,024 steps (8 blocks of k=128 per round: steady state, memory reused)."""
    on = f"learner on {jax.devices()[0].platform.upper()}"
    frames = frame_trace(max(steps // 2, 1024))
    rows = rows_of(f"CartPole, {on}", per_step_times(cartpole_trace(steps), 100_000, repeats,
                                                     learner_variants()),
                   cartpole_env_time(steps), "NumPy ring + device_put")  # fmt: skip
    return rows + rows_of(f"84x84 uint8, {on}", per_step_times(frames, 8_000, repeats,
                                                               learner_variants()),
                          frame_env_time(len(frames)), "NumPy ring + device_put")  # fmt: skip


def main() -> None:
    args = command_line(__doc__, {"--learner": "only the learner on the accelerator "
                                               "(hostloop_learner_<platform>.md)"})  # fmt: skip
    # --quick: the standing GPU check gives this script 70 s (400 steps ran past it there)
    steps, repeats = (200, 3) if args.quick else (2000, 5)
    if args.learner:
        rows = learner_rows(steps, repeats)
        write_results(args.out, "hostloop_learner", rows, COLUMNS[:-1], __doc__)
        report(rows)
        return
    rows = rows_of("CartPole", per_step_times(cartpole_trace(steps), 100_000, repeats),
                   cartpole_env_time(steps))  # fmt: skip
    frames = frame_trace(steps // 2)
    rows += rows_of("84x84 uint8", per_step_times(frames, 8_000, repeats),
                    frame_env_time(steps // 2))  # fmt: skip
    rows += host_storage_rows(args.quick)
    write_results(args.out, "hostloop", rows, COLUMNS, __doc__)
    report(rows)
    frames_rows = {r["buffer"]: r for r in rows if r["env"] == "84x84 uint8"}
    if "cpprb" in frames_rows:
        best = min((frames_rows[f"jaxbuf k={k}"]["median_us"], k) for k in BLOCKS if k <= 32)
        print(f"84x84 uint8: jaxbuf / cpprb {best[0] / frames_rows['cpprb']['median_us']:.2f} "
              f"at k={best[1]}")  # fmt: skip
    cart = {r["buffer"]: r for r in rows if r["env"] == "CartPole"}
    ratio, k = min((cart[f"jaxbuf k={k}"]["ratio"], k) for k in BLOCKS if k <= 32)
    print(f"hostloop: jaxbuf / NumPy ring {ratio:.2f} at k={k} (CartPole, {jax.default_backend()})")


def report(rows: list[dict]) -> None:
    for row in rows:
        print(f"{row['env']:12s} {row['buffer']:16s} {row['median_us']:8.1f} us/step "
              f"(fastest {row['fastest_us']:.1f})  {row.get('ratio', 0):.2f} of NumPy ring, "
              f"{row.get('vs_one_device', 0):.2f} of one device")  # fmt: skip


if __name__ == "__main__":
    main()
