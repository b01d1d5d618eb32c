"""The CleanRL guide's diff, as a user applies it: to CleanRL's own `dqn_atari_jax.py`.

The repository holds no CleanRL file: `benchmarks/agents/cleanrl_release.py` downloads the
release the guide names from the package registry and reads its files out of the wheel, checked
by hash; `benchmarks/agents/cleanrl_dqn.py` applies the guide's diff to them and runs the result
on real ALE (its figures are the guide's). Here: the fetched files are the release's byte for
byte (a changed byte is refused), the diff in `docs/coming_from_cleanrl.md` applies with `git
apply` (which refuses fuzz), and what it makes is the script the guide describes. A registry
that cannot be reached fails these tests; nothing falls back to a copy.
"""

import ast
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.agents import cleanrl_dqn, cleanrl_release  # noqa: E402


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> pathlib.Path:
    """The release's files, downloaded once per worker (`cleanrl_release.fetch`)."""
    folder = tmp_path_factory.mktemp("cleanrl-release")
    cleanrl_release.fetch(folder)
    return folder


@pytest.fixture
def upstream(release, tmp_path) -> pathlib.Path:
    """The release's files in a scratch folder (not a git repository, as a user's copy)."""
    cleanrl_dqn.checkout(release, tmp_path, "cleanrl")
    (tmp_path / "guide.diff").write_text(cleanrl_dqn.guide_diff())
    return tmp_path


def test_the_fetched_files_are_the_releases_and_a_changed_byte_is_refused(release, tmp_path):
    script = (release / cleanrl_dqn.SCRIPT).read_bytes()
    assert cleanrl_release.sha256(script) == cleanrl_release.SCRIPT_SHA256
    assert b"from stable_baselines3.common.buffers import ReplayBuffer" in script
    assert b"MIT License" in (release / "LICENSE").read_bytes()
    assert (release / "cleanrl_utils" / "evals" / "dqn_jax_eval.py").exists()
    changed = tmp_path / "changed"
    shutil.copytree(release, changed)
    (changed / cleanrl_dqn.SCRIPT).write_bytes(script + b"\n")
    with pytest.raises(ValueError, match=r"is not CleanRL 1\.2\.0's"):
        cleanrl_dqn.checkout(changed, tmp_path / "run", "cleanrl")
    page = (ROOT / "docs" / "coming_from_cleanrl.md").read_text()
    assert f"CleanRL {cleanrl_release.RELEASE}" in page
    assert "cleanrl/upstream" not in page and not (ROOT / "benchmarks/agents/cleanrl").exists()


def test_a_wheel_that_is_not_the_releases_is_refused(release, tmp_path):
    wheel = release / "wheel" / cleanrl_release.WHEEL
    with zipfile.ZipFile(wheel) as original, zipfile.ZipFile(tmp_path / wheel.name, "w") as copy:
        for item in original.infolist():
            data = original.read(item)
            copy.writestr(item, data + b"#" if item.filename == cleanrl_dqn.SCRIPT else data)
    with pytest.raises(ValueError, match="does not match its RECORD hash"):
        cleanrl_release.extract(tmp_path / wheel.name, tmp_path / "out")


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
    assert broken != diff
    (upstream / "guide.diff").write_text(broken)
    done = subprocess.run(["git", "apply", "--check", "guide.diff"], cwd=upstream,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "patch does not apply" in done.stderr
