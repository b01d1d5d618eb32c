"""The lowering census: every public operation of every kind, sampler and option, lowered
for the accelerators on this CPU host (once for cuda and tpu, the module then split by
platform: `split_platforms`), and the control flow and memory operations counted in each
platform's module text.

On a GPU a `while` iteration is a kernel launch driven from the host and a `case`/`if`
sends its predicate to the host; each gather or scatter is a kernel. So these counts are
what can be checked here of "fit for an accelerator". `tests/test_census.py` holds them
to the table in `docs/census.md`; `python tests/census.py` prints that table anew.

The table is lowered at 16 environments and batches of 256 (`BASE`); `scale` lowers
every operation again at the shapes users run (`SCALE`: up to 4,096 environments,
batches of 32,768, 2**20 steps), finds loops and branches there, and draws whose work
grows with the capacity (`growing_ops`); `python tests/census.py --scale` prints the
page's table of them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import export

import jaxbuf

PLATFORMS = ("cuda", "tpu")
# Operations that must lower without loops or branches on an accelerator.
BRANCH_FREE = ("add", "add_step", "sample", "set_priorities", "next_batch", "finish",
               "minibatches", "write_and_draw", "can_insert", "can_sample", "inserted",
               "sampled", "deleted", "insert_internal", "sample_internal")  # fmt: skip
# Operations that draw a batch: checked for work that grows with the capacity.
DRAWS = ("sample", "next_batch", "sample_internal")
COUNTED = ("while", "case/if", "gather", "scatter", "sort")
HOST_SECTION = "## Host memory"  # the page's section of tests/census_host.py
SCALE_SECTION = "## At the shapes users run"  # the page's section of the scale census
LENGTH = 8


class Shape(NamedTuple):
    """Where the census lowers: `envs` environments (or stacked buffers) of `steps`
    stored steps each, batches of `batch`; a replay buffer holds `items` items
    (`envs * steps` unless given)."""

    envs: int
    batch: int
    steps: int
    items: int | None = None

    @property
    def capacity(self) -> int:
        return self.envs * self.steps if self.items is None else self.items

    def halved(self) -> Shape:
        """The same shape with half the stored steps (the capacity check)."""
        return self._replace(steps=self.steps // 2, items=self.capacity // 2)


# The committed table of docs/census.md (ceilings): 16 environments x 2**16 steps.
BASE = Shape(16, 256, 1 << 16, 1 << 16)
# The shapes users run (Brax, MuJoCo Playground, PureJaxRL scans: thousands of
# environments, batches of 8k-32k), up to 2**20 stored steps, on both sides of every
# size switch: `_lowering.SMALL` (64 groups), `_lowering.PAIRS` (1,024 draws).
SCALE = (Shape(1, 1, 1 << 20), Shape(64, 256, 1 << 14), Shape(65, 8192, (1 << 20) // 65),
         Shape(1024, 32768, 1 << 10), Shape(4096, 8192, 1 << 8),
         Shape(4096, 32768, 1 << 8))  # fmt: skip


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


def lowered_for_each(fn: Callable, args: tuple) -> dict[str, str]:
    """`{platform: module text}`: traced once and lowered once for all `PLATFORMS`, then
    split by platform (`split_platforms`): the same counts as `lowered` for each
    platform (checked on every operation of the census at three shapes), 2.5-2.9 times
    as fast as a trace lowered for each platform."""
    lowering = jax.jit(fn).trace(*args).lower(lowering_platforms=PLATFORMS)
    return split_platforms(lowering.as_text())


def exported_for_each(fn: Callable, args: tuple) -> dict[str, str]:
    """`lowered_for_each` through `jax.export` (`lowered` for all `PLATFORMS` at once)."""
    return split_platforms(export.export(jax.jit(fn), platforms=PLATFORMS)(*args).mlir_module())


PLATFORM_INDEX = 'jax.global_constant = "_platform_index"'
CASE = re.compile(r'(\s*)(%[\w#]+)(:\d+)? = "stablehlo\.case"\((%[\w#]+)\) \(\{$')
FUNCTION = re.compile(r"\s*func\.func \w+ @([\w.$-]+)\((.*)")
CALL = re.compile(r"\bcall @([\w.$-]+)\(([^)]*)\)")
I32_CONSTANT = re.compile(r"\s*(%[\w#]+) = stablehlo\.constant dense<(-?\d+)> : tensor<i32>")


def split_platforms(text: str, platforms: tuple[str, ...] = PLATFORMS) -> dict[str, str]:
    """`{platform: module text}` from one module lowered for several platforms: where
    JAX lowers a primitive differently per platform it emits a `case` on the platform's
    index (the argument marked `_platform_index`, passed on to the functions called);
    each platform's text keeps only its own branch of such a case, the case renamed
    `platform.case` (a single platform's lowering has no such case, or one on a
    constant: no branch either way)."""
    lines = text.splitlines()
    positions = _platform_arguments(lines)
    return {p: "\n".join(_one_platform(lines, positions, i)) for i, p in enumerate(platforms)}


def _arguments(signature: str) -> list[str]:
    return re.findall(r"(%arg\d+):", signature)


def _platform_arguments(lines: list[str]) -> dict[str, int]:
    """{function: position of its platform-index argument}, from `main`'s marked
    argument through the calls that pass it on."""
    functions, current, positions = {}, None, {}
    for line in lines:
        if match := FUNCTION.match(line):
            current = match.group(1)
            functions[current] = []
            if PLATFORM_INDEX in line:
                head = line.split(PLATFORM_INDEX)[0]
                positions[current] = len(_arguments(head)) - 1
        elif current is not None and (call := CALL.search(line)):
            operands = [a.strip() for a in call.group(2).split(",")]
            functions[current].append((call.group(1), operands))
    changed = True
    while changed:
        changed = False
        for caller, calls in functions.items():
            if caller not in positions:
                continue
            index = f"%arg{positions[caller]}"
            for callee, operands in calls:
                if index in operands and callee not in positions:
                    positions[callee] = operands.index(index)
                    changed = True
    return positions


def _one_platform(lines: list[str], positions: dict[str, int], platform: int) -> list[str]:
    """The module's lines with each platform case cut to `platform`'s branch, and the
    platform's index taken out of the calls that pass it on (as a single platform's
    lowering calls them)."""
    out: list[str] = []
    by_platform: dict[str, int] = {}  # values the platform fixes, in the current function
    constants: dict[str, int] = {}  # the function's i32 constants
    index = None  # the current function's platform-index argument
    pending = lines[::-1]
    while pending:
        line = pending.pop()
        if function := FUNCTION.match(line):
            position = positions.get(function.group(1))
            index = None if position is None else f"%arg{position}"
            by_platform, constants = ({} if index is None else {index: platform}), {}
        if constant := I32_CONSTANT.match(line):
            constants[constant.group(1)] = int(constant.group(2))
        case = CASE.match(line)
        if not case or case.group(4) not in by_platform:
            out.append(line if index is None else _without_index(line, index))
            continue
        branches, closing = _branches(pending, case.group(1))
        chosen = branches[by_platform[case.group(4)]]
        returned = re.match(r"\s*stablehlo\.return (%[\w#]+) : tensor<i32>", chosen[-1])
        if case.group(3) is None and returned:  # a platform's number for the next case
            inner = {m.group(1): int(m.group(2)) for m in map(I32_CONSTANT.match, chosen) if m}
            fixed = {**constants, **inner}.get(returned.group(1))
            if fixed is not None:
                by_platform[case.group(2)] = fixed
        out.append(line.replace('"stablehlo.case"', '"platform.case"'))
        pending.append(closing)
        pending.extend(reversed(chosen))  # walked next: cases nested in the branch
    return out


def _without_index(line: str, index: str) -> str:
    """A call's line without the platform index among its operands and their types."""
    call = CALL.search(line)
    if not call:
        return line
    operands = [a.strip() for a in call.group(2).split(",")]
    if index not in operands:
        return line
    at = operands.index(index)
    head, types = line[: call.end()], line[call.end() :]
    head = head[: call.start(2)] + ", ".join(operands[:at] + operands[at + 1 :]) + ")"
    typed = re.search(r": \(([^)]*)\) ->", types)
    listed = [t.strip() for t in typed.group(1).split(", ")]
    assert listed[at] == "tensor<i32>", line
    types = (types[: typed.start(1)] + ", ".join(listed[:at] + listed[at + 1 :])
             + types[typed.end(1) :])  # fmt: skip
    return head + types


