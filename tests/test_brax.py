"""jaxbuf.brax: Brax's replay-buffer interface, observations stored once, against a model of
Brax's UniformSamplingQueue; Brax's own SAC trained with it where Brax runs."""

import multiprocessing
import sys
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf.brax


class Transition(NamedTuple):  # brax.training.types.Transition
    observation: jax.Array
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    next_observation: jax.Array
    extras: dict = ()


DUMMY = Transition(jnp.zeros(3), jnp.zeros(2), 0.0, 0.0, jnp.zeros(3),
                   {"state_extras": {"truncation": 0.0}, "policy_extras": {}})  # fmt: skip


def brax_steps(rng, num_envs, count, episode=5):
    """`count` actor steps of `num_envs` environments as Brax's auto-reset gives them:
    next_observation[t] is observation[t + 1], the reset observation after an end."""
    obs = rng.normal(size=(num_envs, 3)).astype(np.float32)
    steps = []
    for t in range(count):
        done = ((t + np.arange(num_envs)) % episode == episode - 1).astype(np.float32)
        after = rng.normal(size=(num_envs, 3)).astype(np.float32)
        steps.append(Transition(obs, rng.normal(size=(num_envs, 2)).astype(np.float32),
                                rng.normal(size=num_envs).astype(np.float32), 1 - done, after,
                                {"state_extras": {"truncation": done * (t % 2)},
                                 "policy_extras": {}}))  # fmt: skip
        obs = after
    return steps


def test_every_sample_is_a_stored_transition_with_its_own_next_observation():
    """Many wrap-arounds: every sampled transition equals one Brax inserted among the newest
    `capacity` per environment, next_observation included, and the newest are drawn too."""
    replay = jaxbuf.brax.BraxReplay(4 * 7, DUMMY, 64, num_envs=4)
    insert, sample = jax.jit(replay.insert), jax.jit(replay.sample)
    state = replay.init(jax.random.key(0))
    steps = brax_steps(np.random.default_rng(0), 4, 40)
    newest_drawn = 0
    for t, step in enumerate(steps):
        state = insert(state, step)
        kept = steps[max(0, t - 6) : t + 1]
        assert int(replay.size(state)) == 4 * len(kept)
        state, batch = sample(state)
        batch = jax.device_get(batch)  # rows read in NumPy
        stored = [(x, e) for x in kept for e in range(4)]
        table = {tuple(x.observation[e]): i for i, (x, e) in enumerate(stored)}
        drawn = [stored[table[tuple(observation)]] for observation in batch.observation]
        rows = [jax.tree.map(lambda leaf, e=e: np.asarray(leaf[e]), x) for x, e in drawn]
        chex.assert_trees_all_close(batch, jax.tree.map(lambda *r: np.stack(r), *rows))
        newest_drawn += sum(x is step for x, _ in drawn)
    assert newest_drawn > 100
    assert int(state.mismatched) == 0
    assert replay.bytes_per_transition() == 4 * (3 + 2 + 1 + 1 + 1)  # no next_observation


def test_draws_are_uniform_over_the_stored_transitions():
    from scipy import stats

    replay = jaxbuf.brax.BraxReplay(4 * 5, DUMMY, 4096, num_envs=4)
    state = replay.init(jax.random.key(1))
    for step in brax_steps(np.random.default_rng(1), 4, 8):
        state = replay.insert(state, step)
    _, batch = replay.sample(state)
    counts = np.unique(np.asarray(batch.observation[:, 0]), return_counts=True)[1]
    assert len(counts) == 20 and stats.chisquare(counts).pvalue > 1e-3


def test_a_next_observation_other_than_the_next_step_is_counted():
    replay = jaxbuf.brax.BraxReplay(20, DUMMY, 8, num_envs=2)
    state = replay.init(jax.random.key(0))
    steps = brax_steps(np.random.default_rng(2), 2, 3)
    state = replay.insert(state, steps[0]._replace(next_observation=steps[0].observation))
    state = replay.insert(state, steps[1])
    assert int(state.mismatched) == 2


