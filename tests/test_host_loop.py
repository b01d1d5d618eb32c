"""blocks and HostLoop: k steps written and k batches drawn in one call, exactly as
k single calls; the host loop's staging, semantics and errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxbuf

N = 2  # environments
TRANSITION = jaxbuf.Transition(jnp.zeros(2), jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                               jnp.bool_(False), jnp.zeros(2))  # fmt: skip
PIXELS = jnp.zeros((3, 2), jnp.uint8)
FRAMES = jaxbuf.Transition(PIXELS, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                           jnp.bool_(False), PIXELS)  # fmt: skip
GOAL_OBS = {"achieved_goal": jnp.int32(0), "desired_goal": jnp.int32(0)}
GOALS = jaxbuf.Transition(GOAL_OBS, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                          jnp.bool_(False), GOAL_OBS)  # fmt: skip
EPISODE = {"obs": jnp.zeros(2), "done": jnp.bool_(False)}
ROLLOUT = {"obs": jnp.zeros(2), "reward": jnp.float32(0), "value": jnp.float32(0),
           "final_value": jnp.float32(0), "terminated": jnp.bool_(False),
           "truncated": jnp.bool_(False)}  # fmt: skip
ITEM = {"obs": jnp.zeros(2), "id": jnp.int32(0)}


def goal_reward(achieved, desired):
    return (achieved == desired).astype(jnp.float32)


# name: (buffer, example, leading axes of one call's data)
CASES = {
    "replay, prioritized": (
        lambda: jaxbuf.make_replay_buffer(10, 4, sampler=jaxbuf.prioritized()), ITEM, (3,)),
    "trajectory, epochs": (
        lambda: jaxbuf.make_trajectory_buffer(N, 8, 3, 3, sampler=jaxbuf.epochs()),
        EPISODE, (N,)),
    "transition, n-step, frames": (
        lambda: jaxbuf.make_transition_buffer(N, 8, 4, n_step=2, frames={"obs": 2}),
        FRAMES, (N,)),
    "transition, goals, prioritized": (
        lambda: jaxbuf.make_transition_buffer(N, 8, 4, goals=jaxbuf.hindsight(goal_reward),
                                              sampler=jaxbuf.prioritized()),
        GOALS, (N,)),
    "episode": (
        lambda: jaxbuf.make_episode_buffer(N, 10, 3, 5, done_fn=lambda step: step["done"]),
        EPISODE, (N,)),
    "vectorized transition": (
        lambda: jaxbuf.vectorize(jaxbuf.make_transition_buffer(N, 8, 4), 2), TRANSITION, (2, N)),
    "vectorized replay": (
        lambda: jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 4), 2), ITEM, (2, 3)),
    "queue": (lambda: jaxbuf.make_queue(12, 2, 3), ITEM, (2,)),
    "rollout": (
        lambda: jaxbuf.make_rollout_buffer(6, N, discount=0.9, gae_lambda=0.9), ROLLOUT, (N,)),
}  # fmt: skip


def random_data(rng, example, lead):
    """Random leaves `[*lead, *leaf]` like `example`'s: bools true 20% of the time."""

    def leaf(x):
        shape = (*lead, *x.shape)
        if x.dtype == jnp.bool_:
            return rng.random(shape) < 0.2
        if jnp.issubdtype(x.dtype, jnp.integer):
            return rng.integers(0, 5, shape).astype(x.dtype)
        return rng.normal(size=shape).astype(x.dtype)

    return jax.tree.map(leaf, example)


def single_add(buffer):
    add = getattr(buffer, "add_step", None) or buffer.add
    return jax.jit(add)


