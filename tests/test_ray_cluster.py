"""jaxbuf.ray on a cluster of several nodes: Ray's own multi-node test cluster
(`ray.cluster_utils.Cluster`: a head and two worker nodes, each its own raylet and object
store) on this machine. The learner runs on the head node, which also holds its inbox; the
actors run on the worker nodes (placed by a resource only they offer, spread over them) and
join by the inbox's name and namespace, as a user's processes do. Worker nodes are removed
while the learner samples: every actor there dies with its blocks in flight and restarts on
another node; a checkpoint is restored under actors of other nodes; parameters published
once reach actors on every node.
"""

from __future__ import annotations

import os
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from test_ray import (  # noqa: E402
    EXAMPLE,
    TESTS,
    _acknowledged,
    _alive,
    _check_exactly_once,
    _held,
    _producer_class,
    _within_bounds,
    stop_writing,
)

import jaxbuf  # noqa: E402
from jaxbuf.ray.ingest import Ingest  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
STORE = 80 * 2**20  # each node's object store, bytes
REMOVALS = 10  # worker nodes removed (and replaced) in one run


def _worker(cluster):
    """A worker node offering two actor slots."""
    return cluster.add_node(num_cpus=1, resources={"actor_slot": 2}, object_store_memory=STORE)


@pytest.fixture(scope="module")
def nodes():
    """A head node (the learner) and two worker nodes (the actors)."""
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False})  # fmt: skip
    workers = [_worker(cluster) for _ in range(2)]
    cluster.wait_for_nodes()
    path = os.pathsep.join([str(TESTS / "workers"), os.environ.get("PYTHONPATH", "")])
    ray.init(address=cluster.address, namespace=f"cluster-{uuid.uuid4().hex[:8]}",
             runtime_env={"env_vars": {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}},
             logging_level="ERROR", log_to_driver=False)  # fmt: skip
    actor = ray.remote(num_cpus=0, max_restarts=-1, resources={"actor_slot": 1},
                       scheduling_strategy="SPREAD")(_producer_class())  # fmt: skip
    yield cluster, workers, actor
    ray.shutdown()
    cluster.shutdown()


def _ingest(name: str, capacity: int = 8) -> Ingest:
    buffer = jaxbuf.make_replay_buffer(40_000, 16)
    limiter = jaxbuf.sample_to_insert_ratio(2.0, min_size_to_sample=32, error_buffer=64.0)
    return Ingest(buffer, buffer.init(EXAMPLE), inbox=name, capacity=capacity, limiter=limiter,
                  namespace=ray.get_runtime_context().namespace)  # fmt: skip


def _sample(ingest, key, count: int):
    for _ in range(count):
        assert ingest.wait_until_can_sample(timeout=60), ingest.stats()
        key, draw = jax.random.split(key)
        ingest.sample(draw)
        assert _within_bounds(ingest), ingest.limiter_state.counts()
    return key


def _stop(ingest, actors, key):
    """Stops the actors (`stop_writing`), then ends them; their final counts."""
    finals = stop_writing(ingest, actors, key)
    for actor in actors:  # frees their slots for the next test (a kill is asynchronous)
        ray.kill(actor, no_restart=True)
    for _ in range(300):
        if ray.available_resources().get("actor_slot", 0) >= 4:
            break
        time.sleep(0.1)
    return finals


def test_worker_nodes_removed_lose_and_repeat_nothing(nodes, tmp_path):
    cluster, workers, actor_class = nodes
    ingest = _ingest("nodes")
    namespace = ray.get_runtime_context().namespace
    logs = [tmp_path / f"actor{i}.log" for i in range(2)]
    actors = [actor_class.remote("nodes", i, str(logs[i]), 8, 3, 0.001, namespace)
              for i in range(2)]  # fmt: skip
    head = ray.get_runtime_context().get_node_id()
    seen = {ray.get(a.node.remote()) for a in actors}
    assert head not in seen and len(seen) == 2  # one actor on each worker node
    key = _sample(ingest, jax.random.key(0), 50)
    moved = 0
    for removal in range(REMOVALS):
        node = ray.get(_alive(actors[removal % 2]).node.remote())
        victim = next(w for w in workers if w.node_id == node)
        cluster.remove_node(victim)  # every actor there dies at once, blocks in flight too
        workers = [w for w in workers if w is not victim] + [_worker(cluster)]
        key = _sample(ingest, key, 20)
        after = ray.get(_alive(actors[removal % 2]).node.remote())
        moved += after != node
    assert moved == REMOVALS  # each restarted on another node
    finals = _stop(ingest, actors, key)
    _check_exactly_once(ingest, logs, 8)
    assert all(f["in_flight"] == 0 for f in finals), finals
    stats = ingest.stats()
    assert stats["duplicates"] == 0 and stats["inbox"]["queued"] == 0
    assert sum(stats["inbox"]["incarnations"].values()) >= 2 + REMOVALS
    ingest.close()


def test_a_checkpoint_restored_under_actors_of_other_nodes_and_params_reach_every_node(
    nodes, tmp_path
):
    _, _, actor_class = nodes
    ingest = _ingest("nodes-restore", capacity=4)
    namespace = ray.get_runtime_context().namespace
    logs = [tmp_path / f"actor{i}.log" for i in range(2)]
    actors = [actor_class.remote("nodes-restore", i, str(logs[i]), 4, 2, 0.0, namespace)
              for i in range(2)]  # fmt: skip
    assert len({ray.get(a.node.remote()) for a in actors}) == 2
    assert ingest.publish({"w": jnp.full(3, 7.0)}) == 1  # put once into the object store
    for _ in range(300):  # within seconds; a loaded machine may take longer
        got = ray.get([a.params.remote() for a in actors])
        if all(version == 1 for version, _, _ in got):
            break
        time.sleep(0.1)
    assert all(v == 1 and np.array_equal(p["w"], np.full(3, 7.0)) for v, p, _ in got), got
    key = _sample(ingest, jax.random.key(1), 20)
    ingest.save(tmp_path / "ckpt")
    saved = {name: e.steps for name, e in ingest.ledger.entries.items()}
    key = _sample(ingest, key, 20)
    ingest.restore(tmp_path / "ckpt")
    assert {name: e.steps for name, e in ingest.ledger.entries.items()} == saved
    for log in logs:
        log.unlink(missing_ok=True)  # what writers were told before the restore no longer holds
    key = _sample(ingest, key, 20)
    _stop(ingest, actors, key)
    held = _held(ingest)
    assert max(held.values()) == 1
    for index in range(2):
        assert ingest.ledger.entries[f"actor-{index}"].steps == sum(
            c for k, c in held.items() if k[0] == index)  # fmt: skip
    assert all(_acknowledged(log) for log in logs)
    ingest.close()
