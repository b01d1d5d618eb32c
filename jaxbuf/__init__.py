"""jaxbuf: JAX-native experience buffers for reinforcement learning.

Buffers are pure functions over immutable `flax.struct` states: they run inside
jitted training steps, vmap across environments, take explicit PRNG keys and,
donated, update their storage in place. Every sampled kind (replay, trajectory,
transition, episode) takes a `sampler` (`uniform` or `prioritized`) and returns
one `Sample` record.

The top level holds what a training script calls: the factories, the samplers and
options, the records, checkpoints, `memory`, `HostLoop`, the transforms, the rate
limiter and `gae`. The rest lives in named submodules: `jaxbuf.types` (function types,
states, records of one kind), `jaxbuf.io` (states from data, datasets, Vaults, export,
configurations), `jaxbuf.rl` (returns), `jaxbuf.envs` (environments, spaces, prefill),
`jaxbuf.ray` (actors in other processes), `jaxbuf.brax`.

The `if TYPE_CHECKING:` imports below are the one list of the top level's names
(`jaxbuf._public` reads them): each is imported on first use (PEP 562), so a process
that needs one corner of the library, such as an actor's `jaxbuf.ray.Writer`, does not
import JAX, Flax and every buffer kind.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import TYPE_CHECKING, Any

from jaxbuf import _public
from jaxbuf._version import __version__ as __version__

if TYPE_CHECKING:
    from jaxbuf.core.footprint import memory as memory
    from jaxbuf.core.records import Buffer as Buffer
    from jaxbuf.core.records import Sample as Sample
    from jaxbuf.core.records import Transition as Transition
    from jaxbuf.core.samplers import epochs as epochs
    from jaxbuf.core.samplers import prioritized as prioritized
    from jaxbuf.core.samplers import uniform as uniform
    from jaxbuf.io.checkpoint import restore as restore
    from jaxbuf.io.checkpoint import save as save
    from jaxbuf.kinds.episode import make_episode_buffer as make_episode_buffer
    from jaxbuf.kinds.queue import make_queue as make_queue
    from jaxbuf.kinds.replay import make_replay_buffer as make_replay_buffer
    from jaxbuf.kinds.rollout import make_rollout_buffer as make_rollout_buffer
    from jaxbuf.kinds.trajectory import make_trajectory_buffer as make_trajectory_buffer
    from jaxbuf.kinds.transition import make_transition_buffer as make_transition_buffer
    from jaxbuf.loop.host_loop import HostLoop as HostLoop
    from jaxbuf.options.goals import hindsight as hindsight
    from jaxbuf.rl.rate_limit import RateLimiter as RateLimiter
    from jaxbuf.rl.rate_limit import batches_allowed as batches_allowed
    from jaxbuf.rl.rate_limit import sample_to_insert_ratio as sample_to_insert_ratio
    from jaxbuf.rl.returns import gae as gae
    from jaxbuf.transforms.blocks import blocks as blocks
    from jaxbuf.transforms.mix import mix as mix
    from jaxbuf.transforms.sharding import per_shard as per_shard
    from jaxbuf.transforms.sharding import shard as shard
    from jaxbuf.transforms.vectorize import vectorize as vectorize

_public_getattr, __dir__, __all__ = _public.attach(__name__, __file__)


def __getattr__(name: str) -> Any:
    """A public name (imported from its module on first use), a 0.3 name that moved (with
    a warning naming its home), or a subpackage."""
    if name in __all__:
        return _public_getattr(name)
    if _public.moved_home(name) is not None:
        return _public.moved_from_top_level(name)
    if not name.startswith("_") and importlib.util.find_spec(f"jaxbuf.{name}") is not None:
        return _with_modules(importlib.import_module(f"jaxbuf.{name}"))
    raise AttributeError(f"module 'jaxbuf' has no attribute {name!r}")


def _with_modules(package: Any) -> Any:
    """A subpackage reached as an attribute (`jaxbuf.kinds.trajectory`), with each of its
    modules imported, as an import of the whole library left it."""
    for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return package
