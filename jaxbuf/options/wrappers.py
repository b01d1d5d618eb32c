"""The storage options every sampled kind takes, as options of the one build step.

`storage_dtypes={"obs": "bfloat16"}` keeps float32 leaves in 2 bytes
(`jaxbuf.options.precision`: lossy, opt-in, rounding to nearest, a clamp at the
storage dtype's range, never an inf from a finite value; a `done_fn` sees the
stored values as float32). `host_memory=("obs",)` allocates leaves in the device's
`pinned_host` memory, written and read by row slices inside `add` and `sample`
(`jaxbuf.options.host_memory`; JAX 0.7+, raising at `make` where the device has no
memory kinds). Both name top-level leaves (`"obs"` covers everything below it;
in a transition buffer it also covers `next_obs`, kept in the same ring), and
neither combines with `goals`.

Each is a `core.pipeline.Option` whose `layout` wraps the kind's layout; `build`
applies them in its one order: precision first (what is written is narrowed), then
placement (where the narrowed leaves live).
"""

from __future__ import annotations

import functools
from typing import Any

from jaxbuf.core.contracts import Layout, Option
from jaxbuf.options import host_memory as _host_memory
from jaxbuf.options import precision as _precision


def narrowed(layout: Layout, *, dtypes: dict[str, str]) -> Layout:
    """`layout` storing the named float32 leaves narrow (and the side ring of a leaf
    named, with `next_obs`, as that leaf)."""
    if layout.side_of is not None:
        dtypes = _precision.with_next_obs(dtypes)
    return _precision.narrowed_layout(layout, dtypes)


def placed(layout: Layout, *, names: tuple[str, ...]) -> Layout:
    """`layout` keeping the named leaves (and a named leaf's side ring) in host memory."""
    return _host_memory.hosted_layout(layout, names, side=layout.side_of)


def storage(*, storage_dtypes: Any = None, host_memory: Any = None) -> tuple[Option | None, ...]:
    """The storage options given, each checked (errors naming the argument); None for
    one not given."""
    dtypes = _precision.check_storage_dtypes(storage_dtypes)
    names = _host_memory.check_names(host_memory)
    precision = Option(name="storage_dtypes", config={"storage_dtypes": dtypes},
                       layout=functools.partial(narrowed, dtypes=dtypes))  # fmt: skip
    placement = Option(name="host_memory", config={"host_memory": names},
                       layout=functools.partial(placed, names=names))  # fmt: skip
    return (precision if dtypes else None), (placement if names else None)


def seen_as_stored(done_fn: Any, storage_dtypes: Any) -> Any:
    """`done_fn` as it sees a stored step (float32 again where narrowed)."""
    return _precision.seen_as_stored(done_fn, _precision.check_storage_dtypes(storage_dtypes))
