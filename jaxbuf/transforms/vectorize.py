"""Independent buffers of any sampled kind, one per environment (say), behind one interface.

`vectorize` lifts a kind's layout over a leading buffer axis: the state is the
single buffer's state stacked `num_buffers` times, but for the sampler's state,
which covers the slots of every buffer at once (buffer `b`'s slot `s` is
`b * num_slots + s`), so one draw is uniform (or in proportion to priority)
over everything stored in all buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbuf.core import assembly as _assembly
from jaxbuf.core import pipeline as _pipeline
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Layout, Option, Relabel
from jaxbuf.core.records import Buffer, PyTree, Sample


def _inner(state):
    """The stacked single-buffer states, without the (global) sampler state."""
    return state.replace(sampler=None)


def _check_lead(tree: PyTree, count: int, what: str) -> None:
    expected = f"a leading axis of num_buffers={count}"
    _validation.check_leading(tree, count, what, expected, "Give one entry per buffer.")


def _pick(stacked: PyTree, which: jax.Array) -> PyTree:
    """Row `i` of buffer `which[i]` from leaves `[num_buffers, B, ...]`."""
    rows = jnp.arange(which.shape[0])
    return jax.tree.map(lambda x: x[which, rows], stacked)


def _lifted_changes(changes: Changes, count: int, num_slots: int) -> Changes:
    base = (jnp.arange(count, dtype=jnp.int32) * num_slots)[:, None]
    cleared = None
    if changes.cleared is not None:
        cleared = jnp.where(changes.cleared >= 0, changes.cleared + base, -1).ravel()
    keep = None if changes.keep is None else changes.keep.ravel()
    return Changes(cleared=cleared, filled=(changes.filled + base).ravel(), keep=keep,
                   disjoint=changes.disjoint)  # fmt: skip


def lift(layout: Layout, count: int) -> Layout:
    """`layout` over `count` stacked buffers (see the module docstring)."""
    slots, groups = layout.num_slots, layout.groups

    def init(example: PyTree):
        one = layout.init(example)
        return jax.tree.map(lambda x: jnp.repeat(x[None], count, axis=0), one)

    def write(state, data: PyTree, where=None):
        _check_lead(data, count, "items")
        write_each = jax.vmap(layout.write, in_axes=(0, 0, None))  # one gate for all buffers
        try:
            after, changes = write_each(_inner(state), data, where)
        except (ValueError, TypeError) as error:
            raise type(error)(
                f"{error} (shapes there are one buffer's, without the leading num_buffers axis.)"
            ) from error
        return after.replace(sampler=state.sampler), _lifted_changes(changes, count, slots)

    def counts(state) -> jax.Array:
        per = jax.vmap(layout.counts)(_inner(state))
        return jnp.broadcast_to(per.reshape(count, -1), (count, groups)).ravel()

    def slot(state, group, member):
        which, local = _storage.split(group, groups)
        per = jax.vmap(lambda s: layout.slot(s, local, member))(_inner(state))
        return which, _pick(per, which)

    def usable(state, flat):
        which, local = _storage.split(flat, slots)
        return _pick(jax.vmap(lambda s: layout.usable(s, local))(_inner(state)), which)

    def expand(state, where):
        which, local = where
        return _pick(jax.vmap(lambda s: layout.expand(s, local))(_inner(state)), which)

    def place(flat):
        which, local = _storage.split(flat, slots)
        return which, layout.place(local)

    def ready(state, flat=None):
        per = jax.vmap(layout.ready)(_inner(state))
        return jnp.all(per) if flat is None else per[flat // slots]

    def one_step(state, step: PyTree):
        _check_lead(step, count, "step")
        assert layout.one_step is not None
        return jax.vmap(layout.one_step)(_inner(state), step)

    return Layout(
        init=init, write=write, num_slots=count * slots, groups=count * groups, counts=counts,
        slot=slot, usable=usable, expand=expand, ready=ready, place=place,
        flatten=lambda where: where[0] * slots + layout.flatten(where[1]),
        one_step=None if layout.one_step is None else one_step,
        steps_axis=layout.steps_axis + 1, side_of=layout.side_of,
    )  # fmt: skip


def _lift_option(option: Option) -> Option:
    """An option of the single buffer, for the stacked ones: its layout wrapper is in
    the lifted layout already; its rewrite of drawn items `(buffer, local where)` runs
    on each item's own buffer."""
    if option.relabel is None:
        return option
    relabel = option.relabel

    def choose(state, where, key):
        which, local = where
        return _pick(jax.vmap(lambda s: relabel.choose(s, local, key))(_inner(state)), which)

    def apply(state, where, experience, source):
        which, local = where
        per = jax.vmap(lambda s: relabel.apply(s, local, experience, source))(_inner(state))
        return _pick(per, which)

    return option._replace(relabel=Relabel(choose, apply))


