"""Return and advantage estimators with termination and truncation done right.

All arrays are time-major, `[T, *batch]`, with any number of batch axes. For
the step taken at time `t`:

- `rewards[t]`: the reward received after it;
- `values[t]`: the value estimate of the observation it was taken from;
- `next_values[t]`: the value estimate of the TRUE next observation. After a
  time-limit truncation that is the final observation of the episode, not the
  reset observation that auto-resetting environments return;
- `terminated[t]`: the episode ended in a terminal state: nothing follows, no
  bootstrap;
- `truncated[t]`: the episode was cut (time limit): bootstrap from
  `next_values[t]`, but do not carry later steps (another episode) back.

The end of the arrays is treated as a truncation: every estimator bootstraps
from `next_values[T-1]` there. Pass zeros as `next_values` for returns without
bootstrap. `discount` and lambdas are scalars or arrays broadcastable to
`[T, *batch]`, in [0, 1]: a known value outside (NaN included) raises
`ValueError`; a traced one is clamped into [0, 1] (NaN stays NaN and shows in
the result).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxbuf.core import lowering as _lowering
from jaxbuf.core import validation as _validation
from jaxbuf.core.validation import check_int

_METHODS = ("auto", "scan", "associative")


def _time_major(**arrays: Any) -> tuple[jax.Array, ...]:
    """Checks that the arrays share one `[T, *batch]` shape and proper dtypes."""
    shape, first = None, ""
    out = []
    for name, array in arrays.items():
        array = jnp.asarray(array)
        if array.ndim < 1 or array.shape[0] < 1:
            raise ValueError(
                f"{name} must be time-major [T, *batch] with T >= 1, got {array.shape}."
            )
        if shape is None:
            shape, first = array.shape, name
        elif array.shape != shape:
            raise ValueError(f"{name} has shape {array.shape}, but {first} has {shape}.")
        flag = name in ("terminated", "truncated")
        if flag and array.dtype != jnp.bool_:
            raise TypeError(
                f"{name} must be a bool array, got {array.dtype}; use `x > 0` or .astype(bool)."
            )
        if not flag and not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array, got {array.dtype}.")
        out.append(array)
    floats = {
        a.dtype for n, a in zip(arrays, out, strict=True) if n not in ("terminated", "truncated")
    }
    if len(floats) > 1:
        raise TypeError(
            f"rewards and values must share one float dtype, got {sorted(map(str, floats))}."
        )
    return tuple(out)


def check_method(method: str) -> str:
    """Returns `method` if it names a way of solving the recurrence, else raises."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}.")
    return method


def _coefficient(name: str, value: Any, like: jax.Array) -> jax.Array:
    """A discount or lambda as an array of `like`'s dtype, scalar or `[T, *batch]`.

    Known values (numbers, NumPy arrays, concrete JAX arrays) must lie in [0, 1]
    or raise `ValueError`; a traced value is clamped into [0, 1] (NaN stays NaN,
    so it shows in the result instead of hiding).
    """
    known = _validation.known(value)
    if known is not None:
        if known.dtype == np.bool_ or not np.issubdtype(known.dtype, np.number):
            raise TypeError(f"{name} must be a number or an array of numbers, got {value!r}.")
        outside = known[~((known >= 0) & (known <= 1))]
        if outside.size:
            count = f" ({outside.size} entries outside)" if known.ndim else ""
            raise ValueError(f"{name} must be in [0, 1], got {outside.flat[0]}{count}.")
    value = jnp.clip(jnp.asarray(value, like.dtype), 0, 1)
    if value.ndim == 0:
        return value
    try:
        return jnp.broadcast_to(value, like.shape)
    except ValueError:
        raise ValueError(
            f"{name} has shape {value.shape}, which does not broadcast to "
            f"[T, *batch] = {like.shape}."
        ) from None