def _branches(pending: list[str], indent: str) -> tuple[list[list[str]], str]:
    """Takes a case's regions off `pending` (lines in reverse): each branch's lines, and
    the case's closing line."""
    branches: list[list[str]] = [[]]
    while True:
        line = pending.pop()
        if line == f"{indent}}}, {{":
            branches.append([])
        elif line.startswith(f"{indent}}})"):
            return branches, line
        else:
            branches[-1].append(line)


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


def _goals() -> jaxbuf.types.Hindsight:
    return jaxbuf.hindsight(lambda achieved, desired: -jnp.abs(achieved - desired).sum(),
                            achieved="achieved", desired="desired")  # fmt: skip


def _samplers() -> Iterator[tuple[str, Any]]:
    yield "uniform", jaxbuf.uniform()
    yield "distinct", jaxbuf.uniform(replacement=False)
    yield "prioritized", jaxbuf.prioritized()
    yield "epochs", jaxbuf.epochs()


def _kinds(sampler: Any, shape: Shape) -> Iterator[tuple[str, Any, Any, int]]:
    """(name, buffer, example, time axis of `add`: 0 for replay's items)."""
    envs, batch, steps = shape.envs, shape.batch, shape.steps
    yield "replay", jaxbuf.make_replay_buffer(shape.capacity, batch, sampler=sampler), STEP, 0
    yield "trajectory", jaxbuf.make_trajectory_buffer(
        envs, steps, batch, LENGTH, done_fn=_done, sampler=sampler), STEP, 1  # fmt: skip
    yield "transition", jaxbuf.make_transition_buffer(
        envs, steps, batch, sampler=sampler), _transition(jnp.zeros(8)), 1  # fmt: skip
    yield "episode", jaxbuf.make_episode_buffer(
        envs, steps, batch, 64, done_fn=_done, sampler=sampler), STEP, 1  # fmt: skip