def vectorize(buffer: Buffer, num_buffers: int) -> Buffer:
    """Turns one sampled buffer into `num_buffers` independent ones over a stacked state.

    Each buffer (say, one per environment) keeps its own FIFO order, episodes and
    `min_size`. The state is the single buffer's state with a leading
    `[num_buffers]` axis on every leaf (`size` included), but for the sampler's
    state: one sampler covers every buffer's slots, so `sample` draws
    `sample_batch_size` items in total, uniformly (or in proportion to priority)
    over everything stored in all buffers; how many come from each buffer is
    random. A sample's `source` is the buffer of each item and its `indices` are
    `buffer * num_slots + index` (accepted by `take` and `set_priorities`); an
    item is `valid` where its own buffer holds `min_size`. `can_sample` is true
    when every buffer can sample.

    The expansion of drawn items runs once per buffer and keeps each item's
    own, so a `sample` costs about `num_buffers` times a single buffer's reads:
    for many environments prefer one per-environment buffer (`num_envs`) where
    one shared clock suits the data.

    Args:
      buffer: a buffer made by `make_replay_buffer`, `make_trajectory_buffer`,
        `make_transition_buffer` or `make_episode_buffer`, with either sampler.
      num_buffers: the number of independent buffers.

    Returns:
      A `Buffer` whose `config` adds `num_buffers`; its `add` takes leaves
      `[num_buffers, ...]` of what the single buffer's `add` takes.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffers = jaxbuf.vectorize(jaxbuf.make_replay_buffer(10, 6), num_buffers=3)
      >>> state = buffers.init({"obs": jnp.zeros(2)})
      >>> state = buffers.add(state, {"obs": jnp.ones((3, 4, 2))})
      >>> batch = buffers.sample(state, jax.random.key(0))
      >>> state.size.tolist(), batch.experience["obs"].shape, batch.source.shape
      ([4, 4, 4], (6, 2), (6,))
    """
    if not isinstance(buffer, Buffer) or not isinstance(buffer.layout, Layout):
        raise TypeError(
            "vectorize takes a sampled buffer (make_replay_buffer, make_trajectory_buffer, "
            f"make_transition_buffer, make_episode_buffer), got {type(buffer).__name__}."
        )
    if "num_buffers" in buffer.config:
        raise ValueError("this buffer is vectorized already; vectorize the single buffer.")
    num_slots = buffer.layout.num_slots
    num_buffers = _validation.check_int(
        "num_buffers", num_buffers, maximum=_validation.MAX_INT32 // num_slots
    )
    config = {k: v for k, v in buffer.config.items() if k != "sampler"}
    stacked = _assembly.assemble(
        lift(buffer.layout, num_buffers), buffer.sampler, buffer.config.sample_batch_size,
        **config, num_buffers=num_buffers,
    )  # fmt: skip
    options = tuple(_lift_option(option) for option in buffer.options)
    return _pipeline.reapplied(_with_source(stacked, num_slots).replace(options=options), options)


def _with_source(buffer: Buffer, slots: int) -> Buffer:
    """`buffer` whose samples say which buffer each item came from (`source`)."""
    sample, advance = buffer.sample, buffer.next_batch

    def sourced(state, key, **options) -> Sample:
        batch = sample(state, key, **options)
        return batch.replace(source=batch.indices // slots)

    def next_batch(state, key):
        assert advance is not None
        state, batch = advance(state, key)
        return state, batch.replace(source=batch.indices // slots)

    return buffer.replace(sample=_assembly.wrapped(sourced, sample),
                          next_batch=None if advance is None
                          else _assembly.wrapped(next_batch, advance))  # fmt: skip
