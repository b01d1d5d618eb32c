"""The drop-in `jaxbuf.flashbax` against Flashbax itself: same calls, same states, the
same uniform samples bit for bit, the same prioritised probabilities."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
import jaxbuf.flashbax as ours

fbx = pytest.importorskip("flashbax")
ROWS = 2
EXAMPLE = {"obs": jnp.zeros(3), "id": jnp.int32(0)}


def allowed(fn):
    """A Flashbax function run with JAX's default rank and dtype promotion (its code relies
    on them; jaxbuf's tests make them errors, so the drop-in's own code is checked without)."""

    def run(*args, **kwargs):
        with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return run


def flashbax_buffer(factory, **kwargs):
    """A Flashbax buffer whose functions allow rank promotion."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buffer = getattr(fbx, factory)(**kwargs)
    names = ("init", "add", "sample", "can_sample", "set_priorities", "can_add")
    return buffer.replace(**{n: allowed(getattr(buffer, n)) for n in names if hasattr(buffer, n)})


def chunk(rng, start: int, rows: int | None, length: int | None) -> dict:
    """Steps numbered from `start`: `[rows, length, ...]`, an axis left out where None."""
    shape = tuple(n for n in (rows, length) if n is not None)
    ids = start + np.arange(int(np.prod(shape, dtype=int))).reshape(shape).astype(np.int32)
    obs = rng.normal(size=(*shape, 3)).astype(np.float32)
    return {"obs": jnp.asarray(obs), "id": jnp.asarray(ids)}