@pytest.mark.parametrize("name", list(CASES))
def test_a_block_writes_and_draws_what_k_single_calls_do(name):
    make, example, lead = CASES[name]
    buffer, k = make(), 3
    blocks = jaxbuf.blocks(buffer, steps_per_call=k)
    write, add = jax.jit(blocks.write), single_add(buffer)
    rng = np.random.default_rng(0)
    state = single = buffer.init(example)
    for _ in range(2 if name == "rollout" else 5):  # 15 steps: the rings wrap around
        steps = random_data(rng, example, (k, *lead))
        state = write(state, steps)
        for j in range(k):
            single = add(single, jax.tree.map(lambda x, j=j: x[j], steps))
        chex.assert_trees_all_equal(state, single)
    if blocks.draw is None:
        assert name == "rollout" and blocks.write_and_draw is None
        return
    key = jax.random.key(1)
    after, block = jax.jit(blocks.draw)(state, key)
    block = jax.device_get(block)  # rows read in NumPy, not by an eager gather each
    if isinstance(buffer, jaxbuf.types.Queue):
        draw = jax.jit(lambda s, _: buffer.pop(s))
    elif buffer.next_batch is not None:
        draw = jax.jit(buffer.next_batch)
    else:
        draw = jax.jit(lambda s, key: (s, buffer.sample(s, key)))
    for j, subkey in enumerate(jax.random.split(key, k)):
        single, batch = draw(single, subkey)
        chex.assert_trees_all_equal(jax.tree.map(lambda x, j=j: x[j], block), batch)
    chex.assert_trees_all_equal(after, single)


def proportions_test(blocks, state, expected, **options):
    """Chi-square of the slots a block's batches drew against `expected`."""
    _, block = jax.jit(lambda s, key: blocks.draw(s, key, **options))(state, jax.random.key(7))
    counts = np.bincount(np.asarray(block.indices).ravel(), minlength=len(expected))
    assert block.indices.shape == (64, 32)
    expected = np.asarray(expected, np.float64)
    assert counts[expected == 0].sum() == 0  # never a slot of priority 0
    drawable = expected > 0
    law = expected[drawable] / expected[drawable].sum() * counts.sum()
    return stats.chisquare(counts[drawable], law).pvalue


def test_block_draws_follow_uniform_and_priority_proportions():
    uniform = jaxbuf.make_replay_buffer(8, 32)
    state = uniform.add(uniform.init(jnp.int32(0)), jnp.arange(8, dtype=jnp.int32))
    assert proportions_test(jaxbuf.blocks(uniform, 64), state, np.full(8, 1 / 8)) > 1e-3
    buffer = jaxbuf.make_replay_buffer(8, 32, sampler=jaxbuf.prioritized(1.0))
    state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(8, dtype=jnp.int32))
    blocks = jaxbuf.blocks(buffer, 64)
    priorities = np.array([1, 2, 3, 4, 0, 5, 6, 9], np.float32)
    state = blocks.set_priorities(state, np.arange(8)[None], priorities[None])
    expected = priorities / priorities.sum()
    assert proportions_test(blocks, state, expected, importance_exponent=0.5) > 1e-3
    # a wrong law is rejected: the test can fail
    assert proportions_test(blocks, state, np.where(priorities > 0, 1.0, 0.0)) < 1e-6


def transition_steps(rng, count):
    return [random_data(rng, TRANSITION, (N,)) for _ in range(count)]


def test_host_loop_state_equals_single_adds_and_blocks_equal_draws():
    buffer = jaxbuf.make_transition_buffer(N, 16, 4, n_step=2, min_size=6)
    blocks = jaxbuf.blocks(buffer, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(3), steps_per_call=4)
    add, draw = jax.jit(buffer.add_step), jax.jit(blocks.draw)
    single, key = buffer.init(TRANSITION), jax.random.key(3)
    steps = transition_steps(np.random.default_rng(0), 22)
    for t, step in enumerate(steps):
        block = loop.add(step)
        single = add(single, step)
        assert loop.staged == (t + 1) % 4
        if (t + 1) % 4:
            assert block is None
            continue
        key, now = jax.random.split(key)
        expected = jax.device_get(draw(single, now)[1])
        chex.assert_trees_all_equal(block, expected)
        assert isinstance(block.valid, np.ndarray)
        # a batch holds what was written up to this call; min_size=6 steps per env
        assert block.valid.all() == (t + 1 >= 6 + 1)  # 6 stored, n=2 needs one more
    assert loop.staged == 2
    chex.assert_trees_all_equal(loop.state, single)  # the 2 staged steps are written
    assert loop.staged == 0 and int(loop.state.added) == 22


