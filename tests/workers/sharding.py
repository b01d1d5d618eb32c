"""Checks of sharded buffers that need several devices or processes.

`test_sharding.py` runs this file in fresh Python processes, since the number of
(simulated) devices is fixed when JAX starts:

    python tests/workers/sharding.py CASE [PROCESS_ID PORT FOLDER]

Each case raises on a failed check and prints `ok CASE` at the end.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))  # tests/: reference.py
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def _setup(devices: int) -> None:
    import os

    # after the caller's flags (conftest.py's compile flags), so that this count wins
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"


def _jax():
    import jax

    jax.config.update("jax_numpy_rank_promotion", "raise")
    return jax


def buffers():
    """(name, buffer, example, make_input) for a buffer of every kind, sized per shard."""
    import jax.numpy as jnp
    import numpy as np
    from reference import prioritized_replay, prioritized_trajectory

    import jaxbuf

    item = {"obs": jnp.zeros(3), "done": jnp.bool_(False)}
    step = {
        "obs": jnp.zeros(3),
        "reward": 0.0,
        "value": 0.0,
        "final_value": 0.0,
        "terminated": False,
        "truncated": False,
    }
    transition = jaxbuf.Transition(
        obs=jnp.zeros(2),
        action=jnp.int32(0),
        reward=jnp.float32(0),
        terminated=jnp.bool_(False),
        truncated=jnp.bool_(False),
        next_obs=jnp.zeros(2),
    )

    def items(rng, *lead):
        return {
            "obs": rng.normal(size=(*lead, 3)).astype(np.float32),
            "done": rng.random(lead) < 0.2,
        }

    def transitions(rng, envs, time):
        lead = (envs, time)
        return jaxbuf.Transition(
            obs=rng.normal(size=(*lead, 2)).astype(np.float32),
            action=rng.integers(0, 4, lead).astype(np.int32),
            reward=rng.normal(size=lead).astype(np.float32),
            terminated=rng.random(lead) < 0.1,
            truncated=rng.random(lead) < 0.1,
            next_obs=rng.normal(size=(*lead, 2)).astype(np.float32),
        )

    def rollout_step(rng, envs):
        return {
            "obs": rng.normal(size=(envs, 3)).astype(np.float32),
            "reward": rng.normal(size=envs).astype(np.float32),
            "value": rng.normal(size=envs).astype(np.float32),
            "final_value": rng.normal(size=envs).astype(np.float32),
            "terminated": rng.random(envs) < 0.2,
            "truncated": rng.random(envs) < 0.1,
        }

    done = lambda s: s["done"]  # noqa: E731
    return [
        ("replay", jaxbuf.make_replay_buffer(7, 5), item, lambda r, s: items(r, s * 3)),
        (
            "vectorized",
            jaxbuf.vectorize(jaxbuf.make_replay_buffer(5, 4), 2),
            item,
            lambda r, s: items(r, s * 2, 3),
        ),
        (
            "prioritized",
            prioritized_replay(9, 6),
            item,
            lambda r, s: items(r, s * 4),
        ),
        (
            "trajectory",
            jaxbuf.make_trajectory_buffer(2, 11, 4, 3, done_fn=done),
            item,
            lambda r, s: items(r, s * 2, 4),
        ),
        (
            "prioritized_trajectory",
            prioritized_trajectory(2, 10, 5, 2),
            item,
            lambda r, s: items(r, s * 2, 3),
        ),
        (
            "transition",
            jaxbuf.make_transition_buffer(2, 12, 4, n_step=3),
            transition,
            lambda r, s: transitions(r, s * 2, 5),
        ),
        (
            "episode",
            jaxbuf.make_episode_buffer(2, 16, 3, 6, done_fn=done),
            item,
            lambda r, s: items(r, s * 2, 5),
        ),
        ("queue", jaxbuf.make_queue(12, 3, 4), item, lambda r, s: items(r, s * 3)),
        (
            "rollout",
            jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.8),
            step,
            lambda r, s: rollout_step(r, s * 2),
        ),
    ]


def _jitted(buffer):
    """The buffer with jitted functions: the per-shard references run many times."""
    import jax

    names = ("add", "sample", "pop", "finish", "clear", "set_priorities", "can_sample")
    jitted = {n: jax.jit(getattr(buffer, n)) for n in names if getattr(buffer, n, None)}
    if hasattr(buffer, "minibatches"):
        jitted["minibatches"] = jax.jit(buffer.minibatches, static_argnums=2)
    return buffer.replace(**jitted)


def _block(tree, shard, count):
    """Shard `shard`'s block of inputs split along the leading axis."""
    import jax
    import numpy as np

    def block(x):
        x = np.asarray(x)  # also a global array: index on the host
        return x[len(x) // count * shard : len(x) // count * (shard + 1)]

    return jax.tree.map(block, tree)


def _equal(a, b, what, rtol=0.0):
    import jax
    import numpy as np

    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_allclose(
            np.asarray(x),
            np.asarray(y),
            rtol=rtol,
            atol=0,
            err_msg=f"{what}{jax.tree_util.keystr(path)}",
        )


def _leading_spec(tree, axis, position=0):
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        spec = tuple(leaf.sharding.spec) + (None,) * leaf.ndim
        want = (None,) * position + (axis,)
        assert spec[: position + 1] == want, (jax.tree_util.keystr(path), leaf.sharding.spec)


# `buffers()` in two parts of about the same compile time (the prioritized kinds apart)
PARTS = ({"prioritized", "transition", "vectorized", "queue", "rollout"},
         {"prioritized_trajectory", "replay", "trajectory", "episode"})  # fmt: skip


def half(part: int | None) -> list:
    """`buffers()`, or those of `PARTS[part]`: one check in two processes."""
    found = buffers()
    assert set().union(*PARTS) == {name for name, *_ in found}
    return found if part is None else [b for b in found if b[0] in PARTS[part]]


def contents(part: int | None = None) -> None:
    """The sharded buffer equals one single buffer per shard, state and samples."""
    jax = _jax()
    import jax.numpy as jnp
    import numpy as np

    import jaxbuf

    mesh, count = jax.make_mesh((4,), ("data",)), 4
    rng = np.random.default_rng(0)
    for name, buffer, example, make in half(part):
        sharded = jaxbuf.shard(buffer, mesh, "data")
        state = sharded.init(example)
        _leading_spec(state, "data")
        buffer = _jitted(buffer)  # the references, one per shard
        singles = [buffer.init(example) for _ in range(count)]
        add = jax.jit(sharded.add, donate_argnums=0)
        for step in range(9):  # many wraps of every small ring
            data = make(rng, count)
            if name == "queue" and step % 2:
                key = jax.random.key(step)
                state, batch = jax.jit(sharded.pop)(state)
                for d in range(count):
                    singles[d], single = buffer.pop(singles[d])
                    _equal(_block(batch, d, count), single, f"{name} pop {d}")
                continue
            state = add(state, data)
            singles = [buffer.add(s, _block(data, d, count)) for d, s in enumerate(singles)]
            if name == "rollout" and step % 4 == 3:
                last = rng.normal(size=2 * count).astype(np.float32)
                state = jax.jit(sharded.finish)(state, last)
                singles = [buffer.finish(s, _block(last, d, count)) for d, s in enumerate(singles)]
                key = jax.random.key(step)
                batch = jax.jit(sharded.minibatches, static_argnums=2)(state, key, 2)
                _leading_spec(batch, "data", position=1)
                for d in range(count):
                    single = buffer.minibatches(singles[d], jax.random.fold_in(key, d), 2)
                    _equal(
                        jax.tree.map(lambda x, d=d: np.asarray(x)[:, 4 * d : 4 * (d + 1)], batch),
                        single,
                        f"{name} minibatches {d}",
                        rtol=1e-6,
                    )  # jit and eager round apart
                state = jax.jit(sharded.clear)(state)
                singles = [buffer.clear(s) for s in singles]
            for d in range(count):
                _equal(
                    jax.tree.map(lambda x, d=d: np.asarray(x)[d], state),
                    singles[d],
                    f"{name} state {d}",
                )
            _leading_spec(state, "data")
            if name in ("queue", "rollout"):
                continue
            key = jax.random.key(100 + step)
            ready = [bool(buffer.can_sample(s)) for s in singles]
            assert bool(jax.jit(sharded.can_sample)(state)) == all(ready), name
            batch = jax.jit(sharded.sample)(state, key)
            _leading_spec(batch, "data")
            for d in range(count):
                single = buffer.sample(singles[d], jax.random.fold_in(key, d))
                _equal(_block(batch, d, count), single, f"{name} sample {d}")
            if name.startswith("prioritized"):
                priorities = jnp.asarray(rng.random(len(batch.indices)) * 3, jnp.float32)
                state = jax.jit(sharded.set_priorities, donate_argnums=0)(
                    state, batch.indices, priorities
                )
                singles = [
                    buffer.set_priorities(
                        singles[d], _block(batch.indices, d, count), _block(priorities, d, count)
                    )
                    for d in range(count)
                ]
                beta = jnp.float32(0.7)  # a traced keyword argument reaches every shard
                batch = jax.jit(sharded.sample)(state, key, importance_exponent=beta)
                for d in range(count):
                    single = buffer.sample(
                        singles[d], jax.random.fold_in(key, d), importance_exponent=beta
                    )
                    _equal(_block(batch, d, count), single, f"{name} weighted sample {d}")
        if name not in ("queue", "rollout"):
            assert bool(jax.jit(sharded.can_sample)(state)), name
    print("ok contents")


def inside() -> None:
    """per_shard inside a user's shard_map equals shard; a 2-D mesh replicates the rest."""
    jax = _jax()
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxbuf

    rng = np.random.default_rng(3)
    _, buffer, example, make = buffers()[3]  # trajectory
    mesh = jax.make_mesh((4,), ("data",))
    sharded, inner = jaxbuf.shard(buffer, mesh), jaxbuf.per_shard(buffer)
    reference = _jitted(sharded)

    @jax.jit
    @jax.shard_map(
        mesh=mesh, in_specs=(P("data"), P("data"), P()), out_specs=(P("data"), P("data"), P("data"))
    )
    def step(state, data, key):  # a whole training step per shard
        state = inner.add(state, data)
        return state, inner.sample(state, key), inner.can_sample(state)

    ours, theirs = sharded.init(example), sharded.init(example)
    for i in range(5):
        data = make(rng, 4)
        key = jax.random.key(i)
        ours, batch, ready = step(ours, jax.device_put(data, NamedSharding(mesh, P("data"))), key)
        theirs = reference.add(theirs, data)
        _equal(ours, theirs, "per_shard state")
        _equal(batch, reference.sample(theirs, key), "per_shard sample")
        assert ready.shape == (4,) and bool(ready.all()) == bool(reference.can_sample(theirs))

    grid = jax.make_mesh((2, 2), ("data", "model"))
    two = jaxbuf.shard(buffer, grid, "data")
    buffer = _jitted(buffer)
    state = two.init(example)
    singles = [buffer.init(example) for _ in range(2)]
    for i in range(5):
        data = make(rng, 2)
        state = jax.jit(two.add, donate_argnums=0)(state, data)
        singles = [buffer.add(x, _block(data, d, 2)) for d, x in enumerate(singles)]
        key = jax.random.key(i)
        batch = jax.jit(two.sample)(state, key)
        for d in range(2):
            _equal(
                _block(batch, d, 2),
                buffer.sample(singles[d], jax.random.fold_in(key, d)),
                f"2-D mesh sample {d}",
            )
    leaf = jax.tree.leaves(state)[0]
    assert leaf.sharding.spec[0] == "data" and len(leaf.sharding.device_set) == 4, leaf.sharding
    print("ok inside")


def hlo(part: int | None = None) -> None:
    """Compiled add and sample hold no collective; can_sample (the control) does."""
    jax = _jax()
    import numpy as np

    import jaxbuf

    mesh = jax.make_mesh((4,), ("data",))
    rng = np.random.default_rng(1)
    for name, buffer, example, make in half(part):
        sharded = jaxbuf.shard(buffer, mesh, "data")
        state = sharded.init(example)
        data = make(rng, 4)
        calls = {"add": (sharded.add, (state, data))}
        if getattr(sharded, "sample", None) is not None:
            calls["sample"] = (sharded.sample, (state, jax.random.key(0)))
        if getattr(sharded, "pop", None) is not None:
            calls["pop"] = (sharded.pop, (state,))
        if getattr(sharded, "minibatches", None) is not None:
            calls["minibatches"] = (
                lambda s, k, b=sharded: b.minibatches(s, k, 2),
                (state, jax.random.key(0)),
            )
        if getattr(sharded, "set_priorities", None) is not None:
            batch = jax.jit(sharded.sample)(state, jax.random.key(0))
            calls["set_priorities"] = (
                sharded.set_priorities,
                (state, batch.indices, batch.probabilities),
            )
        for what, (fn, args) in calls.items():
            text = jax.jit(fn).lower(*args).compile().as_text()
            found = [c for c in COLLECTIVES if c in text]
            assert not found, f"{name}.{what} compiles to collectives {found}"
        if getattr(sharded, "can_sample", None) is not None:  # the control: a reduction over shards
            text = jax.jit(sharded.can_sample).lower(state).compile().as_text()
            assert any(c in text for c in COLLECTIVES), f"{name}.can_sample: control found none"
    print("ok hlo")


def errors() -> None:
    """Bad meshes, inputs and states are refused, naming what is wrong."""
    jax = _jax()
    import jax.numpy as jnp

    import jaxbuf

    mesh = jax.make_mesh((4,), ("data",))
    buffer = jaxbuf.make_trajectory_buffer(2, 8, 4, 2)
    sharded = jaxbuf.shard(buffer, mesh, "data")
    state = sharded.init({"obs": jnp.zeros(3)})

    def raises(error, match, fn, *args):
        try:
            fn(*args)
        except error as caught:
            assert match in str(caught), f"{match!r} not in {caught}"
        else:
            raise AssertionError(f"no {error.__name__} ({match})")

    raises(
        ValueError,
        "axis_name 'batch' is not an axis of the mesh, whose axes are ('data',)",
        jaxbuf.shard,
        buffer,
        mesh,
        "batch",
    )
    raises(TypeError, "mesh must be a jax.sharding.Mesh, got list", jaxbuf.shard, buffer, [0])
    raises(TypeError, "got function", jaxbuf.shard, lambda: None, mesh)
    raises(
        ValueError,
        "items['obs']: axis 0 of shape (6, 5, 3) must split evenly over the 4 "
        "shards of mesh axis 'data'",
        sharded.add,
        state,
        {"obs": jnp.zeros((6, 5, 3))},
    )
    raises(
        ValueError,
        "must be 2. Every leaf needs the same leading axes [num_envs, T]. (In a "
        "buffer sharded over the 4 shards of mesh axis 'data': shapes above are one shard's "
        "block, 1/4 of the leading axis of each input.)",
        jax.jit(sharded.add),
        state,
        {"obs": jnp.zeros((4, 5, 3))},
    )
    single = buffer.init({"obs": jnp.zeros(3)})
    raises(
        ValueError,
        "expected a leading shard axis of 4 (the size of mesh axis 'data')",
        sharded.sample,
        single,
        jax.random.key(0),
    )
    before = jax.tree.map(lambda x: x.copy(), state)
    raises(
        TypeError,
        "dtype",
        jax.jit(sharded.add, donate_argnums=0),
        state,
        {"obs": jnp.zeros((8, 5, 3), jnp.int32)},
    )
    _equal(state, before, "state after a refused add")
    print("ok errors")


def checkpoint(folder: str) -> None:
    """A sharded state saved with Orbax comes back onto the same mesh."""
    jax = _jax()
    import numpy as np
    import orbax.checkpoint as ocp

    import jaxbuf

    mesh = jax.make_mesh((4,), ("data",))
    for name, buffer, example, make in buffers()[2:5]:
        sharded = jaxbuf.shard(buffer, mesh, "data")
        add = jax.jit(sharded.add)  # eager, a sharded add compiles each primitive
        state = add(sharded.init(example), make(np.random.default_rng(2), 4))
        path = ocp.test_utils.erase_and_create_empty(f"{folder}/{name}")
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path / "state", state)
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(path / "state", jax.eval_shape(sharded.init, example))
        _equal(restored, state, f"{name} restored")
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (name, a.sharding)
    print("ok checkpoint")