def _gae_scan(rewards, values, next_values, terminated, truncated, discount, gae_lambda):
    """GAE by `lax.scan`, every per-step quantity computed inside the loop body.

    Computing the deltas in the body reads each input once and writes only the
    advantages; precomputing them writes and rereads two `[T, *batch]` arrays,
    which on CPU cost more than the recurrence itself. Scalar coefficients are
    closed over; arrays (already full-shaped) are scanned.
    """
    scanned = {k: c for k, c in (("discount", discount), ("lambda", gae_lambda)) if c.ndim}

    def step(following: jax.Array, inputs):
        reward, value, next_value, term, trunc, per_step = inputs
        gamma = per_step.get("discount", discount)
        lam = per_step.get("lambda", gae_lambda)
        delta = reward + gamma * (1 - term.astype(reward.dtype)) * next_value - value
        advantage = delta + gamma * lam * (1 - (term | trunc).astype(reward.dtype)) * following
        return advantage, advantage

    inputs = (rewards, values, next_values, terminated, truncated, scanned)
    return lax.scan(step, jnp.zeros_like(rewards[0]), inputs, reverse=True)[1]


def per_platform(method: str, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args, method=...)` with `"auto"` resolved per lowering platform:
    `"scan"` on CPU, `"associative"` elsewhere (`_lowering.loop_or_unrolled`)."""
    if check_method(method) != "auto":
        return function(*args, method=method)
    return _lowering.loop_or_unrolled(
        *args,
        loop=functools.partial(function, method="scan"),
        unrolled=functools.partial(function, method="associative"),
    )


def _solve_backwards(deltas: jax.Array, coefficients: jax.Array, method: str) -> jax.Array:
    """`x_t = deltas_t + coefficients_t * x_{t+1}` for t = T-1, ..., 0, with `x_T = 0`."""
    if check_method(method) == "auto":
        return per_platform(method, _solve_backwards, deltas, coefficients)
    if method == "scan":

        def step(carry: jax.Array, inputs: tuple[jax.Array, jax.Array]):
            delta, coefficient = inputs
            carry = delta + coefficient * carry
            return carry, carry

        _, solution = lax.scan(
            step, jnp.zeros_like(deltas[0]), (deltas, coefficients), reverse=True
        )
        return solution

    # An element (c, d) is the map x -> d + c * x. With reverse=True the scan composes the
    # maps of later times (`later`) into each earlier one.
    def compose(later, earlier):
        return earlier[0] * later[0], earlier[1] + earlier[0] * later[1]

    return lax.associative_scan(compose, (coefficients, deltas), reverse=True)[1]


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    *,
    discount: Any,
    gae_lambda: Any,
    method: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation (Schulman et al., 2016).

    With `done_t = terminated_t | truncated_t`:

    ```text
    δ_t = r_t + γ_t (1 - terminated_t) V'_t - V_t
    A_t = δ_t + γ_t λ_t (1 - done_t) A_{t+1},    A_T = 0
    R_t = A_t + V_t
    ```

    where `V'` is `next_values`. With `lambda = 1`, `R` is `discounted_returns`;
    with `lambda = 0`, `A` is the one-step TD error.

    Args:
      rewards: `[T, *batch]`, rewards after the steps at times `[0, T)`.
      values: `[T, *batch]`, values of the observations at times `[0, T)`.
      next_values: `[T, *batch]`, values of the true next observations.
      terminated: bool `[T, *batch]`.
      truncated: bool `[T, *batch]`.
      discount: `gamma`, scalar or broadcastable to `[T, *batch]`.
      gae_lambda: `lambda`, scalar or broadcastable to `[T, *batch]`.
      method: `"scan"` (`lax.scan`, reverse: `T` sequential steps),
        `"associative"` (`lax.associative_scan`: `O(log T)` depth, no loop), or
        `"auto"`: scan where the program is lowered for CPU, associative for
        GPU and TPU (`jax.lax.platform_dependent`), the faster on each. They
        agree to float32 precision.

    Returns:
      `(advantages, returns)`, both `[T, *batch]`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> rewards = jnp.ones(3)
      >>> values = next_values = jnp.zeros(3)
      >>> flags = jnp.array([False, False, False])
      >>> advantages, _ = jaxbuf.gae(rewards, values, next_values, flags, flags,
      ...                            discount=0.5, gae_lambda=1.0)
      >>> advantages.tolist()
      [1.75, 1.5, 1.0]
    """
    rewards, values, next_values, terminated, truncated = _time_major(
        rewards=rewards, values=values, next_values=next_values,
        terminated=terminated, truncated=truncated,
    )  # fmt: skip
    discount = _coefficient("discount", discount, rewards)
    gae_lambda = _coefficient("gae_lambda", gae_lambda, rewards)
    args = (rewards, values, next_values, terminated, truncated, discount, gae_lambda)
    advantages = per_platform(method, _advantages, *args)
    return advantages, advantages + values


def _advantages(rewards, values, next_values, terminated, truncated, discount, gae_lambda, *,
                method: str) -> jax.Array:  # fmt: skip
    """GAE's advantages by `"scan"` or `"associative"` (arguments as checked by `gae`)."""
    if method == "scan":
        return _gae_scan(rewards, values, next_values, terminated, truncated, discount, gae_lambda)
    not_terminated = 1 - terminated.astype(rewards.dtype)
    not_done = 1 - (terminated | truncated).astype(rewards.dtype)
    deltas = rewards + discount * not_terminated * next_values - values
    return _solve_backwards(deltas, discount * gae_lambda * not_done, method)


