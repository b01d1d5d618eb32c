"""Storage dtypes: float32 leaves kept in bfloat16/float16, sampled as float32. Against the
plain buffer fed the values rounded by NumPy (ml_dtypes), on random operation sequences with
wrap-arounds and episode ends; the clamp; memory; errors."""

import re

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxbuf

STEP = jaxbuf.Transition(jnp.zeros(6), jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                         jnp.bool_(False), jnp.zeros(6))  # fmt: skip
NUMPY = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def rounded(x: np.ndarray, name: str) -> np.ndarray:
    """What storage in `name` gives back: the clamp, then NumPy's rounding to nearest."""
    largest = float(ml_dtypes.finfo(NUMPY[name]).max)
    clamped = np.where(np.isfinite(x), np.clip(x, -largest, largest), x)
    return clamped.astype(NUMPY[name]).astype(np.float32)


def random_steps(rng, num_envs, length, scale):
    ends = rng.random((num_envs, length)) < 0.1
    terminated = ends & (rng.random((num_envs, length)) < 0.5)
    return jaxbuf.Transition(
        obs=(rng.normal(size=(num_envs, length, 6)) * scale).astype(np.float32),
        action=rng.integers(0, 4, (num_envs, length)).astype(np.int32),
        reward=rng.normal(size=(num_envs, length)).astype(np.float32),
        terminated=terminated, truncated=ends & ~terminated,
        next_obs=(rng.normal(size=(num_envs, length, 6)) * scale).astype(np.float32),
    )  # fmt: skip


@pytest.mark.parametrize("name, scale", [("bfloat16", 1e30), ("float16", 3e4)])
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_narrow_transition_buffer_samples_what_a_float32_one_fed_rounded_values_does(
    name, scale, n_step
):
    """Beyond float16's range at scale 3e4 (values up to 1.5e5 are clamped), bfloat16 at
    1e30; capacity 12 with 5 adds of 7 steps: the rings wrap around."""
    narrow = jaxbuf.make_transition_buffer(3, 12, 64, n_step=n_step, min_episode_length=3,
                                           storage_dtypes={"obs": name})  # fmt: skip
    plain = jaxbuf.make_transition_buffer(3, 12, 64, n_step=n_step, min_episode_length=3)
    rng = np.random.default_rng(7)
    state, reference = narrow.init(STEP), plain.init(STEP)
    add, add_plain = jax.jit(narrow.add), jax.jit(plain.add)
    for round_ in range(5):
        steps = random_steps(rng, 3, 7, scale)
        state = add(state, steps)
        reference = add_plain(
            reference,
            steps.replace(obs=rounded(steps.obs, name), next_obs=rounded(steps.next_obs, name)),
        )
        key = jax.random.key(round_)
        got, want = narrow.sample(state, key), plain.sample(reference, key)
        assert got.experience.obs.dtype == got.experience.next_obs.dtype == jnp.float32
        chex.assert_trees_all_equal(got, want)
    assert np.isfinite(np.asarray(got.experience.obs)).all()  # clamped, never inf
    assert state.experience["obs"].dtype == state.side.experience.dtype == NUMPY[name]


def done_seen_as_float32(step):
    """An episode ends where the first value exceeds 1 (1.001 does in float32 and not once
    rounded to bfloat16); it must see the stored values as float32."""
    assert step["x"].dtype == jnp.float32, step["x"].dtype
    return step["x"][0] > 1.0


