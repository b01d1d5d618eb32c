"""Buffers sharded over a mesh axis: one independent buffer per shard, no traffic.

`shard(buffer, mesh, axis_name)` turns a buffer made by any jaxbuf factory into
one whose state has a leading shard axis split over the mesh axis: shard `d`
holds the state of the buffer it was made from, for its own environments or
items. `add` gives each shard its block of the inputs, `sample` draws each
shard's batch from its own data with its own key (`fold_in(key, d)`), and the
batch is a global `jax.Array` split over the same axis. Every function is a
`jax.shard_map` of the single buffer's function, so the compiled `add` and
`sample` contain no collective; `can_sample` (true when every shard can) is the
one that reduces over shards.

`per_shard(buffer, axis_name)` gives the same functions for code that already
runs inside a `shard_map` over that axis, where each shard sees its block of the
state.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxbuf.core import footprint as _footprint
from jaxbuf.core import hosted as _hosted
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import _Record


class _Role(NamedTuple):
    """How a buffer function's positional arguments and result map onto shards.

    `args` names each positional argument: `state` (the shard's block of the
    state), `data` (split over shards along its leading axis) or `key` (the same
    key everywhere, folded with the shard index). `result` is `state`, `batch`
    (split along the leading axis), `minibatches` (split along the second), `all`
    (a bool that holds when it holds on every shard) or a tuple of these.
    """

    args: tuple[str, ...]
    result: Any
    optional: int = 0  # how many of the last `args` may be left out


ROLES = {
    "add": _Role(("state", "data"), "state"),
    "add_step": _Role(("state", "data"), "state"),
    "set_priorities": _Role(("state", "data", "data"), "state"),
    "finish": _Role(("state", "data"), "state"),
    "clear": _Role(("state",), "state"),
    "sample": _Role(("state", "key"), "batch"),
    "take": _Role(("state", "data", "data"), "batch", optional=1),
    "minibatches": _Role(("state", "key"), "minibatches"),
    "pop": _Role(("state",), ("state", "batch")),
    "next_batch": _Role(("state", "key"), ("state", "batch")),
    "can_sample": _Role(("state",), "all"),
    "can_add": _Role(("state",), "all"),
}


def _check_buffer(buffer: Any) -> None:
    if not isinstance(buffer, _Record) or not hasattr(buffer, "config"):
        raise TypeError(
            "shard and per_shard take a buffer made by a jaxbuf factory (make_replay_buffer, "
            f"make_trajectory_buffer, ...), got {type(buffer).__name__}."
        )


def _functions(buffer: Any) -> dict[str, Any]:
    return {name: fn for name in ROLES if (fn := getattr(buffer, name, None)) is not None}


def per_shard(buffer: Any, axis_name: str = "data") -> Any:
    """The buffer's functions for use inside a `shard_map` over `axis_name`.

    Inside the `shard_map`, a state made by `shard(buffer, mesh, axis_name).init`
    appears as its block: every leaf with a leading axis of 1. The functions
    returned take and return such blocks; `sample` and `minibatches` fold the
    shard index into the key, so shards draw independently from one key; and
    `can_sample` (`can_add`) answers for the shard alone (reduce it with
    `jax.lax.pmin` if every shard must agree). Nothing here communicates.

    Args:
      buffer: a buffer made by a jaxbuf factory, sized for ONE shard (its
        `num_envs`, `capacity` and `sample_batch_size` are per shard).
      axis_name: the mesh axis the state is split over.

    Returns:
      A buffer of the same type, with the same `config`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("data",))
      >>> buffer = jaxbuf.make_replay_buffer(capacity=100, sample_batch_size=4)
      >>> sharded, inner = jaxbuf.shard(buffer, mesh), jaxbuf.per_shard(buffer)
      >>> state = sharded.init({"obs": jnp.zeros(3)})
      >>> @jax.jit
      ... @jax.shard_map(mesh=mesh, in_specs=(P("data"), P("data"), P()),
      ...                out_specs=(P("data"), P("data")))
      ... def step(state, obs, key):  # runs once per shard, on its block
      ...     state = inner.add(state, {"obs": obs})
      ...     return state, inner.sample(state, key).experience["obs"]
      >>> obs = jax.device_put(jnp.ones((8, 3)), jax.NamedSharding(mesh, P("data")))
      >>> state, obs = step(state, obs, jax.random.key(0))
      >>> obs.shape
      (4, 3)
    """
    _check_buffer(buffer)

    def wrap(name: str, fn: Any) -> Any:
        role = ROLES[name]

        def local(*args, **kwargs):
            args = list(args)
            for i, kind in enumerate(role.args[: len(args)]):
                if kind == "key":
                    args[i] = jax.random.fold_in(args[i], jax.lax.axis_index(axis_name))
            # A vmap over the block's axis of 1, not a squeeze: a state reshaped
            # between an `add` and a `sample` makes XLA copy the storage.
            mapped = [0 if kind == "state" else None for kind in role.args[: len(args)]]
            mapped += [None] * (len(args) - len(mapped))
            result = jax.vmap(lambda *a: fn(*a, **kwargs), in_axes=mapped)(*args)
            return _unblock(role.result, result)

        local.__name__ = local.__qualname__ = name
        local.__doc__ = fn.__doc__
        return local

    return buffer.replace(
        **{n: wrap(n, f) for n, f in _functions(buffer).items()}, init=_local_init(buffer)
    )


def _local_init(buffer: Any) -> Any:
    def init(*args, **kwargs):
        return jax.tree.map(lambda x: x[None], buffer.init(*args, **kwargs))

    init.__doc__ = buffer.init.__doc__
    return init


def _unblock(kind: Any, result: Any) -> Any:
    """A result mapped over the block axis, as the role says it leaves the shard."""
    if isinstance(kind, tuple):
        return tuple(_unblock(k, r) for k, r in zip(kind, result, strict=True))
    if kind in ("state", "all"):
        return result
    return jax.tree.map(lambda x: x[0], result)


def _spec(kind: Any, axis: str) -> Any:
    """How a result of the role `kind` lies over the shards."""
    if isinstance(kind, tuple):
        return tuple(_spec(k, axis) for k in kind)
    return P(None, axis) if kind == "minibatches" else P(axis)


def _check_mesh(mesh: Any, axis_name: str) -> int:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"axis_name {axis_name!r} is not an axis of the mesh, whose axes are "
            f"{tuple(mesh.axis_names)}."
        )
    return int(mesh.shape[axis_name])


def _placer(mesh: Mesh, axis_name: str):
    """Lays an array out over the mesh with a spec, by the mesh's own rules."""
    kind = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))[axis_name]
    explicit = kind == jax.sharding.AxisType.Explicit

    def place(x: jax.Array, spec: P) -> jax.Array:
        sharding = NamedSharding(mesh, spec)
        if explicit:
            return jax.sharding.reshard(x, sharding)
        return jax.lax.with_sharding_constraint(x, sharding)

    return place


