"""GPU and TPU without the hardware: every public function of every kind exports for
`cuda` and `tpu`, and platform-specific paths are chosen per lowering platform."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxbuf

ITEM = {"obs": jnp.zeros(2), "done": jnp.bool_(False)}
STEP = {
    "obs": jnp.zeros(2), "reward": jnp.float32(0), "value": jnp.float32(0),
    "final_value": jnp.float32(0), "terminated": jnp.bool_(False), "truncated": jnp.bool_(False),
}  # fmt: skip
TRANSITION = jaxbuf.Transition(
    obs=jnp.zeros(2), action=jnp.int32(0), reward=jnp.float32(0), terminated=jnp.bool_(False),
    truncated=jnp.bool_(False), next_obs=jnp.zeros(2),
)  # fmt: skip


def done(step):
    return step["done"]


def batched(example, *lead):
    return jax.tree.map(lambda x: jnp.zeros((*lead, *x.shape), x.dtype), example)


def sampled(sampler):
    """(name, buffer, example, add input, add_step input) of every sampled kind."""
    return [
        ("replay", jaxbuf.make_replay_buffer(16, 4, sampler=sampler), ITEM,
         batched(ITEM, 3), None),
        ("trajectory", jaxbuf.make_trajectory_buffer(2, 16, 4, 3, done_fn=done, sampler=sampler),
         ITEM, batched(ITEM, 2, 3), batched(ITEM, 2)),
        ("transition", jaxbuf.make_transition_buffer(2, 16, 4, n_step=2, sampler=sampler),
         TRANSITION, batched(TRANSITION, 2, 3), batched(TRANSITION, 2)),
        ("episode", jaxbuf.make_episode_buffer(2, 16, 4, 5, done_fn=done, sampler=sampler),
         ITEM, batched(ITEM, 2, 3), batched(ITEM, 2)),
    ]  # fmt: skip


def calls(buffer, example, data, step):
    """Every function of a sampled buffer with arguments."""
    state = buffer.init(example)
    key, indices = jax.random.key(0), jnp.arange(4, dtype=jnp.int32)
    found = {
        "add": (buffer.add, (state, data)),
        "sample": (buffer.sample, (state, key)),
        "can_sample": (buffer.can_sample, (state,)),
        "take": (buffer.take, (state, indices)),
    }
    if step is not None:
        found["add_step"] = (buffer.add_step, (state, step))
    if buffer.set_priorities is not None:
        found["set_priorities"] = (buffer.set_priorities, (state, indices, jnp.ones(4)))
    return found


def exported_text(fn, args, platforms):
    return export.export(jax.jit(fn), platforms=platforms)(*args).mlir_module()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_every_function_of_every_sampled_kind_exports_for_cuda_and_tpu(sampler):
    make = jaxbuf.uniform if sampler == "uniform" else jaxbuf.prioritized
    for name, buffer, example, data, step in sampled(make()):
        for what, (fn, args) in calls(buffer, example, data, step).items():
            text = exported_text(fn, args, ("cuda", "tpu"))
            assert text, f"{name}.{what}"
            if sampler == "prioritized" and what in ("add", "add_step", "set_priorities"):
                # the sum tree is updated per lowering platform: parallel on both
                # accelerators, sequential on CPU (a module for both accelerators has
                # the sequential update where either of them takes it)
                assert "sumtree_parallel" in text and "sumtree_sequential" not in text
                cpu = exported_text(fn, args, ("cpu",))
                assert "sumtree_sequential" in cpu and "sumtree_parallel" not in cpu


def test_queue_rollout_vectorized_and_mixed_functions_export_for_cuda_and_tpu():
    queue = jaxbuf.make_queue(8, 2, 4)
    qstate = queue.init(ITEM)
    rollout = jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9)
    rstate = rollout.init(STEP)
    vectorized = jaxbuf.vectorize(jaxbuf.make_replay_buffer(8, 4, sampler=jaxbuf.prioritized()), 2)
    vstate = vectorized.init(ITEM)
    replay = jaxbuf.make_replay_buffer(8, 4)
    mixed = jaxbuf.mix([replay, replay], [0.5, 0.5], 4)
    key = jax.random.key(0)
    functions = [
        (queue.add, (qstate, batched(ITEM, 2))), (queue.pop, (qstate,)),
        (queue.can_add, (qstate,)), (queue.can_sample, (qstate,)),
        (rollout.add, (rstate, batched(STEP, 2))), (rollout.finish, (rstate, jnp.zeros(2))),
        (lambda s, k: rollout.minibatches(s, k, 2), (rstate, key)), (rollout.clear, (rstate,)),
        (vectorized.add, (vstate, batched(ITEM, 2, 3))), (vectorized.sample, (vstate, key)),
        (vectorized.set_priorities, (vstate, jnp.arange(4), jnp.ones(4))),
        (mixed, ([replay.init(ITEM)] * 2, key)),
    ]  # fmt: skip
    for fn, args in functions:
        assert exported_text(fn, args, ("cuda", "tpu"))


def test_the_exported_cpu_program_runs_and_matches_the_jitted_one():
    buffer = jaxbuf.make_replay_buffer(16, 4, sampler=jaxbuf.prioritized())
    state = buffer.init(ITEM)
    items = jax.tree.map(lambda x: jnp.ones((3, *x.shape), x.dtype), ITEM)
    program = export.export(jax.jit(buffer.add), platforms=("cpu", "cuda"))(state, items)
    ran, jitted = program.call(state, items), jax.jit(buffer.add)(state, items)
    for a, b in zip(jax.tree.leaves(ran), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_array_equal(a, b)
