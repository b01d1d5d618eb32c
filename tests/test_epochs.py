"""The epochs sampler: every anchor exactly once per pass, checked against a model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf.core import permutation

ENVS, STRIDE, LENGTH, N, PERIOD, EPISODE = 2, 3 * 10**6, 3, 2, 2, 3  # STRIDE: whole episodes


def make(kind, capacity, batch):
    epochs = jaxbuf.epochs()
    if kind == "replay":
        return jaxbuf.make_replay_buffer(capacity, batch, sampler=epochs)
    if kind.startswith("trajectory"):
        period = PERIOD if kind == "trajectory, period" else 1
        return jaxbuf.make_trajectory_buffer(ENVS, capacity, batch, LENGTH, period=period,
                                             sampler=epochs)  # fmt: skip
    if kind == "episode":
        done = lambda step: step["id"] % EPISODE == 2  # noqa: E731
        return jaxbuf.make_episode_buffer(ENVS, capacity, batch, EPISODE, sampler=epochs,
                                          done_fn=done)  # fmt: skip
    return jaxbuf.make_transition_buffer(ENVS, capacity, batch, n_step=N, sampler=epochs)


def data(kind, first, count):
    """Items (or steps of every environment) with ids `first, first + 1, ...`."""
    if kind == "replay":
        return {"id": jnp.arange(first, first + count, dtype=jnp.int32)}
    ids = (first + jnp.arange(count, dtype=jnp.int32))[None] + STRIDE * jnp.arange(ENVS)[:, None]
    if kind != "transition":
        return {"id": ids}
    obs = ids.astype(jnp.float32)[..., None]
    no = jnp.zeros(ids.shape, bool)
    return jaxbuf.Transition(obs, ids, jnp.ones(ids.shape), no, no, obs)


def anchor_ids(kind, batch):
    """The id of each valid row's anchor (item, window start, transition start)."""
    if kind == "replay":
        ids = batch.experience["id"]
    elif kind != "transition":
        ids = batch.experience["id"][:, 0]
    else:
        ids = batch.experience.action
    return np.asarray(ids)[np.asarray(batch.valid)].tolist()


def drawable(kind, history, capacity):
    """The anchors a pass beginning now holds: ids per the kind's rule."""
    if kind == "replay":
        return set(history[-capacity:])
    stored = history[-capacity:]
    if kind == "episode":  # complete episodes, every step stored
        starts = [s for s in stored if s % EPISODE == 0 and s + EPISODE - 1 in stored]
    else:
        span = N + 1 if kind == "transition" else LENGTH
        starts = stored[: len(stored) - span + 1] if len(stored) >= span else []
        starts = [s for s in starts if kind != "trajectory, period" or s % PERIOD == 0]
    return {s + STRIDE * e for s in starts for e in range(ENVS)}


KINDS = ["replay", "trajectory", "trajectory, period", "transition", "episode"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_anchor_once_per_pass_with_adds_between(kind, platform_path):
    capacity, batch = (12 if kind == "trajectory, period" else 13), 4
    buffer = make(kind, capacity, batch)
    add, next_batch = jax.jit(buffer.add), jax.jit(buffer.next_batch)
    rng = np.random.default_rng(len(kind))
    history, next_id = [], 0  # ids of one environment (the others are offset)
    lead = (0,) * (1 if kind == "replay" else 2)
    state = buffer.init(jax.tree.map(lambda x: x[lead], data(kind, 0, 1)))
    passes, members, visited, gone = 0, set(), [], set()
    for call in range(400):
        if rng.random() < 0.3:  # an add between batches: overwrites, and new anchors
            count = int(rng.integers(1, 6))
            state = add(state, data(kind, next_id, count))
            history += list(range(next_id, next_id + count))
            next_id += count
            gone |= members - drawable(kind, history, capacity)  # overwritten in the pass
        epoch = int(state.sampler.epoch)
        state, got = next_batch(state, jax.random.key(call))
        if int(state.sampler.epoch) != epoch:  # a new pass began with this call
            if passes:  # the previous one covered all its anchors still stored
                assert len(visited) == len(set(visited)), call
                assert set(visited) | gone == members, call  # visited, or overwritten first
            passes, members = passes + 1, drawable(kind, history, capacity)
            visited, gone = [], set()
        ids = anchor_ids(kind, got)
        assert set(ids) <= members - gone and not set(ids) & set(visited)
        visited += ids
    assert passes > 10


def test_passes_are_shuffled_differently_and_sample_peeks(platform_path):
    buffer = jaxbuf.make_replay_buffer(64, 16, sampler=jaxbuf.epochs())
    state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(64, dtype=jnp.int32))
    sample, next_batch = jax.jit(buffer.sample), jax.jit(buffer.next_batch, donate_argnums=0)
    orders = []
    for call in range(8):
        peek = sample(state, jax.random.key(call))
        state, got = next_batch(state, jax.random.key(call))
        np.testing.assert_array_equal(peek.experience, got.experience)
        orders.append(got.experience.tolist())
    first = [i for order in orders[:4] for i in order]
    second = [i for order in orders[4:] for i in order]
    assert sorted(first) == sorted(second) == list(range(64)) and first != second
    assert first != list(range(64))