def test_host_loop_applies_staged_priorities_before_the_next_write():
    buffer = jaxbuf.make_replay_buffer(6, 4, sampler=jaxbuf.prioritized(1.0))
    loop = jaxbuf.HostLoop(buffer, buffer.init(jnp.int32(0)), jax.random.key(0),
                           steps_per_call=2)  # fmt: skip
    assert loop.add(np.array([0, 1], np.int32)) is None
    block = loop.add(np.array([2, 3], np.int32))
    assert block.indices.shape == (2, 4)
    loop.set_priorities(np.array([[0, 1], [2, 0]]), np.array([[5.0, 1.0], [2.0, 3.0]]))
    loop.add(np.array([4, 5], np.int32))
    loop.add(np.array([6, 7], np.int32))  # rows 0 and 1 overwritten: max priority 5
    tree = loop.state.sampler.tree
    leaves = np.asarray(tree.sums)[len(tree.sums) // 2 :][:6]
    # slot 0: 3.0 set last, then overwritten by item 6 at the running maximum 5
    np.testing.assert_allclose(leaves, [5, 5, 2, 1, 5, 5])


@pytest.mark.parametrize("staged", [0, 1])
def test_flush_applies_staged_priorities_before_a_partial_stage(staged):
    """Priorities staged with a partial stage (or none) are applied by `flush`, before
    the staged steps are written: the rows set keep them, the new row the maximum."""
    buffer = jaxbuf.make_replay_buffer(6, 4, sampler=jaxbuf.prioritized(1.0))
    loop = jaxbuf.HostLoop(buffer, buffer.init(jnp.int32(0)), jax.random.key(0),
                           steps_per_call=2)  # fmt: skip
    loop.add(np.array([0, 1], np.int32))
    loop.add(np.array([2, 3], np.int32))
    loop.set_priorities(np.array([0, 3]), np.array([4.0, 0.5]))
    for item in range(staged):
        loop.add(np.array([4, 5], np.int32) + item)
    loop.flush()
    tree = loop.state.sampler.tree
    leaves = np.asarray(tree.sums)[len(tree.sums) // 2 :][:6]
    np.testing.assert_allclose(leaves, [4, 1, 1, 0.5, *([4, 4] if staged else [0, 0])])
    assert loop.staged == 0 and not loop._priorities


def test_nothing_staged_is_lost_at_an_exception_or_a_save(tmp_path):
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    steps = transition_steps(np.random.default_rng(1), 7)
    with pytest.raises(RuntimeError, match="the learner failed"):  # noqa: SIM117
        with jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0),
                             steps_per_call=4) as loop:  # fmt: skip
            for step in steps:
                loop.add(step)
            raise RuntimeError("the learner failed")
    assert loop.staged == 0 and int(loop._state.added) == 7
    loop.add(steps[0])
    path = jaxbuf.save(tmp_path / "buffer", loop.state, buffer)
    restored = jaxbuf.restore(path, buffer.init(TRANSITION), buffer)
    assert int(restored.added) == 8
    chex.assert_trees_all_equal(restored.experience, loop.state.experience)


def test_host_loop_outputs_torch_and_feeds_a_rollout():
    torch = pytest.importorskip("torch")
    buffer = jaxbuf.make_replay_buffer(8, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(ITEM), jax.random.key(0), steps_per_call=2,
                           output="torch")  # fmt: skip
    rng = np.random.default_rng(0)
    loop.add(random_data(rng, ITEM, (3,)))
    block = loop.add(random_data(rng, ITEM, (3,)))
    assert isinstance(block.experience["obs"], torch.Tensor)
    assert tuple(block.experience["obs"].shape) == (2, 4, 2) and bool(block.valid.all())
    rollout = jaxbuf.make_rollout_buffer(4, N, discount=0.9, gae_lambda=0.9)
    loop = jaxbuf.HostLoop(rollout, rollout.init(ROLLOUT), jax.random.key(0), steps_per_call=4)
    steps = [random_data(rng, ROLLOUT, (N,)) for _ in range(4)]
    assert [loop.add(step) for step in steps] == [None] * 4
    single = rollout.init(ROLLOUT)
    for step in steps:
        single = rollout.add(single, step)
    chex.assert_trees_all_equal(loop.state, single)
    with pytest.raises(TypeError, match="draws no batches"):
        loop.draw()


def test_host_loop_draw_flushes_first_and_options_are_traced():
    buffer = jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.prioritized())
    loop = jaxbuf.HostLoop(buffer, buffer.init(jnp.int32(0)), jax.random.key(0), steps_per_call=4,
                           batches_per_call=2, output="jax", importance_exponent=1.0)  # fmt: skip
    empty = loop.draw()
    assert empty.indices.shape == (2, 4) and not bool(empty.valid.any())
    loop.add(np.array([1, 2], np.int32))
    loop.sample_options["importance_exponent"] = 0.5
    block = loop.draw()  # the staged step is written first
    assert bool(block.valid.all()) and set(np.asarray(block.experience).ravel()) <= {1, 2}
    assert loop._calls._draw._cache_size() == 1  # beta changed without recompiling


