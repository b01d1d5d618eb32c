"""Return estimators against plain NumPy loops, identities between them, errors."""

import functools
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from reference import np_gae

import jaxbuf

# --- NumPy references: one Python loop over time each, written from the math. ---


def np_lambda_returns(r, nv, term, trunc, gamma, lam):
    out, following = np.zeros_like(r), np.zeros_like(r[0])
    for t in reversed(range(len(r))):
        boot = trunc[t] | (t == len(r) - 1)
        tail = np.where(boot, nv[t], (1 - lam[t]) * nv[t] + lam[t] * following)
        following = r[t] + gamma[t] * (1 - term[t]) * tail
        out[t] = following
    return out


def np_n_step(r, nv, term, trunc, gamma, n):
    """Forward sums per start time and batch element (a different formulation)."""
    out = np.zeros_like(r)
    for index in np.ndindex(r.shape):
        t0, rest = index[0], index[1:]
        total, scale = 0.0, 1.0
        for k in range(n):
            t = t0 + k
            total += scale * r[(t, *rest)]
            if term[(t, *rest)]:
                break
            scale *= gamma[(t, *rest)]
            if trunc[(t, *rest)] or t == len(r) - 1 or k == n - 1:
                total += scale * nv[(t, *rest)]
                break
        out[index] = total
    return out


def rollout(seed=0, shape=(60, 3, 4), p_end=0.1):
    """Random time-major data with many ends; next_values[t] = values[t+1] inside episodes."""
    rng = np.random.default_rng(seed)
    r = rng.normal(size=shape).astype(np.float32)
    v = rng.normal(size=shape).astype(np.float32)
    term = rng.random(shape) < p_end
    trunc = (rng.random(shape) < p_end) & ~term
    final = rng.normal(size=shape).astype(np.float32)  # values of final observations
    nv = np.concatenate([v[1:], rng.normal(size=(1, *shape[1:])).astype(np.float32)])
    nv = np.where(term | trunc, final, nv).astype(np.float32)
    return r, v, nv, term, trunc


def full(x, shape):
    return np.broadcast_to(np.asarray(x, np.float32), shape)


@pytest.mark.parametrize("method", ["scan", "associative"])
@pytest.mark.parametrize("coefficients", ["scalar", "per-step"])
def test_gae_matches_numpy(method, coefficients):
    r, v, nv, term, trunc = rollout()
    rng = np.random.default_rng(1)
    if coefficients == "scalar":
        gamma, lam = 0.97, 0.9
    else:  # broadcastable arrays: per time step and per environment
        gamma = rng.uniform(0.8, 1.0, size=(60, 1, 4)).astype(np.float32)
        lam = rng.uniform(0.5, 1.0, size=(60, 3, 1)).astype(np.float32)
    advantages, returns = jax.jit(jaxbuf.gae, static_argnames="method")(
        r, v, nv, term, trunc, discount=gamma, gae_lambda=lam, method=method
    )
    want = np_gae(r, v, nv, term, trunc, full(gamma, r.shape), full(lam, r.shape))
    np.testing.assert_allclose(advantages, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["auto", "scan", "associative"])
def test_lambda_and_discounted_returns_match_numpy(method):
    r, _, nv, term, trunc = rollout(2)
    shape = r.shape
    got = jaxbuf.rl.lambda_returns(r, nv, term, trunc, discount=0.95, lambda_=0.7, method=method)
    want = np_lambda_returns(r, nv, term, trunc, full(0.95, shape), full(0.7, shape))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got = jaxbuf.rl.discounted_returns(r, nv, term, trunc, discount=0.95, method=method)
    want = np_lambda_returns(r, nv, term, trunc, full(0.95, shape), full(1.0, shape))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 5, 100])
