"""jaxbuf: JAX-native experience buffers for reinforcement learning.

Buffers are pure functions over immutable `flax.struct` states: they run inside
jitted training steps, vmap across environments, take explicit PRNG keys and,
donated, update their storage in place. Every sampled kind (replay, trajectory,
transition, episode) takes a `sampler` (`uniform` or `prioritized`) and returns
one `Sample` record.

Public names are imported on first use (PEP 562): a process that needs one corner of
the library, such as an actor's `jaxbuf.ray.Writer`, does not import JAX, Flax and
every buffer kind.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import TYPE_CHECKING, Any

from jaxbuf._version import __version__ as __version__

if TYPE_CHECKING:
    from jaxbuf.core.footprint import MemoryReport, memory
    from jaxbuf.core.records import (
        AddFn,
        Buffer,
        BufferLike,
        CanSampleFn,
        Config,
        InitFn,
        Sample,
        SampleFn,
        Transition,
    )
    from jaxbuf.core.records import (
        PyTree as PyTree,
    )
    from jaxbuf.core.samplers import (
        EpochState,
        PriorityState,
        Sampler,
        epochs,
        prioritized,
        uniform,
    )
    from jaxbuf.core.storage import RingState, TimeRingState
    from jaxbuf.io.access import take_all
    from jaxbuf.io.checkpoint import load_metadata, restore, save
    from jaxbuf.io.config import buffer_from_config
    from jaxbuf.io.dataset import DatasetWriter, dataset_to_state, read_dataset
    from jaxbuf.io.export import export, read_export, stored_items, to_torch
    from jaxbuf.io.vault import read_vault, vault_to_state
    from jaxbuf.kinds.episode import EpisodeRecords, make_episode_buffer
    from jaxbuf.kinds.queue import Queue, QueueState, make_queue
    from jaxbuf.kinds.replay import from_data, make_replay_buffer
    from jaxbuf.kinds.rollout import (
        STEP_KEYS,
        RolloutBatch,
        RolloutBuffer,
        RolloutBufferState,
        make_rollout_buffer,
    )
    from jaxbuf.kinds.trajectory import make_trajectory_buffer
    from jaxbuf.kinds.transition import FinalObservations, make_transition_buffer
    from jaxbuf.loop.host_loop import HostLoop
    from jaxbuf.options.goals import Hindsight, hindsight
    from jaxbuf.rl.prefill import Environment, gymnax_env, prefill
    from jaxbuf.rl.rate_limit import (
        RateLimiter,
        RateLimiterState,
        batches_allowed,
        sample_to_insert_ratio,
    )
    from jaxbuf.rl.returns import discounted_returns, gae, lambda_returns, n_step_returns
    from jaxbuf.rl.spaces import example_from_space
    from jaxbuf.transforms.blocks import Blocks, blocks
    from jaxbuf.transforms.mix import mix
    from jaxbuf.transforms.sharding import per_shard, shard
    from jaxbuf.transforms.vectorize import vectorize

# Each public name and the module that defines it.
_HOMES: dict[str, str] = {
    "MemoryReport": "jaxbuf.core.footprint",
    "memory": "jaxbuf.core.footprint",
    "AddFn": "jaxbuf.core.records",
    "Buffer": "jaxbuf.core.records",
    "BufferLike": "jaxbuf.core.records",
    "CanSampleFn": "jaxbuf.core.records",
    "Config": "jaxbuf.core.records",
    "InitFn": "jaxbuf.core.records",
    "Sample": "jaxbuf.core.records",
    "SampleFn": "jaxbuf.core.records",
    "Transition": "jaxbuf.core.records",
    "PyTree": "jaxbuf.core.records",
    "EpochState": "jaxbuf.core.samplers",
    "PriorityState": "jaxbuf.core.samplers",
    "Sampler": "jaxbuf.core.samplers",
    "epochs": "jaxbuf.core.samplers",
    "prioritized": "jaxbuf.core.samplers",
    "uniform": "jaxbuf.core.samplers",
    "RingState": "jaxbuf.core.storage",
    "TimeRingState": "jaxbuf.core.storage",
    "take_all": "jaxbuf.io.access",
    "load_metadata": "jaxbuf.io.checkpoint",
    "restore": "jaxbuf.io.checkpoint",
    "save": "jaxbuf.io.checkpoint",
    "buffer_from_config": "jaxbuf.io.config",
    "DatasetWriter": "jaxbuf.io.dataset",
    "dataset_to_state": "jaxbuf.io.dataset",
    "read_dataset": "jaxbuf.io.dataset",
    "export": "jaxbuf.io.export",
    "read_export": "jaxbuf.io.export",
    "stored_items": "jaxbuf.io.export",
    "to_torch": "jaxbuf.io.export",
    "read_vault": "jaxbuf.io.vault",
    "vault_to_state": "jaxbuf.io.vault",
    "EpisodeRecords": "jaxbuf.kinds.episode",
    "make_episode_buffer": "jaxbuf.kinds.episode",
    "Queue": "jaxbuf.kinds.queue",
    "QueueState": "jaxbuf.kinds.queue",
    "make_queue": "jaxbuf.kinds.queue",
    "from_data": "jaxbuf.kinds.replay",
    "make_replay_buffer": "jaxbuf.kinds.replay",
    "STEP_KEYS": "jaxbuf.kinds.rollout",
    "RolloutBatch": "jaxbuf.kinds.rollout",
    "RolloutBuffer": "jaxbuf.kinds.rollout",
    "RolloutBufferState": "jaxbuf.kinds.rollout",
    "make_rollout_buffer": "jaxbuf.kinds.rollout",
    "make_trajectory_buffer": "jaxbuf.kinds.trajectory",
    "FinalObservations": "jaxbuf.kinds.transition",
    "make_transition_buffer": "jaxbuf.kinds.transition",
    "HostLoop": "jaxbuf.loop.host_loop",
    "Hindsight": "jaxbuf.options.goals",
    "hindsight": "jaxbuf.options.goals",
    "Environment": "jaxbuf.rl.prefill",
    "gymnax_env": "jaxbuf.rl.prefill",
    "prefill": "jaxbuf.rl.prefill",
    "RateLimiter": "jaxbuf.rl.rate_limit",
    "RateLimiterState": "jaxbuf.rl.rate_limit",
    "batches_allowed": "jaxbuf.rl.rate_limit",
    "sample_to_insert_ratio": "jaxbuf.rl.rate_limit",
    "discounted_returns": "jaxbuf.rl.returns",
    "gae": "jaxbuf.rl.returns",
    "lambda_returns": "jaxbuf.rl.returns",
    "n_step_returns": "jaxbuf.rl.returns",
    "example_from_space": "jaxbuf.rl.spaces",
    "Blocks": "jaxbuf.transforms.blocks",
    "blocks": "jaxbuf.transforms.blocks",
    "mix": "jaxbuf.transforms.mix",
    "per_shard": "jaxbuf.transforms.sharding",
    "shard": "jaxbuf.transforms.sharding",
    "vectorize": "jaxbuf.transforms.vectorize",
}


def __getattr__(name: str) -> Any:
    """A public name (imported from its module on first use), or a subpackage."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"jaxbuf.{name}") is not None:
        return _with_modules(importlib.import_module(f"jaxbuf.{name}"))
    raise AttributeError(f"module 'jaxbuf' has no attribute {name!r}")


def _with_modules(package: Any) -> Any:
    """A subpackage reached as an attribute (`jaxbuf.kinds.trajectory`), with each of its
    modules imported, as an import of the whole library left it."""
    for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return package


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
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
