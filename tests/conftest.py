"""Strict JAX settings for every test: no silent rank or dtype promotion.

Warnings are errors too (`filterwarnings = error` in pyproject.toml).
"""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(params=["jit", "eager"])
def variant(request):
    """Runs a test twice: with the function under `jax.jit`, and called eagerly.

    This is what `chex.variants(with_jit=True, without_jit=True)` does for
    absltest; chex's decorator does not compose with pytest's parametrize.
    """
    return jax.jit if request.param == "jit" else (lambda fn: fn)
