"""jaxbuf.ray: actor processes feeding a learner's buffer through Ray.

The ledger against a plain reference on random sequences of sends, resends, restarts and
restores; then one local Ray cluster for the file: actors killed at random moments while
the learner writes and samples under a rate limiter (every acknowledged block in the
buffer exactly once, the limiter's bounds at every moment, at most `window` blocks in
flight per writer), a checkpoint restored under running actors, parameters published.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuf.ray.ledger import Ledger

ray = pytest.importorskip("ray")

import jaxbuf  # noqa: E402
from jaxbuf.ray.ingest import Ingest  # noqa: E402
from jaxbuf.ray.writer import PARAMS_CHECK, Writer  # noqa: E402

TESTS = pathlib.Path(__file__).parent
# Ray starts its processes with subprocess's preexec_fn, which runs fork handlers: JAX's
# warns that a fork after its backend started may deadlock; the child runs exec at once.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


# --- the ledger, without Ray ----------------------------------------------------------


def _arrivals(rng: random.Random, writers: int, events: int) -> list[tuple[str, int, int]]:
    """Blocks as they reach a learner: each writer's numbers in order but some overtaken
    (delayed, as an async inbox may), some sent twice, some restarts (a new incarnation;
    the old one's late blocks may still come)."""
    incarnation = {w: 1 for w in range(writers)}
    sent = {w: 0 for w in range(writers)}
    late: list[tuple[str, int, int]] = []
    arrivals = []
    for _ in range(events):
        w = rng.randrange(writers)
        roll = rng.random()
        if roll < 0.08:  # restart: a block of the old incarnation may arrive later
            late.append((f"w{w}", incarnation[w], sent[w]))
            incarnation[w] += 1
            sent[w] = 0
        elif roll < 0.2 and sent[w]:  # a block sent again
            arrivals.append((f"w{w}", incarnation[w], rng.randrange(sent[w])))
        elif roll < 0.25 and late:
            arrivals.append(late.pop(rng.randrange(len(late))))
        elif roll < 0.35:  # overtaken: arrives after a later one of the same incarnation
            late.append((f"w{w}", incarnation[w], sent[w]))
            sent[w] += 1
        else:
            arrivals.append((f"w{w}", incarnation[w], sent[w]))
            sent[w] += 1
    return arrivals


@pytest.mark.parametrize("seed", range(6))
def test_the_ledger_writes_each_block_once_and_only_the_newest_incarnation(seed):
    rng = random.Random(seed)
    ledger, written, newest = Ledger(), [], {}
    for name, incarnation, sequence in _arrivals(rng, writers=3, events=400):
        decision = ledger.decide(name, incarnation, sequence)
        # the reference: new if never written and not older than the newest written
        fresh = (name, incarnation, sequence) not in written
        expected = (
            "stale" if incarnation < newest.get(name, 0) else ("write" if fresh else "duplicate")
        )
        assert decision == expected, (name, incarnation, sequence)
        if decision == "write":
            ledger.written(name, incarnation, sequence, steps=2)
            written.append((name, incarnation, sequence))
            newest[name] = incarnation
        if rng.random() < 0.05:  # a checkpoint read back
            ledger = Ledger.from_json(ledger.to_json())
    assert len(set(written)) == len(written)
    for name, entry in ledger.entries.items():
        assert (
            entry.blocks == sum(w[0] == name for w in written) and entry.steps == 2 * entry.blocks
        )
    assert ledger.duplicates + ledger.stale + len(written) == len(
        _arrivals(random.Random(seed), 3, 400)
    )


def test_a_writers_floor_closes_the_gap_a_restore_leaves_and_nothing_below_is_written():
    ledger = Ledger()
    for sequence in range(6):
        ledger.written("a", 1, sequence, steps=1)
    saved = ledger.to_json()
    ledger.written("a", 1, 6, steps=1)
    ledger = Ledger.from_json(saved)  # back to a checkpoint: block 6 left the buffer
    assert ledger.decide("a", 1, 8, floor=6) == "write"  # 6 was acknowledged: never again
    ledger.written("a", 1, 8, steps=1)
    assert ledger.acknowledged() == {"a": (1, 6)} and ledger.entries["a"].above == [8]
    assert ledger.decide("a", 1, 4, floor=6) == "duplicate"
    assert ledger.decide("a", 1, 7, floor=6) == "write"  # sent again after the restore
    ledger.written("a", 1, 7, steps=1)
    assert ledger.acknowledged() == {"a": (1, 8)} and ledger.entries["a"].above == []
    assert Ledger.from_json(ledger.to_json()) == ledger


def test_a_ledger_that_is_not_one_names_the_cause():
    with pytest.raises(ValueError, match=r"not a writer ledger.*entries"):
        Ledger.from_json({"duplicates": 0})
    with pytest.raises(ValueError, match="not a writer ledger"):
        Ledger.from_json({"entries": {"a": {"incarnation": "x"}}, "duplicates": 0, "stale": 0})


def test_checkpoint_extra_must_be_json_and_comes_back(tmp_path):
    buffer = jaxbuf.make_replay_buffer(4, 2)
    state = buffer.init({"x": jnp.float32(0)})
    with pytest.raises(TypeError, match="extra must be JSON-ready"):
        jaxbuf.save(tmp_path / "c", state, extra={"bad": object()})
    with pytest.raises(TypeError, match="extra must be a dict"):
        jaxbuf.save(tmp_path / "c", state, extra=[1])
    assert not (tmp_path / "c" / "metadata.json").exists()
    jaxbuf.save(tmp_path / "c", state, extra={"ledger": {"a": [1, 2]}})
    assert jaxbuf.io.load_metadata(tmp_path / "c")["extra"] == {"ledger": {"a": [1, 2]}}


def test_writer_arguments_are_checked_before_connecting():
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        Writer("nowhere", "a", block_size=0)
    with pytest.raises(ValueError, match=r"window must be a positive int, got 1\.5"):
        Writer("nowhere", "a", block_size=4, window=1.5)
    with pytest.raises(ValueError, match="answer_timeout must be a positive number of seconds"):
        Writer("nowhere", "a", block_size=4, answer_timeout=0)


def test_the_writer_walks_steps_as_jax_does_without_importing_it():
    import collections

    from flax import struct

    from jaxbuf.ray import writer

    Pair = collections.namedtuple("Pair", "a b")

    @struct.dataclass
    class Record:
        x: np.ndarray

    steps = [{"b": np.zeros(3), "a": (1, [2.0, np.int32(3)]), "n": None, "p": Pair(np.ones(2), 5)},
             [np.float32(1), {"z": np.arange(2)}], 3.0, {"r": Record(np.ones(2))},
             collections.OrderedDict(y=np.ones(1), x=np.zeros(1))]  # fmt: skip
    for step in steps:
        leaves, structure = writer._flatten(step)
        reference, treedef = jax.tree_util.tree_flatten(step)
        assert [leaf.tolist() for leaf in leaves] == [np.asarray(r).tolist() for r in reference]
        assert jax.tree_util.tree_structure(writer._unflatten(structure, leaves)) == treedef
    # plain containers are walked by the writer; a flax record and an OrderedDict by JAX
    assert [writer._flatten(step)[1].kind for step in steps] == [
        "dict",
        "list",
        "leaf",
        "jax",
        "jax",
    ]
    code = "import sys, jaxbuf.ray; jaxbuf.ray.Writer; assert 'jax' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_ingest_arguments_are_checked_before_the_inbox_starts():
    buffer = jaxbuf.make_replay_buffer(8, 2)
    state = buffer.init({"x": jnp.float32(0)})
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        Ingest(buffer, state, capacity=0)
    with pytest.raises(ValueError, match="blocks_per_poll must be a positive int, got True"):
        Ingest(buffer, state, blocks_per_poll=True)


# --- one local Ray cluster for the rest -------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    path = os.pathsep.join([str(TESTS / "workers"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, namespace=f"test-{uuid.uuid4().hex[:8]}",
             runtime_env={"env_vars": {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}},
             logging_level="ERROR", log_to_driver=False)  # fmt: skip
    yield ray.remote(num_cpus=0, max_restarts=-1)(_producer_class())
    ray.shutdown()


