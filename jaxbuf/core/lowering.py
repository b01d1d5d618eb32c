"""The lowering seam: every choice jaxbuf makes per lowering platform, and every size switch.

A jaxbuf function gives the same results on every platform, but not with the same
program. A CPU runs a loop, a branch or a small gather cheaply; on a GPU or TPU each
iteration of a loop is a round of kernel launches driven from the host, a branch sends
its predicate to the host, and a small gather is a kernel of its own. Each choice below
is named for what it trades and takes both forms; `choose` picks one where the program
is lowered (`jax.lax.platform_dependent`), so a program exported from a CPU host for
`cuda` gets the accelerators' form. Both forms give the same results bit for bit, and
the tests run both on a CPU: their `platform_path` fixture patches `choose`, the only
function here that asks for the platform.

A size switch picks a form by a static size (known when the function is traced). Each
is defined here, once, with its rule; the measurements that set them are in
docs/architecture.md ("The lowering seam").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

# Tables of at most this many entries are read by comparison with every entry on
# accelerators (elementwise work that fuses), larger ones by a gather.
SMALL = 64
# Up to this many entries, finding repeats compares every pair (`[B, B]` elementwise
# work that fuses; on CPU, Floyd's loop); above, a sort (the pairs grow as `B^2`).
PAIRS = 1024
# Rows of at least this many bytes are written on CPU as slice copies, not a scatter
# (which XLA's CPU backend runs element by element).
WIDE_ROW = 512
# Up to this many wide rows are written on CPU one row at a time; more as two windows.
FEW_ROWS = 64
# Up to this many rows of host memory move one slice each; more are gathered or
# scattered by the host and move in one block.
ROW_SLICES = 32
# Sum-tree levels walked per wide access on accelerators (`_sumtree_blocks`).
LEVELS = 5


def choose(*args: Any, cpu: Callable[..., Any], accelerator: Callable[..., Any]) -> Any:
    """`cpu(*args)` in a program lowered for CPU, `accelerator(*args)` for GPU and TPU."""
    return jax.lax.platform_dependent(*args, cpu=cpu, default=accelerator)


def loop_or_unrolled(*args: Any, loop: Callable[..., Any], unrolled: Callable[..., Any]) -> Any:
    """Steps in a loop (`while`, `scan`, `fori_loop`) on CPU; the same steps without a
    loop on accelerators (unrolled, log-depth, or vectorized), the same results."""
    return choose(*args, cpu=loop, accelerator=unrolled)


def branch_or_mask(*args: Any, branch: Callable[..., Any], mask: Callable[..., Any]) -> Any:
    """Work skipped by a branch (`cond`) on CPU; on accelerators done and masked by a
    select, so that no predicate travels to the host."""
    return choose(*args, cpu=branch, accelerator=mask)


def gather_or_compare(*args: Any, gather: Callable[..., Any], compare: Callable[..., Any]) -> Any:
    """A read of a small table (at most `SMALL` entries): a gather on CPU; on
    accelerators a comparison with every entry, summed (elementwise work that fuses
    with its neighbours instead of a gather kernel of its own)."""
    return choose(*args, cpu=gather, accelerator=compare)


def copies_or_scatter(*args: Any, copies: Callable[..., Any], scatter: Callable[..., Any]) -> Any:
    """Wide rows written as slice copies on CPU (a memory copy each); one scatter or
    window update on accelerators."""
    return choose(*args, cpu=copies, accelerator=scatter)


def apart_or_together(*args: Any, apart: Callable[..., Any], together: Callable[..., Any]) -> Any:
    """Reads apart on CPU, where XLA narrows each to the columns its consumers use;
    together in one gather on accelerators, one kernel instead of several."""
    return choose(*args, cpu=apart, accelerator=together)
