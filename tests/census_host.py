"""The lowering census of host-placed leaves (`host_memory=`): each kind's `add`, `add_step`
and `sample`, exported for `cuda` and `tpu` from real arrays (an abstract or compile-only
device lists no memories and drops the kind), and what touches a host array counted:

- `row slices`: `dynamic_slice` / `dynamic_update_slice` on a host array (copies of rows
  or windows; DMAs on a GPU);
- `host gathers/scatters`: gathers on a host array computed by the host (`compute_on`),
  whose result, `B` rows, then moves to the device at once, and scatters of rows moved
  there at once;
- `whole transfers`: a whole host array moved between memories;
- `device gathers/scatters`: a gather or scatter on a host array in device computation.

The last two must be 0. `python tests/census_host.py` prints the table of
`docs/census.md`'s host-memory section.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import census
import jax
import jax.numpy as jnp
from census import Shape, counts

import jaxbuf

HOST_COUNTED = ("row slices", "host gathers/scatters", "whole transfers", "device gathers/scatters")
ENVS, CAPACITY, FEW, MANY = 4, 1024, 16, 256
FRAME = jnp.zeros((12, 10), jnp.uint8)  # a shape no device leaf has


def host_counts(text: str) -> dict[str, int]:
    """The host census of one module text (see the module docstring)."""
    hosted = set(re.findall(r'%arg\d+: (tensor<[^>]+>) \{mhlo\.memory_kind = "pinned_host"', text))
    lines = text.splitlines()

    def on_host(line: str) -> bool:  # the first operand's type is a host array's
        return any(f": ({t}" in line for t in hosted)

    def ops(pattern: str) -> list[str]:
        return [line for line in lines if re.search(pattern, line) and on_host(line)]

    gathers = ops(r'"stablehlo\.(?:dynamic_)?gather"|"stablehlo\.scatter"')
    in_device = [line for line in gathers if '_xla_compute_type = "host"' not in line]
    # host computations are called functions, one per signature: count the calls
    by_host = ops(r'= (?:func\.)?call @.*_xla_compute_type = "host"')
    return {
        "row slices": len(ops(r"stablehlo\.dynamic_(?:update_)?slice ")),
        "host gathers/scatters": len(by_host),
        "whole transfers": len(ops(r"@annotate_device_placement")),
        "device gathers/scatters": len(in_device),
    }


def _done(step: Any) -> jax.Array:
    return step["terminated"] | step["truncated"]


# The committed table of docs/census.md: 4 environments x 1,024 steps, batches of 16
# (row slices) and 256 (host gathers).
BASE = Shape(ENVS, FEW, CAPACITY, CAPACITY)


def _buffers(shape: Shape) -> Iterator[tuple[str, Any, dict]]:
    host = {"host_memory": ("obs",)}
    batch, envs, steps = shape.batch, shape.envs, shape.steps
    step = {"obs": FRAME, "action": jnp.int32(0), "reward": jnp.float32(0),
            "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}  # fmt: skip
    for name, sampler in (("uniform", jaxbuf.uniform()), ("prioritized", jaxbuf.prioritized())):
        buffer = jaxbuf.make_replay_buffer(shape.capacity, batch, sampler=sampler, **host)
        yield f"replay/{name} B={batch}", buffer, step
    yield f"transition n_step=3 frames B={batch}", jaxbuf.make_transition_buffer(
        envs, steps, batch, n_step=3, frames={"obs": 4}, min_episode_length=8, **host
    ), {**step, "next_obs": FRAME}  # fmt: skip
    yield f"trajectory frames B={batch}", jaxbuf.make_trajectory_buffer(
        envs, steps, batch, 8, done_fn=_done, frames={"obs": 4}, **host), step  # fmt: skip
    yield f"episode frames B={batch}", jaxbuf.make_episode_buffer(
        envs, steps, batch, 16, done_fn=_done, frames={"obs": 4}, **host), step  # fmt: skip


def _calls(shape: Shape, adds: bool) -> Iterator[tuple[str, Callable, tuple]]:
    """Each host-placed kind's `sample` at `shape`, and with `adds` its `add` (8 steps
    of every environment; replay: 8 items, or one per environment past the base) and
    `add_step`."""
    items = 8 if shape == BASE else shape.envs
    for name, buffer, step in _buffers(shape):
        state = buffer.init(step)
        replay = name.startswith("replay")
        lead = (items,) if replay else (shape.envs, 8)
        data = jax.tree.map(lambda x, lead=lead: jnp.zeros((*lead, *x.shape), x.dtype), step)
        if adds:  # adds do not depend on the batch size
            yield f"{name.split(' B=')[0]}.add", buffer.add, (state, data)
            if not replay:
                one = jax.tree.map(lambda x: x[:, 0], data)
                yield f"{name.split(' B=')[0]}.add_step", buffer.add_step, (state, one)
        yield f"{name}.sample", buffer.sample, (state, jax.random.key(0))


def operations(shape: Shape = BASE) -> Iterator[tuple[str, Callable, tuple]]:
    """(name, function, real arguments) of the host census: at the base, the adds and
    samples of batches of 16 and 256 and the stacked tools; elsewhere, at that shape."""
    if shape != BASE:
        yield from _calls(shape, adds=True)
        yield from _stacked(shape)
        return
    yield from _calls(BASE, adds=True)
    yield from _calls(BASE._replace(batch=MANY), adds=False)
    yield from _stacked(BASE)


def _stacked(shape: Shape) -> Iterator[tuple[str, Callable, tuple]]:
    """`vectorize` (host columns stacked) and `blocks` (several batches drawn per call)."""
    step = {"obs": FRAME, "reward": jnp.float32(0)}
    stacks = 2 if shape == BASE else shape.envs
    per_buffer = FEW if shape == BASE else max(shape.batch // stacks, 1)
    replay = jaxbuf.make_replay_buffer(CAPACITY if shape == BASE else shape.steps, per_buffer,
                                       host_memory=("obs",))  # fmt: skip
    stacked = jaxbuf.vectorize(replay, stacks)
    state = stacked.init(step)
    items = jax.tree.map(lambda x: jnp.zeros((stacks, 4, *x.shape), x.dtype), step)
    yield f"vectorize(replay, {stacks}).add", stacked.add, (state, items)
    yield (f"vectorize(replay, {stacks}) B={per_buffer}.sample", stacked.sample,
           (state, jax.random.key(0)))  # fmt: skip
    replay = jaxbuf.make_replay_buffer(shape.capacity, shape.batch, host_memory=("obs",))
    blocks = jaxbuf.blocks(replay, 4)
    data = jax.tree.map(lambda x: jnp.zeros((4, 2, *x.shape), x.dtype), step)
    args = (replay.init(step), data, jax.random.key(0))
    yield f"blocks(replay, 4) B={shape.batch}.write_and_draw", blocks.write_and_draw, args


def table(shape: Shape = BASE) -> dict[str, dict[str, dict[str, int]]]:
    """{operation: {platform: host counts and the while/case/if counts}}."""
    rows = {}
    for name, fn, args in operations(shape):
        rows[name] = {}
        # exported (a trace's lowering sees other memory kinds), once for both platforms
        for platform, text in census.exported_for_each(fn, args).items():
            found = counts(text)
            rows[name][platform] = {**host_counts(text), "while": found["while"],
                                    "case/if": found["case/if"]}  # fmt: skip
    return rows


def markdown(rows: dict[str, dict[str, dict[str, int]]]) -> str:
    """The docs table: `cuda` counts (`tpu` where they differ)."""
    return census.markdown(rows, (*HOST_COUNTED, "while", "case/if"))


if __name__ == "__main__":
    sys.stdout.write(markdown(table()))