def _producer_class():
    """The actor class, imported by name (the workers find it on their PYTHONPATH)."""
    import sys

    sys.path.insert(0, str(TESTS / "workers"))
    from ray_producer import Producer

    return Producer


KILLS = 3  # in CI; benchmarks/distributed/soak.py kills 20 times
EXAMPLE = {"ids": jnp.zeros(4, jnp.int32), "obs": jnp.zeros(3, jnp.float32)}


def _limited_ingest(name: str, capacity: int = 8):
    buffer = jaxbuf.make_replay_buffer(20_000, 16)
    limiter = jaxbuf.sample_to_insert_ratio(2.0, min_size_to_sample=32, error_buffer=64.0)
    return Ingest(buffer, buffer.init(EXAMPLE), inbox=name, capacity=capacity, limiter=limiter)


def _alive(actor):
    """The actor, once it answers (a killed one restarts: its calls fail until then)."""
    for _ in range(300):
        try:
            ray.get(actor.__ray_ready__.remote())
            return actor
        except ray.exceptions.ActorUnavailableError:
            time.sleep(0.1)
    raise AssertionError("a killed actor did not restart in 30 s")


def _kill(actor) -> None:
    """Kills the actor's process and waits until its restart has connected (a kill is
    asynchronous: a call sent before the old process died would be lost with it)."""
    before = ray.get(_alive(actor).incarnation.remote())
    ray.kill(actor, no_restart=False)
    for _ in range(300):
        try:
            if ray.get(actor.incarnation.remote()) != before:
                return
        except ray.exceptions.RayActorError:  # restarting (unavailable) or not yet dead
            pass
        time.sleep(0.1)
    raise AssertionError("a killed actor did not restart in 30 s")


