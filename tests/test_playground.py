"""MuJoCo Playground's own SAC configuration with `jaxbuf.brax`: a short smoke of
`benchmarks/agents/playground_sac.py` where Playground is installed (CI's Playground environment,
made by the command `docs/coming_from_brax.md` prints); the page's install commands are the
ones CI runs."""

import pathlib
import re
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).parent.parent


def page_commands() -> list[str]:
    page = (ROOT / "docs" / "coming_from_brax.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", page, flags=re.DOTALL)
    return [line for block in blocks for line in block.splitlines() if line.startswith("pip ")]


def test_ci_installs_brax_and_playground_with_the_page_s_commands_as_printed():
    commands = page_commands()
    assert commands == ['pip install -e ".[brax]"', 'pip install -e ".[playground]"']
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert any(re.fullmatch(rf"\.venv-[\w-]+/bin/{re.escape(command)}", line) for line in ci)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                            "ignore::FutureWarning")  # fmt: skip
def test_playground_s_sac_config_runs_with_jaxbuf_and_reports_what_it_saw():
    """CartpoleBalance, Playground's configuration less the keyword Brax 0.14.2 refuses,
    `impl="jax"`, 10k steps (the 8,192-step prefill, then training), 100-step episodes (auto-resets
    inside the run): the run ends, its report counts every stored step and none mismatched."""
    pytest.importorskip("mujoco_playground")
    sys.path.insert(0, str(ROOT))
    from benchmarks.agents import playground_sac

    args = type("Args", (), {"env": "CartpoleBalance", "num_timesteps": 10_000,
                             "num_evals": 2, "episode_length": 100})  # fmt: skip
    # Brax's and Playground's code rely on JAX's default promotions, which conftest.py makes strict
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        row = playground_sac.run("jaxbuf", 0, args)
    assert row["report"]["buffer/mismatched"] == 0
    assert row["report"]["buffer/size"] >= 8_192
    assert row["jaxbuf_row"] < row["brax_row"]
