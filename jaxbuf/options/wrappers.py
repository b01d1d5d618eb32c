"""The storage options every sampled kind takes, checked together and applied to its layout.

`storage_dtypes={"obs": "bfloat16"}` keeps float32 leaves in 2 bytes
(`jaxbuf.options.precision`: lossy, opt-in, rounding to nearest, a clamp at the
storage dtype's range, never an inf from a finite value; a `done_fn` sees the
stored values as float32). `host_memory=("obs",)` allocates leaves in the device's
`pinned_host` memory, written and read by row slices inside `add` and `sample`
(`jaxbuf.options.host_memory`; JAX 0.7+, raising at `make` where the device has no
memory kinds). Both name top-level leaves (`"obs"` covers everything below it;
in a transition buffer it also covers `next_obs`, kept in the same ring), and
neither combines with `goals`.

Every kind applies them in one order, `wrap`: precision on the kind's own layout
(what is written is narrowed), then placement (where the narrowed leaves live).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxbuf.core.assembly import Layout
from jaxbuf.options import goals as _goals
from jaxbuf.options import host_memory as _host_memory
from jaxbuf.options import precision as _precision


class Options(NamedTuple):
    """A factory's checked storage options (empty where not asked for)."""

    storage_dtypes: dict[str, str]
    host_memory: tuple[str, ...]

    def config(self) -> dict[str, Any]:
        """The entries these options add to a buffer's configuration."""
        return {name: value for name, value in self._asdict().items() if value}

    def done_fn(self, done_fn: Any) -> Any:
        """`done_fn` as it sees a stored step (float32 again where narrowed)."""
        return _precision.seen_as_stored(done_fn, self.storage_dtypes)


def check(*, storage_dtypes: Any = None, host_memory: Any = None, goals: Any = None) -> Options:
    """The options, each checked (errors naming the argument), and their combination
    with `goals` (a checked `Hindsight` or None)."""
    options = Options(_precision.check_storage_dtypes(storage_dtypes),
                      _host_memory.check_names(host_memory))  # fmt: skip
    _goals.check_alone(goals, **options._asdict())
    return options


def wrap(layout: Layout, options: Options, *, side: str | None = None) -> Layout:
    """`layout` with the options applied: narrowed, then placed. `side` names the leaf
    whose side ring (a transition buffer's final observations, `"obs"`) follows it."""
    dtypes = options.storage_dtypes
    if side is not None:
        dtypes = _precision.with_next_obs(dtypes)
    narrowed = _precision.narrowed_layout(layout, dtypes)
    return _host_memory.hosted_layout(narrowed, options.host_memory, side=side)