def test_a_partial_last_batch_is_flagged_and_an_empty_buffer_gives_nothing():
    buffer = jaxbuf.make_replay_buffer(16, 4, sampler=jaxbuf.epochs())
    state = buffer.init(jnp.int32(0))
    state, got = buffer.next_batch(state, jax.random.key(0))
    assert not got.valid.any() and int(state.sampler.epoch) == 0
    assert not bool(buffer.can_sample(state))
    state = buffer.add(state, jnp.arange(6, dtype=jnp.int32))
    state, first = buffer.next_batch(state, jax.random.key(1))
    state, last = buffer.next_batch(state, jax.random.key(2))
    assert first.valid.tolist() == [True] * 4 and last.valid.tolist() == [True] * 2 + [False] * 2


def test_epochs_work_vectorized_from_config_and_through_checkpoints(tmp_path):
    config = {"kind": "replay", "capacity": 8, "sample_batch_size": 3,
              "sampler": {"kind": "epochs"}, "num_buffers": 2}  # fmt: skip
    buffer = jaxbuf.io.buffer_from_config(config)
    state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(10, dtype=jnp.int32).reshape(2, 5))
    state, first = jax.jit(buffer.next_batch)(state, jax.random.key(0))
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "c", state, buffer), state, buffer)
    seen = first.experience[first.valid].tolist()
    for call in range(1, 4):
        restored, got = buffer.next_batch(restored, jax.random.key(call))
        seen += got.experience[got.valid].tolist()
    assert sorted(seen) == list(range(10))
    assert buffer.config.sampler == {"kind": "epochs"}


def test_epochs_work_in_a_sharded_buffer():
    mesh = jax.make_mesh((1,), ("data",))
    sharded = jaxbuf.shard(jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.epochs()), mesh, "data")
    add, next_batch = jax.jit(sharded.add), jax.jit(sharded.next_batch)  # one trace each
    state = add(sharded.init(jnp.int32(0)), jnp.arange(6, dtype=jnp.int32))
    seen = []
    for call in range(2):  # one pass: 4 + 2
        state, batch = next_batch(state, jax.random.key(call))
        seen += np.asarray(batch.experience)[np.asarray(batch.valid)].tolist()
    assert sorted(seen) == list(range(6)) and state.sampler.epoch.tolist() == [1]


def _fields_set(batch) -> set[str]:
    return {name for name in batch.__dataclass_fields__ if getattr(batch, name) is not None}


@pytest.mark.parametrize("vectorized", [False, True])
def test_sample_and_next_batch_return_records_with_the_same_fields(vectorized):
    step = {"obs": jnp.zeros(2), "done": jnp.bool_(False)}
    transition = jaxbuf.Transition(jnp.zeros(2), jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                   jnp.bool_(False), jnp.zeros(2))  # fmt: skip
    done = lambda s: s["done"]  # noqa: E731
    sampler = jaxbuf.epochs()
    buffers = [
        (jaxbuf.make_replay_buffer(8, 2, sampler=sampler), step),
        (jaxbuf.make_trajectory_buffer(2, 8, 2, 3, done_fn=done, sampler=sampler), step),
        (jaxbuf.make_transition_buffer(2, 8, 2, n_step=2, sampler=sampler), transition),
        (jaxbuf.make_episode_buffer(2, 8, 2, 4, done_fn=done, sampler=sampler), step),
    ]
    for buffer, example in buffers:
        buffer = jaxbuf.vectorize(buffer, 2) if vectorized else buffer
        state = jax.eval_shape(buffer.init, example)
        key = jax.random.key(0)
        drawn = jax.eval_shape(buffer.sample, state, key)
        _, following = jax.eval_shape(buffer.next_batch, state, key)
        assert _fields_set(drawn) == _fields_set(following), buffer.config.kind
        assert ("source" in _fields_set(drawn)) == vectorized


def _critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile with `df` degrees of freedom at the normal quantile `z`
    (Wilson-Hilferty; z = 3.09: one test in a thousand exceeds it by chance)."""
    h = 2 / (9 * df)
    return df * (1 - h + z * h**0.5) ** 3


@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_pass_order_is_uniform_over_all_permutations(n):
    """Over many keys, each of the `n!` orders of a pass of `n` anchors is equally
    likely (chi-square at p = 0.001), with the rounds the smallest buffer gets."""
    import itertools
    import math

    trials = 200 * math.factorial(n)
    seeds = jax.random.bits(jax.random.key(n), (trials, 2), jnp.uint32)
    order = jax.jit(jax.vmap(lambda seed: permutation.permute(
        seed, jnp.arange(n, dtype=jnp.int32), jnp.int32(n), permutation.rounds(n))))  # fmt: skip
    orders = np.asarray(order(seeds))
    index = {p: i for i, p in enumerate(itertools.permutations(range(n)))}
    seen = np.bincount([index[tuple(o)] for o in orders.tolist()], minlength=len(index))
    expected = trials / len(index)
    assert ((seen - expected) ** 2 / expected).sum() < _critical(len(index) - 1), seen


def test_a_pass_order_is_a_bijection_at_any_size_and_costs_nothing_outside_it():
    permute = jax.jit(permutation.permute, static_argnums=3)  # one program for every size
    positions = jnp.arange(4096, dtype=jnp.int32)
    for i, n in enumerate([1, 2, 7, 64, 1000, 4093]):
        seed = jax.random.bits(jax.random.key(i), (2,), jnp.uint32)
        got = np.asarray(permute(seed, positions, jnp.int32(n), permutation.rounds(4096)))
        assert sorted(got[:n].tolist()) == list(range(n)) and (got[n:] == 0).all(), n
        again = np.asarray(permute(seed, positions, jnp.int32(n), permutation.rounds(4096)))
        np.testing.assert_array_equal(got, again)  # a key's order is reproducible