def test_one_differing_element_of_next_observation_counts_its_step():
    replay = jaxbuf.brax.BraxReplay(20, DUMMY, 8, num_envs=2)
    state = replay.init(jax.random.key(0))
    steps = brax_steps(np.random.default_rng(2), 2, 3)
    changed = np.array(steps[0].next_observation)
    changed[1, 2] += 1.0  # environment 1, one element of three
    state = replay.insert(state, steps[0]._replace(next_observation=changed))
    state = replay.insert(state, steps[1])
    assert int(state.mismatched) == 1


@pytest.mark.parametrize("size, num_envs, per_env", [(10, 4, 3), (12, 4, 3), (13, 4, 4), (3, 4, 1)])
def test_rings_keep_at_least_max_replay_size_transitions(size, num_envs, per_env):
    """`ceil(size / num_envs)` steps per environment: never fewer than Brax's queue keeps."""
    replay = jaxbuf.brax.BraxReplay(size, DUMMY, 8, num_envs=num_envs)
    state = replay.init(jax.random.key(0))
    for step in brax_steps(np.random.default_rng(3), num_envs, 2 * per_env + 1):
        state = replay.insert(state, step)
    assert replay.capacity_per_env == per_env
    assert int(replay.size(state)) == num_envs * per_env >= size


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: jaxbuf.brax.BraxReplay(10, {"observation": 1}, 4, num_envs=2), TypeError,
         "dummy_data_sample must be a Brax Transition"),
        (lambda: jaxbuf.brax.BraxReplay(10, DUMMY._replace(next_observation=jnp.zeros(4)), 4,
                                        num_envs=2), ValueError, "next_observation must have"),
        (lambda: jaxbuf.brax.BraxReplay(10, DUMMY, 4, num_envs=0), ValueError, "num_envs"),
        (lambda: jaxbuf.brax.BraxReplay(10, DUMMY, 4, num_envs=2).insert(
            jaxbuf.brax.BraxReplay(10, DUMMY, 4, num_envs=2).init(jax.random.key(0)),
            brax_steps(np.random.default_rng(0), 3, 1)[0]), ValueError,
         r"samples\['action'\] has num_envs=3"),
        (lambda: jaxbuf.brax.BraxReplay(10, DUMMY, 4, num_envs=2).insert(
            jaxbuf.brax.BraxReplay(10, DUMMY, 4, num_envs=2).init(jax.random.key(0)),
            jax.tree.map(lambda x: x.astype(np.float16) if x.dtype == np.float32 else x,
                         brax_steps(np.random.default_rng(0), 2, 1)[0])), TypeError,
         r"samples\['action'\] has dtype float16; expected float32"),
    ],
)  # fmt: skip
def test_bad_configuration_and_samples_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_use_in_brax_replaces_brax_s_queue_and_restores_it():
    replay_buffers = pytest.importorskip("brax.training.replay_buffers")
    original = replay_buffers.UniformSamplingQueue
    with pytest.raises(RuntimeError), jaxbuf.brax.use_in_brax(num_envs=8):
        queue = replay_buffers.UniformSamplingQueue(max_replay_size=64, dummy_data_sample=DUMMY,
                                                    sample_batch_size=4)  # fmt: skip
        assert isinstance(queue, jaxbuf.brax.BraxReplay) and queue.capacity_per_env == 8
        raise RuntimeError("training failed")
    assert replay_buffers.UniformSamplingQueue is original


def train_sac(use_jaxbuf: bool, seed: int):
    """Evaluation rewards of Brax's SAC, and with jaxbuf what its report said at each
    `progress_fn` (`report=True`)."""
    from brax import envs
    from brax.training.agents.sac import train as sac

    env = envs.get_environment("inverted_pendulum", backend="positional")
    evals, reports = [], []
    config = dict(
        environment=env,
        num_timesteps=16_000,
        episode_length=1000,
        num_envs=64,
        batch_size=256,
        grad_updates_per_step=8,
        max_replay_size=10_000,
        min_replay_size=2_048,
        num_evals=2,
        num_eval_envs=16,
        seed=seed,
        learning_rate=6e-4,
        discounting=0.97,
        progress_fn=lambda step, m: (evals.append(float(m["eval/episode_reward"])),
                                     reports.append(seen.metrics() if use_jaxbuf else {})),
    )  # fmt: skip
    # Brax's code relies on JAX's default promotions, which conftest.py makes strict
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        if use_jaxbuf:
            with jaxbuf.brax.use_in_brax(num_envs=64, report=True) as seen:
                sac.train(**config)
        else:
            sac.train(**config)
    return evals, reports


