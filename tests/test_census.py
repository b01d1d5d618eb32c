"""The lowering census (tests/census.py): on GPU and TPU, no loop and no branch in the hot
operations, and every operation's gathers and scatters under the ceilings of docs/census.md."""

import pathlib

import census
import census_flashbax
import census_host
import jax
import jax.numpy as jnp
import pytest
from census import BRANCH_FREE, COUNTED, GROUPS, PLATFORMS, counts, lowered, markdown, read_markdown
from census import table as census_table

from jaxbuf.core import lowering as _lowering

PAGE = pathlib.Path(__file__).parents[1] / "docs" / "census.md"


def test_the_census_counts_loops_branches_and_memory_operations():
    x = jnp.zeros(8)

    def looped(x):
        return jax.lax.fori_loop(0, x.shape[0], lambda i, y: y.at[i].set(y[i - 1] + 1), x)

    def branched(x):
        return jax.lax.cond(x[0] > 0, lambda: x[::-1], lambda: x)

    def per_platform(x):  # a case on a constant index, folded away: not a branch
        return jax.lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos)

    found = counts(lowered(looped, (x,), "cuda"))
    assert found["while"] == 1 and found["gather"] >= 1 and found["scatter"] >= 1
    assert counts(lowered(branched, (x,), "cuda"))["case/if"] == 1
    assert counts(lowered(per_platform, (x,), "cuda"))["case/if"] == 0
    assert counts(lowered(jnp.sort, (x,), "tpu"))["sort"] == 1


@pytest.mark.parametrize("group", GROUPS)
def test_hot_operations_have_no_loop_and_no_branch_and_stay_under_their_ceilings(group):
    """The base table (`census.BASE`), one group of operations lowered once for both
    checks (they were two tests over the whole table, each lowering it): no loop and no
    branch in a hot operation on either platform, and every operation's counts under
    the ceilings of docs/census.md."""
    table = census_table(group=group)
    checked = 0
    for name, per_platform in table.items():
        if name.rsplit(".", 1)[1] in BRANCH_FREE:
            for platform in PLATFORMS:
                found = per_platform[platform]
                assert found["while"] == 0, f"{name} loops on {platform}"
                assert found["case/if"] == 0, f"{name} branches on {platform}"
            checked += 1
    assert checked >= {"kinds": 40, "tools": 20}[group]
    ceilings = read_markdown(PAGE.read_text())
    names = {name for g in GROUPS for name, _, _ in census.operations(group=g)}
    assert set(ceilings) == names, "docs/census.md lists other operations: regenerate it"
    assert set(table) <= names
    over = [
        f"{name} {platform} {what}: {found[what]} > {ceilings[name][what]}"
        for name, per_platform in table.items()
        for platform, found in per_platform.items()
        for what in COUNTED
        if found[what] > ceilings[name][what]
    ]
    assert not over, "over the ceilings of docs/census.md:\n" + "\n".join(over)


def test_the_page_table_reads_back():
    rows = {"a.sample": {p: dict.fromkeys(COUNTED, 1) for p in PLATFORMS}}
    rows["a.sample"]["tpu"] = {**rows["a.sample"]["tpu"], "gather": 3}
    assert read_markdown(markdown(rows)) == {"a.sample": {**dict.fromkeys(COUNTED, 1), "gather": 3}}


def shape_id(shape: census.Shape) -> str:
    return f"{shape.envs}x{shape.steps} B={shape.batch}"


def scale_page() -> str:
    return PAGE.read_text().split(census.SCALE_SECTION)[1]


@pytest.mark.parametrize("group", census.GROUPS)
@pytest.mark.parametrize("shape", census.SCALE, ids=shape_id)
def test_at_the_shapes_users_run_no_loop_no_branch_and_no_draw_sized_like_the_storage(shape, group):
    """Every kind and sampler (`kinds`), and every option and tool (`tools`), lowered at
    thousands of environments and batches of 8k-32k (`census.SCALE`): no `while` or
    `case` in a hot operation on either platform, and no draw (`sample`, `next_batch`,
    Brax's `sample_internal`) working on arrays of the storage's size, the epochs
    sampler's `next_batch` included, with no allowance for any; the page shows the row."""
    found = census.scale(shape, group)
    assert found["operations"] >= {"kinds": 90, "tools": 45}[group]
    assert not found["loops"], "\n".join(found["loops"])
    assert not found["growing"], found["growing"]
    assert not hasattr(census, "GROWS"), "no draw may be allowed to grow with the capacity"
    row = census.scale_row(shape, group, found)
    assert row in scale_page(), "python tests/census.py --scale"


@pytest.mark.parametrize("shape", census.SCALE, ids=shape_id)
def test_at_the_shapes_users_run_host_leaves_move_by_rows(shape):
    """Host-placed leaves (`host_memory=`, from real arrays) at each scale shape: no
    array moved whole, no gather on host memory in device code, no loop or branch; the
    page shows the row."""
    host = census_host.table(shape)
    for name, per_platform in host.items():
        for platform, counted in per_platform.items():
            assert counted["whole transfers"] == counted["device gathers/scatters"] == 0, name
            assert counted["while"] == counted["case/if"] == 0, f"{name} on {platform}"
    if shape.envs > _lowering.ROW_SLICES:  # final observations: one host scatter, no rows
        step = host["transition n_step=3 frames.add_step"]["cuda"]
        assert step["host gathers/scatters"] == 1 and step["row slices"] == 1, step
    assert census.host_scale_row(shape, host) in scale_page(), "python tests/census.py --scale"