def _options(shape: Shape) -> Iterator[tuple[str, Any, Any]]:
    """Buffers with the options (uniform sampler): n-step, frames, goals."""
    envs, batch, steps = shape.envs, shape.batch, shape.steps
    yield "transition n_step=3", jaxbuf.make_transition_buffer(
        envs, steps, batch, n_step=3, discount=0.99), _transition(jnp.zeros(8))  # fmt: skip
    yield "transition frames", jaxbuf.make_transition_buffer(
        envs, steps, batch, frames={"obs": 4}), _transition(FRAMES["obs"])  # fmt: skip
    yield "trajectory frames", jaxbuf.make_trajectory_buffer(
        envs, steps, batch, LENGTH, done_fn=_done, frames={"obs": 4}), FRAMES  # fmt: skip
    yield "transition goals", jaxbuf.make_transition_buffer(
        envs, steps, batch, goals=_goals()), _transition(GOAL_OBS)  # fmt: skip
    yield "episode goals", jaxbuf.make_episode_buffer(
        envs, steps, batch, 64, done_fn=_done, goals=_goals()), GOAL_STEP  # fmt: skip


def _sampled_calls(name: str, buffer: Any, example: Any, time_axis: int, shape: Shape):
    state = jax.eval_shape(buffer.init, example)
    key = jax.random.key(0)
    lead = (shape.batch,) if time_axis == 0 else (shape.envs, 4)
    yield f"{name}.add", buffer.add, (state, _zeros(example, *lead))
    gate = jax.ShapeDtypeStruct((), jnp.bool_)
    masked = lambda s, d, w: buffer.add(s, d, where=w)  # noqa: E731
    yield f"{name} where=.add", masked, (state, _zeros(example, *lead), gate)
    if time_axis and getattr(buffer, "add_step", None) is not None:
        yield f"{name}.add_step", buffer.add_step, (state, _zeros(example, shape.envs))
    if getattr(buffer, "next_batch", None) is not None:
        yield f"{name}.next_batch", buffer.next_batch, (state, key)
    else:
        yield f"{name}.sample", buffer.sample, (state, key)
    indices = jax.ShapeDtypeStruct((shape.batch,), jnp.int32)
    yield f"{name}.take", buffer.take, (state, indices)
    yield f"{name}.can_sample", buffer.can_sample, (state,)
    if getattr(buffer, "set_priorities", None) is not None:
        priorities = jax.ShapeDtypeStruct((shape.batch,), jnp.float32)
        yield f"{name}.set_priorities", buffer.set_priorities, (state, indices, priorities)