def bad_step(field, value):
    step = random_data(np.random.default_rng(0), TRANSITION, (N,))
    return step.replace(**{field: value})


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda loop: loop.add(bad_step("reward", np.zeros(N, np.float64))), TypeError,
         r"step\.reward: expected float32\[2\] like the loop's first step, got float64\[2\]"),
        (lambda loop: loop.add(bad_step("obs", np.zeros((N, 3), np.float32))), TypeError,
         r"step\.obs: expected float32\[2, 2\]"),
        (lambda loop: loop.add({"obs": np.zeros(2)}), ValueError,
         r"step lacks step\.obs and has step\['obs'\], which the first step had not \(5 more"),
        (lambda loop: loop.add(bad_step("next_obs", None)), ValueError,
         r"step lacks step\.next_obs: every step needs the loop's first step's leaves"),
        (lambda loop: loop.add(bad_step("obs", {"pixels": np.zeros((N, 2), np.float32)})),
         ValueError, r"step lacks step\.obs and has step\.obs\['pixels'\]"),
        (lambda loop: loop.add(bad_step("obs", [np.zeros((N, 2), np.float32)])),
         ValueError, r"step lacks step\.obs and has step\.obs\[0\]"),
        (lambda loop: loop.set_priorities(np.zeros(2, int), np.zeros(2)), TypeError,
         "sampler=jaxbuf.prioritized"),
    ],
)  # fmt: skip
def test_host_loop_rejects_a_bad_step_and_keeps_what_is_staged(call, error, match):
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0), steps_per_call=4)
    good = transition_steps(np.random.default_rng(2), 2)
    for step in good:
        loop.add(step)
    with pytest.raises(error, match=match):
        call(loop)
    assert loop.staged == 2
    assert int(loop.state.added) == 2
    np.testing.assert_array_equal(loop.state.experience["obs"][:, 1], good[1].obs)


def test_host_loop_checks_the_first_step_against_the_buffer():
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0), steps_per_call=4)
    with pytest.raises(TypeError, match="reward"):
        loop.add(bad_step("reward", np.zeros(N, np.float64)))
    with pytest.raises(ValueError, match="num_envs"):
        loop.add(random_data(np.random.default_rng(0), TRANSITION, (3,)))
    assert loop.staged == 0


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda b, s: jaxbuf.HostLoop(b, s, jax.random.key(0), steps_per_call=17), ValueError,
         r"steps_per_call must be in \[1, 16\], got 17"),
        (lambda b, s: jaxbuf.HostLoop(b, s, jax.random.key(0), steps_per_call=2, output="list"),
         ValueError, "output must be one of"),
        (lambda b, s: jaxbuf.HostLoop(b, s, 0, steps_per_call=2), TypeError, "key must be a PRNG"),
        (lambda b, s: jaxbuf.blocks(b, 4, batches_per_call=-1), ValueError, "batches_per_call"),
        (lambda b, s: jaxbuf.blocks(jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9),
                                    2, batches_per_call=2), ValueError, "must be 0 for a rollout"),
        (lambda b, s: jaxbuf.blocks(object(), 2), TypeError, "blocks takes a jaxbuf buffer"),
        (lambda b, s: jaxbuf.blocks(b, 4).write(s, jax.tree.map(lambda x: x[None], TRANSITION)),
         ValueError, r"steps\.obs: expected a leading axis of steps_per_call=4 steps"),
        (lambda b, s: jaxbuf.blocks(jaxbuf.make_replay_buffer(
            8, 2, sampler=jaxbuf.prioritized()), 2).set_priorities(s, jnp.zeros((2, 2), int),
                                                                   jnp.zeros(4)),
         ValueError, "one shape"),
    ],
)  # fmt: skip
def test_block_configuration_errors(make, error, match):
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    with pytest.raises(error, match=match):
        make(buffer, buffer.init(TRANSITION))