@pytest.mark.parametrize("kind", ["trajectory", "episode"])
def test_narrow_trajectory_and_episode_buffers_sample_what_float32_ones_fed_rounded_values_do(
    kind,
):
    """Capacity 10 per environment with 6 adds of 4 steps (the rings wrap); values near
    the episode boundary's threshold, so `done_fn` must see the rounded values."""
    make = {"trajectory": lambda **o: jaxbuf.make_trajectory_buffer(
                2, 10, 32, 3, done_fn=done_seen_as_float32, **o),
            "episode": lambda **o: jaxbuf.make_episode_buffer(
                2, 10, 32, 4, done_fn=done_seen_as_float32, **o)}[kind]  # fmt: skip
    narrow, plain = make(storage_dtypes={"x": "bfloat16"}), make()
    example = {"x": jnp.zeros(3), "t": jnp.int32(0)}
    state, reference = narrow.init(example), plain.init(example)
    add, add_plain = jax.jit(narrow.add), jax.jit(plain.add)
    rng = np.random.default_rng(5)
    for round_ in range(6):
        x = rng.choice(np.float32([0.5, 1.001, 1.5, -2.0]), size=(2, 4, 3)).astype(np.float32)
        t = np.full((2, 4), round_, np.int32)
        state = add(state, {"x": x, "t": t})
        reference = add_plain(reference, {"x": rounded(x, "bfloat16"), "t": t})
        if bool(plain.can_sample(reference)):
            key = jax.random.key(round_)
            chex.assert_trees_all_equal(narrow.sample(state, key), plain.sample(reference, key))
    assert state.experience["x"].dtype == jnp.bfloat16
    assert dict(narrow.config)["storage_dtypes"] == {"x": "bfloat16"}
    rebuilt = jaxbuf.io.buffer_from_config({**dict(narrow.config), "done_fn": done_seen_as_float32})
    assert rebuilt.init(example).experience["x"].dtype == jnp.bfloat16


def test_a_narrow_replay_buffer_and_its_clamp():
    buffer = jaxbuf.make_replay_buffer(5, 16, storage_dtypes={"x": "float16"})
    state = buffer.init({"x": jnp.zeros(2), "id": jnp.int32(0)})
    values = np.array([[1e5, -1e5], [np.inf, -np.inf], [np.nan, 0.1], [65519, 65520]], np.float32)
    state = buffer.add(state, {"x": values, "id": np.arange(4, dtype=np.int32)})
    rows = np.asarray(buffer.take(state, jnp.arange(4))["x"])
    np.testing.assert_array_equal(rows[0], [65504, -65504])  # clamped, not inf
    np.testing.assert_array_equal(rows[1], [np.inf, -np.inf])  # infinities stay
    assert np.isnan(rows[2, 0]) and rows[2, 1] == np.float32(np.float16(0.1))
    np.testing.assert_array_equal(rows[3], [65504, 65504])  # would round to inf unclamped
    halves = np.full((5, 2), 0.5, np.float16)  # the storage dtype itself is taken as it is
    state = buffer.add(state, {"x": halves, "id": np.arange(5, dtype=np.int32)})
    assert np.asarray(buffer.sample(state, jax.random.key(0)).experience["x"]).tolist() == [
        [0.5, 0.5]] * 16  # fmt: skip


def test_bfloat16_observations_halve_the_memory_per_stored_step():
    plain = jaxbuf.memory(jaxbuf.make_transition_buffer(16, 1000, 256, min_episode_length=100),
                          STEP.replace(obs=jnp.zeros(512), next_obs=jnp.zeros(512)))  # fmt: skip
    narrow = jaxbuf.memory(
        jaxbuf.make_transition_buffer(16, 1000, 256, min_episode_length=100,
                                      storage_dtypes={"obs": "bfloat16"}),
        STEP.replace(obs=jnp.zeros(512), next_obs=jnp.zeros(512)))  # fmt: skip
    observations = [sum(size for leaf, size in report.leaves.items() if "obs" in leaf)
                    for report in (plain, narrow)]  # fmt: skip
    assert observations[1] / observations[0] == 0.5
    assert narrow.per_stored_step / plain.per_stored_step <= 0.53


