"""On-policy rollout storage: `[num_steps, num_envs]` steps, GAE, shuffled minibatches."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from jaxbuf.core import assembly as _assembly
from jaxbuf.core import footprint as _footprint
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import Config, PyTree, _Record
from jaxbuf.rl import returns as _returns
from jaxbuf.rl.returns import STEP_KEYS


class RolloutBufferState(struct.PyTreeNode):
    """State of a rollout buffer.

    Attributes:
      experience: the stored steps, a dict with leaves `[num_steps, num_envs, ...]`.
      size: int32 scalar, the number of stored time steps (at most `num_steps`).
      dropped: int32 scalar, the number of `add` calls made while full, whose
        steps were not stored (saturating at 2**31 - 1).
      advantages: float `[num_steps, num_envs]`, set by `finish` (0 beyond `size`).
      returns: float `[num_steps, num_envs]`, set by `finish` (0 beyond `size`).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_rollout_buffer(4, 2, discount=0.99, gae_lambda=0.95)
      >>> step = {"obs": jnp.zeros(3), "reward": 0.0, "value": 0.0, "final_value": 0.0,
      ...     "terminated": False, "truncated": False}
      >>> state = buffer.init(step)
      >>> state.experience["obs"].shape, state.advantages.shape, int(state.size)
      ((4, 2, 3), (4, 2), 0)
    """

    experience: PyTree
    size: jax.Array
    dropped: jax.Array
    advantages: jax.Array
    returns: jax.Array

    def stored_rows(self) -> tuple[dict, tuple[np.ndarray, np.ndarray], PyTree]:
        """On the host: `(labels, index, tree)`, the stored steps time-major,
        labelled with `time`, `env`, and their `advantage` and `return`."""
        num_envs = self.advantages.shape[1]
        time, env = np.divmod(np.arange(int(self.size) * num_envs, dtype=np.int32), num_envs)
        advantage, returns = np.asarray(self.advantages), np.asarray(self.returns)
        labels = {"time": time, "env": env, "advantage": advantage[time, env]}
        return labels | {"return": returns[time, env]}, (time, env), self.experience


class RolloutBatch(struct.PyTreeNode):
    """Shuffled minibatches of a finished rollout.

    Attributes:
      experience: the steps, leaves `[num_minibatches, batch, ...]`.
      advantages: `[num_minibatches, batch]`, normalized if the buffer says so.
      returns: `[num_minibatches, batch]`, the value targets.
      valid: bool `[num_minibatches, batch]`, false for slots beyond `size` (all
        true for a full rollout).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_rollout_buffer(2, 1, discount=0.5, gae_lambda=1.0)
      >>> step = {"obs": jnp.zeros(1), "reward": 1.0, "value": 0.0, "final_value": 0.0,
      ...     "terminated": False, "truncated": False}
      >>> state = buffer.init(step)
      >>> one = jax.tree.map(lambda x: jnp.asarray(x)[None], step)
      >>> state = buffer.add(buffer.add(state, one), one)
      >>> state = buffer.finish(state, last_value=jnp.zeros(1))
      >>> batch = buffer.minibatches(state, jax.random.key(0), num_minibatches=1)
      >>> batch.experience["obs"].shape, sorted(batch.returns[0].tolist())
      ((1, 2, 1), [1.0, 1.5])
    """

    experience: PyTree
    advantages: jax.Array
    returns: jax.Array
    valid: jax.Array


@dataclasses.dataclass(frozen=True)
class RolloutBuffer(_Record):
    """The pure functions of a rollout buffer (see `make_rollout_buffer`), and its
    configuration.

    Examples:
      >>> import dataclasses, jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_rollout_buffer(num_steps=4, num_envs=2, discount=0.99,
      ...     gae_lambda=0.95)
      >>> [field.name for field in dataclasses.fields(buffer)]
      ['init', 'add', 'finish', 'minibatches', 'clear', 'config']
    """

    init: Callable[..., Any]
    add: Callable[..., Any]
    finish: Callable[..., Any]
    minibatches: Callable[..., Any]
    clear: Callable[..., Any]
    config: Config


def _check_example(example: Any) -> PyTree:
    if not isinstance(example, Mapping):
        raise TypeError(f"example_step must be a dict with the keys {list(STEP_KEYS)}.")
    missing = [key for key in STEP_KEYS if key not in example]
    if missing:
        raise ValueError(f"example_step lacks {missing}; every step needs {STEP_KEYS}.")
    spec = _validation.item_spec(example, "example_step")
    for key in STEP_KEYS:
        want_bool = key in ("terminated", "truncated")
        leaf = spec[key]
        ok = leaf.dtype == jnp.bool_ if want_bool else jnp.issubdtype(leaf.dtype, jnp.floating)
        if leaf.shape != () or not ok:
            kind = "bool" if want_bool else "float"
            raise TypeError(
                f"example_step[{key!r}] must be a {kind} scalar (one environment's "
                f"{key}), got shape {leaf.shape} and dtype {leaf.dtype}."
            )
    if (
        spec["reward"].dtype != spec["value"].dtype
        or spec["value"].dtype != spec["final_value"].dtype
    ):
        raise TypeError("example_step's reward, value and final_value must share one float dtype.")
    return spec


def make_rollout_buffer(
    num_steps: int,
    num_envs: int,
    *,
    discount: float,
    gae_lambda: float,
    normalize_advantages: bool = True,
    method: str = "auto",
) -> RolloutBuffer:
    """Makes an on-policy rollout buffer (PPO): store steps, compute GAE, minibatch.

    A step is a dict holding, per environment, at least the keys of `STEP_KEYS`:
    `reward`, `value`, `terminated`, `truncated` and `final_value` (the value of
    the true final observation of a truncated episode), plus anything else
    (observation, action, log-probability). A rollout holds `num_steps` steps;
    an `add` to a full rollout stores nothing and counts the step in
    `state.dropped`. `finish` bootstraps the last stored step from `last_value`
    (unless that step ended its episode). `clear` starts the next rollout.

    Args:
      num_steps: time steps per rollout.
      num_envs: environments stepped together.
      discount: `gamma` of GAE.
      gae_lambda: `lambda` of GAE.
      normalize_advantages: whether `minibatches` rescales the advantages to
        zero mean and unit standard deviation over the whole rollout.
      method: `"auto"` (scan on CPU, associative scan on accelerators),
        `"scan"` or `"associative"`, as for `jaxbuf.gae`.

    Returns:
      A `RolloutBuffer` of pure functions `init(example_step)`, `add(state, step)`
      with leaves `[num_envs, ...]`, `finish(state, last_value)` with
      `last_value` `[num_envs]`, `minibatches(state, key, num_minibatches)` and
      `clear(state)`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_rollout_buffer(4, 2, discount=0.99, gae_lambda=0.95)
      >>> step = {"obs": jnp.zeros(3), "reward": 0.0, "value": 0.0, "final_value": 0.0,
      ...         "terminated": False, "truncated": False}
      >>> state = buffer.init(step)
      >>> for _ in range(4):
      ...     state = buffer.add(state, jax.tree.map(lambda x: jnp.stack([x, x]), step))
      >>> state = buffer.finish(state, last_value=jnp.zeros(2))
      >>> batch = buffer.minibatches(state, jax.random.key(0), num_minibatches=2)
      >>> batch.experience["obs"].shape, batch.advantages.shape
      ((2, 4, 3), (2, 4))
    """
    config = Config(
        kind="rollout",
        num_steps=_validation.check_int("num_steps", num_steps),
        num_envs=_validation.check_int("num_envs", num_envs),
        discount=_validation.check_fraction("discount", discount),
        gae_lambda=_validation.check_fraction("gae_lambda", gae_lambda),
        normalize_advantages=_validation.check_bool("normalize_advantages", normalize_advantages),
        method=_returns.check_method(method),
    )
    if config.num_steps * config.num_envs > _validation.MAX_INT32:
        raise ValueError("num_steps * num_envs must fit in int32.")
    functions = (init, add, finish, minibatches, clear)
    return RolloutBuffer(*(_assembly.bind(fn, config) for fn in functions), config=config)


def init(config: Config, example_step: PyTree) -> RolloutBufferState:
    """An empty rollout for steps like `example_step` (one environment's step, a dict
    with the keys of `STEP_KEYS`, no batch axes): leaves `[num_steps, num_envs, ...]`."""
    spec = _check_example(example_step)
    per_env = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct((config.num_envs, *s.shape), s.dtype), spec
    )
    shape, dtype = (config.num_steps, config.num_envs), spec["value"].dtype

    def allocate() -> RolloutBufferState:
        return RolloutBufferState(
            experience=_storage.allocate(per_env, config.num_steps),
            size=jnp.zeros((), jnp.int32),
            dropped=jnp.zeros((), jnp.int32),
            advantages=jnp.zeros(shape, dtype),
            returns=jnp.zeros(shape, dtype),
        )

    _footprint.refuse_unfit(allocate, spec)
    return allocate()


def add(config: Config, state: RolloutBufferState, step: PyTree) -> RolloutBufferState:
    """Stores one step (leaves `[num_envs, ...]`) at time `size`; a full rollout stores
    nothing and counts the call in `dropped`."""
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype), state.experience)
    _validation.check_batch(spec, step, [("num_envs", config.num_envs)], what="step")
    full = state.size >= config.num_steps
    row = jnp.minimum(state.size, config.num_steps - 1)

    def put(column: jax.Array, value: jax.Array) -> jax.Array:
        old = lax.dynamic_index_in_dim(column, row, keepdims=False)
        return lax.dynamic_update_index_in_dim(column, jnp.where(full, old, value), row, 0)

    return state.replace(
        experience=jax.tree.map(put, state.experience, step),
        size=state.size + (~full).astype(jnp.int32),
        dropped=_validation.count_up(state.dropped, full.astype(jnp.int32)),
    )


def finish(config: Config, state: RolloutBufferState, last_value: jax.Array) -> RolloutBufferState:
    """Computes GAE advantages and returns `[num_steps, num_envs]` of the stored steps,
    bootstrapping the last one from `last_value` `[num_envs]` (unless it ended its
    episode) and every truncated step from its `final_value`."""
    steps = state.experience
    want = jax.ShapeDtypeStruct((config.num_envs,), steps["value"].dtype)
    _validation.check_batch(want, last_value, [], what="last_value")
    time = jnp.arange(config.num_steps, dtype=jnp.int32)[:, None]
    stored, last = time < state.size, time >= state.size - 1
    following = jnp.concatenate([steps["value"][1:], last_value[None]])
    following = jnp.where(last, last_value[None], following)
    next_values = jnp.where(steps["truncated"], steps["final_value"], following)
    advantages, returns = _returns.gae(
        steps["reward"], steps["value"], next_values,
        steps["terminated"], steps["truncated"] | last,
        discount=config.discount, gae_lambda=config.gae_lambda, method=config.method,
    )  # fmt: skip
    return state.replace(
        advantages=jnp.where(stored, advantages, 0), returns=jnp.where(stored, returns, 0)
    )


def _normalized(advantages: jax.Array, valid: jax.Array) -> jax.Array:
    """Zero mean and unit standard deviation over the valid entries; 0 elsewhere.

    Computed in at least float32 and cast back, so that float16 advantages
    neither overflow the variance nor lose the epsilon (1e-8).
    """
    wide = advantages.astype(jnp.float32 if advantages.dtype.itemsize < 4 else advantages.dtype)
    count = jnp.maximum(valid.sum(), 1).astype(wide.dtype)
    mean = jnp.where(valid, wide, 0).sum() / count
    var = jnp.where(valid, (wide - mean) ** 2, 0).sum() / count
    normalized = jnp.where(valid, (wide - mean) / (jnp.sqrt(var) + 1e-8), 0)
    return normalized.astype(advantages.dtype)


def minibatches(
    config: Config, state: RolloutBufferState, key: jax.Array, num_minibatches: int
) -> RolloutBatch:
    """The finished rollout, shuffled and split into `num_minibatches` minibatches
    (`RolloutBatch`, leaves `[num_minibatches, num_steps * num_envs //
    num_minibatches, ...]`); `num_minibatches` is static."""
    num_minibatches = _validation.check_int("num_minibatches", num_minibatches)
    total = config.num_steps * config.num_envs
    if total % num_minibatches:
        raise ValueError(
            f"num_steps * num_envs = {config.num_steps} * {config.num_envs} = {total} is not "
            f"divisible by num_minibatches={num_minibatches}."
        )
    shape = (config.num_steps, config.num_envs)
    valid = jnp.broadcast_to(jnp.arange(config.num_steps)[:, None] < state.size, shape)
    advantages = state.advantages
    if config.normalize_advantages:
        advantages = _normalized(advantages, valid)
    order = jax.random.permutation(key, total)
    split = (num_minibatches, total // num_minibatches)

    def shuffle(x: jax.Array) -> jax.Array:
        return x.reshape(total, *x.shape[2:])[order].reshape(*split, *x.shape[2:])

    return RolloutBatch(
        experience=jax.tree.map(shuffle, state.experience),
        advantages=shuffle(advantages),
        returns=shuffle(state.returns),
        valid=shuffle(valid),
    )


def clear(config: Config, state: RolloutBufferState) -> RolloutBufferState:
    """Starts the next rollout: `size` and `dropped` (int32 scalars) go to 0; the
    storage `[num_steps, num_envs, ...]` is kept and overwritten by the next adds."""
    return state.replace(size=jnp.zeros((), jnp.int32), dropped=jnp.zeros((), jnp.int32))
