"""Brax's replay-buffer interface over jaxbuf storage, for Brax's and MuJoCo Playground's SAC.

Brax's `sac.train` builds a `UniformSamplingQueue`: every transition flattened
into one float32 row, `next_observation` stored beside `observation`, and, once
full, the whole buffer rolled at every insert (O(capacity)). `BraxReplay` has
the same interface (`init(key)`, `insert`, `sample -> (state, batch)`, `size`,
`insert_internal`, `sample_internal`, the `check_can_*` hooks that Brax's
`PmapWrapper` calls) over per-environment time rings:

- **observations stored once.** Brax's actor step gives, per environment,
  `next_observation[t] == observation[t + 1]`: its auto-reset wrapper puts the
  reset observation in both. So row `t` of an environment's ring holds
  everything but `next_observation`, which a sample reads from row `t + 1`
  (for the newest step, from the one `next_observation` kept per environment).
  Should a wrapper break that equality, `state.mismatched` counts the steps
  whose stored next observation differs from the one given.
- **each leaf in its own dtype** (uint8 pixels stay uint8), checked at every
  insert like any jaxbuf `add`, naming the leaf.
- **no O(capacity) work**: a full ring overwrites its oldest step in place.

Sampling is Brax's: `sample_batch_size` transitions drawn uniformly with
replacement among all stored ones, the newest included, with the key kept in
the state. Memory per stored transition: one step without `next_observation`.

`use_in_brax(num_envs=...)` hands it to `sac.train`, which builds its buffer
inside the function (it takes no buffer argument): within the `with` block,
`brax.training.replay_buffers.UniformSamplingQueue` is this class.

Examples:
  >>> import jax, jax.numpy as jnp, jaxbuf.brax
  >>> from typing import NamedTuple
  >>> class Transition(NamedTuple):  # Brax's brax.training.types.Transition
  ...     observation: jax.Array
  ...     action: jax.Array
  ...     reward: jax.Array
  ...     discount: jax.Array
  ...     next_observation: jax.Array
  ...     extras: dict = ()
  >>> dummy = Transition(jnp.zeros(3), jnp.zeros(2), 0.0, 0.0, jnp.zeros(3),
  ...                    {"state_extras": {"truncation": 0.0}, "policy_extras": {}})
  >>> replay = jaxbuf.brax.BraxReplay(1000, dummy, 8, num_envs=4)
  >>> state = replay.init(jax.random.key(0))
  >>> step = jax.tree.map(lambda x: jnp.ones((4, *jnp.shape(x)), jnp.float32), dummy)
  >>> state = replay.insert(state, step)
  >>> state, batch = replay.sample(state)
  >>> batch.next_observation.shape, int(replay.size(state)), replay.capacity_per_env
  ((8, 3), 4, 250)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf.core import draws as _draws
from jaxbuf.core import footprint as _footprint
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import PyTree
from jaxbuf.core.storage import TimeRingState
from jaxbuf.options import precision as _precision

__all__ = ["BraxReplay", "BraxReplayState", "BufferReport", "use_in_brax"]

NEXT = "next_observation"


class BraxReplayState(struct.PyTreeNode):
    """A `BraxReplay`'s state.

    Attributes:
      steps: per-environment time rings of the transitions without
        `next_observation`, leaves `[num_envs, capacity_per_env, ...]`.
      next_observation: the newest step's `next_observation` per environment,
        leaves `[num_envs, *observation]`.
      key: the PRNG key sampling splits, as in Brax's queue.
      mismatched: int32, the stored steps whose next observation (the next
        step's observation) differed from the `next_observation` given; 0
        with Brax's auto-reset wrapper.
    """

    steps: TimeRingState
    next_observation: PyTree
    key: jax.Array
    mismatched: jax.Array


class BufferReport:
    """What the buffer that `sac.train` built inside a `use_in_brax(..., report=True)`
    block saw, read on the host while it trains: every `sample` (once per training
    step) sends its counters through a `jax.debug.callback`. Brax returns no
    buffer state, so this is how `mismatched` is read.

    Attributes:
      enabled: whether samples report (`use_in_brax`'s `report`).
      samples: the reports received (one per device per training step).
      mismatched: stored steps whose given `next_observation` differed from the
        next step's observation: 0 unless a wrapper broke the equality the buffer
        relies on (those steps then sample the stored next observation); None
        before the first training step.
      size: the transitions stored; None before the first training step.

    On several devices, `mismatched` and `size` sum the latest report of each.
    """

    def __init__(self, enabled: bool):
        self.enabled, self.samples = enabled, 0
        self._latest: dict[int, tuple[int, int]] = {}

    def record(self, mismatched: Any, size: Any) -> None:
        """Takes one device's counters (called from the compiled training step)."""
        self._latest[self.samples % jax.local_device_count()] = (int(mismatched), int(size))
        self.samples += 1

    @property
    def mismatched(self) -> int | None:
        return sum(m for m, _ in self._latest.values()) if self._latest else None

    @property
    def size(self) -> int | None:
        return sum(n for _, n in self._latest.values()) if self._latest else None

    def metrics(self) -> dict[str, int]:
        """`{"buffer/mismatched": ..., "buffer/size": ...}` to log beside Brax's own
        metrics in a `progress_fn`; empty before the first report."""
        if not self._latest:
            return {}
        mismatched, size = (sum(column) for column in zip(*self._latest.values(), strict=True))
        return {"buffer/mismatched": mismatched, "buffer/size": size}


class BraxReplay:
    """Brax's `UniformSamplingQueue` interface, observations stored once (see the
    module docstring).

    Args:
      max_replay_size: the transitions stored (per device, as Brax passes it);
        each environment's ring holds `ceil(max_replay_size / num_envs)` steps
        (per device), so at least as many are kept as Brax's queue keeps.
      dummy_data_sample: one unbatched Brax `Transition` (a NamedTuple with
        `observation` and `next_observation` of the same structure, shapes and
        dtypes), as `sac.train` builds it; Python scalars are float32/int32.
      sample_batch_size: transitions per `sample`.
      num_envs: the environments of every `insert` (all devices together, as
        given to `sac.train`); each of `jax.device_count()` devices holds
        `num_envs / devices`.
      storage_dtypes: `{"observation": "bfloat16"}`: float32 leaves stored in 2
        bytes and sampled as float32 (`observation` covers the next one); lossy
        and opt-in, as for `jaxbuf.make_replay_buffer`.
      report: a `BufferReport` that every `sample` updates on the host (a
        `jax.debug.callback`), or None.
    """

    def __init__(self, max_replay_size: int, dummy_data_sample: Any, sample_batch_size: int,
                 *, num_envs: int, storage_dtypes: Mapping[str, Any] | None = None,
                 report: BufferReport | None = None):  # fmt: skip
        self.report = report
        devices = jax.device_count()
        num_envs = _validation.check_int("num_envs", num_envs)
        if num_envs % devices:
            raise ValueError(f"num_envs={num_envs} must divide evenly over {devices} devices.")
        self.num_envs = num_envs // devices
        self.spec, self.template = _item_spec(dummy_data_sample)
        self.narrow = _precision.check_storage_dtypes(storage_dtypes)
        try:
            _precision.check_example(self.spec, self.narrow)
        except (TypeError, ValueError) as error:  # built by use_in_brax: say where to change
            if report is None:
                raise
            raise type(error)(f"use_in_brax(storage_dtypes={self.narrow}): {error}") from None
        self.stored_spec = _precision.spec(self.spec, self.narrow)
        size = _validation.check_int("max_replay_size", max_replay_size)
        self.capacity_per_env = math.ceil(size / self.num_envs)
        self.sample_batch_size = _validation.check_int("sample_batch_size", sample_batch_size)

    def init(self, key: jax.Array) -> BraxReplayState:
        """An empty state holding `key`; refused, before anything is allocated, if it
        cannot fit the device (`jaxbuf.memory`'s check)."""

        def allocate() -> BraxReplayState:
            experience = _storage.allocate(self.stored_spec, self.num_envs, self.capacity_per_env)
            pending = _storage.allocate(self.stored_spec["observation"], self.num_envs)
            return BraxReplayState(TimeRingState(experience=experience, **_storage.counters()),
                                   pending, key, jnp.zeros((), jnp.int32))  # fmt: skip

        _footprint.refuse_unfit(allocate, self.spec, lambda state: state.steps.experience)
        return allocate()

    def check_can_insert(self, buffer_state: Any, samples: Any, shards: int) -> None:
        """Brax's hook before an insert: nothing to check (a full ring overwrites)."""

    def check_can_sample(self, buffer_state: Any, shards: int) -> None:
        """Brax's hook before a sample: nothing to check (Brax prefills first)."""

    def insert(self, buffer_state: BraxReplayState, samples: Any) -> BraxReplayState:
        """Writes one step of every environment (leaves `[num_envs, ...]`)."""
        return self.insert_internal(buffer_state, samples)

    def sample(self, buffer_state: BraxReplayState) -> tuple[BraxReplayState, Any]:
        """`(state, batch)`: `sample_batch_size` transitions, uniformly with replacement."""
        return self.sample_internal(buffer_state)

    def insert_internal(self, buffer_state: BraxReplayState, samples: Any) -> BraxReplayState:
        """`insert`, as Brax's `PmapWrapper` calls it on each device."""
        stored, given_next = _split(samples, self.template)
        self._check_num_envs(stored)
        _validation.check_batch(self.spec, stored, [("num_envs", self.num_envs)], "samples")
        spec = self.spec["observation"]
        _validation.check_batch(spec, given_next, [("num_envs", self.num_envs)],
                                f"samples.{NEXT}")  # fmt: skip
        stored = _precision.store(stored, self.narrow)
        given_next = _precision.store({"observation": given_next}, self.narrow)["observation"]
        return _insert(buffer_state, stored, jax.tree.map(jnp.asarray, given_next))

    def sample_internal(self, buffer_state: BraxReplayState) -> tuple[BraxReplayState, Any]:
        """`sample`, as Brax's `PmapWrapper` calls it on each device."""
        key, now = jax.random.split(buffer_state.key)
        stored, following = _draw(buffer_state, now, self.sample_batch_size)
        stored = _precision.restore(stored, self.narrow)
        following = _precision.restore({"observation": following}, self.narrow)["observation"]
        if self.report is not None and self.report.enabled:
            jax.debug.callback(self.report.record, buffer_state.mismatched,
                               self.size(buffer_state))  # fmt: skip
        return buffer_state.replace(key=key), _join(stored, following, self.template)

    def _check_num_envs(self, stored: dict[str, Any]) -> None:
        """Names the value to change when the environments of an insert are not those
        `num_envs` promised (`use_in_brax`'s argument, which `sac.train` cannot see)."""
        given = jnp.shape(jax.tree.leaves(stored["observation"])[0])[:1]
        if self.report is None or given == (self.num_envs,):
            return
        devices = jax.device_count()
        raise ValueError(
            f"use_in_brax(num_envs={self.num_envs * devices}): but sac.train inserts "
            f"{given[0] if given else 'no'} environments per device ({devices} device(s)), "
            f"num_envs={given[0] * devices if given else '?'} in all: give use_in_brax the "
            "num_envs given to sac.train."
        )

    def size(self, buffer_state: BraxReplayState) -> jax.Array:
        """The transitions stored, all of them drawable (int32)."""
        return buffer_state.steps.size * self.num_envs

    def bytes_per_transition(self) -> int:
        """Bytes of storage per stored transition: one step without `next_observation`."""
        return sum(math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
                   for leaf in jax.tree.leaves(self.stored_spec))  # fmt: skip


@contextlib.contextmanager
def use_in_brax(*, num_envs: int, storage_dtypes: Mapping[str, Any] | None = None,
                report: bool = False) -> Iterator[BufferReport]:  # fmt: skip
    """Within the block, Brax's trainers build a `BraxReplay` where they build a
    `UniformSamplingQueue` (Brax's SAC and MuJoCo Playground's, which calls it).

    Args:
      num_envs: what you pass to `sac.train` as `num_envs` (checked against the
        device count here, against `sac.train`'s inserts when it traces them).
      storage_dtypes: see `BraxReplay` (`{"observation": "bfloat16"}` halves the
        observations' bytes); names checked here against Brax's `Transition`.
      report: whether every training step sends the buffer's counters to the
        host (a `jax.debug.callback` per step and device: a host round trip
        on a GPU, which is why it is opt-in).

    Yields:
      A `BufferReport`: `report.mismatched` and `report.metrics()` (for Brax's
      `progress_fn`) while `sac.train` runs and after.

    Examples:
      A Brax user changes two lines::

          import jaxbuf.brax
          with jaxbuf.brax.use_in_brax(num_envs=64):
              make_policy, params, metrics = sac.train(environment=env, num_envs=64, ...)
    """
    replay_buffers = _import_brax_replay_buffers()
    _check_use(num_envs, storage_dtypes, report)
    original = replay_buffers.UniformSamplingQueue
    seen = BufferReport(report)
    replay_buffers.UniformSamplingQueue = functools.partial(
        BraxReplay, num_envs=num_envs, storage_dtypes=storage_dtypes, report=seen
    )
    try:
        yield seen
    finally:
        replay_buffers.UniformSamplingQueue = original


# the fields of brax.training.types.Transition that storage_dtypes can name
BRAX_FIELDS = ("observation", "action", "reward", "discount", "extras")


def _check_use(num_envs: Any, storage_dtypes: Any, report: Any) -> None:
    """`use_in_brax`'s arguments, checked before Brax builds anything."""
    num_envs = _validation.check_int("num_envs", num_envs)
    if num_envs % jax.device_count():
        raise ValueError(
            f"use_in_brax(num_envs={num_envs}): sac.train splits num_envs over the "
            f"{jax.device_count()} devices, so it must be a multiple of {jax.device_count()}."
        )
    narrow = _precision.check_storage_dtypes(storage_dtypes)
    unknown = sorted(set(narrow) - set(BRAX_FIELDS))
    if unknown:
        covered = " (next_observation is stored with observation: name observation)"
        raise ValueError(
            f"use_in_brax(storage_dtypes=...) names {unknown}, which Brax's Transition does "
            f"not store; its fields: {list(BRAX_FIELDS)}"
            f"{covered if NEXT in unknown else ''}."
        )
    if not isinstance(report, bool):
        raise TypeError(f"use_in_brax(report=...) must be True or False, got {report!r}.")


def _import_brax_replay_buffers() -> Any:
    """Brax's `replay_buffers` module (an optional dependency: `jaxbuf[brax]`)."""
    try:
        return importlib.import_module("brax.training.replay_buffers")
    except ImportError:
        raise ImportError(
            'use_in_brax needs Brax: in a checkout of jaxbuf, pip install -e ".[brax]" (the '
            "extra bounds JAX below 0.10, which Brax 0.14 needs; see docs/coming_from_brax.md)."
        ) from None


def _item_spec(dummy: Any) -> tuple[dict[str, Any], Any]:
    """The spec of what is stored (every field but `next_observation`, Python scalars
    as float32/int32) and the Transition type's template."""
    fields = getattr(dummy, "_fields", ())
    if "observation" not in fields or NEXT not in fields:
        raise TypeError(
            "dummy_data_sample must be a Brax Transition (a NamedTuple with observation and "
            f"next_observation), got {type(dummy).__name__}."
        )
    stored = {name: getattr(dummy, name) for name in fields if name != NEXT}
    spec = _validation.item_spec(stored, "dummy_data_sample")  # Python floats: float32
    next_spec = _validation.item_spec(getattr(dummy, NEXT), f"dummy_data_sample.{NEXT}")
    if next_spec != spec["observation"]:
        raise ValueError(
            f"dummy_data_sample.{NEXT} must have observation's structure, shapes and dtypes "
            f"(it is stored once): got {next_spec} and {spec['observation']}."
        )
    return spec, dummy


def _split(samples: Any, template: Any) -> tuple[dict[str, Any], Any]:
    if type(samples) is not type(template):
        raise TypeError(
            f"samples must be a {type(template).__name__} like dummy_data_sample, got "
            f"{type(samples).__name__}."
        )
    stored = {name: getattr(samples, name) for name in samples._fields if name != NEXT}
    return stored, getattr(samples, NEXT)


def _join(stored: dict[str, Any], following: Any, template: Any) -> Any:
    return type(template)(**stored, **{NEXT: following})


def _insert(state: BraxReplayState, stored: PyTree, given_next: PyTree) -> BraxReplayState:
    """Appends one step per environment; counts a previous step whose given next
    observation differs from this step's observation."""
    differs = jax.tree.leaves(jax.tree.map(
        lambda a, b: jnp.any((a != b).reshape(a.shape[0], -1), axis=1),
        state.next_observation, stored["observation"]))  # fmt: skip
    differs = functools.reduce(jnp.logical_or, differs) & (state.steps.size > 0)
    mismatched = _validation.count_up(state.mismatched, jnp.sum(differs, dtype=jnp.int32))
    steps = _storage.append_steps(state.steps, jax.tree.map(lambda x: x[:, None], stored))
    return state.replace(steps=steps, next_observation=given_next, mismatched=mismatched)


def _draw(state: BraxReplayState, key: jax.Array, count: int) -> tuple[PyTree, PyTree]:
    """`count` stored steps drawn uniformly with replacement, and each one's next
    observation (the next row's, or the newest step's kept one)."""
    steps = state.steps
    num_envs, capacity = jax.tree.leaves(steps.experience)[0].shape[:2]
    size = steps.size
    draws = _draws.uniform_indices(key, size * num_envs, count)
    env, age = draws // jnp.maximum(size, 1), draws % jnp.maximum(size, 1)
    row = (steps.position - size + age) % capacity
    stored = _storage.read(steps.experience, env, row)
    newest = age == size - 1
    after = _storage.read(steps.experience["observation"], env, (row + 1) % capacity)
    kept = _storage.read(state.next_observation, env)

    def choose(a, b):
        return jnp.where(newest.reshape(-1, *[1] * (a.ndim - 1)), a, b)

    return stored, jax.tree.map(choose, kept, after)