def test_blocks_and_vectorize_take_narrow_buffers():
    buffer = jaxbuf.make_transition_buffer(2, 8, 4, storage_dtypes={"obs": "bfloat16"})
    steps = random_steps(np.random.default_rng(3), 2, 4, 1.0)
    blocks = jax.jit(jaxbuf.blocks(buffer, 4).write)
    per_step = jax.tree.map(lambda x: np.moveaxis(x, 1, 0), steps)
    single = buffer.init(STEP)
    for t in range(4):
        single = buffer.add_step(single, jax.tree.map(lambda x, t=t: x[t], per_step))
    chex.assert_trees_all_equal(blocks(buffer.init(STEP), per_step), single)
    stacked = jaxbuf.vectorize(buffer, 3)
    assert stacked.init(STEP).experience["obs"].dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"x": "int8"}), ValueError,
         "storage_dtypes['x'] must be 'bfloat16' or 'float16'"),
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes=["x"]), TypeError,
         "storage_dtypes must be a mapping"),
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"id": "float16"}).init(
            {"x": jnp.zeros(2), "id": jnp.int32(0)}), TypeError,
         "storage_dtypes['id']: example['id'] is int32; only float32 leaves"),
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"done": "bfloat16"}).init(
            {"x": jnp.zeros(2), "done": jnp.bool_(False)}), TypeError,
         "storage_dtypes['done']: example['done'] is bool; only float32 leaves"),
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"h": "bfloat16"}).init(
            {"h": jnp.zeros(2, jnp.float16)}), TypeError,
         "storage_dtypes['h']: example['h'] is float16; only float32 leaves"),
        (lambda: (lambda b: b.add(b.init({"x": jnp.zeros(2)}), {"x": jnp.zeros((3, 2), bool)}))(
            jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"x": "bfloat16"})), TypeError,
         "['x'] is bool; it is stored as bfloat16 from float32"),
        (lambda: jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"y": "float16"}).init(
            {"x": jnp.zeros(2)}), ValueError, "storage_dtypes names ['y'], which the example"),
        (lambda: jaxbuf.make_transition_buffer(2, 8, 2, storage_dtypes={"next_obs": "float16"}),
         ValueError, "storage_dtypes['next_obs']='float16', but a transition buffer stores "
         "next_obs with obs (storage_dtypes['obs']=None): give 'obs' alone"),
        (lambda: jaxbuf.make_transition_buffer(
            2, 8, 2, storage_dtypes={"obs": "float16"},
            goals=jaxbuf.hindsight(lambda a, d: (a == d).astype(jnp.float32))), ValueError,
         "storage_dtypes and goals cannot be combined"),
        (lambda: jaxbuf.make_episode_buffer(
            2, 8, 2, 4, done_fn=lambda s: s["done"], storage_dtypes={"obs": "float16"},
            goals=jaxbuf.hindsight(lambda a, d: (a == d).astype(jnp.float32))), ValueError,
         "storage_dtypes and goals cannot be combined: the reward function reads"),
        (lambda: (lambda b: b.add(b.init({"x": jnp.zeros(2)}), {"x": jnp.zeros((3, 2),
                                                                jnp.int32)}))(
            jaxbuf.make_replay_buffer(8, 2, storage_dtypes={"x": "float16"})), TypeError,
         "['x'] is int32; it is stored as float16 from float32"),
    ],
)  # fmt: skip
def test_bad_storage_dtypes_are_named(make, error, match):
    with pytest.raises(error, match=re.escape(match)):
        make()


SUBNORMALS = np.array([1e-40, -3e-39, 5e-39, 1.1e-38, -1e-45, 1.17e-38], np.float32)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_subnormals_and_every_bit_pattern_round_as_numpy_rounds_them(name):
    """float32 subnormals (bfloat16 keeps float32's exponent range, so it has them
    too), then 100,000 random bit patterns: infinities, nans, the clamp, ties."""
    buffer = jaxbuf.make_replay_buffer(100_000, 2, storage_dtypes={"x": name})
    bits = np.random.default_rng(5).integers(0, 2**32, 100_000 - 6, dtype=np.uint64)
    values = np.concatenate([SUBNORMALS, bits.astype(np.uint32).view(np.float32)])
    state = jax.jit(buffer.add)(buffer.init({"x": jnp.float32(0)}), {"x": values})
    got = np.asarray(buffer.take(state, jnp.arange(values.size))["x"])
    with np.errstate(invalid="ignore", over="ignore"):
        want = rounded(values, name)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    if name == "bfloat16":
        assert (got[[0, 1, 2, 3, 5]] != 0).all() and got[4] == 0  # -1e-45 rounds to -0


