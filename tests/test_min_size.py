"""Below `min_size`, every sampled kind says so: `can_sample` false, every item invalid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import prioritized_replay, prioritized_trajectory, prioritized_transition

import jaxbuf


def transition_steps(num_envs, length):
    step = jaxbuf.Transition(
        obs=jnp.zeros(2), action=jnp.int32(0), reward=jnp.float32(1),
        terminated=jnp.bool_(False), truncated=jnp.bool_(False), next_obs=jnp.zeros(2),
    )  # fmt: skip
    return step, jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs, length, *x.shape)), step)


def replay(make):
    buffer = make(20, 4, min_size=10)
    state = buffer.add(buffer.init(jnp.float32(0)), jnp.arange(5.0))
    more = buffer.add(state, jnp.arange(5.0, 10.0))
    return buffer, state, more


def steps(make, **kwargs):
    buffer = make(2, 20, 4, min_size=10, **kwargs)
    example = {"x": jnp.float32(0)}
    state = buffer.add(buffer.init(example), {"x": jnp.ones((2, 6))})
    return buffer, state, buffer.add(state, {"x": jnp.ones((2, 4))})


def transitions(make):
    buffer = make(2, 20, 4, n_step=2, min_size=10)
    example, chunk = transition_steps(2, 6)
    state = buffer.add(buffer.init(example), chunk)
    return buffer, state, buffer.add(state, transition_steps(2, 4)[1])


KINDS = {
    "transition": lambda: transitions(jaxbuf.make_transition_buffer),
    "prioritized_replay": lambda: replay(prioritized_replay),
    "prioritized_trajectory": lambda: steps(prioritized_trajectory, sequence_length=2),
    "prioritized_transition": lambda: transitions(prioritized_transition),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_below_min_size_nothing_is_valid_and_weights_cannot_be_mistaken(kind):
    buffer, below, at = KINDS[kind]()
    for state, ready in ((below, False), (at, True)):
        assert bool(buffer.can_sample(state)) is ready
        for sample in (buffer.sample, jax.jit(buffer.sample)):
            batch = sample(state, jax.random.key(1))
            assert np.asarray(batch.valid).tolist() == [ready] * 4
            weights = getattr(batch, "weights", None)
            if weights is not None:  # a learner multiplying by them learns nothing
                assert (np.asarray(weights) > 0).tolist() == [ready] * 4