def same(a, b) -> None:
    """Equal leaves, in order (the records are each library's own classes)."""
    left, right = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(left) == len(right)
    for x, y in zip(left, right, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same_state(a, b) -> None:
    same(a.experience, b.experience)
    for name in ("current_index", "is_full", "write_index", "read_index", "running_index"):
        if hasattr(b, name):
            assert int(getattr(a, name)) == int(getattr(b, name)), name


UNIFORM = {
    "trajectory": (
        "make_trajectory_buffer",
        dict(
            add_batch_size=ROWS,
            sample_batch_size=16,
            sample_sequence_length=3,
            period=2,
            min_length_time_axis=3,
            max_length_time_axis=9,
        ),
        (ROWS, True),
    ),
    "flat": (
        "make_flat_buffer",
        dict(max_length=12, min_length=2, sample_batch_size=8),
        (None, False),
    ),
    "flat batched": (
        "make_flat_buffer",
        dict(
            max_length=16,
            min_length=2,
            sample_batch_size=8,
            add_sequences=True,
            add_batch_size=ROWS,
        ),
        (ROWS, True),
    ),
    "item": (
        "make_item_buffer",
        dict(max_length=10, min_length=1, sample_batch_size=8, add_batches=True),
        (4, False),
    ),
}


@pytest.mark.parametrize("name", list(UNIFORM))
def test_uniform_buffers_sample_as_flashbax_bit_for_bit(name):
    factory, kwargs, (rows, sequences) = UNIFORM[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = getattr(ours, factory)(**kwargs)
    theirs = flashbax_buffer(factory, **kwargs)
    mine_add, theirs_add = jax.jit(mine.add, donate_argnums=0), jax.jit(theirs.add)
    mine_sample, theirs_sample = jax.jit(mine.sample), jax.jit(theirs.sample)
    state, reference = mine.init(EXAMPLE), theirs.init(EXAMPLE)
    rng, added = np.random.default_rng(len(name)), 0
    for step in range(14):  # several wrap-arounds
        length = int(rng.integers(1, 4)) if sequences else None
        data = chunk(rng, added, rows, length)
        added += int(np.prod(data["id"].shape))
        state, reference = mine_add(state, data), theirs_add(reference, data)
        same_state(state, reference)
        assert bool(mine.can_sample(state)) == bool(theirs.can_sample(reference))
        for key in jax.random.split(jax.random.key(step), 2):
            same(mine_sample(state, key), theirs_sample(reference, key))


def test_the_queue_and_the_mixer_are_flashbaxs():
    kwargs = dict(
        max_length_time_axis=7, add_batch_size=ROWS, add_sequence_length=3, sample_sequence_length=2
    )
    mine, theirs = (
        ours.make_trajectory_queue(**kwargs),
        flashbax_buffer("make_trajectory_queue", **kwargs),
    )
    state, reference, rng, added = (
        mine.init(EXAMPLE),
        theirs.init(EXAMPLE),
        np.random.default_rng(1),
        0,
    )
    for _ in range(30):
        assert bool(mine.can_add(state)) == bool(theirs.can_add(reference))
        assert bool(mine.can_sample(state)) == bool(theirs.can_sample(reference))
        if mine.can_add(state) and rng.random() < 0.6:
            data = chunk(rng, added, ROWS, 3)
            state, reference, added = mine.add(state, data), theirs.add(reference, data), added + 6
        elif mine.can_sample(state):
            (state, got), (reference, want) = mine.sample(state), theirs.sample(reference)
            same(got, want)
        same_state(state, reference)
    kwargs = UNIFORM["trajectory"][1]
    pairs = [
        (ours.make_trajectory_buffer(**kwargs), flashbax_buffer("make_trajectory_buffer", **kwargs))
        for _ in range(2)
    ]
    data = [chunk(rng, 100 * i, ROWS, 5) for i in range(2)]
    states = [[b.add(b.init(EXAMPLE), data[i]) for b in pair] for i, pair in enumerate(pairs)]
    mixers = [
        m.make_mixer([p[i] for p in pairs], 10, [0.7, 0.3]) for i, m in enumerate((ours, fbx))
    ]
    mixers[1] = mixers[1].replace(sample=allowed(mixers[1].sample))
    key = jax.random.key(3)
    same(
        mixers[0].sample([s[0] for s in states], key), mixers[1].sample([s[1] for s in states], key)
    )
    assert bool(mixers[0].can_sample([s[0] for s in states]))


PRIORITISED = {
    "trajectory": (
        "make_prioritised_trajectory_buffer",
        dict(
            add_batch_size=ROWS,
            sample_batch_size=16,
            sample_sequence_length=2,
            period=2,
            min_length_time_axis=2,
            max_length_time_axis=9,
            priority_exponent=0.7,
        ),
        (ROWS, True),
    ),
    "flat": (
        "make_prioritised_flat_buffer",
        dict(max_length=12, min_length=2, sample_batch_size=8),
        (None, False),
    ),
    "item": (
        "make_prioritised_item_buffer",
        dict(
            max_length=10,
            min_length=1,
            sample_batch_size=8,
            add_batches=True,
            priority_exponent=1.0,
        ),
        (4, False),
    ),
}


def drawable_items(state, length: int, period: int) -> np.ndarray:
    """bool per Flashbax item number: whether its `length` steps from `t = item * period` of
    its row are stored, one after the other (a NumPy reference)."""
    rows, capacity = jax.tree.leaves(state.experience)[0].shape[:2]
    written, per_row = int(state.running_index), capacity // period
    oldest = max(0, written - capacity)
    starts = {s % capacity for s in range(oldest, written - length + 1)}
    one_row = np.array([j * period in starts for j in range(per_row)])
    return np.tile(one_row, rows)


def leaves_of(state, buffer):
    """A drop-in state's item priorities (to the exponent), in Flashbax's item order."""
    tree = ours.to_flashbax(state, buffer).sum_tree_state
    first = 2**tree.tree_depth - 1
    return np.asarray(tree.nodes[first : first + tree.capacity])


@pytest.mark.parametrize("name", list(PRIORITISED))
def test_prioritised_buffers_keep_flashbaxs_items_priorities_and_probabilities(name):
    factory, kwargs, (rows, sequences) = PRIORITISED[name]
    length, period = (
        kwargs.get("sample_sequence_length", 2 - name.endswith("item")),
        kwargs.get("period", 1),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = getattr(ours, factory)(**kwargs)
    theirs = flashbax_buffer(factory, **kwargs)
    add, sample, update = jax.jit(mine.add), jax.jit(mine.sample), jax.jit(mine.set_priorities)
    state, reference = mine.init(EXAMPLE), theirs.init(EXAMPLE)
    rng, added = np.random.default_rng(7), 0
    for step in range(14):
        data = chunk(rng, added, rows, int(rng.integers(1, 4)) if sequences else None)
        added += int(np.prod(data["id"].shape))
        state, reference = add(state, data), jax.jit(theirs.add)(reference, data)
        same_state(state, reference)
        batch = sample(state, jax.random.key(step))
        tree = reference.sum_tree_state
        first = 2**tree.tree_depth - 1
        theirs_leaves = np.asarray(tree.nodes[first : first + tree.capacity], np.float64)
        drawable = drawable_items(reference, length, period)
        mine_leaves = leaves_of(state, mine)
        np.testing.assert_array_equal(mine_leaves > 0, drawable & (theirs_leaves > 0))
        np.testing.assert_allclose(mine_leaves[drawable], theirs_leaves[drawable], rtol=1e-6)
        # Flashbax's own probabilities divide by a root that drifts from its leaves' sum and
        # can count an item not yet written (see the docs): the drop-in's are Flashbax's
        # leaves over the drawable items' sum
        values = np.where(drawable, theirs_leaves, 0.0)
        if values.sum() > 0:
            want = values[np.asarray(batch.indices)] / values.sum()
            np.testing.assert_allclose(np.asarray(batch.probabilities), want, rtol=1e-5)
            assert (want > 0).all()
        new = jnp.asarray(
            rng.random(batch.indices.shape) * (rng.random(batch.indices.shape) > 0.2), jnp.float32
        )
        state = update(state, batch.indices, new)
        reference = jax.jit(theirs.set_priorities)(reference, batch.indices, new)


def test_flashbax_52s_updates_keep_the_total_the_sum_of_the_leaves():
    """Flashbax #52's script (priorities of one sample set again and again): Flashbax's
    float32 root drifts from its leaves' sum until draws land on unwritten items; the
    drop-in's total stays the sum, and every draw has a positive probability."""
    rows, length = 8, 16
    buffer = ours.make_prioritised_trajectory_buffer(
        add_batch_size=rows,
        sample_batch_size=rows,
        sample_sequence_length=length,
        period=1,
        min_length_time_axis=length,
        max_length_time_axis=length * 4,
    )
    state = buffer.add(buffer.init(0.0), jnp.zeros((rows, length * 2)))
    indices = buffer.sample(state, jax.random.key(42)).indices

    def update(state, key):
        priorities = jax.random.uniform(key, (rows,), minval=0.1, maxval=5)
        state = buffer.set_priorities(state, indices, priorities)
        return state, buffer.sample(state, key).probabilities

    state, probabilities = jax.jit(lambda s, k: jax.lax.scan(update, s, k))(
        state, jax.random.split(jax.random.key(0), 1000)
    )
    leaves = leaves_of(state, buffer).astype(np.float64)
    np.testing.assert_allclose(float(state.sum_tree_state.tree.total), leaves.sum(), rtol=1e-6)
    assert (np.asarray(probabilities) > 0).all()


def test_a_zero_priority_item_is_never_drawn_in_float32():
    """Rainbow's use: an item added and priorities |td error| set after every draw, zeros
    and 2e-9 .. 2e4 among them, in float32 over thousands of steps."""
    buffer = ours.make_prioritised_item_buffer(
        max_length=60, min_length=1, sample_batch_size=32, priority_exponent=0.6
    )

    def step(state, inputs):
        key, item = inputs
        state = buffer.add(state, item)
        batch = buffer.sample(state, key)
        words = jax.random.uniform(key, batch.indices.shape, minval=-30.0, maxval=10.0)
        td = jnp.where(words < -20, 0.0, jnp.exp(words))
        return buffer.set_priorities(state, batch.indices, td), batch.probabilities

    steps = 3000
    inputs = (jax.random.split(jax.random.key(0), steps), jnp.arange(steps, dtype=jnp.int32))
    _, probabilities = jax.jit(lambda s, i: jax.lax.scan(step, s, i))(
        buffer.init(jnp.int32(0)), inputs
    )
    assert (np.asarray(probabilities) > 0).all()


def test_states_travel_to_flashbax_and_back_and_through_a_checkpoint(tmp_path):
    kwargs = PRIORITISED["trajectory"][1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the time axis cut to a multiple of the period
        mine = ours.make_prioritised_trajectory_buffer(**kwargs)
    theirs = flashbax_buffer("make_prioritised_trajectory_buffer", **kwargs)
    state = mine.add(mine.init(EXAMPLE), chunk(np.random.default_rng(0), 0, ROWS, 7))
    state = mine.set_priorities(state, jnp.array([0, 1, 4]), jnp.array([2.0, 0.0, 5.0]))
    theirs_state = ours.to_flashbax(state, mine)
    same_state(theirs_state, state)
    back = ours.from_flashbax(theirs_state, mine)
    np.testing.assert_array_equal(leaves_of(back, mine), leaves_of(state, mine))
    np.testing.assert_allclose(
        back.sum_tree_state.max_priority, state.sum_tree_state.max_priority, rtol=1e-6
    )
    batch = theirs.sample(theirs_state, jax.random.key(0))  # Flashbax draws from what we gave it
    assert set(np.asarray(batch.indices).tolist()) <= {0, 2, 4, 5, 6}  # 7 steps; item 1 is 0
    folder = jaxbuf.save(tmp_path / "ckpt", state)
    restored = jaxbuf.restore(folder, jax.eval_shape(mine.init, EXAMPLE))
    same(restored, state)
    uniform = ours.make_item_buffer(8, 1, 2, add_batches=True)
    plain = uniform.add(uniform.init(EXAMPLE), chunk(np.random.default_rng(1), 0, 3, None))
    same_state(ours.from_flashbax(ours.to_flashbax(plain)), plain)


def test_vmap_over_buffers_and_donation():
    buffer = ours.make_flat_buffer(
        max_length=16, min_length=2, sample_batch_size=4, add_batch_size=ROWS
    )
    states = jax.vmap(lambda _: buffer.init(EXAMPLE))(jnp.arange(3))
    data = jax.tree.map(
        lambda x: jnp.stack([x] * 3), chunk(np.random.default_rng(0), 0, ROWS, None)
    )
    states = jax.jit(jax.vmap(buffer.add), donate_argnums=0)(states, data)
    batch = jax.vmap(buffer.sample)(states, jax.random.split(jax.random.key(0), 3))
    assert batch.experience.first["obs"].shape == (3, 4, 3)
    before = buffer.add(buffer.init(EXAMPLE), jax.tree.map(lambda x: x[0], data))
    pointer = before.experience["obs"].unsafe_buffer_pointer()
    after = jax.jit(buffer.add, donate_argnums=0)(before, jax.tree.map(lambda x: x[0], data))
    assert after.experience["obs"].unsafe_buffer_pointer() == pointer
    queue = ours.make_trajectory_queue(8, ROWS, 2, 2)  # a donated fresh state: no leaf twice
    state = jax.jit(queue.add, donate_argnums=0)(
        queue.init(EXAMPLE), chunk(np.random.default_rng(0), 0, ROWS, 2)
    )
    assert int(state.write_index) == 2


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (
            "make_trajectory_buffer",
            dict(
                add_batch_size=2,
                sample_batch_size=4,
                sample_sequence_length=9,
                period=1,
                min_length_time_axis=9,
                max_length_time_axis=8,
            ),
            "`sample_sequence_length` (9) must be less than or equal to `max_length_time_axis` (8)",
        ),
        (
            "make_trajectory_buffer",
            dict(
                add_batch_size=2,
                sample_batch_size=4,
                sample_sequence_length=2,
                period=1,
                min_length_time_axis=2,
                max_size=16,
                max_length_time_axis=8,
            ),
            "Cannot specify both `max_size` and `max_length_time_axis`",
        ),
        (
            "make_flat_buffer",
            dict(max_length=8, min_length=2, sample_batch_size=9),
            "sample_batch_size (9) must be less than or equal to max_length (8)",
        ),
        (
            "make_flat_buffer",
            dict(max_length=8, min_length=2, sample_batch_size=2, add_batch_size=8),
            "max_length // add_batch_size (8 // 8) must be at least 2",
        ),
        (
            "make_item_buffer",
            dict(max_length=8, min_length=9, sample_batch_size=2),
            "min_length (9) cannot be larger than max_length (8)",
        ),
        (
            "make_prioritised_item_buffer",
            dict(max_length=8, min_length=1, sample_batch_size=2, priority_exponent=1.5),
            "priority_exponent must be",
        ),
        (
            "make_mixer",
            dict(buffers=[], sample_batch_size=4, proportions=[1]),
            "Number of buffers (0) and proportions (1) must match",
        ),
    ],
)
def test_argument_errors_say_what_flashbax_says(factory, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(ours, factory)(**kwargs)


def test_a_wrong_leaf_at_add_is_named():
    buffer = ours.make_flat_buffer(
        max_length=16, min_length=2, sample_batch_size=4, add_batch_size=ROWS
    )
    state = buffer.init(EXAMPLE)
    with pytest.raises(ValueError, match=r"\['obs'\]"):
        buffer.add(state, {"obs": jnp.zeros((ROWS, 4)), "id": jnp.zeros(ROWS, jnp.int32)})
    with pytest.raises(TypeError, match=r"\['id'\]"):
        buffer.add(state, {"obs": jnp.zeros((ROWS, 3)), "id": jnp.zeros(ROWS, jnp.float32)})


def test_pmap_over_two_devices_as_flashbaxs_users_run_it():
    """Stoix and Mava pmap their learners: one buffer state per device, the same samples
    as Flashbax's on each."""
    script = """
import jax, jax.numpy as jnp, numpy as np, flashbax, jaxbuf.flashbax as fbx
jax.config.update("jax_numpy_rank_promotion", "allow")  # Flashbax's code relies on it
assert jax.local_device_count() == 2
kw = dict(add_batch_size=2, sample_batch_size=8, sample_sequence_length=2, period=1,
          min_length_time_axis=2, max_length_time_axis=6)
results = []
for lib in (fbx, flashbax):
    b = lib.make_trajectory_buffer(**kw)
    s = jax.pmap(b.init)(jnp.zeros((2, 3)))
    data = jnp.arange(2 * 2 * 5 * 3, dtype=jnp.float32).reshape(2, 2, 5, 3)
    s = jax.pmap(b.add)(s, data)
    keys = jax.random.split(jax.random.key(0), 2)
    results.append(np.asarray(jax.pmap(b.sample)(s, keys).experience))
np.testing.assert_array_equal(*results)
print("ok")
"""
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    import os

    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **env},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def purejaxrl_style_training(fbx_module, steps: int = 40):
    """A PureJaxRL-style DQN loop written once against `fbx_module`'s names: a flat
    buffer of TimeSteps inside a jitted scan, `can_sample` under `lax.cond`, a linear Q
    function fitted to `first.reward + 0.9 * max Q(second.obs)`."""
    envs, obs_size, actions = 4, 3, 2
    buffer = fbx_module.make_flat_buffer(max_length=64, min_length=8, sample_batch_size=8,
                                         add_sequences=False, add_batch_size=envs)  # fmt: skip
    timestep = {"obs": jnp.zeros(obs_size), "action": jnp.int32(0), "reward": jnp.float32(0),
                "done": jnp.bool_(False)}  # fmt: skip
    params = jnp.zeros((obs_size, actions))

    def update(params, batch):
        def loss(params):
            q = (batch.first["obs"] @ params)[jnp.arange(8), batch.first["action"]]
            live = 1.0 - batch.first["done"].astype(jnp.float32)
            target = batch.first["reward"] + 0.9 * live * jnp.max(
                batch.second["obs"] @ params, axis=-1)  # fmt: skip
            return jnp.mean((q - jax.lax.stop_gradient(target)) ** 2)

        return params - 0.1 * jax.grad(loss)(params)

    def step(carry, key):
        params, state = carry
        obs_key, act_key, sample_key = jax.random.split(key, 3)
        obs = jax.random.normal(obs_key, (envs, obs_size))
        action = jax.random.randint(act_key, (envs,), 0, actions)
        reward, done = obs[:, 0], obs[:, 1] > 1.0
        state = buffer.add(state, {"obs": obs, "action": action, "reward": reward, "done": done})
        params = jax.lax.cond(buffer.can_sample(state),
                              lambda p: update(p, buffer.sample(state, sample_key).experience),
                              lambda p: p, params)  # fmt: skip
        return (params, state), None

    run = jax.jit(lambda carry, keys: jax.lax.scan(step, carry, keys)[0])
    return run((params, buffer.init(timestep)), jax.random.split(jax.random.key(0), steps))


def test_a_purejaxrl_style_learner_changes_only_its_import():
    params, state = purejaxrl_style_training(ours)
    with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
        reference_params, reference_state = purejaxrl_style_training(fbx)
    np.testing.assert_array_equal(params, reference_params)  # the same samples, bit for bit
    same_state(state, reference_state)