# The census's operations in two groups of about the same lowering time: every kind
# with every sampler, and the options and tools (`operations(shape, group)`).
GROUPS = ("kinds", "tools")


def operations(shape: Shape = BASE, group: str | None = None
               ) -> Iterator[tuple[str, Callable, tuple]]:  # fmt: skip
    """(name, function, abstract arguments) of every operation in the census, or of
    one of its `GROUPS`."""
    if group in (None, "kinds"):
        for sampler_name, sampler in _samplers():
            for kind, buffer, example, time_axis in _kinds(sampler, shape):
                yield from _sampled_calls(f"{kind}/{sampler_name}", buffer, example,
                                          time_axis, shape)  # fmt: skip
    if group in (None, "tools"):
        yield from _tools(shape)


def _tools(shape: Shape) -> Iterator[tuple[str, Callable, tuple]]:
    """The options (n-step, frames, goals), `vectorize`, the rollout buffer and the
    queue, a Python loop's blocks, and the rate limiter (base) or Brax's buffer."""
    for name, buffer, example in _options(shape):
        yield from _sampled_calls(name, buffer, example, 1, shape)
    yield from _vectorized(shape)
    yield from _rollout_and_queue(shape)
    yield from _blocks(shape)
    if shape == BASE:
        yield from _rate_limiter()  # counters only: no shape to vary
        return
    yield from _brax(shape)


def _vectorized(shape: Shape):
    """`vectorize`: one prioritized replay buffer per environment."""
    if shape == BASE:
        replay = jaxbuf.make_replay_buffer(4096, 64, sampler=jaxbuf.prioritized())
    else:  # the batch split among the buffers
        per_buffer = max(shape.batch // shape.envs, 1)
        replay = jaxbuf.make_replay_buffer(shape.steps, per_buffer, sampler=jaxbuf.prioritized())
    stacked = jaxbuf.vectorize(replay, shape.envs)
    yield from _sampled_calls("vectorize(replay/prioritized)", stacked, STEP, 1, shape)


def _brax(shape: Shape):
    """`jaxbuf.brax.BraxReplay`, Brax's interface (its own transition record)."""
    import jaxbuf.brax

    extras = {"state_extras": {"truncation": jnp.float32(0)}}
    dummy = BraxTransition(jnp.zeros(8), jnp.zeros(2), jnp.float32(0), jnp.float32(0),
                           jnp.zeros(8), extras)  # fmt: skip
    replay = jaxbuf.brax.BraxReplay(shape.envs * shape.steps, dummy, shape.batch,
                                    num_envs=shape.envs)  # fmt: skip
    state = jax.eval_shape(replay.init, jax.random.key(0))
    steps = _zeros(dummy, shape.envs)
    yield "brax.insert_internal", replay.insert_internal, (state, steps)
    yield "brax.sample_internal", replay.sample_internal, (state,)


class BraxTransition(NamedTuple):
    """Brax's `brax.training.types.Transition` (Brax itself is not needed)."""

    observation: Any
    action: Any
    reward: Any
    discount: Any
    next_observation: Any
    extras: Any = ()


def _rate_limiter():
    """The rate limiter's checks (double arithmetic from integer words) and counts."""
    limiter = jaxbuf.sample_to_insert_ratio(0.0004, 1, 2.0)
    state = jax.eval_shape(limiter.init)
    count, gate = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.bool_)
    for name in ("can_insert", "can_sample"):
        yield f"rate limiter.{name}", getattr(limiter, name), (state, count)
    for name in ("inserted", "sampled", "deleted"):
        yield f"rate limiter.{name}", getattr(limiter, name), (state, count, gate)