# Brax warns about itself (unmaintained pipelines, JAX's deprecations of what it calls)
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                            "ignore::FutureWarning")  # fmt: skip
def test_brax_sac_learns_with_jaxbuf_as_with_its_queue():
    """Brax's own SAC, 16k steps on inverted_pendulum (the queue fills at 10k and rolls
    after): from the untrained policy's return (the same for both), jaxbuf and Brax's
    queue both learn, each ending at least three times as high (seed 0: 129 and 149, from
    30), and within the spread the seeds give each."""
    pytest.importorskip("brax")
    if not hasattr(jax, "device_put_replicated"):
        pytest.skip("Brax 0.14 calls jax.device_put_replicated, gone in JAX 0.10")
    # the two runs at once, each in a fresh process (one per core): half the wall time
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        (ours, reports), (theirs, _) = pool.starmap(train_sac, [(True, 0), (False, 0)])
    # the report, read in progress_fn: nothing before training, then the queue's size
    # (10k, full: 10,048 at 157 per environment) and no mismatched step
    assert reports[0] == {} and reports[-1] == {"buffer/mismatched": 0, "buffer/size": 10_048}
    untrained = ours[0]
    assert theirs[0] == untrained < 50
    assert ours[-1] > 3 * untrained and theirs[-1] > 3 * untrained
    assert abs(ours[-1] - theirs[-1]) < 60


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ({"num_envs": 0}, ValueError, "num_envs"),
        ({"num_envs": 4, "storage_dtypes": {"next_observation": "bfloat16"}}, ValueError,
         r"names \['next_observation'\], which Brax's Transition does not store; .* name "
         "observation"),
        ({"num_envs": 4, "storage_dtypes": {"obs": "bfloat16"}}, ValueError,
         r"use_in_brax\(storage_dtypes=...\) names \['obs'\]"),
        ({"num_envs": 4, "storage_dtypes": {"observation": "int8"}}, ValueError,
         "must be 'bfloat16' or 'float16'"),
        ({"num_envs": 4, "report": "yes"}, TypeError, r"report=...\) must be True or False"),
    ],
)  # fmt: skip
def test_use_in_brax_checks_its_arguments_at_the_call(arguments, error, match):
    with pytest.raises(error, match=match):
        jaxbuf.brax._check_use(arguments["num_envs"], arguments.get("storage_dtypes"),
                               arguments.get("report", False))  # fmt: skip


def test_num_envs_not_divisible_by_the_devices_is_named_at_the_call(monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 4)
    with pytest.raises(ValueError, match=r"use_in_brax\(num_envs=6\): .* multiple of 4"):
        jaxbuf.brax._check_use(6, None, False)


def test_an_insert_of_other_num_envs_names_use_in_brax_and_the_value():
    """What `sac.train` inserts (64 environments) against what `use_in_brax` was told (32)."""
    report = jaxbuf.brax.BufferReport(enabled=False)
    replay = jaxbuf.brax.BraxReplay(64, DUMMY, 8, num_envs=32, report=report)
    state = replay.init(jax.random.key(0))
    step = brax_steps(np.random.default_rng(0), 64, 1)[0]
    with pytest.raises(
        ValueError,
        match=r"use_in_brax\(num_envs=32\): but sac.train inserts "
        r"64 environments per device \(1 device\(s\)\), num_envs=64 in all",
    ):
        replay.insert(state, step)