def process(process_id: int, port: int, folder: str) -> None:
    """One of two processes with two devices each: add, sample, checkpoint."""
    jax = _jax()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxbuf

    assert jax.device_count() == 4 and jax.local_device_count() == 2, jax.devices()
    mesh = jax.make_mesh((4,), ("data",))
    buffer = jaxbuf.make_trajectory_buffer(2, 8, 3, 2)
    sharded = jaxbuf.shard(buffer, mesh, "data")
    example = {"obs": jnp.zeros(3)}
    state = sharded.init(example)
    local_devices = [d for d in mesh.devices.flat if d.process_index == process_id]
    shards = [int(np.flatnonzero(mesh.devices.flat == d)[0]) for d in local_devices]
    singles = {d: buffer.init(example) for d in shards}
    buffer = _jitted(buffer)  # the references, one per shard
    add = jax.jit(sharded.add, donate_argnums=0)
    sample = jax.jit(sharded.sample)
    for step in range(6):
        # Each process makes only its own environments' steps: 2 shards x 2 envs.
        local = {
            "obs": np.stack(
                [
                    np.full((5, 3), 100 * step + 10 * d + e, np.float32)
                    for d in shards
                    for e in range(2)
                ]
            )
        }
        items = jax.make_array_from_process_local_data(
            NamedSharding(mesh, P("data")), local["obs"], (8, 5, 3)
        )
        state = add(state, {"obs": items})
        for i, d in enumerate(shards):
            singles[d] = buffer.add(singles[d], {"obs": local["obs"][2 * i : 2 * i + 2]})
        key = jax.random.key(step)
        batch = sample(state, key)
        for block in batch.experience["obs"].addressable_shards:
            d = block.index[0].start // 3
            expected = buffer.sample(singles[d], jax.random.fold_in(key, d))
            np.testing.assert_array_equal(np.asarray(block.data), expected.experience["obs"])
    assert bool(jax.jit(sharded.can_sample)(state))
    try:
        jaxbuf.save(f"{folder}/refused{process_id}", state)
    except ValueError as error:
        assert "is spread over several processes" in str(error), error
    else:
        raise AssertionError("jaxbuf.save took a state spread over processes")
    path = ocp.test_utils.erase_and_create_empty(f"{folder}/multihost") if process_id == 0 else None
    ocp.multihost.sync_global_processes("folder made")
    path = path or ocp.test_utils.epath.Path(f"{folder}/multihost")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "state", state)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(path / "state", jax.eval_shape(sharded.init, example))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        for x, y in zip(a.addressable_shards, b.addressable_shards, strict=True):
            assert x.index == y.index and x.device == y.device
            np.testing.assert_array_equal(np.asarray(x.data), np.asarray(y.data))
    jax.distributed.shutdown()
    print(f"ok process {process_id}")


