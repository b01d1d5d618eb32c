"""HostLoop's blocks: memory reused across calls (never under a block still held),
prefetched blocks and what they can contain, and blocks delivered on another device."""

import os
import pathlib
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf

N, K = 2, 4
FRAME = jnp.zeros((6, 6), jnp.uint8)
EXAMPLE = jaxbuf.Transition(FRAME, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                            jnp.bool_(False), FRAME)  # fmt: skip


def steps(count: int, rng=None) -> list[jaxbuf.Transition]:
    """Steps whose `action` is their time `t` (so a batch tells which steps it drew)."""
    rng = rng or np.random.default_rng(0)
    return [jaxbuf.Transition(
        rng.integers(0, 255, (N, 6, 6), dtype=np.uint8), np.full(N, t, np.int32),
        rng.normal(size=N).astype(np.float32), rng.random(N) < 0.1, np.zeros(N, bool),
        rng.integers(0, 255, (N, 6, 6), dtype=np.uint8)) for t in range(count)]  # fmt: skip


def loop_of(**options) -> jaxbuf.HostLoop:
    buffer = jaxbuf.make_transition_buffer(N, 32, 4)
    return jaxbuf.HostLoop(buffer, buffer.init(EXAMPLE), jax.random.key(3), steps_per_call=K,
                           **options)  # fmt: skip


def test_the_memory_of_dropped_blocks_is_reused_and_a_held_block_never_changes():
    loop, pointers = loop_of(), []
    held, kept = None, None
    for t, step in enumerate(steps(12 * K)):
        block = loop.add(step)
        if block is None:
            continue
        pointers.append(block.experience.obs.ctypes.data)
        if t == 3 * K - 1:
            held, kept = block, jax.tree.map(np.copy, block)
        del block
    # every call is given back the block of two calls before, once no one holds it
    assert sum(a == b for a, b in zip(pointers[4:], pointers[2:-2], strict=True)) >= 6
    assert pointers[2] not in pointers[3:], "a held block's memory is never written again"
    chex.assert_trees_all_equal(held, kept)


def test_jax_blocks_are_reused_once_dropped_and_never_while_held():
    loop, pointers, held = loop_of(output="jax"), [], {}
    for t, step in enumerate(steps(14 * K)):
        block = loop.add(step)
        if block is None:
            continue
        pointers.append(block.experience.obs.unsafe_buffer_pointer())
        if t in (3 * K - 1, 6 * K - 1):  # a whole block, and one leaf alone
            held[t] = block if t == 3 * K - 1 else block.experience.obs
            held[-t] = np.array(held[t].experience.obs if t == 3 * K - 1 else held[t])
        del block
    assert sum(a == b for a, b in zip(pointers[4:], pointers[2:-2], strict=True)) >= 6
    for index in (2, 5):
        assert pointers[index] not in pointers[index + 1 :], "a held block is never written"
    np.testing.assert_array_equal(held[3 * K - 1].experience.obs, held[-(3 * K - 1)])
    np.testing.assert_array_equal(held[6 * K - 1], held[-(6 * K - 1)])