def test_the_scale_shapes_cross_every_size_switch():
    """Each size-dependent switch is lowered on both of its sides."""
    shapes = census.SCALE
    for switch, size in (("SMALL", lambda s: s.envs), ("PAIRS", lambda s: s.batch),
                         ("ROW_SLICES", lambda s: s.batch)):  # fmt: skip
        limit = getattr(_lowering, switch)
        assert min(map(size, shapes)) <= limit < max(map(size, shapes)), switch
    assert {s.envs for s in shapes} >= {1, 64, 65, 1024, 4096}
    assert {s.batch for s in shapes} >= {1, 256, 8192, 32768}
    assert max(s.envs * s.steps for s in shapes) == 2**20 >= max(s.capacity for s in shapes)


def test_the_capacity_check_finds_work_sized_like_the_storage():
    """`census.growing_ops` flags a reduction, a select or a sort over the storage, and
    neither a gather of its rows nor a scan over environments that makes results of a
    ring's length at either capacity."""

    x256 = jax.ShapeDtypeStruct((256, 8), jnp.float32)
    i4096 = jax.ShapeDtypeStruct((4096,), jnp.int32)

    def flagged(fn, rows: int) -> list[str]:
        def args(n):
            return (jax.ShapeDtypeStruct((n, 8), jnp.float32),
                    jax.ShapeDtypeStruct((4096,), jnp.int32))  # fmt: skip

        full, half = (census.lowered_for_each(fn, args(n))["cuda"] for n in (rows, rows // 2))
        return census.growing_ops(full, half)

    assert flagged(lambda x, i: x[i], 256) == []

    def scanned(x, i):  # results of 256 entries inside the scan over 4,096
        return x[i[:256]] + jax.lax.associative_scan(jnp.add, i).astype(jnp.float32)[:1, None]

    assert "256xi32" in census.lowered_for_each(scanned, (x256, i4096))["cuda"]
    assert flagged(scanned, 256) == []
    assert any("reduce" in op for op in flagged(lambda x, i: x.sum() + x[i], 1 << 16))
    assert any("select" in op for op in flagged(lambda x, i: jnp.where(x > 0, x, 0)[i], 1 << 16))
    assert flagged(lambda x, i: jnp.argsort(x[:, 0])[i], 1 << 16)


def test_lowering_once_for_both_platforms_counts_as_export_does_for_each():
    """`lowered_for_each` lowers once for cuda and tpu and splits the module: where JAX
    lowers a primitive differently per platform (threefry's bits) the module has cases
    on the platform's index; each platform's text keeps its own branch and counts as
    that platform's own export."""
    x = jax.ShapeDtypeStruct((8,), jnp.float32)

    def fn(x, key):
        noise = jax.random.uniform(key, (8,))
        return jax.lax.platform_dependent(x + noise, cpu=jnp.sin,
                                          default=lambda x: jnp.sort(x)[::-1])  # fmt: skip

    args = (x, jax.random.key(0))
    both = jax.jit(fn).trace(*args).lower(lowering_platforms=PLATFORMS).as_text()
    assert '"stablehlo.case"(%arg0)' in both  # a case on the platform's index
    for texts in (census.lowered_for_each(fn, args), census.exported_for_each(fn, args)):
        assert {p: counts(t) for p, t in texts.items()} == {p: counts(lowered(fn, args, p))
                                                            for p in PLATFORMS}  # fmt: skip
        assert counts(texts["cuda"])["sort"] == 1
        assert texts["cuda"] != texts["tpu"] and "platform.case" in texts["tpu"]


@pytest.fixture(scope="module")
def against_flashbax():
    """The operations of `census_flashbax` at each of its shapes, lowered once (5 s)."""
    return {shape: census_flashbax.census(shape) for shape in census_flashbax.SHAPES}


def test_against_flashbax_every_count_stays_under_the_page(against_flashbax):
    """At the GPU table's shapes, every jaxbuf operation's gathers, scatters, sorts and
    bytes at or under the page's tables, which show every operation and Flashbax's."""
    page = census_flashbax.read_page(PAGE.read_text())
    assert set(page) == set(census_flashbax.SHAPES), "python tests/census_flashbax.py"
    over = [
        f"{shape} {name}: {what} {row[what]} > {page[shape][name][what]}"
        for shape, rows in against_flashbax.items()
        for name, row in rows.items()
        for what in census_flashbax.COLUMNS
        if not name.startswith("flashbax") and row[what] > page[shape][name][what]
    ]
    assert not over, "\n".join(over)
    assert {s: set(r) for s, r in page.items()} == {s: set(r) for s, r in against_flashbax.items()}


def test_where_a_kind_does_what_flashbax_does_it_runs_no_more(against_flashbax):
    """One gather per stored leaf in a sample and one scatter per leaf in an add, as
    Flashbax's flat buffer runs; the transition kind's extras named one by one (its true
    final observations, its search among environments); the replay kind reads each
    stored byte once where Flashbax's pairs read each twice."""
    for shape, rows in against_flashbax.items():
        for name, row in rows.items():
            kind, operation = name.rsplit(".", 1)
            if kind not in census_flashbax.LEAVES or operation == "set_priorities":
                continue
            what = "gather" if operation == "sample" else "scatter"
            extra = census_flashbax.EXTRA.get(name, (what, ()))[1]
            assert row[what] <= census_flashbax.LEAVES[kind] + len(extra), (shape, name, row)
        item = 2 * 4 * shape.obs + 4 * 8 + 4 + 1  # obs, next_obs, action, reward, done
        assert rows["replay.sample"]["storage"] == item, rows["replay.sample"]
        assert rows["flashbax flat.sample"]["storage"] == 2 * (item - 4 * shape.obs)
