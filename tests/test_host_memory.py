"""Experience leaves in host memory (`host_memory=`): the same states and samples, bit for
bit, as device placement, with the named leaves kept in `pinned_host` memory through
donated adds and samples that come back in device memory (this CPU has JAX's memory
kinds, all the same RAM)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf import _host_memory

pytestmark = pytest.mark.skipif(
    getattr(getattr(jax, "memory", None), "Space", None) is None,
    reason="JAX's memory spaces (jax.memory.Space) arrived in JAX 0.7",
)
EXAMPLE = {"obs": jnp.zeros((6, 5), jnp.uint8), "reward": jnp.float32(0), "id": jnp.int32(0)}


def random_items(rng, count: int) -> dict:
    return {"obs": rng.integers(0, 255, (count, 6, 5), dtype=np.uint8),
            "reward": rng.normal(size=count).astype(np.float32),
            "id": rng.integers(0, 1000, count).astype(np.int32)}  # fmt: skip


def memory_kind(leaf) -> str:
    return leaf.sharding.memory_kind


def assert_same(a, b) -> None:
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                            strict=True):  # fmt: skip
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)


@pytest.mark.parametrize(
    "sampler", [jaxbuf.uniform(), jaxbuf.prioritized()], ids=["uniform", "prioritized"]
)
def test_host_placement_equals_device_placement_over_wrap_arounds(sampler, platform_path):
    hosted = jaxbuf.make_replay_buffer(37, 8, sampler=sampler, host_memory=("obs",))
    plain = jaxbuf.make_replay_buffer(37, 8, sampler=sampler)
    host_state, device_state = hosted.init(EXAMPLE), plain.init(EXAMPLE)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"
    assert memory_kind(host_state.experience["reward"]) == "device"
    adds = [jax.jit(b.add, donate_argnums=0) for b in (hosted, plain)]
    samples = [jax.jit(b.sample) for b in (hosted, plain)]
    rng = np.random.default_rng(0)
    for i in range(40):  # about 6 wrap-arounds, adds of 1 to 11 items
        items = random_items(rng, int(rng.integers(1, 12)))
        host_state, device_state = adds[0](host_state, items), adds[1](device_state, items)
        key = jax.random.key(i)
        from_host, from_device = samples[0](host_state, key), samples[1](device_state, key)
        assert_same(from_host, from_device)
        assert memory_kind(from_host.experience["obs"]) == "device"
    assert_same(host_state, device_state)
    assert memory_kind(host_state.experience["obs"]) == "pinned_host"  # kept by donated adds


def test_reads_of_host_rows_take_any_index_shape(platform_path):
    column = jax.device_put(jnp.arange(60, dtype=jnp.int32).reshape(4, 5, 3),
                            jax.memory.Space.Host)  # fmt: skip
    envs, times = jnp.array([[0], [3]]), jnp.array([[1, 4], [0, 2]])
    rows = jax.jit(_host_memory.read_rows, static_argnums=())(column, (envs, times))
    expected = np.arange(60).reshape(4, 5, 3)[np.asarray(envs), np.asarray(times)]
    assert np.array_equal(rows, expected) and memory_kind(rows) == "device"


def test_host_memory_is_checked():
    with pytest.raises(TypeError, match=r"host_memory must be a sequence of leaf names"):
        jaxbuf.make_replay_buffer(8, 2, host_memory="obs")
    buffer = jaxbuf.make_replay_buffer(8, 2, host_memory=("pixels",))
    with pytest.raises(ValueError, match=r"host_memory names \['pixels'\].*\['id', 'obs'"):
        buffer.init(EXAMPLE)


def test_a_device_without_host_memory_is_refused_at_make(monkeypatch):
    monkeypatch.setattr(_host_memory, "_memory_kinds", lambda: {"device"})
    with pytest.raises(ValueError, match=r"host_memory needs JAX's memory kinds.*offers"):
        jaxbuf.make_replay_buffer(8, 2, host_memory=("obs",))