def test_partial_flushes_keep_every_step_in_order():
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0), steps_per_call=4)
    add, single = jax.jit(buffer.add_step), buffer.init(TRANSITION)
    for count in (2, 3, 1, 5, 6):  # flushes of 2, 3, 1, then 4 + 1, 4 + 2 staged steps
        for step in transition_steps(np.random.default_rng(count), count):
            loop.add(step)
            single = add(single, step)
        chex.assert_trees_all_equal(loop.state, single)
        assert loop.staged == 0


@pytest.mark.parametrize(
    "make",
    [lambda: jaxbuf.make_replay_buffer(8, 2),
     lambda: jaxbuf.make_replay_buffer(8, 2, sampler=jaxbuf.prioritized()),
     lambda: jaxbuf.make_replay_buffer(8, 2, sampler=jaxbuf.epochs()),
     lambda: jaxbuf.vectorize(jaxbuf.make_replay_buffer(8, 2), 2)],
    ids=["uniform", "prioritized", "epochs", "vectorized"],
)  # fmt: skip
def test_k_replay_steps_beyond_the_capacity_are_k_single_adds(make):
    """k steps of n items with k * n over the capacity: the newest `capacity` items are kept,
    as k single adds keep them, by blocks and by a HostLoop (which used to strand them)."""
    buffer = make()
    lead = (3,) if buffer.config.get("num_buffers") is None else (2, 3)
    rng = np.random.default_rng(5)
    steps = [random_data(rng, ITEM, lead) for _ in range(10)]
    add, single = jax.jit(buffer.add), buffer.init(ITEM)
    for step in steps:
        single = add(single, step)
    draws = buffer.config.sampler.kind != "epochs"  # an epoch's draws move its state on
    loop = jaxbuf.HostLoop(buffer, buffer.init(ITEM), jax.random.key(0), steps_per_call=4,
                           batches_per_call=None if draws else 0)  # fmt: skip
    blocks = [loop.add(step) for step in steps]
    assert [block is None for block in blocks] == [True, True, True, not draws] * 2 + [True] * 2
    chex.assert_trees_all_equal(loop.state, single)
    write = jax.jit(jaxbuf.blocks(buffer, 5).write)
    stacked = (
        jax.tree.map(lambda *x: np.stack(x), *steps[:5]),
        jax.tree.map(lambda *x: np.stack(x), *steps[5:]),
    )
    chex.assert_trees_all_equal(write(write(buffer.init(ITEM), stacked[0]), stacked[1]), single)


def test_a_failed_call_strands_nothing_and_the_next_add_writes_the_stage(monkeypatch):
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0), steps_per_call=4)
    steps = transition_steps(np.random.default_rng(4), 9)
    draw = loop._calls._draw

    def fails_once(*args):
        loop._calls._draw = draw
        raise RuntimeError("the device failed")

    loop._calls._draw = fails_once
    for step in steps[:3]:
        loop.add(step)
    with pytest.raises(RuntimeError, match="the device failed"):
        loop.add(steps[3])  # the call that writes 4 steps and draws fails
    assert loop.staged == 4
    for step in steps[4:]:  # the next add writes the stage, then stages its step
        loop.add(step)
    add, single = jax.jit(buffer.add_step), buffer.init(TRANSITION)
    for step in steps:
        single = add(single, step)
    chex.assert_trees_all_equal(loop.state, single)


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_partial_flush_that_fails_midway_keeps_the_unwritten_steps(fail_at):
    buffer = jaxbuf.make_transition_buffer(N, 16, 4)
    loop = jaxbuf.HostLoop(buffer, buffer.init(TRANSITION), jax.random.key(0), steps_per_call=4)
    steps = transition_steps(np.random.default_rng(6), 6)
    for step in steps[:3]:
        loop.add(step)
    one, calls = loop._calls.one, []

    def fails(state, step):
        calls.append(1)
        if len(calls) == fail_at + 1:
            raise RuntimeError("the device failed")
        return one(state, step)

    loop._calls.one = fails
    with pytest.raises(RuntimeError, match="the device failed"):
        loop.flush()
    assert loop.staged == 3 - fail_at  # the written ones are gone from the stage, no more
    loop._calls.one = one
    for step in steps[3:]:
        loop.add(step)
    add, single = jax.jit(buffer.add_step), buffer.init(TRANSITION)
    for step in steps:
        single = add(single, step)
    chex.assert_trees_all_equal(loop.state, single)
