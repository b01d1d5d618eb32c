"""Bad configuration and bad input: clear errors, raised before anything changes."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import prioritized_replay

import jaxbuf

EXAMPLE = {"obs": jnp.zeros(3), "action": jnp.int32(0)}


def good_items(batch=2):
    return {"obs": jnp.ones((batch, 3)), "action": jnp.arange(batch, dtype=jnp.int32)}


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(capacity=0), ValueError, "capacity must be in [1, 1073741823], got 0"),
        (dict(capacity=-3), ValueError, "capacity must be in [1, 1073741823], got -3"),
        (dict(capacity=2**31), ValueError, "capacity must be in [1, 1073741823], got 2147483648"),
        (dict(capacity=1.5), TypeError, "capacity must be an integer, got 1.5 of type float"),
        (dict(capacity=True), TypeError, "capacity must be an integer, got the bool True"),
        (dict(capacity="8"), TypeError, "capacity must be an integer, got '8' of type str"),
        (dict(sample_batch_size=0), ValueError, "sample_batch_size must be in [1,"),
        (dict(min_size=0), ValueError, "min_size must be in [1,"),
        (dict(min_size=11), ValueError, "min_size=11 exceeds capacity=10"),
        (dict(sampler="uniform"), TypeError, "or jaxbuf.epochs(), got str"),
        (dict(truncate_ok=1), TypeError, "truncate_ok must be a bool, got 1 of type int"),
        (
            dict(sample_batch_size=11, sampler=jaxbuf.uniform(replacement=False)),
            ValueError,
            "sample_batch_size=11 exceeds capacity=10, so a batch without replacement",
        ),
    ],
)
def test_bad_configuration_names_the_argument_and_value(kwargs, error, message):
    arguments = dict(capacity=10, sample_batch_size=4) | kwargs
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.make_replay_buffer(
            arguments.pop("capacity"), arguments.pop("sample_batch_size"), **arguments
        )


def test_numpy_integers_are_accepted_as_configuration():
    buffer = jaxbuf.make_replay_buffer(np.int64(10), np.int32(4), min_size=np.int16(2))
    assert buffer.config.capacity == 10 and type(buffer.config.capacity) is int


@pytest.mark.parametrize(
    "example, error, message",
    [
        ({}, ValueError, "example has no array leaves"),
        ({"obs": jnp.zeros(3), "name": "cart"}, TypeError, "example['name'] is a str"),
    ],
)
def test_bad_examples_are_rejected_by_init(example, error, message):
    with pytest.raises(error, match=re.escape(message)):
        jaxbuf.make_replay_buffer(4, 2).init(example)


BAD_ITEMS = [
    pytest.param(
        {"obs": jnp.ones((2, 3))},
        ValueError,
        "items does not have the tree structure of the buffer's items: missing leaves "
        "['action']; unexpected leaves none",
        id="missing-leaf",
    ),
    pytest.param(
        good_items() | {"extra": jnp.ones(2)},
        ValueError,
        "missing leaves none; unexpected leaves ['extra']",
        id="extra-leaf",
    ),
    pytest.param(
        [jnp.ones((2, 3)), jnp.arange(2, dtype=jnp.int32)],
        ValueError,
        "missing leaves ['action'], ['obs']; unexpected leaves [0], [1]",
        id="other-container",
    ),
    pytest.param(
        {"obs": jnp.ones((2, 4)), "action": jnp.zeros(2, jnp.int32)},
        ValueError,
        "items['obs'] has shape (2, 4); expected (B, 3): the leading axes B, then the item "
        "shape (3,).",
        id="item-shape",
    ),
    pytest.param(
        {"obs": jnp.ones(3), "action": jnp.zeros(2, jnp.int32)},
        ValueError,
        "items['obs'] has shape (3,); expected (B, 3)",
        id="no-batch-axis",
    ),
    pytest.param(
        {"obs": jnp.ones((2, 3)), "action": jnp.zeros(3, jnp.int32)},
        ValueError,
        "items['obs'] has B=2 (shape (2, 3)), but items['action'] has 3.",
        id="batch-mismatch",
    ),
    pytest.param(
        {"obs": jnp.ones((2, 3)), "action": jnp.zeros(2, jnp.float32)},
        TypeError,
        "items['action'] has dtype float32; expected int32. jaxbuf never casts silently",
        id="dtype",
    ),
    pytest.param(
        {"obs": jnp.ones((2, 3), jnp.bfloat16), "action": jnp.zeros(2, jnp.int32)},
        TypeError,
        "items['obs'] has dtype bfloat16; expected float32.",
        id="dtype-same-kind",
    ),
    pytest.param(
        good_items(9),
        ValueError,
        "items holds 9 items but the capacity is 8. Pass truncate_ok=True",
        id="more-than-capacity",
    ),
    pytest.param(
        good_items(0),
        ValueError,
        "items holds no items (B=0)",
        id="empty-batch",
    ),
]


@pytest.mark.parametrize("items, error, message", BAD_ITEMS)
def test_bad_items_raise_and_leave_the_state_untouched(items, error, message, variant):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    state = buffer.add(buffer.init(EXAMPLE), good_items())
    before = jax.device_get(state)
    add = variant(buffer.add)
    with pytest.raises(error, match=re.escape(message)):
        add(state, items)
    chex.assert_trees_all_equal(jax.device_get(state), before)


@pytest.mark.parametrize("items, error, message", BAD_ITEMS[:8])
def test_bad_items_raise_under_vmap(items, error, message):
    buffer = jaxbuf.make_replay_buffer(8, 2)
    states = jax.vmap(buffer.init, axis_size=3, in_axes=None)(EXAMPLE)
    stacked = jax.tree.map(lambda x: jnp.stack([x] * 3), items)
    with pytest.raises(error, match=re.escape(message)):
        jax.jit(jax.vmap(buffer.add))(states, stacked)


def test_a_rejected_donated_add_does_not_consume_the_state():
    buffer = jaxbuf.make_replay_buffer(8, 2)
    add = jax.jit(buffer.add, donate_argnums=0)
    state = add(buffer.init(EXAMPLE), good_items())
    with pytest.raises(TypeError, match=r"items\['action'\] has dtype float32"):
        add(state, {"obs": jnp.ones((2, 3)), "action": jnp.zeros(2)})
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    state = add(state, good_items())
    assert int(state.size) == 4


def test_float64_input_is_what_jax_makes_of_it():
    # Without jax_enable_x64 JAX itself stores float64 as float32 (under jit it
    # converts the argument), so a float64 NumPy leaf is accepted as float32.
    buffer = jaxbuf.make_replay_buffer(4, 2)
    state = buffer.init({"x": np.zeros(2)})
    assert state.experience["x"].dtype == jnp.float32
    state = buffer.add(state, {"x": np.ones((1, 2))})
    assert state.experience["x"].dtype == jnp.float32 and int(state.size) == 1


@pytest.mark.parametrize(
    "items, message",
    [
        (
            {"obs": jnp.ones((2, 1, 3)), "action": jnp.zeros((2, 1), jnp.int32)},
            "items['action'] has shape (2, 1); expected a leading axis of num_buffers=3",
        ),
        (
            good_items(),
            "items['action'] has shape (2,); expected a leading axis of num_buffers=3",
        ),
    ],
)
def test_vectorized_add_checks_the_buffer_axis(items, message, variant):
    buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(8, 2), 3)
    add = variant(buffers.add)
    with pytest.raises(ValueError, match=re.escape(message)):
        add(buffers.init(EXAMPLE), items)


def test_vectorize_validates_its_arguments():
    with pytest.raises(TypeError, match="vectorize takes a sampled buffer"):
        jaxbuf.vectorize((lambda: None, lambda: None), 2)
    with pytest.raises(TypeError, match=r"vectorize takes a sampled buffer .*, got Queue"):
        jaxbuf.vectorize(jaxbuf.make_queue(4, 2, 2), 2)
    with pytest.raises(ValueError, match="vectorized already"):
        jaxbuf.vectorize(jaxbuf.vectorize(prioritized_replay(8, 2), 2), 2)
    with pytest.raises(ValueError, match=re.escape("(shapes there are one buffer's")):
        vectorized = jaxbuf.vectorize(jaxbuf.make_replay_buffer(8, 2), 2)
        vectorized.add(vectorized.init(jnp.float32(0)), jnp.zeros((2, 3, 1)))
    buffer = jaxbuf.make_replay_buffer(2**20, 2)
    with pytest.raises(ValueError, match=re.escape("num_buffers must be in [1, 2047], got 4096")):
        jaxbuf.vectorize(buffer, 4096)
    with pytest.raises(ValueError, match=re.escape("num_buffers must be in [1,")):
        jaxbuf.vectorize(buffer, 0)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: jaxbuf.uniform(replacement="no"), TypeError, "replacement must be a bool"),
        (lambda: jaxbuf.prioritized(1.5), ValueError, "priority_exponent must be in [0, 1]"),
        (lambda: jaxbuf.prioritized(stratified=1), TypeError, "stratified must be a bool"),
        (
            lambda: jaxbuf.make_trajectory_buffer(2, 8, 4, 2, sampler=jaxbuf.prioritized),
            TypeError,
            "jaxbuf.prioritized(...) or jaxbuf.epochs(), got function",
        ),
    ],
)
def test_bad_samplers_are_named(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()