def test_n_step_returns_match_numpy(n):
    r, _, nv, term, trunc = rollout(3, shape=(40, 5))
    n_step = jax.jit(jaxbuf.rl.n_step_returns, static_argnames="n")
    got = n_step(r, nv, term, trunc, discount=0.9, n=n)
    want = np_n_step(r, nv, term, trunc, full(0.9, r.shape), n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_identities_between_estimators():
    r, v, nv, term, trunc = rollout(4)
    kw = dict(discount=0.99)
    # lambda = 1: GAE returns are the discounted returns; advantages are those minus values.
    advantages, returns = jaxbuf.gae(r, v, nv, term, trunc, gae_lambda=1.0, **kw)
    discounted = jaxbuf.rl.discounted_returns(r, nv, term, trunc, **kw)
    np.testing.assert_allclose(returns, discounted, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(advantages, discounted - v, rtol=1e-5, atol=1e-4)
    # lambda = 0: advantages are one-step TD errors, returns one-step targets.
    advantages, returns = jaxbuf.gae(r, v, nv, term, trunc, gae_lambda=0.0, **kw)
    td_target = r + 0.99 * (1 - term) * nv
    np.testing.assert_allclose(advantages, td_target - v, rtol=1e-5, atol=1e-6)
    one_step = jaxbuf.rl.n_step_returns(r, nv, term, trunc, n=1, **kw)
    np.testing.assert_allclose(one_step, td_target, rtol=1e-6, atol=1e-6)
    # Any lambda: GAE returns are the lambda returns; n >= T steps are the full returns.
    _, returns = jaxbuf.gae(r, v, nv, term, trunc, gae_lambda=0.8, **kw)
    lam = jaxbuf.rl.lambda_returns(r, nv, term, trunc, lambda_=0.8, **kw)
    np.testing.assert_allclose(returns, lam, rtol=1e-5, atol=1e-4)
    long = jaxbuf.rl.n_step_returns(r, nv, term, trunc, n=len(r), **kw)
    np.testing.assert_allclose(long, discounted, rtol=1e-5, atol=1e-4)


def test_truncation_bootstraps_from_the_final_observation():
    # One episode of 3 steps cut by the time limit, then a new episode of 2 steps.
    r = np.ones(5, np.float32)
    v = np.zeros(5, np.float32)
    nv = np.array([0, 0, 10, 0, 0], np.float32)  # V(final observation) = 10
    trunc = np.array([False, False, True, False, False])
    term = np.zeros(5, bool)
    advantages, _ = jaxbuf.gae(r, v, nv, term, trunc, discount=0.5, gae_lambda=1.0)
    # 1 + .5 * 10 = 6 at the cut, then 1 + .5 * 6 = 4 and 1 + .5 * 4 = 3 before it;
    # the next episode is not carried back.
    np.testing.assert_allclose(advantages, [3.0, 4.0, 6.0, 1.5, 1.0])
    as_terminal, _ = jaxbuf.gae(r, v, nv, trunc, term, discount=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(as_terminal, [1.75, 1.5, 1.0, 1.5, 1.0])  # the biased answer


def test_scan_and_associative_agree_on_long_horizons():
    r, v, nv, term, trunc = rollout(5, shape=(4096, 8), p_end=0.002)
    kw = dict(discount=0.999, gae_lambda=0.98)
    # jitted: each a program compiled once (op by op, every level's shapes compile anew)
    gae = jax.jit(jaxbuf.gae, static_argnames=("method", "discount", "gae_lambda"))
    scan = gae(r, v, nv, term, trunc, method="scan", **kw)
    associative = gae(r, v, nv, term, trunc, method="associative", **kw)
    for a, b in zip(scan, associative, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _lowered(function, platform, *args):
    """The StableHLO of `function` exported for `platform`: what that platform runs.

    JAX 0.7 and later lower only the platform's branch of `jax.lax.platform_dependent`;
    older JAX lowers every branch behind a constant index, and XLA drops the others when it
    compiles, which a CPU host cannot show for `cuda`. There the branch is picked here as
    JAX 0.7 picks it."""
    fresh = jax.jit(lambda *a: function(*a))  # no trace cached for another platform
    exported = functools.partial(export.export, fresh, platforms=(platform,))
    if JAX_VERSION >= (0, 7):
        return exported()(*args).mlir_module()

    def branch_of_platform(*operands, default=None, **branches):
        return branches.get(platform, default)(*operands)

    with mock.patch.object(jax.lax, "platform_dependent", branch_of_platform):
        return exported()(*args).mlir_module()


JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".")[:2])


ESTIMATORS = [
    lambda *a, **k: jaxbuf.gae(*a, discount=0.99, gae_lambda=0.95, **k)[0],
    lambda r, v, nv, *a, **k: jaxbuf.rl.lambda_returns(r, nv, *a, discount=0.99, lambda_=0.9, **k),
    lambda r, v, nv, *a, **k: jaxbuf.rl.discounted_returns(r, nv, *a, discount=0.99, **k),
]
ESTIMATOR_NAMES = ["gae", "lambda_returns", "discounted_returns"]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=ESTIMATOR_NAMES)
def test_auto_is_scan_on_cpu_and_associative_on_accelerators(estimator):
    """The default takes a loop-free path when lowered for an accelerator, the scan on CPU,
    and both paths agree over long horizons with episode ends."""
    args = rollout(7, shape=(2048, 4), p_end=0.003)
    default = jax.jit(estimator)(*args)  # method="auto": the scan on CPU, else associative
    scan = jax.jit(lambda *a: estimator(*a, method="scan"))(*args)
    associative = jax.jit(lambda *a: estimator(*a, method="associative"))(*args)
    taken = scan if jax.default_backend() == "cpu" else associative
    np.testing.assert_array_equal(default, taken)
    np.testing.assert_allclose(scan, associative, rtol=2e-5, atol=2e-5)
    assert "stablehlo.while" in _lowered(estimator, "cpu", *args)
    for platform in ("cuda", "tpu"):
        text = _lowered(estimator, platform, *args)
        assert "stablehlo.while" not in text, platform
        same = _lowered(lambda *a: estimator(*a, method="associative"), platform, *args)
        assert text.count("stablehlo.slice") == same.count("stablehlo.slice") > 0, platform


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=ESTIMATOR_NAMES)
def test_an_explicit_method_is_taken_on_every_platform(estimator):
    """`method="scan"` and `method="associative"` are what they say wherever the program is
    lowered: the scan is a loop on accelerators too, the associative scan has none on CPU."""
    args = rollout(8, shape=(64, 3), p_end=0.05)
    for platform in ("cpu", "cuda", "tpu"):
        scan = _lowered(lambda *a: estimator(*a, method="scan"), platform, *args)
        associative = _lowered(lambda *a: estimator(*a, method="associative"), platform, *args)
        assert "stablehlo.while" in scan, platform
        assert "stablehlo.while" not in associative, platform
        assert "stablehlo.case" not in associative, platform  # no choice left to the platform


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_gradients_flow_through_values(method):
    r, v, nv, term, trunc = rollout(6, shape=(30,), p_end=0.15)
    gamma, lam = 0.9, 0.8

    def total_advantage(values, next_values):
        return jaxbuf.gae(
            r, values, next_values, term, trunc, discount=gamma, gae_lambda=lam, method=method
        )[0].sum()

    d_values, d_next = jax.jit(jax.grad(total_advantage, argnums=(0, 1)))(v, nv)
    # A = M @ delta with M[t, s] = prod_{k=t}^{s-1} gamma * lam * (1 - done_k) for s >= t.
    mixing = np.zeros((30, 30))
    for t in range(30):
        scale = 1.0
        for s in range(t, 30):
            mixing[t, s] = scale
            scale *= gamma * lam * (1 - (term[s] | trunc[s]))
    column = mixing.sum(axis=0)
    np.testing.assert_allclose(d_values, -column, rtol=1e-5)
    np.testing.assert_allclose(d_next, column * gamma * (1 - term), rtol=1e-5)


