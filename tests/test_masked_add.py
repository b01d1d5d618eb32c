"""`add(state, data, where=...)`: a masked write, not a branch. With `where` false the state
comes back bit for bit as it was; with true, as a plain add. Checked for every kind, sampler
and option over random sequences with wrap-arounds and episode ends, against a twin buffer
that skips the masked calls."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accelerators_form, assert_same

import jaxbuf
from jaxbuf.core import lowering as _lowering

STEP = {"obs": jnp.zeros(2), "done": jnp.bool_(False)}
GOAL_STEP = {"achieved": jnp.zeros(2), "desired": jnp.zeros(2), "reward": jnp.float32(0),
             "done": jnp.bool_(False)}  # fmt: skip


def done(step):
    return step["done"]


def transition(obs):
    return jaxbuf.Transition(obs=obs, action=jnp.int32(0), reward=jnp.float32(0),
                             terminated=jnp.bool_(False), truncated=jnp.bool_(False),
                             next_obs=obs)  # fmt: skip


def goals():
    return jaxbuf.hindsight(lambda a, d: -jnp.abs(a - d).sum(), achieved="achieved",
                            desired="desired")  # fmt: skip


def buffers(sampler):
    """(name, buffer, example, time-ring kind?) of every sampled kind and option."""
    goal_obs = {"achieved": jnp.zeros(2), "desired": jnp.zeros(2)}
    return [
        ("replay", jaxbuf.make_replay_buffer(7, 4, sampler=sampler), STEP, False),
        ("trajectory", jaxbuf.make_trajectory_buffer(2, 7, 4, 3, done_fn=done, sampler=sampler),
         STEP, True),
        ("transition", jaxbuf.make_transition_buffer(2, 7, 4, n_step=2, min_episode_length=2,
                                                     sampler=sampler), transition(jnp.zeros(2)),
         True),
        ("episode", jaxbuf.make_episode_buffer(2, 7, 4, 5, done_fn=done, sampler=sampler),
         STEP, True),
        ("transition frames", jaxbuf.make_transition_buffer(2, 7, 4, frames={"obs": 2},
                                                            sampler=sampler),
         transition(jnp.zeros(2)), True),
        ("transition goals", jaxbuf.make_transition_buffer(2, 7, 4, goals=goals(),
                                                           sampler=sampler),
         transition(goal_obs), True),
        ("episode goals", jaxbuf.make_episode_buffer(2, 7, 4, 5, done_fn=done, goals=goals(),
                                                     sampler=sampler), GOAL_STEP, True),
        ("vectorize(replay)", jaxbuf.vectorize(jaxbuf.make_replay_buffer(5, 4, sampler=sampler),
                                               2), STEP, True),
    ]  # fmt: skip


def random_data(rng, example, lead):
    def leaf(x):
        shape = (*lead, *jnp.shape(x))
        if x.dtype == jnp.bool_:
            return jnp.asarray(rng.random(shape) < 0.3)
        return jnp.asarray(rng.integers(0, 100, shape)).astype(x.dtype)

    data = jax.tree.map(leaf, example)
    if isinstance(data, jaxbuf.Transition):  # never both ends at once
        data = data.replace(truncated=data.truncated & ~data.terminated)
    return data


def sample_fn(buffer):
    if buffer.next_batch is not None:
        return lambda s, k: buffer.next_batch(s, k)[1]
    return buffer.sample


KINDS = ["replay", "trajectory", "transition", "episode", "transition frames",
         "transition goals", "episode goals", "vectorize(replay)"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "sampler, path",
    [("uniform", "cpu path"), ("uniform", "accelerator path"),
     ("prioritized", "accelerator path"), ("epochs", "accelerator path")],
)  # fmt: skip
def test_a_masked_add_is_a_skipped_add(sampler, path, kind, monkeypatch):
    """The accelerator path (the masked write) with every sampler; the CPU's `lax.cond`
    needs less: it either adds or returns the state. (One test per kind; it was one
    test per sampler and path over every kind.)"""
    if path == "accelerator path":
        monkeypatch.setattr(_lowering, "choose", accelerators_form)
    make = {"uniform": jaxbuf.uniform, "prioritized": jaxbuf.prioritized,
            "epochs": jaxbuf.epochs}[sampler]  # fmt: skip
    made = {name: rest for name, *rest in buffers(make())}
    assert list(made) == KINDS
    buffer, example, per_env = made[kind]
    rng = np.random.default_rng(len(kind))
    masked = jax.jit(lambda s, d, w, b=buffer: b.add(s, d, where=w), donate_argnums=0)
    plain = jax.jit(buffer.add)
    sample = jax.jit(sample_fn(buffer))
    one, other = buffer.init(example), buffer.init(example)
    for step in range(14):  # 3 steps a time through a ring of 7: six wraps
        lead = (2, 3) if per_env else (3,)
        data = random_data(rng, example, lead)
        allowed = bool(rng.random() < 0.6)
        one = masked(one, data, jnp.bool_(allowed))
        if allowed:
            other = plain(other, data)
        assert_same(one, other, f"{kind} after step {step}")
        key = jax.random.key(step)
        assert_same(sample(one, key), sample(other, key), f"{kind} sample {step}")


def test_add_step_takes_where_and_an_untraced_gate_works():
    buffer = jaxbuf.make_transition_buffer(2, 8, 4)
    state = buffer.init(transition(jnp.zeros(2)))
    step = jax.tree.map(lambda x: jnp.ones((2, *x.shape), x.dtype), transition(jnp.zeros(2)))
    assert int(buffer.add_step(state, step, where=False).size) == 0
    assert int(jax.jit(buffer.add_step)(state, step, where=jnp.bool_(True)).size) == 1


@pytest.mark.parametrize(
    "where, got",
    [(1, "int32[]"), (jnp.ones(2, bool), "bool[2]"), (jnp.float32(1), "float32[]")],
)
def test_where_must_be_a_bool_scalar(where, got):
    buffer = jaxbuf.make_replay_buffer(8, 4)
    state = buffer.init(STEP)
    data = jax.tree.map(lambda x: jnp.zeros((3, *x.shape), x.dtype), STEP)
    expected = f"where must be a bool scalar (whether to store the data), got {got}."
    with pytest.raises(TypeError, match=re.escape(expected)):
        jax.jit(buffer.add)(state, data, where=where)
    assert int(state.size) == 0  # the state is untouched
