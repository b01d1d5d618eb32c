"""Skips that say why, checked: every skip states a condition, and the session fails
(`conftest.py`) if that condition does not hold where the test skipped, a test that
could have run.

The conditions, and the CI environment (`.ci/run`) where each skipped test runs instead:
- "could not import 'M'" (`pytest.importorskip`): M is not installed. Brax: CI's Brax
  environment; torch, gymnax, gymnasium: the test environment (the minimum-JAX one
  lacks them).
- "needs D >= V (installed: ...)" (`needs`): the test environment.
- the reasons in `CONDITIONS`.
"""

import importlib.util
import re
from importlib import metadata

import jax
import pytest
from packaging.version import Version


def needs(distribution: str, minimum: str) -> None:
    """Skips the test unless `distribution` (its installed metadata, which a package
    without `__version__` still has) is at least `minimum`: the reason says so, and
    `pytest_sessionfinish` checks it."""
    installed = _installed(distribution)
    if installed is None or installed < Version(minimum):
        pytest.skip(f"needs {distribution} >= {minimum} (installed: {installed})")


CONDITIONS = {
    "Brax 0.14 calls jax.device_put_replicated, gone in JAX 0.10": (
        lambda: Version(jax.__version__) >= Version("0.10")  # CI's Brax environment: JAX 0.9
    ),
    "JAX's memory spaces (jax.memory.Space) arrived in JAX 0.7": (
        lambda: getattr(getattr(jax, "memory", None), "Space", None) is None  # test env: newest
    ),
}


def _installed(distribution: str) -> Version | None:
    try:
        return Version(metadata.version(distribution))
    except metadata.PackageNotFoundError:
        return None


def skip_holds(reason: str) -> bool:
    """Whether a skip's stated condition holds in this environment."""
    reason = reason.removeprefix("Skipped: ")
    imported = re.match(r"could not import '([\w.]+)'", reason)
    if imported:
        return _missing(imported.group(1))
    version = re.match(r"needs ([\w-]+) >= ([\w.]+) \(installed", reason)
    if version:
        installed = _installed(version.group(1))
        return installed is None or installed < Version(version.group(2))
    return reason in CONDITIONS and CONDITIONS[reason]()


def _missing(name: str) -> bool:
    """Whether module `name` cannot be found (a parent package missing included)."""
    try:
        return importlib.util.find_spec(name) is None
    except ImportError:
        return True