def _within_bounds(ingest) -> bool:
    """Reverb's invariant: diff <= max_diff once filling is over, diff >= min_diff once
    anything was sampled (diff = inserts * spi - samples)."""
    counts = {k: int(v) for k, v in ingest.limiter_state.counts().items()}
    config = ingest.limiter.config
    diff = counts["inserts"] * config["samples_per_insert"] - counts["samples"]
    filling = counts["inserts"] <= config["min_size_to_sample"]
    return (filling or diff <= config["max_diff"]) and (
        counts["samples"] == 0 or diff >= config["min_diff"]
    )


def stop_writing(ingest, actors, key) -> list[dict]:
    """Stops the actors (each waits for its blocks in flight) while the learner writes and
    samples within the limiter's bounds; their final counts."""
    stopping = [_alive(actor).stop.remote() for actor in actors]
    while ray.wait(stopping, num_returns=len(stopping), timeout=0)[1]:
        ingest.poll(timeout=0.1)
        if ingest.pending and ingest.can_sample():
            ingest.sample(key)
        assert _within_bounds(ingest)
    return ray.get(stopping)


def _held(ingest) -> dict[tuple, int]:
    """(actor, incarnation, block, step) -> how many times the buffer holds it."""
    size = int(ingest.state.size)
    ids = np.asarray(ingest.state.experience["ids"])[:size]
    keys, counts = np.unique(ids, axis=0, return_counts=True)
    return {tuple(int(v) for v in k): int(c) for k, c in zip(keys, counts, strict=True)}


def _acknowledged(log: pathlib.Path) -> dict[int, int]:
    """incarnation -> the last block the writer was told is written."""
    told: dict[int, int] = {}
    for line in log.read_text().split("\n") if log.exists() else []:
        if line:
            incarnation, last = map(int, line.split())
            told[incarnation] = max(told.get(incarnation, -1), last)
    return told


