"""The lowering census: every public operation of every kind, sampler and option, lowered
for an accelerator with `jax.export` on this CPU host, and the control flow and memory
operations counted in its module text.

On a GPU a `while` iteration is a kernel launch driven from the host and a `case`/`if`
sends its predicate to the host; each gather or scatter is a kernel. So these counts are
what can be checked here of "fit for an accelerator". `tests/test_census.py` holds them
to the table in `docs/census.md`; `python tests/census.py` prints that table anew.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import export

import jaxbuf

PLATFORMS = ("cuda", "tpu")
# Operations that must lower without loops or branches on an accelerator.
BRANCH_FREE = ("add", "add_step", "sample", "set_priorities", "next_batch", "finish",
               "minibatches", "write_and_draw", "can_insert", "can_sample", "inserted",
               "sampled", "deleted")  # fmt: skip
COUNTED = ("while", "case/if", "gather", "scatter", "sort")
HOST_SECTION = "## Host memory"  # the page's section of tests/census_host.py
ENVS, CAPACITY, BATCH, LENGTH = 16, 1 << 16, 256, 8


GATHER = r'"stablehlo\.(?:dynamic_)?gather"|stablehlo\.dynamic_slice '
SCATTER = r'"stablehlo\.scatter"|stablehlo\.dynamic_update_slice '


def counts(text: str) -> dict[str, int]:
    """The census of one module text. `jax.lax.platform_dependent` leaves a `case` on a
    constant index, which XLA folds away: only cases on computed values count."""
    constants = set(re.findall(r"(%[\w#]+) = stablehlo\.constant", text))
    for out, arg in re.findall(r'(%[\w#]+) = "stablehlo\.case"\((%[\w#]+)\)', text):
        if arg in constants:
            constants.add(out)
    predicates = re.findall(r'"?stablehlo\.(?:case|if)"?\((%[\w#]+)\)', text)
    return {
        "while": len(re.findall(r"stablehlo\.while", text)),
        "case/if": sum(p not in constants for p in predicates),
        # operations, not their `#stablehlo.gather<...>` attributes
        "gather": len(re.findall(GATHER, text)),
        "scatter": len(re.findall(SCATTER, text)),
        "sort": len(re.findall(r"stablehlo\.sort", text)),
    }


def lowered(fn: Callable, args: tuple, platform: str) -> str:
    return export.export(jax.jit(fn), platforms=(platform,))(*args).mlir_module()


def _zeros(example: Any, *lead: int) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((*lead, *jnp.shape(x)), x.dtype), example)


def _done(step: dict) -> jax.Array:
    return step["done"]


STEP = {"obs": jnp.zeros(8), "action": jnp.int32(0), "reward": jnp.float32(0),
        "done": jnp.bool_(False)}  # fmt: skip
FRAMES = {"obs": jnp.zeros((84, 84), jnp.uint8), "done": jnp.bool_(False)}
GOAL_OBS = {"observation": jnp.zeros(8), "achieved": jnp.zeros(3), "desired": jnp.zeros(3)}
GOAL_STEP = {**GOAL_OBS, "reward": jnp.float32(0), "done": jnp.bool_(False)}


def _transition(obs: Any) -> jaxbuf.Transition:
    return jaxbuf.Transition(obs=obs, action=jnp.int32(0), reward=jnp.float32(0),
                             terminated=jnp.bool_(False), truncated=jnp.bool_(False),
                             next_obs=obs)  # fmt: skip


def _goals() -> jaxbuf.Hindsight:
    return jaxbuf.hindsight(lambda achieved, desired: -jnp.abs(achieved - desired).sum(),
                            achieved="achieved", desired="desired")  # fmt: skip


def _samplers() -> Iterator[tuple[str, Any]]:
    yield "uniform", jaxbuf.uniform()
    yield "distinct", jaxbuf.uniform(replacement=False)
    yield "prioritized", jaxbuf.prioritized()
    yield "epochs", jaxbuf.epochs()


def _kinds(sampler: Any) -> Iterator[tuple[str, Any, Any, int]]:
    """(name, buffer, example, time axis of `add`: 0 for replay's items)."""
    yield "replay", jaxbuf.make_replay_buffer(CAPACITY, BATCH, sampler=sampler), STEP, 0
    yield "trajectory", jaxbuf.make_trajectory_buffer(
        ENVS, CAPACITY, BATCH, LENGTH, done_fn=_done, sampler=sampler), STEP, 1  # fmt: skip
    yield "transition", jaxbuf.make_transition_buffer(
        ENVS, CAPACITY, BATCH, sampler=sampler), _transition(jnp.zeros(8)), 1  # fmt: skip
    yield "episode", jaxbuf.make_episode_buffer(
        ENVS, CAPACITY, BATCH, 64, done_fn=_done, sampler=sampler), STEP, 1  # fmt: skip


def _options() -> Iterator[tuple[str, Any, Any]]:
    """Buffers with the options (uniform sampler): n-step, frames, goals."""
    yield "transition n_step=3", jaxbuf.make_transition_buffer(
        ENVS, CAPACITY, BATCH, n_step=3, discount=0.99), _transition(jnp.zeros(8))  # fmt: skip
    yield "transition frames", jaxbuf.make_transition_buffer(
        ENVS, CAPACITY, BATCH, frames={"obs": 4}), _transition(FRAMES["obs"])  # fmt: skip
    yield "trajectory frames", jaxbuf.make_trajectory_buffer(
        ENVS, CAPACITY, BATCH, LENGTH, done_fn=_done, frames={"obs": 4}), FRAMES  # fmt: skip
    yield "transition goals", jaxbuf.make_transition_buffer(
        ENVS, CAPACITY, BATCH, goals=_goals()), _transition(GOAL_OBS)  # fmt: skip
    yield "episode goals", jaxbuf.make_episode_buffer(
        ENVS, CAPACITY, BATCH, 64, done_fn=_done, goals=_goals()), GOAL_STEP  # fmt: skip


def _sampled_calls(name: str, buffer: Any, example: Any, time_axis: int):
    state = jax.eval_shape(buffer.init, example)
    key = jax.random.key(0)
    lead = (BATCH,) if time_axis == 0 else (ENVS, 4)
    yield f"{name}.add", buffer.add, (state, _zeros(example, *lead))
    gate = jax.ShapeDtypeStruct((), jnp.bool_)
    masked = lambda s, d, w: buffer.add(s, d, where=w)  # noqa: E731
    yield f"{name} where=.add", masked, (state, _zeros(example, *lead), gate)
    if time_axis and getattr(buffer, "add_step", None) is not None:
        yield f"{name}.add_step", buffer.add_step, (state, _zeros(example, ENVS))
    if getattr(buffer, "next_batch", None) is not None:
        yield f"{name}.next_batch", buffer.next_batch, (state, key)
    else:
        yield f"{name}.sample", buffer.sample, (state, key)
    indices = jax.ShapeDtypeStruct((BATCH,), jnp.int32)
    yield f"{name}.take", buffer.take, (state, indices)
    yield f"{name}.can_sample", buffer.can_sample, (state,)
    if getattr(buffer, "set_priorities", None) is not None:
        priorities = jax.ShapeDtypeStruct((BATCH,), jnp.float32)
        yield f"{name}.set_priorities", buffer.set_priorities, (state, indices, priorities)


def operations() -> Iterator[tuple[str, Callable, tuple]]:
    """(name, function, abstract arguments) of every operation in the census."""
    for sampler_name, sampler in _samplers():
        for kind, buffer, example, time_axis in _kinds(sampler):
            yield from _sampled_calls(f"{kind}/{sampler_name}", buffer, example, time_axis)
    for name, buffer, example in _options():
        yield from _sampled_calls(name, buffer, example, 1)
    vectorized = jaxbuf.vectorize(jaxbuf.make_replay_buffer(4096, 64, sampler=jaxbuf.prioritized()),
                                  ENVS)  # fmt: skip
    yield from _sampled_calls("vectorize(replay/prioritized)", vectorized, STEP, 1)
    yield from _rollout_and_queue()
    yield from _blocks()
    yield from _rate_limiter()


def _rate_limiter():
    """The rate limiter's checks (double arithmetic from integer words) and counts."""
    limiter = jaxbuf.sample_to_insert_ratio(0.0004, 1, 2.0)
    state = jax.eval_shape(limiter.init)
    count, gate = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.bool_)
    for name in ("can_insert", "can_sample"):
        yield f"rate limiter.{name}", getattr(limiter, name), (state, count)
    for name in ("inserted", "sampled", "deleted"):
        yield f"rate limiter.{name}", getattr(limiter, name), (state, count, gate)


