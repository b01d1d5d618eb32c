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
from skips import needs

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


DELETED = object()  # stands for a deleted array in a parameter list


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
        (
            jax.ShapeDtypeStruct((3,), jnp.float32),
            TypeError,
            r"state\['bad'\] is a jax.ShapeDtypeStruct \(a template from jax.eval_shape\?\)",
        ),
        (DELETED, ValueError, r"state\['bad'\] is a deleted array: it was donated"),
    ],
)
def test_what_a_checkpoint_cannot_hold_is_refused_before_anything_is_written(
    tmp_path, leaf, error, match
):
    if leaf is DELETED:  # an array donated to a jitted call
        leaf = jnp.zeros(3) + 1
        leaf.delete()
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
    # gymnax 1.0 (steps with `truncated`) needs jax 0.6: absent where CI tests jax 0.5.0.
    # Its version comes from its metadata: gymnax 1.0.1 has no __version__, and
    # importorskip's minversion then skipped it everywhere.
    needs("gymnax", "1.0")
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


SIXTY_FOUR = {
    "n": np.int64(2**40 + 3), "max": np.uint64(2**64 - 1), "big": np.float64(1e300),
    "tiny": np.float64(5e-324), "counts": np.array([-(2**62), 2**53 + 1], np.int64),
    "complex": np.complex128(1e300 + 1j), "small": np.int64(7),
}  # fmt: skip


def test_64_bit_numpy_leaves_come_back_as_they_were_saved(tmp_path):
    """NumPy step counters, timestamps and float64 statistics: exact, as NumPy, in their dtype,
    whatever jax_enable_x64 says (JAX without x64 would make them 32 bits)."""
    folder = jaxbuf.save(tmp_path / "ckpt", SIXTY_FOUR)
    template = {key: type(value)(0) if isinstance(value, np.generic) else np.zeros_like(value)
                for key, value in SIXTY_FOUR.items()}  # fmt: skip
    restored = jaxbuf.restore(folder, template)
    for name, want in SIXTY_FOUR.items():
        got = restored[name]
        assert type(got) is type(want), name
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want)


def test_a_large_64_bit_numpy_leaf_is_read_in_chunks_exactly(tmp_path, monkeypatch):
    from jaxbuf.io import checkpoint as _checkpoint

    monkeypatch.setattr(_checkpoint, "CHUNK_BYTES", 64)
    saved = {"t": np.arange(2**40, 2**40 + 100, dtype=np.int64).reshape(50, 2)}
    folder = jaxbuf.save(tmp_path / "c", saved)
    restored = jaxbuf.restore(folder, {"t": np.zeros((50, 2), np.int64)})
    assert isinstance(restored["t"], np.ndarray) and restored["t"].dtype == np.int64
    np.testing.assert_array_equal(restored["t"], saved["t"])


@pytest.mark.parametrize(
    "name, value",
    [("n", "1099511627779"), ("max", "18446744073709551615"), ("big", "1e+300"),
     ("counts", "-4611686018427387904"), ("complex", "1e+300")],
)  # fmt: skip
def test_a_64_bit_value_a_32_bit_template_cannot_hold_is_refused(tmp_path, name, value):
    """`jax.eval_shape` of a state with 64-bit NumPy leaves says 32 bits (x64 off): values
    that survive the conversion restore, the others are refused naming the leaf."""
    saved = {name: SIXTY_FOUR[name], "small": SIXTY_FOUR["small"]}
    folder = jaxbuf.save(tmp_path / "ckpt", saved)
    template = jax.eval_shape(lambda: jax.tree.map(np.zeros_like, saved))
    assert template[name].dtype.itemsize * 2 == SIXTY_FOUR[name].dtype.itemsize
    with pytest.raises(ValueError, match=rf"leaf \['{name}'\] holds .*{re.escape(value)}"):
        jaxbuf.restore(folder, template)
    fits = {key: SIXTY_FOUR[key] for key in ("small", "tiny")}
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "fits", fits), jax.eval_shape(lambda: fits))
    assert isinstance(restored["small"], jax.Array) and int(restored["small"]) == 7
    assert restored["small"].dtype == jnp.int32
    # a float64 rounds to the float32 the template asks for (here, to zero: 5e-324 is within
    # float32's range, not above its smallest subnormal, as JAX's own conversion rounds it)
    assert restored["tiny"].dtype == jnp.float32


