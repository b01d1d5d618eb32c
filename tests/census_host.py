"""The lowering census of host-placed leaves (`host_memory=`): each kind's `add`, `add_step`
and `sample`, exported for `cuda` and `tpu` from real arrays (an abstract or compile-only
device lists no memories and drops the kind), and what touches a host array counted:

- `row slices`: `dynamic_slice` / `dynamic_update_slice` on a host array (copies of rows
  or windows; DMAs on a GPU);
- `host gathers`: gathers on a host array computed by the host (`compute_on`), whose
  result, `B` rows, then moves to the device at once;
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
from census import PLATFORMS, counts, lowered

import jaxbuf

HOST_COUNTED = ("row slices", "host gathers", "whole transfers", "device gathers/scatters")
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
    by_host = ops(r'= call @.*_xla_compute_type = "host"')
    return {
        "row slices": len(ops(r"stablehlo\.dynamic_(?:update_)?slice ")),
        "host gathers": len(by_host),
        "whole transfers": len(ops(r"@annotate_device_placement")),
        "device gathers/scatters": len(in_device),
    }


def _done(step: Any) -> jax.Array:
    return step["terminated"] | step["truncated"]


def _buffers(batch: int) -> Iterator[tuple[str, Any, dict]]:
    host = {"host_memory": ("obs",)}
    step = {"obs": FRAME, "action": jnp.int32(0), "reward": jnp.float32(0),
            "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}  # fmt: skip
    for name, sampler in (("uniform", jaxbuf.uniform()), ("prioritized", jaxbuf.prioritized())):
        buffer = jaxbuf.make_replay_buffer(CAPACITY, batch, sampler=sampler, **host)
        yield f"replay/{name} B={batch}", buffer, step
    yield f"transition n_step=3 frames B={batch}", jaxbuf.make_transition_buffer(
        ENVS, CAPACITY, batch, n_step=3, frames={"obs": 4}, min_episode_length=8, **host
    ), {**step, "next_obs": FRAME}  # fmt: skip
    yield f"trajectory frames B={batch}", jaxbuf.make_trajectory_buffer(
        ENVS, CAPACITY, batch, 8, done_fn=_done, frames={"obs": 4}, **host), step  # fmt: skip
    yield f"episode frames B={batch}", jaxbuf.make_episode_buffer(
        ENVS, CAPACITY, batch, 16, done_fn=_done, frames={"obs": 4}, **host), step  # fmt: skip


def operations() -> Iterator[tuple[str, Callable, tuple]]:
    """(name, function, real arguments) of the host census."""
    for batch in (FEW, MANY):
        for name, buffer, step in _buffers(batch):
            state = buffer.init(step)
            replay = name.startswith("replay")
            lead = (8,) if replay else (ENVS, 8)
            data = jax.tree.map(lambda x, lead=lead: jnp.zeros((*lead, *x.shape), x.dtype), step)
            if batch == FEW:  # adds do not depend on the batch size
                yield f"{name.split(' B=')[0]}.add", buffer.add, (state, data)
                if not replay:
                    one = jax.tree.map(lambda x: x[:, 0], data)
                    yield f"{name.split(' B=')[0]}.add_step", buffer.add_step, (state, one)
            yield f"{name}.sample", buffer.sample, (state, jax.random.key(0))
    yield from _stacked()


def _stacked() -> Iterator[tuple[str, Callable, tuple]]:
    """`vectorize` (host columns stacked) and `blocks` (several batches drawn per call)."""
    step = {"obs": FRAME, "reward": jnp.float32(0)}
    replay = jaxbuf.make_replay_buffer(CAPACITY, FEW, host_memory=("obs",))
    stacked = jaxbuf.vectorize(replay, 2)
    state = stacked.init(step)
    items = jax.tree.map(lambda x: jnp.zeros((2, 4, *x.shape), x.dtype), step)
    yield "vectorize(replay, 2).add", stacked.add, (state, items)
    yield f"vectorize(replay, 2) B={FEW}.sample", stacked.sample, (state, jax.random.key(0))
    blocks = jaxbuf.blocks(replay, 4)
    data = jax.tree.map(lambda x: jnp.zeros((4, 2, *x.shape), x.dtype), step)
    args = (replay.init(step), data, jax.random.key(0))
    yield f"blocks(replay, 4) B={FEW}.write_and_draw", blocks.write_and_draw, args


def table() -> dict[str, dict[str, dict[str, int]]]:
    """{operation: {platform: host counts and the while/case/if counts}}."""
    rows = {}
    for name, fn, args in operations():
        rows[name] = {}
        for platform in PLATFORMS:
            text = lowered(fn, args, platform)
            found = counts(text)
            rows[name][platform] = {**host_counts(text), "while": found["while"],
                                    "case/if": found["case/if"]}  # fmt: skip
    return rows


def markdown(rows: dict[str, dict[str, dict[str, int]]]) -> str:
    """The docs table: `cuda` counts (`tpu` where they differ)."""
    return census.markdown(rows, (*HOST_COUNTED, "while", "case/if"))


if __name__ == "__main__":
    sys.stdout.write(markdown(table()))
