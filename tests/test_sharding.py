"""Sharded buffers: 4 simulated devices, and two processes joined by jax.distributed.

The checks live in `workers/sharding.py`, run here in fresh processes because the
number of CPU devices is fixed when JAX starts.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import jaxbuf

WORKER = pathlib.Path(__file__).parent / "workers" / "sharding.py"
TIMEOUT = 240


def run_worker(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


# "contents" and "hlo" run every other buffer kind in each of two processes (each was one)
@pytest.mark.parametrize(
    "case", ["contents 0", "contents 1", "inside", "hlo 0", "hlo 1", "errors", "host"]
)
def test_on_four_simulated_devices(case):
    assert f"ok {case.split()[0]}" in run_worker(*case.split())


def test_orbax_checkpoint_restores_onto_the_same_mesh(tmp_path):
    assert "ok checkpoint" in run_worker("checkpoint", str(tmp_path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_add_sample_and_checkpoint(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    port = str(free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "process", str(i), port, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=TIMEOUT)[0] for p in processes]
    finally:
        for p in processes:  # bounded: never leave a process behind
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, output) in enumerate(zip(processes, outputs, strict=True)):
        assert p.returncode == 0 and f"ok process {i}" in output, output[-6000:]


def test_one_device_mesh_matches_the_plain_buffer():
    mesh = jax.make_mesh((1,), ("data",))
    buffer = jaxbuf.make_replay_buffer(10, 4)
    sharded = jaxbuf.shard(buffer, mesh)
    items = {"obs": jnp.arange(7, dtype=jnp.float32)}
    state = jax.jit(sharded.add, donate_argnums=0)(sharded.init({"obs": jnp.float32(0)}), items)
    plain = buffer.add(buffer.init({"obs": jnp.float32(0)}), items)
    key = jax.random.key(3)
    got = jax.jit(sharded.sample)(state, key)
    want = buffer.sample(plain, jax.random.fold_in(key, 0))
    assert got.experience["obs"].tolist() == want.experience["obs"].tolist()
    assert type(sharded) is type(buffer) and sharded.config == buffer.config


def test_per_shard_refuses_what_is_not_a_buffer():
    with pytest.raises(TypeError, match="take a buffer made by a jaxbuf factory"):
        jaxbuf.per_shard({"add": None})