def test_values_a_32_bit_template_holds_restore_at_the_edges(tmp_path):
    """What survives the narrowing restores: float64 infinities and nans (not finite values
    lost), complex values rounded within range (not required exact), and Python ints at both
    ends of 64 bits (`-2**63` too) into a Python int template."""
    floats = np.array([np.inf, -np.inf, np.nan, 1.5, 0.1], np.float64)
    saved = {"floats": floats, "complex": np.complex128(0.1 + 0.2j),
             "lowest": -(2**63), "highest": 2**63 - 1}  # fmt: skip
    folder = jaxbuf.save(tmp_path / "ckpt", saved)
    template = {
        "floats": jax.ShapeDtypeStruct((5,), jnp.float32),
        "complex": jax.ShapeDtypeStruct((), jnp.complex64),
        "lowest": 0,
        "highest": 0,
    }
    restored = jaxbuf.restore(folder, template)
    np.testing.assert_array_equal(restored["floats"], floats.astype(np.float32))
    assert restored["complex"] == np.complex64(0.1 + 0.2j)
    assert restored["lowest"] == -(2**63) and restored["highest"] == 2**63 - 1
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        jaxbuf.save(tmp_path / "too_low", {"n": -(2**63) - 1})


def test_a_jax_template_asking_for_64_bits_without_x64_is_refused(tmp_path):
    folder = jaxbuf.save(tmp_path / "ckpt", {"n": np.int64(3)})
    with pytest.raises(
        ValueError,
        match=r"leaf \['n'\] is int64, and the template asks for a "
        r"JAX int64 array, which JAX makes int32 while jax_enable_x64 is off",
    ):
        jaxbuf.restore(folder, {"n": jax.ShapeDtypeStruct((), np.int64)})


X64 = """
import jax, jax.numpy as jnp, numpy as np, jaxbuf
jax.config.update("jax_enable_x64", True)
saved = {{"n": jnp.asarray(2**40 + 3, jnp.int64), "x": jnp.asarray(1e300, jnp.float64),
          "u": jnp.asarray([2**64 - 1], jnp.uint64), "step": 2**40}}
folder = jaxbuf.save({folder!r}, saved)
for template in (jax.tree.map(jnp.zeros_like, saved), jax.eval_shape(lambda: saved)):
    restored = jaxbuf.restore(folder, template)
    for name in ("n", "x", "u"):
        assert isinstance(restored[name], jax.Array), name
        assert restored[name].dtype == saved[name].dtype, name
        assert np.array_equal(np.asarray(restored[name]), np.asarray(saved[name])), name
    assert int(restored["step"]) == 2**40
print("ok")
"""


def test_jax_arrays_under_x64_come_back_as_64_bit_arrays(tmp_path):
    code = X64.format(folder=str(tmp_path / "ckpt"))
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                         capture_output=True, text=True)  # fmt: skip
    assert out.stdout.strip() == "ok"


def test_an_abstract_template_restores_python_scalars_as_its_arrays(tmp_path):
    """Orbax's habit: `restore(folder, jax.eval_shape(lambda: state))`, where flax's
    `TrainState.step` and other Python scalars become weak-typed scalar arrays."""
    saved = training_state(3)
    folder = jaxbuf.save(tmp_path / "ckpt", saved)
    template = jax.eval_shape(lambda: {**training_state(0), "big": 0})
    restored = jaxbuf.restore(folder, {**template, "big": np.int64(0)})  # a NumPy int64
    assert type(restored["big"]) is np.int64 and restored["big"] == 2**40 + 3
    for name, dtype in [("step", jnp.int32), ("lr", jnp.float32), ("done", jnp.bool_)]:
        assert isinstance(restored[name], jax.Array) and restored[name].dtype == dtype, name
        assert restored[name].shape == () and restored[name] == saved[name], name
    assert int(restored["pair"].count) == 3
    # a concrete array takes a Python scalar too, if its value fits
    concrete = jaxbuf.restore(folder, {**template, "big": np.int64(0), "step": jnp.int32(0)})
    assert isinstance(concrete["step"], jax.Array) and int(concrete["step"]) == 10
    with pytest.raises(ValueError, match=r"leaf \['big'\] holds 1099511627779"):
        jaxbuf.restore(folder, template)  # int32, as eval_shape makes a Python int


def test_a_train_state_restores_into_an_abstract_template(tmp_path):
    from flax.training import train_state

    def make(seed):
        params = {"w": jnp.full(3, float(seed))}
        return train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(0.1))

    state = make(1).replace(step=12)
    folder = jaxbuf.save(tmp_path / "ckpt", state)
    restored = jaxbuf.restore(folder, jax.eval_shape(lambda: make(0)))
    assert restored.step.dtype == jnp.int32 and int(restored.step) == 12
    np.testing.assert_array_equal(restored.params["w"], state.params["w"])