@pytest.mark.parametrize("output", ["numpy", "jax"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_the_drawing_call_compiles_once_when_learning_starts(output, prefetch):
    """Writing only before learning, then drawing: one drawing program, whether the
    block given back is new (first calls), spent, or still held by the caller; with
    prefetch, a second that draws alone (the first call draws twice)."""
    loop, kept = loop_of(output=output, prefetch=prefetch), []
    for t, step in enumerate(steps(12 * K)):
        block = loop.add(step, draw=t >= 3 * K)
        if block is not None and t % (3 * K) == K - 1:
            kept.append(block)
    assert loop._calls._draw._cache_size() == (2 if prefetch else 1)
    assert loop._calls._write._cache_size() == 1


@pytest.mark.parametrize("output", ["jax", "torch"])
def test_held_blocks_stay_valid_in_every_output(output):
    if output == "torch":
        pytest.importorskip("torch")
    loop = loop_of(output=output)
    blocks = [b for b in map(loop.add, steps(8 * K)) if b is not None]
    copies = [jax.tree.map(host_copy, b) for b in blocks]
    for step in steps(8 * K, np.random.default_rng(1)):
        loop.add(step)
    for block, copy in zip(blocks, copies, strict=True):
        chex.assert_trees_all_equal(jax.tree.map(host_copy, block), copy)


def host_copy(leaf) -> np.ndarray:
    """A NumPy copy of a JAX array or a Torch tensor."""
    return leaf.numpy().copy() if hasattr(leaf, "numpy") else np.array(leaf)


def reference_blocks(all_steps, prefetch: bool) -> list:
    """The blocks a loop returns, from the pure functions: without prefetch, call
    `i` returns `draw(state_i, key_i)`; with it, the block drawn one call before
    (the first call draws twice from `state_0`)."""
    buffer = jaxbuf.make_transition_buffer(N, 32, 4)
    blocks = jaxbuf.blocks(buffer, K)
    write, draw = jax.jit(blocks.write), jax.jit(blocks.draw)
    state, key, drawn = buffer.init(EXAMPLE), jax.random.key(3), []
    for i in range(len(all_steps) // K):
        stage = jax.tree.map(lambda *x: np.stack(x), *all_steps[i * K : (i + 1) * K])
        state = write(state, stage)
        for _ in range(2 if prefetch and i == 0 else 1):
            key, now = jax.random.split(key)
            drawn.append(draw(state, now)[1])
    return drawn[: len(all_steps) // K]


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_block_is_drawn_by_its_own_call_or_with_prefetch_by_the_one_before(prefetch):
    all_steps = steps(10 * K)
    loop = loop_of(prefetch=prefetch)
    got = [b for b in map(loop.add, all_steps) if b is not None]
    for i, (block, expected) in enumerate(zip(got, reference_blocks(all_steps, prefetch),
                                              strict=True)):  # fmt: skip
        chex.assert_trees_all_equal(block, jax.tree.map(np.asarray, expected))
        # what a block can contain: steps written by its own call, or with prefetch
        # (after the first call) only by the calls before it
        newest = (i + 1) * K - 1 if not prefetch or i == 0 else i * K - 1
        assert block.experience.action[block.valid].max() <= newest


def test_a_prefetched_block_of_a_replaced_state_is_dropped():
    """After `loop.state = new`, the next block holds only steps of the new state:
    those staged after it (actions 100+), none of the state replaced (actions < 100)."""
    loop = loop_of(prefetch=True)
    for step in steps(3 * K):
        loop.add(step)
    loop.state = jaxbuf.make_transition_buffer(N, 32, 4).init(EXAMPLE)
    later = [step.replace(action=step.action + 100) for step in steps(K)]
    block = next(b for b in map(loop.add, later) if b is not None)
    assert (block.experience.action[block.valid] >= 100).all() and block.valid.any()


def test_prefetch_loses_no_step_at_a_save_or_the_end_of_a_run(tmp_path):
    plain, ahead = loop_of(), loop_of(prefetch=True)
    all_steps = steps(7 * K + 3)
    for step in all_steps:
        plain.add(step)
        ahead.add(step)
    jaxbuf.save(tmp_path / "ahead", ahead.state)
    chex.assert_trees_all_equal(ahead.state, plain.state)
    assert int(ahead.state.size) == len(all_steps) and ahead.staged == 0


def test_prefetch_is_refused_where_a_draw_moves_the_state_on():
    epochs = jaxbuf.make_transition_buffer(N, 32, 4, sampler=jaxbuf.epochs())
    queue = jaxbuf.make_queue(16, 2, 2)
    rollout = jaxbuf.make_rollout_buffer(4, N, discount=0.9, gae_lambda=0.9)
    for buffer, example in [(epochs, EXAMPLE), (queue, {"x": jnp.zeros(2)}),
                            (rollout, None)]:  # fmt: skip
        state = None if example is None else buffer.init(example)
        with pytest.raises(ValueError, match="prefetch draws each block one call before"):
            jaxbuf.HostLoop(buffer, state, jax.random.key(0), steps_per_call=2, prefetch=True)


def test_delivery_options_are_checked():
    with pytest.raises(ValueError, match="output='numpy' delivers them as host arrays"):
        loop_of(device=jax.devices()[0])
    with pytest.raises(TypeError, match="prefetch must be True or False, got 'yes'"):
        loop_of(prefetch="yes")
    with pytest.raises(ValueError, match="output must be one of"):
        loop_of(output="cupy")


def test_a_buffer_stored_on_one_device_feeds_a_learner_on_another():
    worker = pathlib.Path(__file__).parent / "workers" / "host_device.py"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, str(worker)], capture_output=True, text=True,
                          timeout=240, env=env)  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.parametrize("prefetch", [False, True])
def test_draw_false_writes_without_drawing_and_drops_a_prefetched_block(prefetch):
    """A learner that starts late draws nothing before it starts; with prefetch, the
    first block after a pause is drawn afresh, never one drawn before the pause."""
    loop, plain, all_steps = loop_of(prefetch=prefetch), loop_of(), steps(12 * K)
    calls = []
    original = loop._calls._draw

    def counted(*args):
        calls.append(1)
        return original(*args)

    loop._calls._draw = counted
    for t, step in enumerate(all_steps):
        learning = not (2 * K <= t < 6 * K)  # draws, pauses, draws again
        block = loop.add(step, draw=learning)
        plain.add(step, draw=False)
        assert (block is not None) == (learning and t % K == K - 1)
        if block is not None and t >= 6 * K:
            newest = t - K if prefetch and t >= 7 * K else t
            assert block.experience.action[block.valid].max() <= newest
            if t == 7 * K - 1:  # the first block after the pause is from after it
                assert block.experience.action[block.valid].max() >= 5 * K
    # 2 drawing calls, + 1 first prefetch, then 6 again (+1 prefetch after the pause)
    assert len(calls) == (10 if prefetch else 8)
    chex.assert_trees_all_equal(loop.state, plain.state)
    with pytest.raises(TypeError, match="draw must be True or False, got 1"):
        loop.add(all_steps[0], draw=1)


def test_a_stacked_example_is_refused_with_what_to_give():
    stacked = jnp.zeros((4, 84, 84), jnp.uint8)
    example = jaxbuf.Transition(stacked, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), stacked)  # fmt: skip
    atari = jaxbuf.make_transition_buffer(1, 100, 32, frames={"obs": 4})
    with pytest.raises(ValueError, match=r"example.obs has shape \(4, 84, 84\).*Give one frame"):
        atari.init(example)
    window = jaxbuf.make_trajectory_buffer(1, 100, 8, 4, frames={"obs": 4})
    with pytest.raises(ValueError, match=r"\['obs'\] has shape \(4, 84, 84\).*\[:, -1\]"):
        window.init({"obs": stacked, "done": jnp.bool_(False)})
    # one frame per step, or channels last, is what frames= takes
    atari.init(example.replace(obs=stacked[-1], next_obs=stacked[-1]))
    jaxbuf.make_transition_buffer(1, 100, 32, frames={"obs": 4}).init(
        example.replace(obs=jnp.zeros((84, 84, 4)), next_obs=jnp.zeros((84, 84, 4)))
    )
