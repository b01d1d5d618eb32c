"""The census against Flashbax's flat buffer, at the shapes of the GPU table (issue 66).

The operations the GPU rows of `docs/census.md` time, lowered for `cuda` on this CPU host
beside the same operations of Flashbax's flat buffer (`make_flat_buffer`, transitions as
pairs of consecutive steps): the gathers (`gather`, `dynamic_slice`), the scatters
(`scatter`, `dynamic_update_slice`) and the sorts of each module, the bytes those
gathers read and those scatters write, per sampled transition (a `sample`: bytes over the
batch) or per added step (an `add`: bytes over the environments), and the bytes of the
largest operand a read or write is made into (work sized like the storage is the cost
to avoid). The kinds:

- `transition`: `make_transition_buffer(E, 256, B)` with its defaults (n=1, a side ring
  of `256 / 10` final observations), one step per environment added (`add_step`);
- `replay`: `make_replay_buffer(E * 256, B)` of full transitions, `E` added per `add`;
- `flashbax flat`: `make_flat_buffer(E * 256, 2 * E, B, add_batch_size=E)`, one step per
  environment added, pairs sampled;
- `prioritized transition`: the transition kind with `jaxbuf.prioritized()`; and its
  `set_priorities` of a batch.

Each step is `obs` float32 `[D]`, `action` float32 `[8]`, `reward` float32 and the
flags (Flashbax's: `done`; the transition kind's: `terminated`, `truncated`).
`python tests/census_flashbax.py` prints the page's table anew.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from census import GATHER, SCATTER, lowered

import jaxbuf

STEPS = 256  # per environment, as the GPU check's probe (tools/probes/scale_probe.py)
SECTION = "## Against Flashbax's flat buffer"  # the page's section


class UserShape(NamedTuple):
    """`envs` environments stepped together, `obs` float32 observation entries, `batch`."""

    envs: int
    obs: int
    batch: int


# The rows of the GPU table (issue 66): 4,096 environments x 64 / 512 entries, batches of
# 8,192 and 32,768; 512 environments x 128.
SHAPES = (UserShape(4096, 64, 8192), UserShape(4096, 512, 8192), UserShape(4096, 64, 32768),
          UserShape(4096, 512, 32768), UserShape(512, 128, 8192))  # fmt: skip
COLUMNS = ("gather", "scatter", "sort", "storage", "tables")
# One-axis operands of at most this many bytes (other than a replay's stored items) are
# tables (per-environment counters, a search's running totals), not the storage.
TABLE_BYTES = 1 << 18


def _step(shape: UserShape) -> dict[str, jax.ShapeDtypeStruct]:
    f32 = jnp.float32
    return {"obs": jax.ShapeDtypeStruct((shape.obs,), f32),
            "action": jax.ShapeDtypeStruct((8,), f32), "reward": jax.ShapeDtypeStruct((), f32),
            "done": jax.ShapeDtypeStruct((), jnp.bool_)}  # fmt: skip


def _zeros(spec: Any, *lead: int) -> Any:
    return jax.tree.map(lambda s: jnp.zeros((*lead, *s.shape), s.dtype), spec)


def _example_transition(shape: UserShape) -> jaxbuf.Transition:
    step = _zeros(_step(shape))
    return jaxbuf.Transition(step["obs"], step["action"], step["reward"], step["done"],
                             step["done"], step["obs"])  # fmt: skip


def _transition_ops(name: str, shape: UserShape, sampler: Any) -> Iterator[tuple]:
    buffer = jaxbuf.make_transition_buffer(shape.envs, STEPS, shape.batch, sampler=sampler)
    state = jax.eval_shape(buffer.init, _example_transition(shape))
    steps = jax.tree.map(lambda x: jnp.zeros((shape.envs, *x.shape), x.dtype),
                         _example_transition(shape))  # fmt: skip
    yield f"{name}.add", buffer.add_step, (state, steps), shape.envs
    yield f"{name}.sample", buffer.sample, (state, jax.random.key(0)), shape.batch
    if getattr(buffer, "set_priorities", None) is not None:
        indices = jax.ShapeDtypeStruct((shape.batch,), jnp.int32)
        priorities = jax.ShapeDtypeStruct((shape.batch,), jnp.float32)
        yield (f"{name}.set_priorities", buffer.set_priorities, (state, indices, priorities),
               shape.batch)  # fmt: skip


def _replay_ops(shape: UserShape) -> Iterator[tuple]:
    item = {**_zeros(_step(shape)), "next_obs": jnp.zeros(shape.obs)}
    buffer = jaxbuf.make_replay_buffer(shape.envs * STEPS, shape.batch)
    state = jax.eval_shape(buffer.init, item)
    yield "replay.add", buffer.add, (state, _zeros(item, shape.envs)), shape.envs
    yield "replay.sample", buffer.sample, (state, jax.random.key(0)), shape.batch


def _flashbax_ops(shape: UserShape) -> Iterator[tuple]:
    import flashbax as fbx

    buffer = fbx.make_flat_buffer(max_length=shape.envs * STEPS, min_length=2 * shape.envs,
                                  sample_batch_size=shape.batch, add_sequences=False,
                                  add_batch_size=shape.envs)  # fmt: skip
    state = jax.eval_shape(buffer.init, _zeros(_step(shape)))
    add = _flashbax_promotion(buffer.add)
    yield "flashbax flat.add", add, (state, _zeros(_step(shape), shape.envs)), shape.envs
    sample = _flashbax_promotion(buffer.sample)
    yield "flashbax flat.sample", sample, (state, jax.random.key(0)), shape.batch


def _flashbax_promotion(fn: Callable) -> Callable:
    """Flashbax's function traced under JAX's default promotion rules (the tests raise
    on rank and dtype promotion, which Flashbax's own code relies on)."""

    def traced(*args: Any) -> Any:
        with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
            return fn(*args)

    return traced


def operations(shape: UserShape) -> Iterator[tuple[str, Callable, tuple, int]]:
    """(name, function, abstract arguments, transitions or steps it moves) at `shape`."""
    yield from _flashbax_ops(shape)
    yield from _transition_ops("transition", shape, jaxbuf.uniform())
    yield from _replay_ops(shape)
    yield from _transition_ops("prioritized transition", shape, jaxbuf.prioritized())


_DTYPE_BYTES = {"f32": 4, "i32": 4, "ui32": 4, "i1": 1, "ui8": 1, "i8": 1, "ui16": 2,
                "i16": 2, "f16": 2, "bf16": 2, "i64": 8, "ui64": 8, "f64": 8}  # fmt: skip


def _bytes(tensor: str) -> int:
    """Bytes of a `tensor<8192x64xf32>` type (its text without `tensor<`)."""
    *dims, dtype = tensor.split("x")
    size = 1
    for dim in dims:
        size *= int(dim)
    return size * _DTYPE_BYTES[dtype]


def _signature(lines: list[str], start: int) -> str:
    """The type signature `(operands) -> result` that ends the operation at `start`
    (a scatter's update region spans lines: its signature follows the region)."""
    depth = 0
    for line in lines[start:]:
        depth += line.count("({") - line.count("})")
        if depth <= 0 and " : " in line:
            return line.rsplit(" : ", 1)[1]
    raise ValueError(f"no signature after line {start}: {lines[start]}")


def _types(text: str) -> list[str]:
    return re.findall(r"tensor<((?:\d+x)*[a-z]\w*)>", text)


def _functions(text: str) -> dict[str, list[str]]:
    """The module's functions: `{name: lines}`."""
    functions: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in text.splitlines():
        match = re.match(r"\s*func\.func (?:public |private )?@([\w.$-]+)\(", line)
        if match:
            lines = functions.setdefault(match.group(1), [])
        lines.append(line)
    return functions


def _is_table(tensor: str, capacity: int) -> bool:
    """Whether an operand is a table: one axis, not the `capacity` stored steps, at most
    `TABLE_BYTES` (per-environment counters, a search's running totals)."""
    dims = tensor.split("x")[:-1]
    return len(dims) == 1 and int(dims[0]) != capacity and _bytes(tensor) <= TABLE_BYTES


def _own(lines: list[str], capacity: int) -> tuple[dict[str, int], list[str]]:
    """One function's own reads and writes (counts, and bytes from or into the storage
    or tables) and the functions it calls."""
    own = dict.fromkeys(("gather", "scatter", "sort", "storage", "tables"), 0)
    for i, line in enumerate(lines):
        is_read, is_write = re.search(GATHER, line), re.search(SCATTER, line)
        own["sort"] += bool(re.search(r"stablehlo\.sort", line))
        if not (is_read or is_write):
            continue
        operands, result = _signature(lines, i).split("->")
        types = _types(operands)
        if is_read:
            own["gather"] += 1
            moved = _bytes(_types(result)[0])
        else:  # scatter(operand, indices, updates); dynamic_update_slice(operand, update, ...)
            own["scatter"] += 1
            moved = _bytes(types[2] if "scatter" in line else types[1])
        own["tables" if _is_table(types[0], capacity) else "storage"] += moved
    return own, re.findall(r"\bcall @([\w.$-]+)\(", "\n".join(lines))


def executed(text: str, capacity: int) -> dict[str, int]:
    """What the module's `main` runs: gathers, scatters and sorts, each function's counted
    as many times as it is called (XLA inlines them), and the bytes those gathers read
    (their results) and scatters write (their updates), from or into the storage or from
    tables (`_is_table`; `capacity`: the stored steps)."""
    functions = _functions(text)
    found = {name: _own(lines, capacity) for name, lines in functions.items()}

    def total(name: str) -> dict[str, int]:
        own, calls = found[name]
        summed = dict(own)
        for callee in calls:
            for key, value in total(callee).items():
                summed[key] += value
        return summed

    return total("main")


def census(shape: UserShape) -> dict[str, dict[str, int]]:
    """{operation: counts} at `shape`: what the `cuda` module runs (`executed`), bytes
    per transition (or added step) from the storage and from tables (`_is_table`)."""
    rows = {}
    for name, fn, args, moves in operations(shape):
        found = executed(lowered(fn, args, "cuda"), capacity=shape.envs * STEPS)
        found["storage"], found["tables"] = (round(found[k] / moves) for k in ("storage", "tables"))
        rows[name] = found
    return rows


def markdown(shape: UserShape, rows: dict[str, dict[str, int]]) -> str:
    head = (f"| `{shape.envs} x {shape.obs}, batch {shape.batch}` | gathers | scatters | "
            "sorts | bytes of storage per transition or step | bytes of tables |\n"
            "|---|---|---|---|---|---|\n")  # fmt: skip
    lines = [f"| `{name}` | " + " | ".join(f"{row[c]:,}" for c in COLUMNS) + " |"
             for name, row in rows.items()]  # fmt: skip
    return head + "\n".join(lines) + "\n"


def read_page(text: str) -> dict[UserShape, dict[str, dict[str, int]]]:
    """{shape: {operation: counts}} from the page's tables of this section."""
    tables: dict[UserShape, dict[str, dict[str, int]]] = {}
    rows: dict[str, dict[str, int]] = {}
    for line in text.split(SECTION, 1)[1].splitlines():
        head = re.match(r"\| `(\d+) x (\d+), batch (\d+)` \|", line)
        row = re.match(r"\| `([^`]+)` \| (.+) \|$", line)
        if head:
            rows = tables.setdefault(UserShape(*map(int, head.groups())), {})
        elif row:
            cells = [int(c.replace(",", "")) for c in row.group(2).split(" | ")]
            rows[row.group(1)] = dict(zip(COLUMNS, cells, strict=True))
    return tables


# What each operation reads or writes beyond one gather (sample) or one scatter (add) per
# stored leaf, Flashbax's rule: the transition kind's final observations and its search.
LEAVES = {"flashbax flat": 4, "replay": 5, "transition": 5}
EXTRA = {"transition.sample": ("gather", ("search among environments", "stale count",
                                          "side-ring slot", "final observation")),
         "transition.add": ("scatter", ("final observation pushed", "its step number",
                                        "step's slot"))}  # fmt: skip


if __name__ == "__main__":
    for user_shape in SHAPES[: int(sys.argv[1]) if sys.argv[1:] else None]:
        sys.stdout.write(markdown(user_shape, census(user_shape)) + "\n")