def _blocks(shape: Shape):
    """A Python loop's call (`jaxbuf.blocks`, `HostLoop`): 32 steps written, 32 batches drawn."""
    k, envs = 32, shape.envs
    for name, sampler in (("uniform", jaxbuf.uniform()), ("prioritized", jaxbuf.prioritized())):
        buffer = jaxbuf.make_transition_buffer(envs, shape.steps, shape.batch, sampler=sampler)
        example = _transition(jnp.zeros(8))
        blocks = jaxbuf.blocks(buffer, k)
        state = jax.eval_shape(buffer.init, example)
        args = (state, _zeros(example, k, envs), jax.random.key(0))
        yield f"blocks(transition/{name}).write_and_draw", blocks.write_and_draw, args
    indices = jax.ShapeDtypeStruct((k, shape.batch), jnp.int32)
    priorities = jax.ShapeDtypeStruct((k, shape.batch), jnp.float32)
    yield (f"blocks(transition/{name}).set_priorities", blocks.set_priorities,
           (state, indices, priorities))  # fmt: skip


def _rollout_and_queue(shape: Shape):
    step = {"obs": jnp.zeros(8), "action": jnp.int32(0), "log_prob": jnp.float32(0),
            "reward": jnp.float32(0), "value": jnp.float32(0), "final_value": jnp.float32(0),
            "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}  # fmt: skip
    envs = 64 if shape == BASE else shape.envs
    rollout = jaxbuf.make_rollout_buffer(128, envs, discount=0.99, gae_lambda=0.95)
    state = jax.eval_shape(rollout.init, step)
    yield "rollout.add", rollout.add, (state, _zeros(step, envs))
    yield "rollout.finish", rollout.finish, (state, jax.ShapeDtypeStruct((envs,), jnp.float32))
    yield "rollout.clear", rollout.clear, (state,)
    minibatches = lambda s, k: rollout.minibatches(s, k, 4)  # noqa: E731
    yield "rollout.minibatches", minibatches, (state, jax.random.key(0))
    if shape == BASE:
        queue = jaxbuf.make_queue(4096, 64, 256)
    else:
        queue = jaxbuf.make_queue(shape.capacity, envs, min(shape.batch, shape.capacity))
    state = jax.eval_shape(queue.init, STEP)
    yield "queue.add", queue.add, (state, _zeros(STEP, envs))
    yield "queue.pop", queue.pop, (state,)


def table(shape: Shape = BASE, group: str | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """{operation: {platform: counts}} of every operation (of one of the `GROUPS`)."""
    return {name: {p: counts(text) for p, text in lowered_for_each(fn, args).items()}
            for name, fn, args in operations(shape, group)}  # fmt: skip


def capacity_dims(text: str) -> set[int]:
    """The dimensions of the exported function's arguments (the state)."""
    head = text[text.index("func.func public @main") :].split("\n", 1)[0]
    return {int(d) for t in re.findall(r"tensor<((?:\d+x)+)", head) for d in t.split("x") if d}


# Operations that may take the storage whole without working on all of it: reads of
# rows (a gather's result is `[B, ...]`) and calls (the callee's operations count).
READS = ("stablehlo.gather", "stablehlo.dynamic_gather", "stablehlo.dynamic_slice",
         "stablehlo.slice", "func.call", "call")  # fmt: skip


def operand_types(text: str) -> set[tuple[str, str]]:
    """`(operation, type)` for every type an operation of a module text takes or makes,
    but only the results of `READS`."""
    found = set()
    for line in text.splitlines():
        match = re.match(r"\s*%[^=]+= \"?([\w.]+)\"?", line)
        if not match or match.group(1) in ("stablehlo.reshape", "stablehlo.constant"):
            continue
        types = line.rsplit(" : ", 1)[-1] if " : " in line else line
        if match.group(1) in READS:
            types = types.rsplit("->", 1)[-1]
        found.update((match.group(1), t) for t in re.findall(r"tensor<(?:\d+x)*[a-z]\w*", types))
    return found


def growing_ops(text: str, halved: str) -> list[str]:
    """The operations of `text` whose work is in proportion to the capacity, `halved`
    being the same function lowered at half the capacity: an operand or result with
    one of the state's dimensions that changed (`capacity_dims`), of a type that the
    halved module has nowhere. A gather's result is `[B, ...]` and never grows; a tree walk does
    more steps at a larger capacity, none of the storage's size; an associative scan
    over 4,096 environments makes results of 256 entries, the size of a ring of 256
    steps, but makes them at either capacity."""
    dims = capacity_dims(text) - capacity_dims(halved)
    grown = []
    for op, result in operand_types(text) - operand_types(halved):
        if {int(d) for d in re.findall(r"(\d+)x", result)} & dims:
            grown.append(f"{op}: {result[7:]}")
    return sorted(grown)


def scale(shape: Shape, group: str | None = None) -> dict[str, Any]:
    """The census at one shape (of one of the `GROUPS`, or all): `operations` lowered,
    those that loop or branch (`BRANCH_FREE` operations with a `while` or a
    `case`/`if`, by platform), and the draws with work sized like the storage (found by
    lowering them again at half the capacity: the state's dimensions that change are
    the capacity's)."""
    halved = {name: (fn, args) for name, fn, args in operations(shape.halved(), group)}
    loops, growing, count = [], {}, 0
    for name, fn, args in operations(shape, group):
        texts = lowered_for_each(fn, args)
        count += 1
        for platform, text in texts.items():
            found = counts(text)
            if name.rsplit(".", 1)[1] in BRANCH_FREE and (found["while"] or found["case/if"]):
                loops.append(f"{name} on {platform}: {found['while']} while, "
                             f"{found['case/if']} case/if")  # fmt: skip
        if name.rsplit(".", 1)[1] in DRAWS:
            smaller = lowered_for_each(*halved[name])
            for platform, text in texts.items():
                ops = growing_ops(text, smaller[platform])
                if ops:
                    growing[f"{name} on {platform}"] = ops
    return {"operations": count, "loops": loops, "growing": growing}


SCALE_HEAD = (
    "| environments | steps each | batch | group | operations (each for cuda and tpu) | "
    "hot ones that loop or branch | draws sized like the storage |\n|---|---|---|---|---|---|---|\n"
)
HOST_SCALE_HEAD = (
    "| environments | steps each | batch | host-placed operations | host arrays moved whole "
    "or gathered in device code |\n|---|---|---|---|---|\n"
)


def _shape_cells(shape: Shape) -> str:
    return f"| {shape.envs:,} | {shape.steps:,} | {shape.batch:,} |"


def scale_row(shape: Shape, group: str, found: dict[str, Any]) -> str:
    """One row of the page's scale table: `found` from `scale(shape, group)`."""
    return (f"{_shape_cells(shape)} {group} | {found['operations']} | {len(found['loops'])} | "
            f"{len(found['growing'])} |")  # fmt: skip


def host_scale_row(shape: Shape, host: dict[str, dict[str, dict]]) -> str:
    """One row of the page's host table at scale: `host` from `census_host.table(shape)`."""
    moved = sum(c["whole transfers"] + c["device gathers/scatters"]
                for per_platform in host.values() for c in per_platform.values())  # fmt: skip
    return f"{_shape_cells(shape)} {len(host)} | {moved} |"


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
    if sys.argv[1:] == ["--scale"]:  # the page's scale table
        import census_host

        rows = [scale_row(s, g, scale(s, g)) for s in SCALE for g in GROUPS]
        sys.stdout.write(SCALE_HEAD + "\n".join(rows) + "\n\n")
        rows = [host_scale_row(s, census_host.table(s)) for s in SCALE]
        sys.stdout.write(HOST_SCALE_HEAD + "\n".join(rows) + "\n")
    else:
        sys.stdout.write(markdown(table()))
