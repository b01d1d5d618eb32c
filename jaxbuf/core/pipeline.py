"""The one build step of a sampled buffer: a layout, a sampler and its options, assembled.

Every option (frame stacking, goal relabeling, storage precision, host memory) is one
`Option` record: the entries it adds to the configuration, the options it cannot be
combined with (and why), and what it wraps: the layout (`layout`, a `Layout -> Layout`
function, as `options.precision.narrowed_layout` narrows what is written and read) and
what is drawn (`relabel`, given its own key). `build` refuses what cannot be combined in
one place, applies the layout wrappers in one fixed order (`ORDER`), assembles the
buffer, and applies the relabeling to `sample`, `next_batch` and `take`. The buffer keeps
its options (`Buffer.options`), so a transform (`vectorize`) re-applies them to what it
builds without knowing any option.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import assembly as _assembly
from jaxbuf.core.contracts import Layout, Option, Relabel, Sampler
from jaxbuf.core.records import Buffer

# The order in which options wrap a layout: frames read stored steps, goals rewrite what
# was drawn, precision narrows what is written, host memory places what was narrowed.
ORDER = ("frames", "goals", "storage_dtypes", "host_memory")


def refuse_combinations(options: Iterable[Option]) -> None:
    """Raises a `ValueError` for the first two options given that cannot be combined."""
    given = {option.name: option for option in options}
    for option in given.values():
        for other, why in option.refuses.items():
            if other in given:
                raise ValueError(f"{other} and {option.name} cannot be combined: {why}.")


def build(layout: Layout, sampler: Any, batch: int, options: Iterable[Option | None],
          /, **config: Any) -> Buffer:  # fmt: skip
    """The `Buffer` of `layout` with `options` (None: not given) applied, drawn by
    `sampler`, `batch` items per `sample`; `config` names the kind's settings."""
    sampler = check_sampler(sampler)
    chosen = sorted((o for o in options if o is not None), key=lambda o: ORDER.index(o.name))
    refuse_combinations(chosen)
    for option in chosen:
        if option.layout is not None:
            layout = option.layout(layout)
    added = {k: v for option in chosen for k, v in option.config.items()}
    buffer = _assembly.assemble(layout, sampler, batch, **config, **added)
    return reapplied(buffer.replace(options=tuple(chosen)), chosen)


def reapplied(buffer: Buffer, options: Iterable[Option]) -> Buffer:
    """`buffer` with the relabeling of `options` applied to what it draws."""
    for option in options:
        if option.relabel is not None:
            buffer = relabeled(buffer, option.relabel)
    return buffer


def check_sampler(sampler: Any) -> Sampler:
    """The `sampler=` argument, checked."""
    if not isinstance(sampler, Sampler):
        raise TypeError(
            "sampler must be jaxbuf.uniform(...), jaxbuf.prioritized(...) or jaxbuf.epochs(), got "
            f"{type(sampler).__name__}."
        )
    return sampler


def relabeled(buffer: Buffer, relabel: Relabel) -> Buffer:
    """`buffer` whose `sample` and `next_batch` rewrite what they draw (the key split
    into the draw's and the rewrite's) and whose `take` rewrites given a sample's
    `goal_source`."""
    layout, sample, advance, take = buffer.layout, buffer.sample, buffer.next_batch, buffer.take

    def rewrite(state, batch, key: jax.Array):
        where = layout.place(batch.indices)
        source = relabel.choose(state, where, key)
        experience = relabel.apply(state, where, batch.experience, source)
        return batch.replace(experience=experience, goal_source=source)

    def drawn(state, key, **options):
        key, goal_key = jax.random.split(key)
        return rewrite(state, sample(state, key, **options), goal_key)

    def next_batch(state, key):
        assert advance is not None
        key, goal_key = jax.random.split(key)
        after, batch = advance(state, key)
        return after, rewrite(state, batch, goal_key)

    def taken(state, indices, goal_source=None):
        experience = take(state, indices)
        if goal_source is None:
            return experience
        where = _assembly.place(layout, indices)
        expected = jax.eval_shape(relabel.choose, state, where, jax.random.key(0)).shape
        source = jnp.asarray(goal_source)
        if source.shape != expected or not jnp.issubdtype(source.dtype, jnp.integer):
            raise TypeError(f"goal_source must be an integer array {list(expected)} (a "
                            f"sample's), got {source.dtype}{list(source.shape)}.")  # fmt: skip
        return relabel.apply(state, where, experience, source.astype(jnp.int32))

    return buffer.replace(
        sample=_assembly.wrapped(drawn, sample), take=_assembly.wrapped(taken, take),
        next_batch=None if advance is None else _assembly.wrapped(next_batch, advance),
    )  # fmt: skip
