"""The types of jaxbuf's API: function protocols, states, and the records of one kind.

What a signature or an `isinstance` names, rarely what a training script calls: the
function types of a buffer record (`InitFn`, `AddFn`, `SampleFn`, `CanSampleFn`,
`BufferLike`), a buffer's `Config`, the states of storage, samplers, the queue, the
rollout buffer and the rate limiter, and the records that one kind or option returns.
Each is imported on first use; the `if TYPE_CHECKING:` imports are the list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxbuf import _public

if TYPE_CHECKING:
    from jaxbuf.core.contracts import Sampler as Sampler
    from jaxbuf.core.footprint import MemoryReport as MemoryReport
    from jaxbuf.core.records import AddFn as AddFn
    from jaxbuf.core.records import BufferLike as BufferLike
    from jaxbuf.core.records import CanSampleFn as CanSampleFn
    from jaxbuf.core.records import Config as Config
    from jaxbuf.core.records import InitFn as InitFn
    from jaxbuf.core.records import SampleFn as SampleFn
    from jaxbuf.core.samplers import EpochState as EpochState
    from jaxbuf.core.samplers import PriorityState as PriorityState
    from jaxbuf.core.storage import RingState as RingState
    from jaxbuf.core.storage import TimeRingState as TimeRingState
    from jaxbuf.kinds.episode import EpisodeRecords as EpisodeRecords
    from jaxbuf.kinds.queue import Queue as Queue
    from jaxbuf.kinds.queue import QueueState as QueueState
    from jaxbuf.kinds.rollout import RolloutBatch as RolloutBatch
    from jaxbuf.kinds.rollout import RolloutBuffer as RolloutBuffer
    from jaxbuf.kinds.rollout import RolloutBufferState as RolloutBufferState
    from jaxbuf.kinds.transition import FinalObservations as FinalObservations
    from jaxbuf.options.goals import Hindsight as Hindsight
    from jaxbuf.rl.rate_limit import RateLimiterState as RateLimiterState
    from jaxbuf.transforms.blocks import Blocks as Blocks

__getattr__, __dir__, __all__ = _public.attach(__name__, __file__)