def lambda_returns(
    rewards: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    *,
    discount: Any,
    lambda_: Any,
    method: str = "auto",
) -> jax.Array:
    """TD(lambda) returns, bootstrapped from `next_values`.

    With `boot_t = truncated_t or t = T - 1`:

    ```text
    if boot_t:  G_t = r_t + γ_t (1 - terminated_t) V'_t
    otherwise:  G_t = r_t + γ_t (1 - terminated_t) ((1 - λ_t) V'_t + λ_t G_{t+1})
    ```

    Args:
      rewards: `[T, *batch]`.
      next_values: `[T, *batch]`, values of the true next observations.
      terminated: bool `[T, *batch]`.
      truncated: bool `[T, *batch]`.
      discount: scalar or broadcastable to `[T, *batch]`.
      lambda_: scalar or broadcastable to `[T, *batch]`.
      method: `"auto"`, `"scan"` or `"associative"`, as for `gae`.

    Returns:
      `[T, *batch]`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> flags = jnp.zeros(2, bool)
      >>> jaxbuf.rl.lambda_returns(jnp.ones(2), jnp.full(2, 10.0), flags, flags,
      ...                       discount=0.5, lambda_=0.5).tolist()
      [5.0, 6.0]
    """
    rewards, next_values, terminated, truncated = _time_major(
        rewards=rewards, next_values=next_values, terminated=terminated, truncated=truncated
    )
    discount = _coefficient("discount", discount, rewards)
    lambda_ = _coefficient("lambda_", lambda_, rewards)
    carry = _carries(terminated, truncated, rewards.dtype) * lambda_
    # G_t = [r_t + g_t (1 - term_t)(1 - carry_t) V'_t] + g_t (1 - term_t) carry_t G_{t+1}
    live = discount * (1 - terminated.astype(rewards.dtype))
    return _solve_backwards(rewards + live * (1 - carry) * next_values, live * carry, method)


def _carries(terminated: jax.Array, truncated: jax.Array, dtype: Any) -> jax.Array:
    """1 where the next step continues the episode inside the arrays, else 0."""
    boot = truncated.at[-1].set(True)
    return 1 - (boot | terminated).astype(dtype)