def _check_exactly_once(ingest, logs, block_size):
    held = _held(ingest)
    assert max(held.values()) == 1, "a step written twice"
    for index, log in enumerate(logs):
        for incarnation, last in _acknowledged(log).items():
            for block in range(last + 1):
                for step in range(block_size):
                    assert held.get((index, incarnation, block, step)) == 1, (
                        index,
                        incarnation,
                        block,
                    )
        entry = ingest.ledger.entries[f"actor-{index}"]
        assert entry.steps == sum(c for k, c in held.items() if k[0] == index)


def test_killed_actors_lose_and_repeat_nothing_and_the_limiter_holds(cluster, tmp_path):
    rng = random.Random(0)
    ingest = _limited_ingest("kills")
    block_size, window = 8, 3
    logs = [tmp_path / f"actor{i}.log" for i in range(2)]
    actors = [cluster.remote("kills", i, str(logs[i]), block_size, window, 0.001,
                             ray.get_runtime_context().namespace) for i in range(2)]  # fmt: skip
    key, kills, updates = jax.random.key(0), 0, 0
    while kills < KILLS or updates < 100:
        if not ingest.wait_until_can_sample(timeout=30):
            pytest.fail(f"no sample possible after 30 s: {ingest.stats()}")
        key, draw = jax.random.split(key)
        ingest.sample(draw)
        updates += 1
        assert _within_bounds(ingest), ingest.limiter_state.counts()
        if kills < KILLS and rng.random() < 0.05:
            _kill(actors[rng.randrange(2)])
            kills += 1
    finals = stop_writing(ingest, actors, key)
    _check_exactly_once(ingest, logs, block_size)
    assert all(f["max_in_flight"] <= window and f["in_flight"] == 0 for f in finals), finals
    stats = ingest.stats()
    assert stats["inbox"]["queued"] == 0 and stats["duplicates"] == 0
    assert sum(stats["inbox"]["incarnations"].values()) == 2 + KILLS, (
        stats
    )  # each restart connected
    assert all(_acknowledged(log) for log in logs)
    ingest.close()


def test_a_restored_checkpoint_under_running_actors_writes_nothing_twice_and_params_arrive(
    cluster, tmp_path
):
    ingest = _limited_ingest("restore", capacity=4)
    logs = [tmp_path / f"actor{i}.log" for i in range(2)]
    namespace = ray.get_runtime_context().namespace
    actors = [cluster.remote("restore", i, str(logs[i]), 4, 2, 0.0, namespace) for i in range(2)]
    assert ray.get([a.params.remote() for a in actors]) == [(0, None, False)] * 2
    for version in (1, 2):  # each put once into the object store
        assert ingest.publish({"w": jnp.full(3, float(version))}) == version
    for _ in range(60):  # the newest version reaches each writer within PARAMS_CHECK seconds
        got = ray.get([a.params.remote() for a in actors])
        if all(version == 2 for version, _, _ in got):
            break
        time.sleep(0.1)
    for got_version, params, jax_started in got:
        assert got_version == 2 and np.array_equal(params["w"], np.full(3, 2.0, np.float32))
        assert isinstance(params["w"], np.ndarray) and not jax_started  # NumPy, no JAX backend
    key = jax.random.key(1)
    for round_ in range(3):
        for _ in range(20):
            assert ingest.wait_until_can_sample(timeout=30), ingest.stats()
            ingest.sample(key)
        if round_ == 0:
            ingest.save(tmp_path / "ckpt")
            saved = {name: e.steps for name, e in ingest.ledger.entries.items()}
        if round_ == 1:  # back to the checkpoint: the blocks written since are gone
            ingest.restore(tmp_path / "ckpt")
            assert {name: e.steps for name, e in ingest.ledger.entries.items()} == saved
            for log in logs:
                log.unlink()  # what writers were told before the restore no longer holds
    stopping = [actor.stop.remote() for actor in actors]
    while ray.wait(stopping, num_returns=2, timeout=0)[1]:
        ingest.poll(timeout=0.1)
        if ingest.pending and ingest.can_sample():
            ingest.sample(key)
    ray.get(stopping)
    held = _held(ingest)
    assert max(held.values()) == 1
    for index in range(2):
        assert ingest.ledger.entries[f"actor-{index}"].steps == sum(
            c for k, c in held.items() if k[0] == index
        )
    assert _within_bounds(ingest)
    jaxbuf.save(tmp_path / "plain", {"buffer": ingest.state, "limiter": ingest.limiter_state})
    with pytest.raises(ValueError, match="holds no writer ledger"):
        ingest.restore(tmp_path / "plain")
    ingest.close()


