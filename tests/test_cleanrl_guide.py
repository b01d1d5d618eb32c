"""The CleanRL guide's diff, as a user applies it: to CleanRL's own `dqn_atari_jax.py`.

`benchmarks/agents/cleanrl/upstream/` holds CleanRL's files at the commit the guide names;
`benchmarks/agents/cleanrl_dqn.py` applies the guide's diff to them and runs the result on
real ALE (its figures are the guide's). Here: the vendored files are upstream's byte for
byte, the diff in `docs/coming_from_cleanrl.md` applies with `git apply` (which
refuses fuzz), and what it makes is the script the guide describes.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.agents import cleanrl_dqn  # noqa: E402


@pytest.fixture
def upstream(tmp_path) -> pathlib.Path:
    """Upstream's files in a scratch folder (not a git repository, as a user's copy)."""
    cleanrl_dqn.checkout(tmp_path, "cleanrl")
    (tmp_path / "guide.diff").write_text(cleanrl_dqn.guide_diff())
    return tmp_path


def test_the_vendored_files_are_upstreams_at_the_pinned_commit(tmp_path):
    for name, blob in cleanrl_dqn.BLOBS.items():
        assert cleanrl_dqn.blob_id(cleanrl_dqn.UPSTREAM / name) == blob, name
    changed = tmp_path / "changed.py"
    changed.write_bytes((cleanrl_dqn.UPSTREAM / cleanrl_dqn.SCRIPT).read_bytes() + b"\n")
    assert cleanrl_dqn.blob_id(changed) != cleanrl_dqn.BLOBS[cleanrl_dqn.SCRIPT]
    assert cleanrl_dqn.COMMIT[:8] in (ROOT / "docs" / "coming_from_cleanrl.md").read_text()


def test_the_guides_diff_applies_to_upstream_as_a_file(upstream):
    before = (upstream / cleanrl_dqn.SCRIPT).read_text()
    done = subprocess.run(["git", "apply", "--verbose", "guide.diff"], cwd=upstream,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (upstream / cleanrl_dqn.SCRIPT).read_text() != before
    assert done.stderr.count("Applied patch") == 1 and "with fuzz" not in done.stderr
    assert not list(upstream.rglob("*.rej"))


def test_the_switched_script_is_the_one_the_guide_describes(upstream):
    subprocess.run(["git", "apply", "guide.diff"], cwd=upstream, check=True)
    source = (upstream / cleanrl_dqn.SCRIPT).read_text()
    ast.parse(source)
    assert "ReplayBuffer" not in source and "rb.sample" not in source
    for line in [
        "import jaxbuf",
        'frames={"obs": 4}, min_episode_length=20',
        "key, loop_key = jax.random.split(key)",
        "steps_per_call=args.train_frequency, batches_per_call=1",
        "draw=global_step > args.learning_starts",
        "if updates % max(1, 100 // args.train_frequency) == 0:",
        "rb.state.side.stale.sum()",
    ]:
        assert source.count(line) == 1, line
    # the network's key is left as upstream split it; the loop's comes from the rest
    assert source.index("key, q_key = jax.random.split(key, 2)") < source.index("loop_key")


def test_a_diff_that_does_not_apply_is_refused(upstream):
    diff = (upstream / "guide.diff").read_text()
    broken = diff.replace("-        rb.add(obs,", "-        rb.add(ob,")
    (upstream / "guide.diff").write_text(broken)
    done = subprocess.run(["git", "apply", "--check", "guide.diff"], cwd=upstream,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "patch does not apply" in done.stderr