def discounted_returns(
    rewards: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    *,
    discount: Any,
    method: str = "auto",
) -> jax.Array:
    """Discounted rewards-to-go (the PPO buffer's `discount_cumsum`), bootstrapped.

    With `boot_t = truncated_t or t = T - 1`:

    ```text
    if boot_t:  G_t = r_t + γ_t (1 - terminated_t) V'_t
    otherwise:  G_t = r_t + γ_t (1 - terminated_t) G_{t+1}
    ```

    Pass `next_values = 0` for plain Monte-Carlo returns of complete episodes.

    Args:
      rewards: `[T, *batch]`.
      next_values: `[T, *batch]`, values of the true next observations.
      terminated: bool `[T, *batch]`.
      truncated: bool `[T, *batch]`.
      discount: scalar or broadcastable to `[T, *batch]`.
      method: `"auto"`, `"scan"` or `"associative"`, as for `gae`.

    Returns:
      `[T, *batch]`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> terminated = jnp.array([False, True, False])
      >>> truncated = jnp.zeros(3, bool)
      >>> jaxbuf.rl.discounted_returns(jnp.ones(3), jnp.full(3, 4.0), terminated, truncated,
      ...                           discount=0.5).tolist()
      [1.5, 1.0, 3.0]
    """
    return lambda_returns(
        rewards, next_values, terminated, truncated, discount=discount, lambda_=1.0, method=method
    )


def n_step_returns(
    rewards: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    *,
    discount: Any,
    n: int,
) -> jax.Array:
    """n-step returns: `n` rewards, then the bootstrap, cut at episode ends.

    ```text
    G¹_t = r_t + γ_t (1 - terminated_t) V'_t
    if boot_t:  Gᵏ_t = r_t + γ_t (1 - terminated_t) V'_t
    otherwise:  Gᵏ_t = r_t + γ_t (1 - terminated_t) Gᵏ⁻¹_{t+1}
    ```

    with `boot_t = truncated_t or t = T - 1`: the sum stops at the first
    termination (no bootstrap), truncation or end of the arrays (bootstrap
    from `next_values` there), whichever comes within `n` steps.

    Args:
      rewards: `[T, *batch]`.
      next_values: `[T, *batch]`, values of the true next observations.
      terminated: bool `[T, *batch]`.
      truncated: bool `[T, *batch]`.
      discount: scalar or broadcastable to `[T, *batch]`.
      n: the static number of steps, `n >= 1`.

    Returns:
      `[T, *batch]`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> flags = jnp.zeros(3, bool)
      >>> jaxbuf.rl.n_step_returns(jnp.ones(3), jnp.full(3, 8.0), flags, flags,
      ...                       discount=0.5, n=2).tolist()
      [3.5, 3.5, 5.0]
    """
    n = check_int("n", n)
    rewards, next_values, terminated, truncated = _time_major(
        rewards=rewards, next_values=next_values, terminated=terminated, truncated=truncated
    )
    discount = _coefficient("discount", discount, rewards)
    live = discount * (1 - terminated.astype(rewards.dtype))
    carry = _carries(terminated, truncated, rewards.dtype)
    one_step = rewards + live * next_values

    def extend(_, returns: jax.Array) -> jax.Array:
        later = jnp.concatenate([returns[1:], returns[-1:]])  # the last is never carried
        return rewards + live * jnp.where(carry > 0, later, next_values)

    return lax.fori_loop(1, n, extend, one_step)


class _StepKeys(dict):
    """The keys every rollout step must have, and what each one holds (per environment).

    A step may hold more keys (observations, actions, log-probabilities); these
    are the ones GAE reads.

    Examples:
      >>> import jaxbuf
      >>> sorted(jaxbuf.rl.STEP_KEYS)
      ['final_value', 'reward', 'terminated', 'truncated', 'value']
      >>> jaxbuf.rl.STEP_KEYS["truncated"]
      'bool scalar: the episode was cut (time limit)'
    """


STEP_KEYS = _StepKeys(
    {
        "reward": "float scalar: the reward received after the step",
        "value": "float scalar: the value estimate of the observation the step was taken from",
        "terminated": "bool scalar: the episode ended in a terminal state",
        "truncated": "bool scalar: the episode was cut (time limit)",
        "final_value": "float scalar: the value of the final observation where truncated "
        "(read only where truncated is true)",
    }
)