def _check_split(tree: Any, count: int, what: str, axis_name: str) -> None:
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = jnp.shape(leaf)
        if not shape or shape[0] % count:
            raise ValueError(
                f"{what}{jax.tree_util.keystr(path)}: axis 0 of shape {tuple(shape)} must "
                f"split evenly over the {count} shards of mesh axis {axis_name!r} (the "
                f"buffer is sized for one shard)."
            )


def shard(buffer: Any, mesh: Mesh, axis_name: str = "data") -> Any:
    """One independent copy of `buffer` per shard of a mesh axis, as one buffer.

    The state is the buffer's state with a leading axis of `S` (the size of the
    mesh axis) on every leaf, split over `axis_name` (and replicated over any
    other mesh axis): shard `d` stores only its own data. Inputs are split the
    same way along their leading axis: `add` of a trajectory buffer made with
    `num_envs=E` takes `[S * E, T, ...]` steps, environments `[d E, (d + 1) E)`
    going to shard `d`; `set_priorities` takes the indices of a sample as they
    came. `sample` returns `S * sample_batch_size` items, shard `d`'s
    `sample_batch_size` drawn from its own data with `fold_in(key, d)` and placed
    at rows `[d B, (d + 1) B)` of a batch split over `axis_name`; sample indices
    are rows of the shard's own storage. `minibatches` of a rollout buffer are
    split along their second axis (each global minibatch takes a block from every
    shard), and advantage normalization uses each shard's own statistics.

    Inside `add` and `sample` there is no cross-device communication; inputs laid
    out differently are first moved to that layout. Every function works under
    `jax.jit` (donate the state) and across processes under `jax.distributed`,
    where each process holds the shards of its devices (build process-local
    inputs with `jax.make_array_from_process_local_data`). Save and restore
    sharded states with Orbax (see the README).

    Args:
      buffer: a buffer made by a jaxbuf factory, sized for ONE shard.
      mesh: the device mesh.
      axis_name: the mesh axis to split the buffer over.

    Returns:
      A buffer of the same type with the same `config` (per shard), whose
      functions take and return sharded states.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> mesh = jax.make_mesh((1,), ("data",))
      >>> buffer = jaxbuf.make_trajectory_buffer(num_envs=2, steps_per_env=16,
      ...                                        sample_batch_size=4, sequence_length=3)
      >>> sharded = jaxbuf.shard(buffer, mesh, "data")
      >>> state = sharded.init({"obs": jnp.zeros(5)})
      >>> state = jax.jit(sharded.add, donate_argnums=0)(state, {"obs": jnp.ones((2, 8, 5))})
      >>> batch = jax.jit(sharded.sample)(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, batch.experience["obs"].sharding.spec
      ((4, 3, 5), P('data', None, None))
    """
    _check_buffer(buffer)
    count = _check_mesh(mesh, axis_name)
    local = per_shard(buffer, axis_name)
    place = _placer(mesh, axis_name)

    def init(example: Any) -> Any:
        """The buffer's empty state for `example`, stacked on a leading shard axis `[S,
        ...]` split over the mesh axis (the rest of its docstring is the buffer's)."""
        shapes = _footprint.shapes(lambda: buffer.init(example))

        def stacked(x: jax.Array, shape: Any) -> jax.Array:
            if _hosted.on_host(shape):  # `host_memory=` storage: zeros made there
                return _hosted.to_host(jnp.zeros((count, *shape.shape), shape.dtype))
            return jnp.broadcast_to(x, (count, *x.shape))

        hosted = jax.tree.map(_hosted.on_host, shapes)
        shardings = jax.tree.map(
            lambda h: NamedSharding(mesh, P(axis_name), memory_kind="pinned_host" if h else None),
            hosted,
        )
        make = jax.jit(lambda: jax.tree.map(stacked, buffer.init(example), shapes),
                       out_shardings=shardings)  # fmt: skip
        return make()

    init.__doc__ = f"{init.__doc__}\n\n{inspect.getdoc(buffer.init) or ''}"

    def wrap(name: str, fn: Any) -> Any:
        role = ROLES[name]

        def sharded(*args, **kwargs):
            if len(args) < len(role.args) - role.optional:
                raise TypeError(f"{name} takes ({', '.join(role.args)}, ...), got {len(args)} "
                                "positional arguments.")  # fmt: skip
            moved, specs = _placed(name, role, args, count, axis_name, place)
            # Further arguments: arrays (a traced beta) go to every shard whole;
            # anything else (num_minibatches) stays a Python value.
            rest, tree = jax.tree.flatten((args[len(role.args) :], kwargs))
            arrays = [isinstance(x, jax.Array) for x in rest]

            def body(moved, dynamic):
                dynamic = iter(dynamic)
                values = [next(dynamic) if a else x for x, a in zip(rest, arrays, strict=True)]
                extra, named = jax.tree.unflatten(tree, values)
                return _noting_shards(fn, count, axis_name)(*moved, *extra, **named)

            dynamic = [x for x, a in zip(rest, arrays, strict=True) if a]
            result = jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(tuple(specs), P()),
                out_specs=_spec(role.result, axis_name),
            )(tuple(moved), dynamic)
            return jnp.all(result) if role.result == "all" else result

        sharded.__name__ = sharded.__qualname__ = name
        sharded.__doc__ = fn.__doc__
        return sharded

    functions = {n: wrap(n, f) for n, f in _functions(local).items()}
    return buffer.replace(**functions, init=init)


