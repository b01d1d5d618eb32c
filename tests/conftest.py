"""Strict JAX settings for every test: no silent rank or dtype promotion.

Warnings are errors too (`filterwarnings = error` in pyproject.toml). XLA compiles with
the flags of `compile_flags.py` (the same results, compiled in about half the time), and
each program once per run (JAX's compilation cache in a folder of the run's own).
"""

import os
import shutil

import compile_flags
import jax
import pytest
from helpers import accelerators_form
from skips import skip_holds

from jaxbuf.core import lowering as _lowering

# before JAX starts its CPU backend (at the first array), which reads XLA_FLAGS once
os.environ["XLA_FLAGS"] = compile_flags.fast_compile(os.environ.get("XLA_FLAGS", ""))
_OWN_CACHE = compile_flags.compilation_cache()
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# as the environment says (read again: JAX may have been imported before this file)
jax.config.update("jax_compilation_cache_dir", os.environ[compile_flags.CACHE])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))  # fmt: skip
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))  # fmt: skip


@pytest.fixture(params=["jit", "eager"])
def variant(request):
    """Runs a test twice: with the function under `jax.jit`, and called eagerly.

    This is what `chex.variants(with_jit=True, without_jit=True)` does for
    absltest; chex's decorator does not compose with pytest's parametrize.
    """
    return jax.jit if request.param == "jit" else (lambda fn: fn)


@pytest.fixture(params=["cpu path", "accelerator path"])
def platform_path(request, monkeypatch):
    """Runs a test twice on this CPU: with the CPU's forms, and with the forms that
    the lowering seam (`jaxbuf.core.lowering.choose`) picks where a program is lowered for
    a GPU or TPU, so both are checked against the same references."""
    if request.param == "accelerator path":
        monkeypatch.setattr(_lowering, "choose", accelerators_form)
    return request.param


_UNFOUNDED: list[str] = []


def pytest_runtest_logreport(report):
    """Records a skip whose stated condition does not hold here (`skips.py`)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if not skip_holds(reason):
            _UNFOUNDED.append(f"{report.nodeid}: {reason}")


def pytest_unconfigure(config):
    """Removes the run's compilation cache where this process made it (the controller)."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    """Fails a session that passed with unfounded skips: a test that could run here."""
    if _UNFOUNDED and exitstatus == 0:
        session.exitstatus = 1
        print("\nskipped although their condition does not hold here:\n  " +
              "\n  ".join(_UNFOUNDED))  # fmt: skip
