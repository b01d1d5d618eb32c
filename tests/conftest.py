"""Strict JAX settings for every test: no silent rank or dtype promotion.

Warnings are errors too (`filterwarnings = error` in pyproject.toml). XLA compiles with
the flags of `compile_flags.py`: the same results, compiled in about half the time.
"""

import os

import compile_flags

# before JAX starts its CPU backend, which reads XLA_FLAGS once (compile_flags.py)
os.environ["XLA_FLAGS"] = compile_flags.fast_compile(os.environ.get("XLA_FLAGS", ""))

import jax
import pytest
from skips import skip_holds

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(params=["jit", "eager"])
def variant(request):
    """Runs a test twice: with the function under `jax.jit`, and called eagerly.

    This is what `chex.variants(with_jit=True, without_jit=True)` does for
    absltest; chex's decorator does not compose with pytest's parametrize.
    """
    return jax.jit if request.param == "jit" else (lambda fn: fn)


@pytest.fixture(params=["cpu path", "accelerator path"])
def platform_path(request, monkeypatch):
    """Runs a test twice on this CPU: with the CPU paths, and with the paths that
    `jax.lax.platform_dependent` picks where a program is lowered for a GPU or TPU
    (its `default=` branch), so both are checked against the same references."""
    if request.param == "accelerator path":

        def default_branch(*args, default, **branches):
            return default(*args)

        monkeypatch.setattr(jax.lax, "platform_dependent", default_branch)
    return request.param


_UNFOUNDED: list[str] = []


def pytest_runtest_logreport(report):
    """Records a skip whose stated condition does not hold here (`skips.py`)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if not skip_holds(reason):
            _UNFOUNDED.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    """Fails a session that passed with unfounded skips: a test that could run here."""
    if _UNFOUNDED and exitstatus == 0:
        session.exitstatus = 1
        print("\nskipped although their condition does not hold here:\n  " +
              "\n  ".join(_UNFOUNDED))  # fmt: skip
