"""jaxbuf: JAX-native experience buffers for reinforcement learning.

Buffers are pure functions over immutable `flax.struct` states: they run inside
jitted training steps, vmap across environments, take explicit PRNG keys and,
donated, update their storage in place. Every sampled kind (replay, trajectory,
transition, episode) takes a `sampler` (`uniform` or `prioritized`) and returns
one `Sample` record.
"""

from jaxbuf._version import __version__ as __version__
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
from jaxbuf.core.samplers import EpochState, PriorityState, Sampler, epochs, prioritized, uniform
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