def host() -> None:
    """Host-placed leaves (`host_memory=`) in a sharded buffer: each shard's block stays
    in host memory, and states and samples equal device placement, on the CPU paths and
    on the accelerator paths, with row-slice reads (B=4) and host-gathered ones (B=40)."""
    jax = _jax()
    import jax.numpy as jnp
    import numpy as np

    import jaxbuf
    from jaxbuf.core import lowering as _lowering

    if getattr(getattr(jax, "memory", None), "Space", None) is None:
        print("ok host (skipped: no memory spaces in this JAX)")
        return
    mesh = jax.make_mesh((4,), ("data",))
    example = {"obs": jnp.zeros((6, 5), jnp.uint8), "reward": jnp.float32(0)}
    choose = _lowering.choose
    for path in ("cpu", "accelerator"):
        if path == "accelerator":  # the form a program lowered for a GPU or TPU runs
            _lowering.choose = lambda *a, cpu, accelerator: accelerator(*a)
        for batch in (4, 40):
            found = {}
            for name, hosted in (("host", ("obs",)), ("device", None)):
                buffer = jaxbuf.make_replay_buffer(13, batch, host_memory=hosted)
                sharded = jaxbuf.shard(buffer, mesh)
                state, add = sharded.init(example), jax.jit(sharded.add, donate_argnums=0)
                rng, samples = np.random.default_rng(batch), []
                for i in range(12):  # about 5 wrap-arounds per shard
                    items = {"obs": rng.integers(0, 255, (20, 6, 5), dtype=np.uint8),
                             "reward": rng.normal(size=20).astype(np.float32)}  # fmt: skip
                    state = add(state, items)
                    samples.append(jax.jit(sharded.sample)(state, jax.random.key(i)))
                kind = state.experience["obs"].sharding.memory_kind
                assert kind == ("pinned_host" if hosted else "device"), kind
                found[name] = jax.tree.map(np.asarray, (state, samples))
            for a, b in zip(jax.tree.leaves(found["host"]), jax.tree.leaves(found["device"]),
                            strict=True):  # fmt: skip
                np.testing.assert_array_equal(a, b)
    _lowering.choose = choose
    print("ok host")


if __name__ == "__main__":
    case = sys.argv[1]
    _setup(2 if case == "process" else 4)
    if case == "process":
        process(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif case == "checkpoint":
        checkpoint(sys.argv[2])
    else:
        part = int(sys.argv[2]) if len(sys.argv) > 2 else None
        if case in ("contents", "hlo"):
            {"contents": contents, "hlo": hlo}[case](part)
        else:
            {"inside": inside, "errors": errors, "host": host}[case]()