def test_gae_under_vmap_equals_the_batched_call():
    r, v, nv, term, trunc = rollout(7, shape=(20, 6))
    kw = dict(discount=0.9, gae_lambda=0.95)
    batched = jaxbuf.gae(r, v, nv, term, trunc, **kw)
    mapped = jax.vmap(lambda *a: jaxbuf.gae(*a, **kw), in_axes=1, out_axes=1)(r, v, nv, term, trunc)
    for a, b in zip(batched, mapped, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_estimator_errors_name_the_argument():
    r, v, nv, term, trunc = rollout(8, shape=(10, 2))
    kw = dict(discount=0.9, gae_lambda=0.9)
    cases = [
        ((r, v[:, :1], nv, term, trunc), kw, ValueError, "values has shape (10, 1), but rewards"),
        ((r, v, nv, term.astype(np.float32), trunc), kw, TypeError, "terminated must be a bool"),
        ((r, v.astype(np.int32), nv, term, trunc), kw, TypeError, "values must be a floating"),
        ((r[0, 0], v, nv, term, trunc), kw, ValueError, "rewards must be time-major"),
        ((r, v, nv, term, trunc), dict(kw, discount=1.5), ValueError, "discount must be in [0, 1]"),
        (
            (r, v, nv, term, trunc),
            dict(kw, gae_lambda=np.ones((3,), np.float32)),
            ValueError,
            "gae_lambda has shape (3,), which does not broadcast",
        ),
        ((r, v, nv, term, trunc), dict(kw, method="fast"), ValueError, "method must be one of"),
        (
            (r, v.astype(jnp.bfloat16), nv, term, trunc),
            kw,
            TypeError,
            "rewards and values must share one float dtype",
        ),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            jax.jit(lambda *a, kwargs=kwargs: jaxbuf.gae(*a, **kwargs))(*args)
    with pytest.raises(ValueError, match=re.escape("n must be in [1,")):
        jaxbuf.rl.n_step_returns(r, nv, term, trunc, discount=0.9, n=0)