def test_a_storage_dtype_brax_s_leaf_cannot_take_names_use_in_brax():
    """Known only when `sac.train` builds the buffer: an integer leaf named."""
    counted = DUMMY._replace(action=jnp.zeros(2, jnp.int32))
    with pytest.raises(
        TypeError,
        match=r"use_in_brax\(storage_dtypes=\{'action': 'bfloat16'\}\)"
        r": storage_dtypes\['action'\]: .* is int32; only float32 leaves",
    ):
        jaxbuf.brax.BraxReplay(64, counted, 8, num_envs=2, storage_dtypes={"action": "bfloat16"},
                               report=jaxbuf.brax.BufferReport(enabled=False))  # fmt: skip


def test_the_report_counts_what_samples_send():
    """Through the compiled sample (a debug callback): a mismatched step, the size."""
    report = jaxbuf.brax.BufferReport(enabled=True)
    replay = jaxbuf.brax.BraxReplay(20, DUMMY, 8, num_envs=2, report=report)
    sample = jax.jit(replay.sample)
    state = replay.init(jax.random.key(0))
    assert report.metrics() == {} and report.mismatched is None
    steps = brax_steps(np.random.default_rng(2), 2, 3)
    state = replay.insert(state, steps[0]._replace(next_observation=steps[0].observation))
    state = replay.insert(state, steps[1])
    state, _ = jax.block_until_ready(sample(state))
    jax.effects_barrier()
    assert report.metrics() == {"buffer/mismatched": 2, "buffer/size": 4}
    assert report.samples == 1


def test_use_in_brax_without_brax_says_how_to_install_it(monkeypatch):
    for name in [m for m in sys.modules if m == "brax" or m.startswith("brax.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "brax", None)  # `import brax` raises, installed or not
    with pytest.raises(ImportError, match=r'pip install -e "\.\[brax\]"'):  # noqa: SIM117
        with jaxbuf.brax.use_in_brax(num_envs=4):
            pass


def test_bfloat16_observations_halve_their_bytes_and_come_back_as_float32():
    narrow = jaxbuf.brax.BraxReplay(4 * 7, DUMMY, 64, num_envs=4,
                                    storage_dtypes={"observation": "bfloat16"})  # fmt: skip
    plain = jaxbuf.brax.BraxReplay(4 * 7, DUMMY, 64, num_envs=4)
    state, reference = narrow.init(jax.random.key(0)), plain.init(jax.random.key(0))
    for step in brax_steps(np.random.default_rng(4), 4, 12):
        state = narrow.insert(state, step)
        as_bf16 = jax.tree.map(
            lambda x: np.asarray(x).astype(jnp.bfloat16).astype(np.float32),
            (step.observation, step.next_observation))  # fmt: skip
        rounded = step._replace(observation=as_bf16[0], next_observation=as_bf16[1])
        reference = plain.insert(reference, rounded)
    state, batch = narrow.sample(state)
    _, expected = plain.sample(reference)
    assert batch.observation.dtype == batch.next_observation.dtype == jnp.float32
    chex.assert_trees_all_equal(batch, expected)
    assert state.steps.experience["observation"].dtype == jnp.bfloat16
    assert narrow.bytes_per_transition() == plain.bytes_per_transition() - 3 * 2
    assert int(state.mismatched) == 0


def test_brax_s_pmap_wrapper_drives_it():
    """Brax's `PmapWrapper` (a buffer per device) calls init, insert_internal,
    sample_internal and size under pmap."""
    replay_buffers = pytest.importorskip("brax.training.replay_buffers")
    devices = jax.local_device_count()
    inner = jaxbuf.brax.BraxReplay(4 * 7, DUMMY, 16, num_envs=4 * devices)
    wrapped = replay_buffers.PmapWrapper(inner)
    state = wrapped.init(jax.random.key(0))
    for step in brax_steps(np.random.default_rng(5), 4 * devices, 3):
        state = wrapped.insert(state, step)
    state, batch = wrapped.sample(state)
    assert batch.observation.shape == (16 * devices, 3)
    assert int(wrapped.size(state)) == 3 * 4 * devices