def _placed(name: str, role: _Role, args: tuple, count: int, axis_name: str, place) -> tuple:
    """The role's positional arguments checked and laid out, and their specs."""
    moved, specs = [], []
    names = iter(_ARGUMENT_NAMES.get(name, ("data", "data")))
    for kind, value in zip(role.args, args, strict=False):
        if kind == "state":
            _check_state(value, count, axis_name)
        elif kind == "data" and value is not None:
            _check_split(value, count, next(names), axis_name)
        spec = P() if kind == "key" else P(axis_name)
        if kind != "state":  # a state from `init` is laid out already; moving
            # it again would make XLA copy it beside the original
            value = jax.tree.map(lambda x, s=spec: place(jnp.asarray(x), s), value)
        moved.append(value)
        specs.append(spec)
    return moved, specs


def _noting_shards(fn: Any, count: int, axis_name: str) -> Any:
    """`fn`, whose shape errors say that the shapes are one shard's block."""

    def noted(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as error:
            raise type(error)(
                f"{error} (In a buffer sharded over the {count} shards of mesh axis "
                f"{axis_name!r}: shapes above are one shard's block, 1/{count} of "
                "the leading axis of each input.)"
            ) from error

    return noted


_ARGUMENT_NAMES = {
    "add": ("items",), "add_step": ("step",), "finish": ("last_value",),
    "take": ("indices", "goal_source"),
}  # fmt: skip


def _check_state(state: Any, count: int, axis_name: str) -> None:
    expected = f"a leading shard axis of {count} (the size of mesh axis {axis_name!r})"
    fix = "Make the state with the sharded buffer's init."
    _validation.check_leading(state, count, "state", expected, fix)