def _blocks():
    """A Python loop's call (`jaxbuf.blocks`, `HostLoop`): 32 steps written, 32 batches drawn."""
    k = 32
    for name, sampler in (("uniform", jaxbuf.uniform()), ("prioritized", jaxbuf.prioritized())):
        buffer = jaxbuf.make_transition_buffer(ENVS, CAPACITY, BATCH, sampler=sampler)
        example = _transition(jnp.zeros(8))
        blocks = jaxbuf.blocks(buffer, k)
        state = jax.eval_shape(buffer.init, example)
        args = (state, _zeros(example, k, ENVS), jax.random.key(0))
        yield f"blocks(transition/{name}).write_and_draw", blocks.write_and_draw, args
    indices = jax.ShapeDtypeStruct((k, BATCH), jnp.int32)
    priorities = jax.ShapeDtypeStruct((k, BATCH), jnp.float32)
    yield (f"blocks(transition/{name}).set_priorities", blocks.set_priorities,
           (state, indices, priorities))  # fmt: skip


def _rollout_and_queue():
    step = {"obs": jnp.zeros(8), "action": jnp.int32(0), "log_prob": jnp.float32(0),
            "reward": jnp.float32(0), "value": jnp.float32(0), "final_value": jnp.float32(0),
            "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}  # fmt: skip
    rollout = jaxbuf.make_rollout_buffer(128, 64, discount=0.99, gae_lambda=0.95)
    state = jax.eval_shape(rollout.init, step)
    yield "rollout.add", rollout.add, (state, _zeros(step, 64))
    yield "rollout.finish", rollout.finish, (state, jax.ShapeDtypeStruct((64,), jnp.float32))
    yield "rollout.clear", rollout.clear, (state,)
    minibatches = lambda s, k: rollout.minibatches(s, k, 4)  # noqa: E731
    yield "rollout.minibatches", minibatches, (state, jax.random.key(0))
    queue = jaxbuf.make_queue(4096, 64, 256)
    state = jax.eval_shape(queue.init, STEP)
    yield "queue.add", queue.add, (state, _zeros(STEP, 64))
    yield "queue.pop", queue.pop, (state,)


def table() -> dict[str, dict[str, dict[str, int]]]:
    """{operation: {platform: counts}} of every operation."""
    return {name: {p: counts(lowered(fn, args, p)) for p in PLATFORMS}
            for name, fn, args in operations()}  # fmt: skip


def markdown(rows: dict[str, dict[str, dict[str, int]]], columns: tuple = COUNTED) -> str:
    """The docs table: one row per operation, `cuda` counts (`tpu` where they differ)."""
    head = "| operation | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    lines = []
    for name, per_platform in rows.items():
        cells = []
        for what in columns:
            cuda, tpu = per_platform["cuda"][what], per_platform["tpu"][what]
            cells.append(str(cuda) if cuda == tpu else f"{cuda} (tpu {tpu})")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def read_markdown(text: str) -> dict[str, dict[str, int]]:
    """{operation: ceilings} from the docs table (the larger of the two platforms)."""
    rows = {}
    for line in text.split(HOST_SECTION)[0].splitlines():
        match = re.match(r"\| `([^`]+)` \| (.+) \|$", line)
        if match:
            cells = [max(map(int, re.findall(r"\d+", c))) for c in match.group(2).split(" | ")]
            rows[match.group(1)] = dict(zip(COUNTED, cells, strict=True))
    return rows


if __name__ == "__main__":
    sys.stdout.write(markdown(table()))
