"""The lowering census (tests/census.py): on GPU and TPU, no loop and no branch in the hot
operations, and every operation's gathers and scatters under the ceilings of docs/census.md."""

import pathlib

import jax
import jax.numpy as jnp
import pytest
from census import BRANCH_FREE, COUNTED, PLATFORMS, counts, lowered, markdown, read_markdown
from census import table as census_table

PAGE = pathlib.Path(__file__).parents[1] / "docs" / "census.md"


@pytest.fixture(scope="module")
def table():
    return census_table()


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


def test_hot_operations_have_no_loop_and_no_branch_on_accelerators(table):
    checked = 0
    for name, per_platform in table.items():
        if name.rsplit(".", 1)[1] in BRANCH_FREE:
            for platform in PLATFORMS:
                found = per_platform[platform]
                assert found["while"] == 0, f"{name} loops on {platform}"
                assert found["case/if"] == 0, f"{name} branches on {platform}"
            checked += 1
    assert checked >= 50


def test_every_operation_stays_under_its_committed_ceiling(table):
    ceilings = read_markdown(PAGE.read_text())
    assert set(ceilings) == set(table), "docs/census.md lists other operations: regenerate it"
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