def test_initial_priorities_need_a_prioritized_ring_and_land_on_the_rows_written(cluster):
    plain = jaxbuf.make_replay_buffer(8, 2)
    ingest = Ingest(plain, plain.init(EXAMPLE), inbox="plain-priorities")
    writer = Writer(
        "plain-priorities", "w", block_size=2, namespace=ray.get_runtime_context().namespace
    )
    for i in range(2):
        writer.append(
            {"ids": np.full(4, i, np.int32), "obs": np.zeros(3, np.float32)}, priority=1.0
        )
    with pytest.raises(TypeError, match="initial priorities need a prioritized replay buffer"):
        ingest.poll(timeout=10)
    ingest.close()
    buffer = jaxbuf.make_replay_buffer(8, 2, sampler=jaxbuf.prioritized(priority_exponent=1.0))
    ingest = Ingest(buffer, buffer.init(EXAMPLE), inbox="priorities")
    writer = Writer("priorities", "w", block_size=3, namespace=ray.get_runtime_context().namespace)
    for i in range(9):  # three blocks: the third wraps the ring of 8
        writer.append(
            {"ids": np.full(4, i, np.int32), "obs": np.zeros(3, np.float32)}, priority=i + 1.0
        )
    writer.append({"ids": np.zeros(4, np.int32), "obs": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="a priority with every step of a block, or with none"):
        writer.append({"ids": np.zeros(4, np.int32), "obs": np.zeros(3, np.float32)}, priority=1.0)
    while ingest.ledger.entries.get("w") is None or ingest.ledger.entries["w"].blocks < 3:
        ingest.poll(timeout=10)
    ids = np.asarray(ingest.state.experience["ids"])[:, 0]
    probabilities = _drawn_frequencies(buffer, ingest.state)
    assert np.allclose(probabilities, (ids + 1.0) / (ids + 1.0).sum(), atol=0.02), (
        ids,
        probabilities,
    )
    ingest.close()


def test_new_parameters_ride_the_answers_to_a_writers_blocks(cluster):
    buffer = jaxbuf.make_replay_buffer(64, 2)
    ingest = Ingest(buffer, buffer.init(EXAMPLE), inbox="riding")
    writer = Writer("riding", "w", block_size=2, namespace=ray.get_runtime_context().namespace)
    step = {"ids": np.zeros(4, np.int32), "obs": np.zeros(3, np.float32)}
    for version in (1, 2):
        assert ingest.publish({"w": jnp.full(3, float(version))}) == version
        ray.get(ingest.inbox.stats.remote())  # the publish has arrived (one event loop)
        writer.append(step), writer.append(step)  # a block: its answer brings the reference
        while not writer.wait(timeout=0.1):
            ingest.poll(timeout=1)
        assert writer.params_version == version - 1
        assert np.array_equal(writer.params()["w"], np.full(3, float(version), np.float32))
        assert writer.params_version == version
    assert "params" not in ingest.stats()["inbox"]["calls"]  # never asked: answers brought both
    writer._heard_at -= 2 * PARAMS_CHECK  # quiet for longer than PARAMS_CHECK: it asks
    assert writer.params()["w"][0] == 2.0 and ingest.stats()["inbox"]["calls"]["params"] == 1
    ingest.close()


def _drawn_frequencies(buffer, state, draws: int = 40_000):
    sample = jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0)))
    rows = np.asarray(
        sample(state, jax.random.split(jax.random.key(3), draws // 2)).indices
    ).ravel()
    return np.bincount(rows, minlength=8) / rows.size


# --- the Ape-X example's actor side, without Ray ------------------------------------------


def test_apex_actors_n_step_transitions_match_a_reference_over_ends_of_both_kinds():
    apex = pytest.importorskip("jaxbuf.examples.apex_actor")
    rng = np.random.default_rng(0)
    n, gamma = 3, 0.9
    nstep, got, episode = apex.NStep(n, gamma), [], []
    for t in range(300):
        terminated, truncated = bool(rng.random() < 0.05), bool(rng.random() < 0.05)
        step = (np.float32(t), t % 2, float(rng.normal()), np.float32(t + 1), terminated, truncated)
        got += nstep.step(*step)
        episode.append(step)
        if terminated or truncated:
            for k, (obs, action, *_rest) in enumerate(episode):  # the reference, per start
                window = episode[k : k + n]
                ended = k + n >= len(episode)
                total = sum(gamma**i * s[2] for i, s in enumerate(window))
                discount = 0.0 if ended and terminated else gamma ** len(window)
                want = got[len(got) - len(episode) + k]
                assert (want["obs"], want["action"], want["next_obs"]) == (
                    obs,
                    action,
                    window[-1][3],
                )
                assert np.isclose(want["reward"], total) and np.isclose(want["discount"], discount)
            episode = []


def test_apex_actors_numpy_network_equals_the_learners():
    apex = pytest.importorskip("jaxbuf.examples.apex_actor")
    network = pytest.importorskip("jaxbuf.examples.dqn_cartpole").QNetwork(2, (16, 8))
    params = network.init(jax.random.key(0), jnp.zeros(4))
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(apex.q_values(jax.device_get(params), obs),
                               network.apply(params, obs), rtol=1e-5, atol=1e-6)  # fmt: skip


def test_a_learner_started_again_from_its_checkpoint_is_found_by_its_writers(cluster, tmp_path):
    namespace = ray.get_runtime_context().namespace
    buffer = jaxbuf.make_replay_buffer(64, 2)
    first = Ingest(buffer, buffer.init(EXAMPLE), inbox="again")
    writer = Writer("again", "w", block_size=2, window=8, namespace=namespace, answer_timeout=5.0)
    step = lambda i: {"ids": np.full(4, i, np.int32), "obs": np.zeros(3, np.float32)}  # noqa: E731
    for i in range(4):  # two blocks, written and acknowledged
        writer.append(step(i))
    while first.ledger.entries.get("w") is None or first.ledger.entries["w"].blocks < 2:
        first.poll(timeout=5)
    first.save(tmp_path / "ckpt")
    first.close()  # the learner's process ends, and its inbox with it
    second = None
    for _ in range(50):  # a new learner, same inbox name, once the old name is free
        try:
            second = Ingest(buffer, buffer.init(EXAMPLE), inbox="again")
            break
        except ValueError:
            time.sleep(0.2)
    assert second is not None
    second.restore(tmp_path / "ckpt")
    for i in range(4, 10):  # three blocks offered to the dead inbox: the writer keeps them
        writer.append(step(i))
    assert not writer.wait(timeout=1)  # finds the inbox gone, reconnects, offers them again
    for _ in range(20):
        if sum(e.steps for e in second.ledger.entries.values()) == 10:
            break
        second.poll(timeout=1)
    assert writer.wait(timeout=10) and writer.incarnation == 1
    held = _held(second)
    assert sorted(k[0] for k in held) == list(range(10)) and max(held.values()) == 1
    second.close()
