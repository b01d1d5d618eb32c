"""Checkpoints of a whole training state: arrays, typed PRNG keys, Python scalars, None,
NamedTuples and flax dataclasses come back exactly; anything else is refused before a byte is
written; a DQN run restored in a fresh process goes on bit for bit."""

import pathlib
import re
import subprocess
import sys
import textwrap
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxbuf


class Pair(NamedTuple):
    array: jax.Array
    count: int


def training_state(seed: int):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    state = buffer.add(buffer.init({"x": jnp.float32(0)}), {"x": jnp.arange(3.0) + seed})
    params = {"w": jnp.full(3, float(seed)), "b": jnp.bfloat16(seed)}
    return {
        "buffer": state, "params": params, "opt": optax.adam(1e-3).init(params),
        "step": 7 + seed, "lr": 0.5 + seed, "done": bool(seed), "big": 2**40 + seed,
        "key": jax.random.key(seed), "raw_key": jax.random.PRNGKey(seed),
        "keys": jax.random.split(jax.random.key(seed, impl="rbg"), 3),
        "nothing": None, "pair": Pair(jnp.zeros(2) + seed, seed),
    }  # fmt: skip


def assert_same(restored, saved):
    assert jax.tree.structure(restored) == jax.tree.structure(saved)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
        assert type(got) is type(want) or isinstance(got, jax.Array)
        if isinstance(want, jax.Array) and jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            assert got.dtype == want.dtype
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert np.asarray(got).dtype == np.asarray(want).dtype


def test_a_training_state_comes_back_exactly(tmp_path):
    saved = training_state(3)
    folder = jaxbuf.save(tmp_path / "ckpt", saved)
    restored = jaxbuf.restore(folder, training_state(0))
    assert_same(restored, saved)
    assert type(restored["step"]) is int and type(restored["lr"]) is float
    assert type(restored["done"]) is bool and restored["big"] == 2**40 + 3
    assert isinstance(restored["pair"], Pair) and type(restored["pair"].count) is int
    assert restored["nothing"] is None and type(restored["buffer"]) is type(saved["buffer"])


@pytest.mark.parametrize(
    "leaf, error, match",
    [
        ("a string", TypeError, r"state\['bad'\] is a str; a checkpoint holds arrays"),
        (object(), TypeError, r"state\['bad'\] is a object"),
        (2**70, ValueError, r"state\['bad'\]: the int 1180591620717411303424 does not fit"),
        (np.array(["a"]), TypeError, r"state\['bad'\] has dtype <U1"),
    ],
)
def test_what_a_checkpoint_cannot_hold_is_refused_before_anything_is_written(
    tmp_path, leaf, error, match
):
    folder = jaxbuf.save(tmp_path / "ckpt", training_state(1))
    files = sorted(p.name for p in folder.iterdir())
    with pytest.raises(error, match=match):
        jaxbuf.save(folder, {**training_state(2), "bad": leaf})
    assert sorted(p.name for p in folder.iterdir()) == files
    assert_same(jaxbuf.restore(folder, training_state(0)), training_state(1))


def test_a_template_of_other_leaf_kinds_is_refused(tmp_path):
    folder = jaxbuf.save(tmp_path / "ckpt", training_state(1))
    for name, value, said in [("step", 1.0, "a Python int, but the template holds a Python float"),
                              ("key", jnp.zeros(2, jnp.uint32), "PRNG keys (threefry2x32), but "
                               "the template holds an array"),
                              ("raw_key", jax.random.key(0), "an array, but the template holds "
                               "PRNG keys")]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(said)):
            jaxbuf.restore(folder, {**training_state(0), name: value})


RESUME = """
import sys, jax, numpy as np, gymnax, jaxbuf
sys.path.insert(0, {tests!r})
from test_training_state import dqn_training
init, train_chunk = dqn_training()
template = {{"runner": init(jax.random.key(1)), "chunk": 0, "learning_rate": 0.0}}
state = jaxbuf.restore({folder!r}, template)
assert state["chunk"] == 1 and state["learning_rate"] == 2.5e-4
runner, _ = train_chunk(state["runner"])
np.savez({out!r}, *jax.tree.leaves(runner.params), step=np.asarray(runner.step))
"""


def dqn_training():
    """The DQN example's `init` and a jitted chunk of 100 iterations (4 envs)."""
    import gymnax

    from jaxbuf.examples import dqn_cartpole

    config = {**dqn_cartpole.CONFIG, "num_envs": 4, "total_timesteps": 800, "num_chunks": 2,
              "learning_starts": 64, "buffer_capacity": 512, "batch_size": 32}  # fmt: skip
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, _ = dqn_cartpole.make_train(config, env, env_params)
    return init, train_chunk


def test_a_dqn_run_resumes_bit_for_bit_in_a_fresh_process(tmp_path):
    init, train_chunk = dqn_training()
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts and floats
        runner, _ = train_chunk(init(jax.random.key(0)))  # learning has begun
        folder = jaxbuf.save(tmp_path / "ckpt", {"runner": runner, "chunk": 1,
                                                 "learning_rate": 2.5e-4})  # fmt: skip
        runner, _ = train_chunk(runner)  # the next 100 updates, uninterrupted
    out = tmp_path / "resumed.npz"
    code = RESUME.format(tests=str(pathlib.Path(__file__).parent), folder=str(folder),
                         out=str(out))  # fmt: skip
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, timeout=300)
    resumed = np.load(out)
    assert int(resumed["step"]) == int(runner.step) == 200
    for i, leaf in enumerate(jax.tree.leaves(runner.params)):
        np.testing.assert_array_equal(resumed[f"arr_{i}"], np.asarray(leaf))
    chex.assert_trees_all_equal(jax.tree.leaves(runner.params)[0].shape, resumed["arr_0"].shape)


def test_an_abstract_template_restores_arrays_and_keys(tmp_path):
    saved = {"key": jax.random.key(5), "keys": jax.random.split(jax.random.key(1, impl="rbg"), 2),
             "x": jnp.arange(4.0)}  # fmt: skip
    folder = jaxbuf.save(tmp_path / "ckpt", saved)
    assert_same(jaxbuf.restore(folder, jax.eval_shape(lambda: saved)), saved)
