"""Every draw, bit for bit, as recorded before 0.4's moves: kind × sampler × option.

Each case builds a buffer at small shapes, fills it with the same adds (several wraps
and episode ends), sets priorities where the sampler has them, and draws with fixed keys;
the digest of every leaf of what comes back (`experience`, `indices`, `valid`, the
probabilities and weights, the epoch sampler's next batches, the state after the draws)
must equal the one in `recorded_draws.json`. A change to any draw, dtype or shape fails
here, naming the case. `JAXBUF_RECORD_DRAWS=1 python -m pytest -n 0
tests/test_recorded_draws.py` writes the file again (under the suite's own settings,
`conftest.py`): only for a change that is meant to change draws, said so in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

RECORDED = pathlib.Path(__file__).with_name("recorded_draws.json")
RECORDING = bool(os.environ.get("JAXBUF_RECORD_DRAWS"))
NUM_ENVS, CAPACITY, BATCH = 2, 12, 6


def done(step):
    return step["done"]


def goal_reward(achieved, desired):
    return -jnp.any(achieved != desired).astype(jnp.float32)


def steps(ids: np.ndarray) -> dict:
    """Steps with distinct ids (consecutive per environment); an episode ends where the id
    is 4 mod 5 or 0 mod 7 (episodes of 1 to 5 steps); a float obs and a 2-float goal."""
    ids = np.asarray(ids, np.int32)
    obs = {"x": np.stack([ids, -ids], -1).astype(np.float32) / 3,
           "achieved_goal": np.stack([ids % 3, ids % 2], -1).astype(np.float32),
           "desired_goal": np.stack([ids % 2, ids % 3], -1).astype(np.float32)}  # fmt: skip
    return {"id": ids, "obs": obs, "reward": (ids % 4).astype(np.float32),
            "done": (ids % 5 == 4) | (ids % 7 == 0)}  # fmt: skip


def transitions(ids: np.ndarray) -> jaxbuf.Transition:
    step = steps(ids)
    return jaxbuf.Transition(
        obs=step["obs"], action=np.asarray(ids, np.int32), reward=step["reward"],
        terminated=step["done"] & (np.asarray(ids) % 3 == 0), truncated=step["done"]
        & (np.asarray(ids) % 3 != 0), next_obs=jax.tree.map(lambda x: x + 0.5, step["obs"]),
    )  # fmt: skip


def batch_of(kind: str, start: int, length: int):
    if kind == "replay":
        return steps(np.arange(start, start + length))
    ids = 1000 * np.arange(NUM_ENVS)[:, None] + start + np.arange(length)  # per environment
    return transitions(ids) if kind == "transition" else steps(ids)


def example(kind: str):
    return jax.tree.map(lambda x: x[(0,) * (1 if kind == "replay" else 2)], batch_of(kind, 0, 1))


def make(kind: str, sampler_name: str, option: str) -> jaxbuf.Buffer:
    sampler = {"uniform": jaxbuf.uniform(), "uniform-noreplace": jaxbuf.uniform(False),
               "prioritized": jaxbuf.prioritized(0.7),
               "epochs": jaxbuf.epochs()}[sampler_name]  # fmt: skip
    options = {
        "none": {},
        "frames": {"frames": {"obs": 3}},
        "goals": {"goals": jaxbuf.hindsight(goal_reward, achieved="achieved_goal",
                                            desired="desired_goal", ratio=0.5)},
        "bfloat16": {"storage_dtypes": {"obs": "bfloat16"}},
        "host_memory": {"host_memory": ("obs",)},
        "frames+bfloat16": {"frames": {"obs": 3}, "storage_dtypes": {"obs": "bfloat16"}},
    }[option]  # fmt: skip
    if kind == "episode" and option == "goals":
        options["goals"] = jaxbuf.hindsight(goal_reward, achieved="obs/achieved_goal",
                                            desired="obs/desired_goal", ratio=0.5)  # fmt: skip
    if kind == "replay":
        return jaxbuf.make_replay_buffer(CAPACITY, BATCH, sampler=sampler, **options)
    if kind == "trajectory":
        return jaxbuf.make_trajectory_buffer(NUM_ENVS, CAPACITY, BATCH, 3, done_fn=done,
                                             sampler=sampler, **options)  # fmt: skip
    if kind == "transition":
        n_step = 1 if option == "goals" else 2  # goals relabel one-step transitions
        return jaxbuf.make_transition_buffer(NUM_ENVS, CAPACITY, BATCH, n_step=n_step, discount=0.9,
                                             min_episode_length=2, sampler=sampler,
                                             **options)  # fmt: skip
    return jaxbuf.make_episode_buffer(NUM_ENVS, CAPACITY, BATCH, 6, done_fn=done,
                                      sampler=sampler, **options)  # fmt: skip


CASES = [
    *[(kind, sampler, "none") for kind in ("replay", "trajectory", "transition", "episode")
      for sampler in ("uniform", "uniform-noreplace", "prioritized", "epochs")],
    ("replay", "uniform", "bfloat16"), ("replay", "prioritized", "host_memory"),
    ("trajectory", "uniform", "frames"), ("trajectory", "prioritized", "frames+bfloat16"),
    ("trajectory", "uniform", "host_memory"),
    ("transition", "uniform", "frames"), ("transition", "prioritized", "frames"),
    ("transition", "uniform", "goals"), ("transition", "uniform", "bfloat16"),
    ("transition", "uniform", "host_memory"), ("transition", "uniform", "frames+bfloat16"),
    ("episode", "uniform", "frames"), ("episode", "uniform", "goals"),
    ("episode", "prioritized", "bfloat16"),
]  # fmt: skip


def digest(tree) -> str:
    """SHA-256 over every leaf's path, dtype, shape and bytes."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        value = np.asarray(jax.random.key_data(leaf) if jnp.issubdtype(
            getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key) else leaf)  # fmt: skip
        h.update(f"{jax.tree_util.keystr(path)}|{value.dtype}|{value.shape}|".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()[:24]


def draws(kind: str, sampler_name: str, option: str) -> dict[str, str]:
    """The digests of one case's draws and final state."""
    buffer = make(kind, sampler_name, option)
    state = buffer.init(example(kind))
    add = jax.jit(buffer.add)
    start = 0
    for length in (5, 1, 7, 3, 7, 2, 5):  # several wraps at capacity 12
        state = add(state, batch_of(kind, start, length))
        start += length
    out = {}
    keys = jax.random.split(jax.random.key(7), 2)
    if sampler_name == "prioritized":
        first = jax.jit(buffer.sample)(state, keys[0])
        priorities = jnp.arange(1, BATCH + 1, dtype=jnp.float32) / 2
        state = jax.jit(buffer.set_priorities)(state, first.indices, priorities)
    if sampler_name == "epochs":
        next_batch = jax.jit(buffer.next_batch)
        for i, key in enumerate(jax.random.split(jax.random.key(3), 4)):
            state, batch = next_batch(state, key)
            out[f"next_batch {i}"] = digest(batch)
    sample = jax.jit(buffer.sample)
    for i, key in enumerate(keys):
        out[f"sample {i}"] = digest(sample(state, key))
    out["state"] = digest(state)
    return out


def queue_and_rollout() -> dict[str, str]:
    """The queue's pops and the rollout's minibatches (a key's permutation, GAE)."""
    queue = jaxbuf.make_queue(7, 3, 4)
    state, out = queue.init(example("replay")), {}
    for i, start in enumerate((0, 3, 6)):
        state = queue.add(state, batch_of("replay", start, 3))
        state, batch = queue.pop(state)
        out[f"queue pop {i}"] = digest(batch)
    rollout = jaxbuf.make_rollout_buffer(5, NUM_ENVS, discount=0.9, gae_lambda=0.8)
    ids = np.arange(5 * NUM_ENVS).reshape(5, NUM_ENVS)
    step = steps(ids)
    rows = {"obs": step["obs"]["x"], "reward": step["reward"], "value": ids / 7.0,
            "final_value": ids / 5.0, "terminated": ids % 4 == 3,
            "truncated": ids % 6 == 5}  # fmt: skip
    rows = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32) if x.dtype == np.float64 else x,
                        rows)  # fmt: skip
    state = rollout.init(jax.tree.map(lambda x: x[0, 0], rows))
    for t in range(5):
        state = rollout.add(state, jax.tree.map(lambda x, t=t: x[t], rows))
    state = rollout.finish(state, jnp.arange(NUM_ENVS, dtype=jnp.float32))
    out["rollout minibatches"] = digest(rollout.minibatches(state, jax.random.key(5), 2))
    return out


def case_id(case) -> str:
    return "-".join(case)


@pytest.fixture(scope="module")
def recorded():
    """The recorded digests; when recording, a dict the cases fill, written at the end."""
    if not RECORDING:
        yield json.loads(RECORDED.read_text())
        return
    found: dict = {}
    yield found
    RECORDED.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_draws_are_the_recorded_ones(case, recorded):
    found = draws(*case)
    if RECORDING:
        recorded[case_id(case)] = found
    assert found == recorded[case_id(case)], case


def test_queue_pops_and_rollout_minibatches_are_the_recorded_ones(recorded):
    found = queue_and_rollout()
    if RECORDING:
        recorded["queue and rollout"] = found
    assert found == recorded["queue and rollout"]


def test_every_case_is_recorded(recorded):
    assert sorted(recorded) == sorted([*map(case_id, CASES), "queue and rollout"])
