"""jaxbuf: JAX-native experience buffers for reinforcement learning.

Buffers are pure functions over immutable `flax.struct` states: they run inside
jitted training steps, vmap across environments, take explicit PRNG keys and,
donated, update their storage in place.
"""

from jaxbuf._access import take, take_all
from jaxbuf._base import AddFn, CanSampleFn, InitFn, SampleFn
from jaxbuf._checkpoint import load_metadata, restore, save
from jaxbuf._config import buffer_from_config
from jaxbuf._dataset import DatasetWriter, dataset_to_state, read_dataset
from jaxbuf._episode import (
    EpisodeBuffer,
    EpisodeBufferConfig,
    EpisodeBufferState,
    EpisodeSample,
    make_episode_buffer,
)
from jaxbuf._export import export, stored_items, to_torch
from jaxbuf._mix import MixedSample, mix
from jaxbuf._prioritized import (
    PrioritizedReplayBuffer,
    PrioritizedReplayBufferConfig,
    PrioritizedReplayBufferState,
    PrioritizedSample,
    make_prioritized_replay_buffer,
)
from jaxbuf._prioritized_steps import (
    PrioritizedNStepSample,
    PrioritizedSequenceSample,
    PrioritizedTrajectoryBuffer,
    PrioritizedTrajectoryBufferConfig,
    PrioritizedTrajectoryBufferState,
    PrioritizedTransitionBufferConfig,
    make_prioritized_trajectory_buffer,
    make_prioritized_transition_buffer,
)
from jaxbuf._priority import PriorityState
from jaxbuf._queue import Queue, QueueConfig, QueueSample, QueueState, make_queue
from jaxbuf._replay import (
    ReplayBuffer,
    ReplayBufferConfig,
    ReplayBufferState,
    ReplaySample,
    from_data,
    make_replay_buffer,
)
from jaxbuf._returns import discounted_returns, gae, lambda_returns, n_step_returns
from jaxbuf._rollout import (
    STEP_KEYS,
    RolloutBatch,
    RolloutBuffer,
    RolloutBufferConfig,
    RolloutBufferState,
    make_rollout_buffer,
)
from jaxbuf._sharding import per_shard, shard
from jaxbuf._spaces import example_from_space
from jaxbuf._trajectory import (
    SequenceSample,
    TrajectoryBuffer,
    TrajectoryBufferConfig,
    TrajectoryBufferState,
    make_trajectory_buffer,
)
from jaxbuf._transition import (
    NStepSample,
    Transition,
    TransitionBuffer,
    TransitionBufferConfig,
    TransitionBufferState,
    make_transition_buffer,
)
from jaxbuf._vectorize import VectorizedReplayBuffer, VectorizedSample, vectorize
from jaxbuf._version import __version__ as __version__

__all__ = [
    "STEP_KEYS",
    "AddFn",
    "CanSampleFn",
    "DatasetWriter",
    "EpisodeBuffer",
    "EpisodeBufferConfig",
    "EpisodeBufferState",
    "EpisodeSample",
    "InitFn",
    "MixedSample",
    "NStepSample",
    "PrioritizedNStepSample",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferConfig",
    "PrioritizedReplayBufferState",
    "PrioritizedSample",
    "PrioritizedSequenceSample",
    "PrioritizedTrajectoryBuffer",
    "PrioritizedTrajectoryBufferConfig",
    "PrioritizedTrajectoryBufferState",
    "PrioritizedTransitionBufferConfig",
    "PriorityState",
    "Queue",
    "QueueConfig",
    "QueueSample",
    "QueueState",
    "ReplayBuffer",
    "ReplayBufferConfig",
    "ReplayBufferState",
    "ReplaySample",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutBufferConfig",
    "RolloutBufferState",
    "SampleFn",
    "SequenceSample",
    "TrajectoryBuffer",
    "TrajectoryBufferConfig",
    "TrajectoryBufferState",
    "Transition",
    "TransitionBuffer",
    "TransitionBufferConfig",
    "TransitionBufferState",
    "VectorizedReplayBuffer",
    "VectorizedSample",
    "buffer_from_config",
    "dataset_to_state",
    "discounted_returns",
    "example_from_space",
    "export",
    "from_data",
    "gae",
    "lambda_returns",
    "load_metadata",
    "make_episode_buffer",
    "make_prioritized_replay_buffer",
    "make_prioritized_trajectory_buffer",
    "make_prioritized_transition_buffer",
    "make_queue",
    "make_replay_buffer",
    "make_rollout_buffer",
    "make_trajectory_buffer",
    "make_transition_buffer",
    "mix",
    "n_step_returns",
    "per_shard",
    "read_dataset",
    "restore",
    "save",
    "shard",
    "stored_items",
    "take",
    "take_all",
    "to_torch",
    "vectorize",
]
