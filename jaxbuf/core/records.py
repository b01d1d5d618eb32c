"""The records every buffer shares: configuration, sample, transition, buffer, protocols.

A buffer is a record of pure functions plus its `config`, built by a `make_*`
factory that closes over the configuration (the optax pattern). Its state is a
`flax.struct` dataclass of arrays only. Each function signature is explained
once, by the protocols below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
from flax import struct

PyTree = Any


class Config(Mapping[str, Any]):
    """A buffer's validated configuration: a read-only mapping with attribute access.

    It holds the factory's arguments by name, plus `kind` (and, for sampled
    kinds, the `sampler`'s own configuration), in the form `buffer_from_config`
    takes: `buffer_from_config(dict(buffer.config))` builds the same buffer
    (but for a `done_fn`, which no file can hold; a `done_key` can).

    Examples:
      >>> import jaxbuf
      >>> config = jaxbuf.make_replay_buffer(100, 8).config
      >>> config.capacity, config["kind"], config.sampler.kind
      (100, 'replay', 'uniform')
    """

    def __init__(self, **fields: Any):
        object.__setattr__(self, "_fields", dict(fields))

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"this configuration has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a buffer configuration is read-only; make a new buffer instead.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._fields.items()) + ")"

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (JSON-ready where the values are)."""
        return {k: v.to_dict() if isinstance(v, Config) else v for k, v in self.items()}


class _Record:
    """Gives a frozen dataclass of functions the Flashbax/PureJaxRL `.replace` idiom."""

    def replace(self, **fields: Any) -> Any:
        """A copy with the given fields replaced, e.g. a jitted, donated `add`:
        `buffer.replace(add=jax.jit(buffer.add, donate_argnums=0))`."""
        return dataclasses.replace(self, **fields)  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True)
class Buffer(_Record):
    """The pure functions of a sampled buffer (replay, trajectory, transition, episode).

    Attributes:
      init: `init(example) -> state`, see `InitFn`.
      add: `add(state, data) -> state`, see `AddFn`.
      sample: `sample(state, key) -> Sample`, see `SampleFn`.
      can_sample: `can_sample(state) -> bool array`.
      take: `take(state, indices) -> experience`: what `sample` returned for those
        `indices` (for valid rows).
      config: the validated `Config`.
      add_step: `add_step(state, step)` with one step per environment (leaves
        `[num_envs, ...]`); None for a replay buffer.
      set_priorities: `set_priorities(state, indices, priorities) -> state`; None
        unless the sampler is `prioritized`.
      next_batch: `next_batch(state, key) -> (state, Sample)`, the next batch of
        the current pass; None unless the sampler is `epochs`.
      layout: the kind's storage, anchors and unit, its options applied, for
        transforms (`vectorize`).
      sampler: the `Sampler`, for transforms.
      options: the options it was built with (`jaxbuf.core.pipeline.Option`), for
        transforms to apply again to what they build.

    Examples:
      >>> import jax, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(capacity=100, sample_batch_size=8)
      >>> buffer = buffer.replace(add=jax.jit(buffer.add, donate_argnums=0))
      >>> type(buffer).__name__, buffer.set_priorities is None
      ('Buffer', True)
    """

    init: Callable[..., Any]
    add: Callable[..., Any]
    sample: Callable[..., Any]
    can_sample: Callable[..., Any]
    take: Callable[..., Any]
    config: Config
    add_step: Callable[..., Any] | None = None
    set_priorities: Callable[..., Any] | None = None
    next_batch: Callable[..., Any] | None = None
    layout: Any = dataclasses.field(default=None, repr=False)
    sampler: Any = dataclasses.field(default=None, repr=False)
    options: tuple = dataclasses.field(default=(), repr=False)


class Sample(struct.PyTreeNode):
    """What `sample` returns, for every sampled kind.

    Attributes:
      experience: what was stored, leaves `[B, ...]` (`B = sample_batch_size`):
        `[B, *item]` items of a replay buffer; `[B, L, *step]` windows of a
        trajectory buffer; `[B, max_length, *step]` padded episodes; a
        `Transition` of n-step transitions (its `reward` and `discount` are the
        n-step ones).
      indices: int32 `[B]`, where each item came from: a storage row (replay),
        `env * steps_per_env + time` of its first step (trajectory, transition), or
        `env * K + record` (episode). `take` and `set_priorities` accept them.
      valid: bool `[B]`, false where the item must not be learned from (the
        buffer below `min_size`, or a prioritized draw that found nothing).
      mask: bool `[B, L]`, the steps that belong to the item's episode (windows
        with a `done_fn`, padded episodes); else None.
      length: int32 `[B]`, the steps summed into an n-step transition, or an
        episode's full length; else None.
      probabilities: float32 `[B]`, the probability `P(i)` of each draw
        (prioritized sampler); else None.
      weights: float32 `[B]`, importance weights `(N P(i))**-beta / max_j (N
        P(j))**-beta`, at most 1, and 0 where `valid` is false (prioritized
        sampler); else None.
      source: int32 `[B]`, which buffer of a vectorized or mixed set each item
        came from; else None.
      goal_source: int32 `[B]` (transitions) or `[B, max_length]` (episode
        steps) with `goals=jaxbuf.hindsight(...)`: the step `env * steps_per_env +
        time` whose achieved goal became the desired goal, -1 where the goal was
        not relabeled; `take(state, indices, goal_source)` accepts it. Else None.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(100, 4)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((5, 3))})
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, batch.indices.shape, batch.weights is None
      ((4, 3), (4,), True)
    """

    experience: PyTree
    indices: jax.Array
    valid: jax.Array
    mask: jax.Array | None = None
    length: jax.Array | None = None
    probabilities: jax.Array | None = None
    weights: jax.Array | None = None
    source: jax.Array | None = None
    goal_source: jax.Array | None = None

    @property
    def relabeled(self) -> jax.Array | None:
        """bool, where the desired goal was relabeled (`goal_source >= 0`); None
        without goal relabeling."""
        return None if self.goal_source is None else self.goal_source >= 0