def test_bfloat16_rounds_exact_ties_to_even_for_both_signs():
    """Exact ties (the low 16 bits 0x8000), which random bit patterns almost never draw:
    the kept half rounds to the even one, up in magnitude from an odd one, never away
    from zero from an even one, whatever the sign (integer arithmetic, not NumPy's cast)."""
    highs = np.array([0x3F80, 0x3F81, 0x4000, 0x4001, 0x0000, 0x0001, 0x7F00, 0x7F01],
                     np.uint32)  # fmt: skip
    highs = np.concatenate([highs, highs | 0x8000])  # both signs
    ties = ((highs << 16) | 0x8000).view(np.float32)
    buffer = jaxbuf.make_replay_buffer(ties.size, 2, storage_dtypes={"x": "bfloat16"})
    state = jax.jit(buffer.add)(buffer.init({"x": jnp.float32(0)}), {"x": ties})
    got = np.asarray(buffer.take(state, jnp.arange(ties.size))["x"]).view(np.uint32)
    want = np.where(highs % 2 == 0, highs, highs + 1) << 16
    np.testing.assert_array_equal(got, want)
    away = np.where(highs % 2 == 0, highs + 1, highs + 1) << 16  # ties away from zero
    assert (got != away).any()  # the check tells the two roundings apart


FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")


def as_dict_(step):
    return {name: getattr(step, name) for name in FIELDS}


def transition_fields(obs, next_obs):
    return {
        "obs": obs,
        "action": jnp.int32(0),
        "reward": jnp.float32(0),
        "terminated": jnp.bool_(False),
        "truncated": jnp.bool_(False),
        "next_obs": next_obs,
    }


def test_a_transition_buffer_takes_dicts_with_its_field_names_when_narrow():
    """`obs` covers `next_obs` whether the example and the steps are Transitions or
    dicts, mixed either way, and the draws are those of a Transition-fed buffer."""
    buffer = jaxbuf.make_transition_buffer(2, 10, 8, min_episode_length=2,
                                           storage_dtypes={"obs": "bfloat16"})  # fmt: skip
    as_dict = transition_fields(jnp.zeros(6), jnp.zeros(6))
    from_dict, from_step = buffer.init(as_dict), buffer.init(STEP)
    assert from_dict.side.experience.dtype == from_step.side.experience.dtype == jnp.bfloat16
    rng = np.random.default_rng(11)
    for _ in range(6):
        steps = random_steps(rng, 2, 3, 1.0)
        from_dict = buffer.add(from_dict, as_dict_(steps))
        from_step = buffer.add(from_step, steps)
    chex.assert_trees_all_equal(buffer.sample(from_dict, jax.random.key(1)),
                                buffer.sample(from_step, jax.random.key(1)))  # fmt: skip
    step = jax.tree.map(lambda x: x[:, 0], as_dict_(random_steps(rng, 2, 1, 1.0)))
    buffer.add_step(from_step, step)  # a dict step into a state made from a Transition


def test_a_replay_buffer_names_next_obs_as_its_own_leaf():
    example = transition_fields(jnp.zeros(3), jnp.zeros(3))
    only_next = jaxbuf.make_replay_buffer(10, 2, storage_dtypes={"next_obs": "bfloat16"})
    state = only_next.init(example)
    assert state.experience["next_obs"].dtype == jnp.bfloat16
    assert state.experience["obs"].dtype == jnp.float32
    only_obs = jaxbuf.make_replay_buffer(10, 2, storage_dtypes={"obs": "float16"})
    assert only_obs.init(example).experience["next_obs"].dtype == jnp.float32
    both = {"obs": "float16", "next_obs": "float16"}
    transition = jaxbuf.make_transition_buffer(2, 10, 2, storage_dtypes=both)
    assert transition.init(STEP).side.experience.dtype == jnp.float16
