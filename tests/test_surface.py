"""The public surface: one list per namespace, and every listing agrees with it.

Each namespace (`jaxbuf`, `jaxbuf.types`, `jaxbuf.io`, `jaxbuf.rl`, `jaxbuf.envs`) writes its
names once, as `if TYPE_CHECKING:` imports that `jaxbuf._public` reads. Here: `__all__` and
`dir()` are that list, each name is the object its module defines, no name has two homes,
the top level stays small, every 0.3 top-level name still imports (a moved one with one
warning naming its home), and the changelog's upgrade table names every moved name's home.
(The API reference's listing is checked in `test_site.py`, the docstrings in `test_docs.py`.)
"""

import importlib
import pathlib
import re
import warnings

import pytest

import jaxbuf
from jaxbuf import _public

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMESPACES = ("jaxbuf", *_public.NAMESPACES)
# jaxbuf 0.3's `__all__`, as it was: each name must still import from the top level.
TOP_LEVEL_0_3 = [
    "STEP_KEYS",
    "AddFn",
    "Blocks",
    "Buffer",
    "BufferLike",
    "CanSampleFn",
    "Config",
    "DatasetWriter",
    "Environment",
    "EpisodeRecords",
    "EpochState",
    "FinalObservations",
    "Hindsight",
    "HostLoop",
    "InitFn",
    "MemoryReport",
    "PriorityState",
    "Queue",
    "QueueState",
    "RateLimiter",
    "RateLimiterState",
    "RingState",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutBufferState",
    "Sample",
    "SampleFn",
    "Sampler",
    "TimeRingState",
    "Transition",
    "batches_allowed",
    "blocks",
    "buffer_from_config",
    "dataset_to_state",
    "discounted_returns",
    "epochs",
    "example_from_space",
    "export",
    "from_data",
    "gae",
    "gymnax_env",
    "hindsight",
    "lambda_returns",
    "load_metadata",
    "make_episode_buffer",
    "make_queue",
    "make_replay_buffer",
    "make_rollout_buffer",
    "make_trajectory_buffer",
    "make_transition_buffer",
    "memory",
    "mix",
    "n_step_returns",
    "per_shard",
    "prefill",
    "prioritized",
    "read_dataset",
    "read_export",
    "read_vault",
    "restore",
    "sample_to_insert_ratio",
    "save",
    "shard",
    "stored_items",
    "take_all",
    "to_torch",
    "uniform",
    "vault_to_state",
    "vectorize",
]


def listed(namespace: str) -> dict[str, str]:
    module = importlib.import_module(namespace)
    return _public.homes(module.__file__)


def test_the_top_level_is_small_and_every_0_3_name_has_one_home():
    assert len(TOP_LEVEL_0_3) == 69
    assert len(jaxbuf.__all__) <= 30
    homes = [name for namespace in NAMESPACES for name in listed(namespace)]
    assert len(homes) == len(set(homes)), sorted(n for n in homes if homes.count(n) > 1)
    assert set(TOP_LEVEL_0_3) == set(homes)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_all_and_dir_are_the_one_list_and_each_name_is_its_modules(namespace):
    module = importlib.import_module(namespace)
    table = listed(namespace)
    assert module.__all__ == sorted(table)
    assert set(table) <= set(dir(module))
    for name, home in table.items():
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(home), name), name
        if hasattr(value, "__module__") and callable(value):
            assert value.__module__ == home, (name, value.__module__, home)


def test_a_moved_name_imports_from_the_top_level_with_one_warning_naming_its_home(monkeypatch):
    monkeypatch.setattr(_public, "_WARNED", set())
    for name in TOP_LEVEL_0_3:
        home = _public.moved_home(name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(jaxbuf, name)
            again = getattr(jaxbuf, name)
        if home is None:
            assert name in jaxbuf.__all__ and not caught, name
            continue
        assert value is again is getattr(importlib.import_module(home), name)
        assert len(caught) == 1 and caught[0].category is DeprecationWarning, name
        message = str(caught[0].message)
        assert f"jaxbuf.{name} moved to {home}.{name}" in message, message
        assert caught[0].filename == __file__  # the user's line, not ours


def test_from_import_of_a_moved_name_warns_and_an_unknown_name_raises(monkeypatch):
    monkeypatch.setattr(_public, "_WARNED", set())
    with pytest.warns(DeprecationWarning, match=r"jaxbuf\.io\.from_data"):
        from jaxbuf import from_data
    assert from_data is jaxbuf.io.from_data
    with pytest.raises(AttributeError, match="has no attribute 'make_flat_buffer'"):
        jaxbuf.make_flat_buffer  # noqa: B018
    with pytest.raises(AttributeError, match=r"'jaxbuf\.io' has no attribute 'save'"):
        jaxbuf.io.save  # noqa: B018


def test_the_changelog_names_every_moved_names_new_home():
    text = (ROOT / "CHANGELOG.md").read_text()
    heading = "### Changed: 0.4's public surface, and what to do when upgrading from 0.3's names"
    upgrade = text.split(heading, 1)[1].split("###")[0]
    for namespace in _public.NAMESPACES:
        row = re.search(rf"^\s*\| `{re.escape(namespace)}` \| (.*) \|$", upgrade, re.M)
        assert row is not None, namespace
        assert sorted(re.findall(r"`(\w+)`", row.group(1))) == sorted(listed(namespace))
