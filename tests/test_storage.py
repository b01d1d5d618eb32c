"""Ring storage writes: the CPU path for wide rows (two slice updates) against NumPy, and the
same states as the scatter of the accelerator path."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accelerators_form

import jaxbuf
from jaxbuf.core import lowering as _lowering
from jaxbuf.core import storage as _storage


@pytest.mark.parametrize("capacity", [1, 3, 7, 10])
def test_wide_rows_are_written_as_slices_exactly_as_a_ring(capacity):
    rng = np.random.default_rng(capacity)
    for batch in range(1, capacity + 1):
        write = jax.jit(_storage._write_slices)
        for position in range(capacity):
            for where in (None, True, False):
                column = rng.integers(0, 255, (capacity, 600), dtype=np.uint8)
                values = rng.integers(0, 255, (batch, 600), dtype=np.uint8)
                gate = None if where is None else jnp.bool_(where)
                got = write(column, values, jnp.int32(position), gate)
                expected = column.copy()
                if where is not False:
                    expected[(position + np.arange(batch)) % capacity] = values
                np.testing.assert_array_equal(got, expected, err_msg=f"{batch=} {position=}")


def filled_frames_buffer():
    """A transition buffer of 84x84 frames (rows of 7056 bytes) after adds of many lengths
    with wrap-arounds and episode ends, checked against the frames given."""
    frame = jnp.zeros((84, 84), jnp.uint8)
    example = jaxbuf.Transition(frame, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                jnp.bool_(False), frame)  # fmt: skip
    buffer = jaxbuf.make_transition_buffer(2, 5, 4)
    add = jax.jit(lambda state, steps: buffer.add(state, steps))  # traced anew per call
    rng = np.random.default_rng(0)
    state = buffer.init(example)
    frames = np.zeros((2, 0, 84, 84), np.uint8)
    for length in [1, 3, 5, 2, 4, 1, 5, 3]:
        pixels = rng.integers(0, 255, (2, length, 84, 84), dtype=np.uint8)
        done = rng.random((2, length)) < 0.3
        steps = jaxbuf.Transition(pixels, np.zeros((2, length), np.int32),
                                  np.ones((2, length), np.float32), done,
                                  np.zeros((2, length), bool), pixels[:, ::-1])  # fmt: skip
        state = add(state, steps)
        frames = np.concatenate([frames, pixels], axis=1)[:, -5:]
        newest = (int(state.position) - frames.shape[1] + np.arange(frames.shape[1])) % 5
        np.testing.assert_array_equal(np.asarray(state.experience["obs"])[:, newest], frames)
    return state


def test_wide_rows_give_the_same_states_as_the_accelerator_path(monkeypatch):
    cpu = filled_frames_buffer()

    monkeypatch.setattr(_lowering, "choose", accelerators_form)
    chex.assert_trees_all_equal(filled_frames_buffer(), cpu)


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("width", [2, 600])  # a scatter, and the CPU's slices for wide rows
def test_time_rings_wrap_multi_step_writes_of_any_number_of_environments(num_envs, width):
    """`append_steps` of 1 to `capacity` steps at every position, one environment among
    them (where the environment and time axes are easy to mix up), against NumPy."""
    rng, capacity = np.random.default_rng(num_envs * width), 5
    ring = _storage.TimeRingState(
        experience=np.zeros((num_envs, capacity, width), np.uint8), **_storage.counters()
    )
    expected = np.zeros((num_envs, capacity, width), np.uint8)
    append = jax.jit(_storage.append_steps)
    for length in [1, 3, 5, 2, 4, 1, 5, 3, 2, 2]:
        steps = rng.integers(0, 255, (num_envs, length, width), dtype=np.uint8)
        rows = (int(ring.position) + np.arange(length)) % capacity
        expected[:, rows] = steps
        ring = append(ring, steps)
        np.testing.assert_array_equal(ring.experience, expected, err_msg=f"{length=}")
    assert int(ring.size) == capacity and int(ring.added) == 28


def test_span_changes_says_disjoint_exactly_where_no_slot_is_cleared_and_filled():
    """`Changes.disjoint` lets a prioritized sampler skip finding the slots both cleared
    and filled (a sort above 1,024 entries): true exactly where no slot is both, which
    every `add_step` of a span over 1 is. Every length, span, capacity up to 7 and write
    position."""
    from jaxbuf.core import time_ring

    for capacity in range(2, 8):
        for span in range(1, capacity + 1):
            for length in range(1, capacity + 1):
                for position in range(capacity):
                    ring = jaxbuf.types.TimeRingState(
                        experience=jnp.zeros((1, capacity)), position=jnp.int32(position),
                        size=jnp.int32(capacity), added=jnp.uint32(0), side=None, sampler=None,
                    )  # fmt: skip
                    after = ring.replace(position=jnp.int32((position + length) % capacity))
                    changes = time_ring.span_changes(ring, after, length, span)
                    cleared = set(np.asarray(changes.cleared).tolist())
                    both = cleared & set(np.asarray(changes.filled).tolist())
                    assert changes.disjoint == (not both), (capacity, span, length, position)
                    assert changes.disjoint or length > 1 or span == 1
