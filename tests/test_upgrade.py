"""What jaxbuf 0.3 wrote, under 0.4: calls, configurations and checkpoints.

0.4 names the per-environment kinds' size `steps_per_env` (0.3's `capacity`, the same number),
so that `capacity` counts items over all environments wherever it appears. A 0.3 call with
`capacity=` is refused with a message that says what to write (never other memory); a 0.3
configuration's `capacity` is read as `steps_per_env` with a warning; a 0.3 checkpoint
(`tests/data/checkpoints_0_3`, written by 0.3.0.dev0) restores into the buffer 0.4 builds.
And the transition buffer's defaults store each observation about once, with the episode
length they are sized for in `jaxbuf.memory`'s report.
"""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_same

import jaxbuf
from jaxbuf.core.time_ring import DoneKey

DATA = pathlib.Path(__file__).with_name("data") / "checkpoints_0_3"
DONE = DoneKey("done")
PER_ENV = {
    "trajectory": lambda **kw: jaxbuf.make_trajectory_buffer(2, sample_batch_size=4,
                                                             sequence_length=3, **kw),
    "transition": lambda **kw: jaxbuf.make_transition_buffer(2, sample_batch_size=4, **kw),
    "episode": lambda **kw: jaxbuf.make_episode_buffer(2, sample_batch_size=4, max_length=6,
                                                       done_fn=DONE, **kw),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(PER_ENV))
def test_a_0_3_capacity_keyword_is_refused_saying_what_to_write(kind):
    with pytest.raises(TypeError, match=r"takes steps_per_env=.*write steps_per_env=12\b"):
        PER_ENV[kind](capacity=12)
    assert PER_ENV[kind](steps_per_env=12).config.steps_per_env == 12
    assert "capacity" not in PER_ENV[kind](steps_per_env=12).config.to_dict()


def test_capacity_counts_items_where_it_remains():
    assert jaxbuf.make_replay_buffer(capacity=12, sample_batch_size=4).config.capacity == 12
    assert (
        jaxbuf.make_queue(capacity=12, add_batch_size=2, sample_batch_size=2).config.capacity == 12
    )


def test_a_0_3_configuration_reads_capacity_as_steps_per_env_with_a_warning():
    config = {"kind": "transition", "num_envs": 2, "capacity": 12, "sample_batch_size": 4}
    with pytest.warns(DeprecationWarning, match="'capacity' \\(12\\) is read as 'steps_per_env'"):
        buffer = jaxbuf.io.buffer_from_config(config)
    assert buffer.config.steps_per_env == 12
    replay = jaxbuf.io.buffer_from_config({"kind": "replay", "capacity": 12,
                                           "sample_batch_size": 4})  # fmt: skip
    assert replay.config.capacity == 12


def steps(ids):
    ids = np.asarray(ids, np.int32)
    return {"id": ids, "obs": np.stack([ids, -ids], -1).astype(np.float32), "done": ids % 5 == 4}


def transitions(ids):
    s = steps(ids)
    return jaxbuf.Transition(s["obs"], np.asarray(ids, np.int32), s["obs"][..., 0], s["done"],
                             np.asarray(ids) % 7 == 6, -s["obs"])  # fmt: skip


# The buffers and adds that wrote tests/data/checkpoints_0_3 (its README.py.txt), in 0.4's words.
WRITTEN = {
    "replay": (lambda: jaxbuf.make_replay_buffer(12, 4),
               lambda t: steps(np.arange(t * 5, t * 5 + 5))),
    "trajectory": (lambda: jaxbuf.make_trajectory_buffer(2, 12, 4, 3, done_fn=DONE),
                   lambda t: steps(1000 * np.arange(2)[:, None] + t * 5 + np.arange(5))),
    "transition": (lambda: jaxbuf.make_transition_buffer(2, 12, 4, n_step=2, discount=0.9,
                                                         min_episode_length=2),
                   lambda t: transitions(1000 * np.arange(2)[:, None] + t * 5 + np.arange(5))),
    "episode": (lambda: jaxbuf.make_episode_buffer(2, 12, 4, 6, done_fn=DONE),
                lambda t: steps(1000 * np.arange(2)[:, None] + t * 5 + np.arange(5))),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(WRITTEN))
def test_a_0_3_checkpoint_restores_into_the_buffer_0_4_builds(kind, tmp_path):
    saved = json.loads((DATA / kind / "metadata.json").read_text())
    assert saved["jaxbuf_version"] == "0.3.0.dev0" and "capacity" in saved["config"]
    make, batch = WRITTEN[kind]
    buffer = make()
    example = jax.tree.map(lambda x: x[(0,) * (1 if kind == "replay" else 2)], batch(0))
    state = buffer.init(example)
    for t in range(4):
        state = buffer.add(state, batch(t))
    folder = shutil.copytree(DATA / kind, tmp_path / kind)  # restore may write beside it
    restored = jaxbuf.restore(folder, buffer.init(example), buffer=buffer)
    assert_same(restored, state, kind)
    other = make().config.to_dict() | {"sample_batch_size": 5}
    with pytest.raises(ValueError, match="sample_batch_size: saved 4, buffer 5"):
        jaxbuf.restore(folder, buffer.init(example),
                       buffer=jaxbuf.io.buffer_from_config(other))  # fmt: skip


def test_the_default_transition_buffer_stores_observations_about_once_and_says_for_what():
    obs = jnp.zeros(64, jnp.float32)
    step = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(0), jnp.bool_(0), obs)
    buffer = jaxbuf.make_transition_buffer(8, 100_000, 256)
    report = jaxbuf.memory(buffer, step)
    assert buffer.config.min_episode_length == 10 and report.sized_for_episodes == 10
    assert report.per_stored_step <= 300
    assert "sized for episodes of 10 steps or more" in str(report)
    lossless = jaxbuf.memory(jaxbuf.make_transition_buffer(8, 100_000, 256, min_episode_length=1),
                             step)  # fmt: skip
    assert lossless.sized_for_episodes is None and lossless.per_stored_step > 500
    assert jaxbuf.make_transition_buffer(2, 6, 4).config.min_episode_length == 6  # at most steps
    # samplers that keep a record per slot would still draw steps made unsampleable
    for sampler, expected in ((jaxbuf.prioritized(), 1), (jaxbuf.epochs(), 1),
                              (jaxbuf.uniform(replacement=False), 10)):  # fmt: skip
        buffer = jaxbuf.make_transition_buffer(8, 100, 4, sampler=sampler)
        assert buffer.config.min_episode_length == expected, sampler.config


def test_episodes_shorter_than_the_default_are_counted_where_the_report_points():
    buffer = jaxbuf.make_transition_buffer(1, 20, 4)  # 2 final observations kept
    obs = jnp.zeros(2, jnp.float32)
    example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(0), jnp.bool_(0), obs)
    ended = np.arange(40) % 2 == 1  # episodes of 2 steps
    steps = jax.tree.map(lambda x: np.broadcast_to(x, (1, 20, *x.shape)), example)
    state = buffer.init(example)
    for half in (ended[:20], ended[20:]):
        state = buffer.add(state, steps.replace(terminated=half[None]))
    assert int(state.side.stale[0]) == 16  # 2 of the 20 stored steps' episodes kept their end
    batch = buffer.sample(state, jax.random.key(0))
    assert bool(batch.valid.all())
    assert (np.asarray(batch.indices) % 20 >= 16).all()  # drawn from the usable steps only
