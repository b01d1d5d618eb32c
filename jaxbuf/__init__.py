"""jaxbuf: JAX-native experience buffers for reinforcement learning.

Buffers are pure functions over immutable `flax.struct` states: they run inside
jitted training steps, vmap across environments, take explicit PRNG keys and,
donated, update their storage in place. Every sampled kind (replay, trajectory,
transition, episode) takes a `sampler` (`uniform` or `prioritized`) and returns
one `Sample` record.
"""

from jaxbuf._access import take_all
from jaxbuf._blocks import Blocks, blocks
from jaxbuf._checkpoint import load_metadata, restore, save
from jaxbuf._config import buffer_from_config
from jaxbuf._dataset import DatasetWriter, dataset_to_state, read_dataset
from jaxbuf._episode import EpisodeRecords, make_episode_buffer
from jaxbuf._export import export, read_export, stored_items, to_torch
from jaxbuf._goals import Hindsight, hindsight
from jaxbuf._host_loop import HostLoop
from jaxbuf._memory import MemoryReport, memory
from jaxbuf._mix import mix
from jaxbuf._prefill import Environment, gymnax_env, prefill
from jaxbuf._queue import Queue, QueueState, make_queue
from jaxbuf._rate_limit import RateLimiter, RateLimiterState, sample_to_insert_ratio
from jaxbuf._replay import from_data, make_replay_buffer
from jaxbuf._returns import discounted_returns, gae, lambda_returns, n_step_returns
from jaxbuf._rollout import (
    STEP_KEYS,
    RolloutBatch,
    RolloutBuffer,
    RolloutBufferState,
    make_rollout_buffer,
)
from jaxbuf._samplers import EpochState, PriorityState, Sampler, epochs, prioritized, uniform
from jaxbuf._sharding import per_shard, shard
from jaxbuf._spaces import example_from_space
from jaxbuf._storage import RingState, TimeRingState
from jaxbuf._trajectory import make_trajectory_buffer
from jaxbuf._transition import FinalObservations, make_transition_buffer
from jaxbuf._types import (
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
from jaxbuf._types import (
    PyTree as PyTree,
)
from jaxbuf._vault import read_vault, vault_to_state
from jaxbuf._vectorize import vectorize
from jaxbuf._version import __version__ as __version__

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