class Transition(struct.PyTreeNode):
    """One environment step, as a transition buffer takes it, and as it samples it.

    `add` takes leaves `[num_envs, T, ...]` (no `discount`); `sample` returns
    n-step transitions, leaves `[B, ...]`, whose learning target is
    `reward + discount * V(next_obs)`.

    Attributes:
      obs: the observation the action was chosen in (any pytree).
      action: the action taken (any pytree).
      reward: floating scalar per step; in a sample, the n-step reward
        `sum_{j<k} gamma**j r_j` over the `k <= n_step` steps up to and
        including the first episode end.
      terminated: bool per step: the episode reached a terminal state (no
        bootstrap); in a sample, whether the k-th step did.
      truncated: bool per step: the episode was cut short (bootstrap from
        `next_obs`); in a sample, whether the k-th step was.
      next_obs: the observation after the step. Where the episode ended it must
        be the FINAL observation (before any automatic reset: gymnax's
        `info["final_observation"]`, Gymnasium 1.x's `info["final_obs"]`);
        elsewhere it equals the next step's `obs` and is not stored.
      discount: None when added; in a sample, `gamma**k`, or 0 where the k-th
        step terminated.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> step = jaxbuf.Transition(obs=jnp.zeros(2), action=jnp.int32(0), reward=jnp.float32(0),
      ...     terminated=jnp.bool_(False), truncated=jnp.bool_(False), next_obs=jnp.zeros(2))
      >>> jax.tree.map(jnp.shape, step)
      Transition(obs=(2,), action=(), reward=(), terminated=(), truncated=(), next_obs=(2,),
      discount=None)
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: PyTree
    discount: jax.Array | None = None


@runtime_checkable
class BufferLike(Protocol):
    """What every jaxbuf buffer is (sampled kinds, vectorized and sharded ones, queue,
    rollout): a record of pure functions with `init`, `add` and `config`, and
    `.replace(**fields)` returning the same type.

    Examples:
      >>> import jaxbuf
      >>> buffers = [jaxbuf.make_replay_buffer(8, 2), jaxbuf.make_queue(8, 2, 2),
      ...            jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9)]
      >>> all(isinstance(b, jaxbuf.types.BufferLike) for b in buffers)
      True
    """

    @property
    def init(self) -> Callable[..., Any]: ...

    @property
    def add(self) -> Callable[..., Any]: ...

    @property
    def config(self) -> Config: ...

    def replace(self, **fields: Any) -> Any:
        """A copy with the given functions replaced (e.g. jitted and donated ones)."""
        ...


class InitFn(Protocol):
    """`init(example) -> state`: every buffer's `init`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> init: jaxbuf.types.InitFn = jaxbuf.make_replay_buffer(8, 2).init
      >>> init({"obs": jnp.zeros(3)}).experience["obs"].shape
      (8, 3)
    """

    def __call__(self, example: PyTree) -> Any:
        """Creates an empty state.

        Args:
          example: ONE item (or step), a pytree of arrays or scalars without batch
            axes. Only its structure, shapes and dtypes are used; storage is
            preallocated and zero-filled.

        Returns:
          The initial state.
        """


class AddFn(Protocol):
    """`add(state, data) -> state`: every buffer's `add`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> add: jaxbuf.types.AddFn = buffer.add
      >>> int(add(buffer.init(jnp.float32(0)), jnp.ones(3)).size)
      3
    """

    def __call__(self, state: Any, data: PyTree) -> Any:
        """Adds data and returns the new state.

        Args:
          state: the current state. Donate it (`jax.jit(add, donate_argnums=0)`) so
            the write happens in place.
          data: leaves `[B, *item]` for a replay buffer, `[num_envs, T, *step]` for
            the per-environment kinds, with the example's dtypes.

        Returns:
          The new state.
        """


class SampleFn(Protocol):
    """`sample(state, key) -> Sample`: every sampled buffer's `sample`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2)
      >>> sample: jaxbuf.types.SampleFn = buffer.sample
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.ones(3))
      >>> sample(state, jax.random.key(0)).experience.shape
      (2,)
    """

    def __call__(self, state: Any, key: jax.Array, **options: Any) -> Sample:
        """Draws a batch.

        Args:
          state: the buffer state.
          key: a PRNG key (typed `jax.random.key` or raw `jax.random.PRNGKey`).
          **options: the sampler's: `importance_exponent` (beta, default 0.4, may be
            traced) for `prioritized`.

        Returns:
          A `Sample` of `sample_batch_size` items.
        """
        ...


class CanSampleFn(Protocol):
    """`can_sample(state) -> bool array`: whether `sample` gives valid items.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_replay_buffer(8, 2, min_size=4)
      >>> can_sample: jaxbuf.types.CanSampleFn = buffer.can_sample
      >>> bool(can_sample(buffer.add(buffer.init(jnp.float32(0)), jnp.ones(3))))
      False
    """

    def __call__(self, state: Any) -> jax.Array:
        """Returns a bool scalar array."""
        ...
