"""Hindsight goal relabeling (Andrychowicz et al., 2017), applied at sample time.

A transition or episode buffer made with `goals=jaxbuf.hindsight(reward_fn)`
stores what the environment gave and, in every `sample`, gives each sampled
transition (each step of a sampled episode), with probability `ratio`, the goal
achieved after another step `u` of the same episode as its desired goal:

- `"future"`: `u` uniform in `[t, end]`, the step itself up to the episode's end;
- `"final"`: `u = end`;
- `"episode"`: `u` uniform in `[first, end]`.

`first` and `end` are the episode's first and last stored steps. For an episode
still running, `end` is its newest step whose next observation is stored (the
goal never comes from beyond the write position), and the episode of a
transition whose beginning was overwritten starts at its oldest stored step (the
goal never comes from another episode). The reward is recomputed as
`reward_fn(achieved, goal)` from the goal achieved after the step itself and,
given a `terminal_fn`, the termination as `terminal_fn(reward)`. A sample's
`goal_source` is the step `env * steps_per_env + time` each new goal came from (-1:
not relabeled), and `take(state, indices, goal_source)` gives the same
experience back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import draws as _draws
from jaxbuf.core import lowering as _lowering
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Option, Relabel
from jaxbuf.core.records import Config, PyTree, Transition, _Record

STRATEGIES = ("future", "final", "episode")


@dataclasses.dataclass(frozen=True)
class Hindsight(_Record):
    """How a buffer relabels goals, made by `jaxbuf.hindsight`; paths are tuples of keys.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> goals = jaxbuf.hindsight(lambda a, g: jnp.where(jnp.all(a == g), 0.0, -1.0),
      ...                          desired=("obs/goal", "next_obs/goal"), achieved="next_obs/at")
      >>> goals.achieved, goals.desired
      (('next_obs', 'at'), (('obs', 'goal'), ('next_obs', 'goal')))
    """

    reward_fn: Callable[[jax.Array, jax.Array], jax.Array]
    achieved: tuple[str, ...]
    desired: tuple[tuple[str, ...], ...]
    ratio: float
    strategy: str
    terminal_fn: Callable[[jax.Array], jax.Array] | None
    reward: tuple[str, ...]
    terminated: tuple[str, ...] | None

    @property
    def config(self) -> Config:
        """The arguments of `jaxbuf.hindsight` that made it, paths as strings."""
        return Config(
            reward_fn=self.reward_fn, achieved="/".join(self.achieved),
            desired=["/".join(p) for p in self.desired], ratio=self.ratio,
            strategy=self.strategy, terminal_fn=self.terminal_fn, reward="/".join(self.reward),
            terminated=None if self.terminated is None else "/".join(self.terminated),
        )  # fmt: skip


def _path(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, str) or not value or "" in value.split("/"):
        raise TypeError(f"{name} must be a '/'-separated key path such as 'achieved_goal' or "
                        f"'obs/desired_goal', got {value!r}.")  # fmt: skip
    return tuple(value.split("/"))


def hindsight(
    reward_fn: Callable[[jax.Array, jax.Array], jax.Array],
    *,
    achieved: str = "achieved_goal",
    desired: str | Sequence[str] = "desired_goal",
    ratio: float = 0.8,
    strategy: str = "future",
    terminal_fn: Callable[[jax.Array], jax.Array] | None = None,
    reward: str = "reward",
    terminated: str | None = None,
) -> Hindsight:
    """Goal relabeling for `make_transition_buffer` and `make_episode_buffer` (`goals=`).

    Args:
      reward_fn: `reward_fn(achieved_goal, desired_goal) -> reward scalar` for one
        step (no batch axes), jittable: the environment's reward.
      achieved: the path of the goal achieved. In a transition buffer, a key path
        into the observation (the goal achieved after step `t` is the one in
        `next_obs`); in an episode buffer, a path into the step whose leaf holds
        the goal achieved AFTER that step (store it so).
      desired: the path (or paths) of the desired goal, all replaced when
        relabeled: into the observation (replaced in `obs` and `next_obs`) for
        transitions, into the step for episodes. Same shape and dtype as `achieved`.
      ratio: the probability that a sampled transition is relabeled, in [0, 1]
        (0.8 is the paper's `k = 4` future goals per real one).
      strategy: `"future"`, `"final"` or `"episode"` (see the module docstring).
      terminal_fn: `terminal_fn(reward) -> bool scalar`: whether a recomputed
        reward ends the episode (e.g. `lambda r: r == 0`). Given it, a relabeled
        transition is terminated where it says so, and truncated (bootstrapped)
        where the stored episode ended but it does not. Without it, the stored
        termination is kept.
      reward: episode buffers: the path of the reward leaf in a step.
      terminated: episode buffers: the path of the bool termination leaf, rewritten
        with `terminal_fn` (required with it).

    Returns:
      A `Hindsight` record to pass as `goals=`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> goals = jaxbuf.hindsight(lambda a, g: -jnp.any(a != g).astype(jnp.float32),
      ...                          strategy="final", terminal_fn=lambda r: r == 0)
      >>> goals.config.strategy, goals.config.ratio, goals.config.desired
      ('final', 0.8, ['desired_goal'])
    """
    for name, fn in (("reward_fn", reward_fn), ("terminal_fn", terminal_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}.")
    if reward_fn is None:
        raise TypeError("hindsight needs a reward_fn(achieved_goal, desired_goal).")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}.")
    paths = [desired] if isinstance(desired, str) else list(desired)
    if not paths:
        raise ValueError("desired names no path; give at least one.")
    terminated_path = None if terminated is None else _path("terminated", terminated)
    return Hindsight(
        reward_fn=reward_fn, achieved=_path("achieved", achieved),
        desired=tuple(_path(f"desired[{i}]", p) for i, p in enumerate(paths)),
        ratio=_validation.check_fraction("ratio", ratio), strategy=strategy,
        terminal_fn=terminal_fn, reward=_path("reward", reward), terminated=terminated_path,
    )  # fmt: skip


# Why goal relabeling refuses each storage option: both change the stored goals it reads.
REFUSES = {
    "storage_dtypes": "the reward function reads the stored goals, which must keep their dtype",
    "host_memory": "goal relabeling reads stored goals with gathers, which host memory refuses; "
    "keep the observations in device memory",
}


def option(goals: Any, relabeling: Callable[..., Relabel], **settings: Any) -> Option | None:
    """Goal relabeling (`goals`, checked: None or a `Hindsight`) as an option of the
    build step, rewriting what is drawn with `relabeling(goals, **settings)`
    (`transition_relabeling` or `episode_relabeling`); None without goals."""
    goals = check_option(goals)
    if goals is None:
        return None
    return Option(name="goals", refuses=REFUSES, relabel=relabeling(goals, **settings))


def check_option(goals: Any) -> Hindsight | None:
    """A factory's `goals` argument: None or a `Hindsight`, else a `TypeError`."""
    if goals is not None and not isinstance(goals, Hindsight):
        raise TypeError(f"goals must be jaxbuf.hindsight(...), got {type(goals).__name__}.")
    return goals


def get(tree: PyTree, path: tuple[str, ...], what: str) -> Any:
    """The subtree at a key path, or a `ValueError` naming the path and `what`."""
    node = tree
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node:
            have = sorted(node) if isinstance(node, Mapping) else type(node).__name__
            raise ValueError(
                f"{what} has no key {'/'.join(path[: depth + 1])!r} (at that level "
                f"it has {have}); hindsight's paths must name its leaves."
            )
        node = node[key]
    return node


def put(tree: PyTree, path: tuple[str, ...], value: Any) -> PyTree:
    """A copy of nested dicts `tree` with the leaf at `path` replaced."""
    if not path:
        return value
    return {**tree, path[0]: put(tree[path[0]], path[1:], value)}


def _where(rows: jax.Array, yes: jax.Array, no: jax.Array) -> jax.Array:
    return jnp.where(rows.reshape(*rows.shape, *[1] * (no.ndim - rows.ndim)), yes, no)


def check(goals: Hindsight, tree: PyTree, what: str, *, episode: bool) -> None:
    """Raises unless the paths name leaves of `tree` (a spec) that fit `reward_fn`."""
    goal = get(tree, goals.achieved, what)
    for path in goals.desired:
        leaf = get(tree, path, what)
        if not hasattr(leaf, "shape") or (leaf.shape, leaf.dtype) != (goal.shape, goal.dtype):
            raise ValueError(f"{what}'s {'/'.join(path)!r} must have the shape and dtype of "
                             f"{'/'.join(goals.achieved)!r}, {goal}; got {leaf}.")  # fmt: skip
    reward = jax.eval_shape(goals.reward_fn, goal, goal)
    if getattr(reward, "shape", None) != ():
        raise TypeError(f"reward_fn must return a scalar for one step, got {reward}.")
    if goals.terminal_fn is not None:
        done = jax.eval_shape(goals.terminal_fn, reward)
        if getattr(done, "shape", None) != () or done.dtype != jnp.bool_:
            raise TypeError(f"terminal_fn must return a bool scalar, got {done}.")
    if episode:
        get(tree, goals.reward, what)
        if goals.terminal_fn is not None and goals.terminated is None:
            raise ValueError("an episode buffer's terminal_fn needs terminated=, the path of "
                             "the step's termination leaf it rewrites.")  # fmt: skip
        if goals.terminated is not None:
            get(tree, goals.terminated, what)


def _pick_steps(key: jax.Array, ratio: float, low, end) -> tuple[jax.Array, jax.Array]:
    """Whether each step is relabeled (probability `ratio`) and its source offset,
    uniform in `[low, end]` (int32 arrays of one shape; `end >= low` where it matters)."""
    pick, coin = jax.random.split(key)
    source = jax.random.randint(pick, low.shape, low, jnp.maximum(end, low) + 1, jnp.int32)
    return jax.random.bernoulli(coin, ratio, low.shape), source


def _range(strategy: str, at, first, end) -> tuple[jax.Array, jax.Array]:
    """The offsets `[low, end]` a goal for the step at offset `at` may come from."""
    low = {"future": at, "final": end, "episode": first}[strategy]
    return jnp.broadcast_to(low, at.shape), jnp.broadcast_to(end, at.shape)


def _mapped(fn: Callable, axes: int) -> Callable:
    """`fn` of one step, vmapped over `axes` leading batch axes."""
    for _ in range(axes):
        fn = jax.vmap(fn)
    return fn


def _rewards(goals: Hindsight, achieved: PyTree, goal: PyTree, dtype, axes: int) -> jax.Array:
    return jnp.asarray(_mapped(goals.reward_fn, axes)(achieved, goal)).astype(dtype)


def _terminal(goals: Hindsight, reward: jax.Array, axes: int) -> jax.Array:
    assert goals.terminal_fn is not None
    return _mapped(goals.terminal_fn, axes)(reward)


def _bitcast_offset(numbers: jax.Array, oldest: jax.Array) -> jax.Array:
    """int32 chronological offsets of step numbers (uint32, wrapping): negative
    for steps older than the oldest stored one."""
    return jax.lax.bitcast_convert_type(numbers - oldest, jnp.int32)


def _episode_span(state: Any, envs: jax.Array, at: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(first, end)`: int32 offsets of the first stored step and the end of the
    episode holding the step at offset `at` in a transition buffer.

    The side ring holds, in time order, the step numbers of the episode ends,
    among them every end at or after a startable step; a binary search finds the
    first end at or after `at`, and the one before it. An episode still running
    ends at the newest step whose next observation is stored (offset `size - 2`).
    """
    side = state.side
    k = side.added_at.shape[1]
    oldest = state.added - state.size.astype(jnp.uint32)
    base = _draws.take_small(side.position - side.size, envs)  # the oldest end's slot
    size = _draws.take_small(side.size, envs)

    def end_at(rank: jax.Array) -> jax.Array:  # rank `[B]` or `[B, w]`
        rows = (base.reshape(-1, *[1] * (rank.ndim - 1)) + rank) % k
        envs_ = envs.reshape(rows.shape[:1] + (1,) * (rank.ndim - 1))
        return _bitcast_offset(side.added_at[envs_, rows], oldest)

    low = _lowering.loop_or_unrolled(
        size,
        at,
        loop=lambda n, a: _binary_search(end_at, n, a, k),
        unrolled=lambda n, a: _wide_search(end_at, n, a, k),
    )
    # the end at `low` and the one before it, in one read
    pair = end_at(jnp.stack([jnp.maximum(low - 1, 0), jnp.minimum(low, k - 1)], axis=1))
    end = jnp.where(low < size, pair[:, 1], state.size - 2)
    previous = jnp.where(low > 0, pair[:, 0] + 1, 0)
    return jnp.maximum(previous, _draws.take_small(side.stale, envs)), end


def _binary_search(end_at: Callable, size: jax.Array, at: jax.Array, k: int) -> jax.Array:
    """The first rank in `[0, size)` whose end is at or after `at` (`size` if none):
    `log2 K` narrow reads, the fastest on CPU."""
    low, high = jnp.zeros_like(at), size
    for _ in range(k.bit_length()):
        active = low < high
        middle = (low + high) // 2
        before = end_at(middle) < at
        low = jnp.where(active & before, middle + 1, low)
        high = jnp.where(active & ~before, middle, high)
    return low


def _wide_search(end_at: Callable, size: jax.Array, at: jax.Array, k: int) -> jax.Array:
    """`_binary_search`'s answer in `ceil(log2(K + 1) / 5)` wide reads: each reads
    `w` ends spaced `stride` apart ([B, w], one gather) and skips the whole strides
    that end before `at`, the stride shrinking `w`-fold each time (for accelerators,
    where each read is a kernel)."""
    bits = k.bit_length()
    levels = -(-bits // 5)
    width = 1 << -(-bits // levels)  # width ** levels > K
    low = jnp.zeros_like(at)
    for level in reversed(range(levels)):
        stride = width**level
        probes = low[:, None] + stride * jnp.arange(1, width, dtype=jnp.int32)[None, :] - 1
        inside = probes < size[:, None]
        before = inside & (end_at(jnp.minimum(probes, k - 1)) < at[:, None])
        low = low + stride * jnp.sum(before, axis=1, dtype=jnp.int32)
    return low


def _achieved_after(state: Any, goals: Hindsight, envs: jax.Array, times: jax.Array) -> PyTree:
    """The goal achieved after each step `(envs, times)` of a transition buffer:
    in the next stored observation, or in the final one where the step ended."""
    steps, side = state.experience, state.side
    capacity = side.slot_of.shape[1]
    ended = steps["terminated"][envs, times] | steps["truncated"][envs, times]
    following = get(steps["obs"], goals.achieved, "obs")[envs, (times + 1) % capacity]
    final = get(side.experience, goals.achieved, "obs")[envs, side.slot_of[envs, times]]
    return _where(ended, final, following)


def transition_relabeling(goals: Hindsight, discount: float) -> Relabel:
    """Relabel of one-step transitions `where = (envs, start times)`."""

    def choose(state, where, key):
        envs, times = where
        capacity = state.side.slot_of.shape[1]
        oldest = state.position - state.size
        at = (times - oldest) % capacity
        first, end = _episode_span(state, envs, at)
        chosen, source = _pick_steps(key, goals.ratio, *_range(goals.strategy, at, first, end))
        return jnp.where(chosen, envs * capacity + (oldest + source) % capacity, -1)

    def apply(state, where, experience: Transition, goal_source):
        capacity = state.side.slot_of.shape[1]
        relabel = goal_source >= 0
        envs, times = _storage.split(_clamped(goal_source, _steps(state)), capacity)
        goal = _achieved_after(state, goals, envs, times)
        reward = _rewards(goals, get(experience.next_obs, goals.achieved, "next_obs"), goal,
                          experience.reward.dtype, axes=1)  # fmt: skip
        terminated, truncated = experience.terminated, experience.truncated
        if goals.terminal_fn is not None:
            ended = terminated | truncated
            terminated = _terminal(goals, reward, axes=1)
            truncated = ended & ~terminated
        new_discount = jnp.where(terminated, 0, discount).astype(experience.reward.dtype)
        relabeled = experience.replace(
            obs=_put_goal(experience.obs, goals, goal), reward=reward, terminated=terminated,
            truncated=truncated, next_obs=_put_goal(experience.next_obs, goals, goal),
            discount=new_discount,
        )  # fmt: skip
        return jax.tree.map(lambda new, old: _where(relabel, new, old), relabeled, experience)

    return Relabel(choose, apply)


def _put_goal(tree: PyTree, goals: Hindsight, goal: jax.Array) -> PyTree:
    for path in goals.desired:
        tree = put(tree, path, goal)
    return tree


def _clamped(goal_source: jax.Array, steps: int) -> jax.Array:
    return jnp.clip(goal_source, 0, steps - 1)


def episode_relabeling(goals: Hindsight, max_length: int) -> Relabel:
    """Relabel of every step of padded episodes `where = (envs, record slots)`."""

    def start_and_length(state, envs, slots):
        capacity = _storage.capacity_of(state.experience, 1)
        age = (state.added - state.side.first_step[envs, slots]).astype(jnp.int32)
        return (state.position - age) % capacity, state.side.length[envs, slots], capacity

    def choose(state, where, key):
        envs, slots = where
        start, length, capacity = start_and_length(state, envs, slots)
        at = jnp.broadcast_to(jnp.arange(max_length, dtype=jnp.int32), (len(envs), max_length))
        end = (length - 1)[:, None]
        chosen, source = _pick_steps(key, goals.ratio, *_range(goals.strategy, at, 0, end))
        chosen = chosen & (at < length[:, None])
        step = envs[:, None] * capacity + (start[:, None] + source) % capacity
        return jnp.where(chosen, step, -1)

    def apply(state, where, experience: PyTree, goal_source):
        capacity = _storage.capacity_of(state.experience, 1)
        relabel = goal_source >= 0
        envs, times = _storage.split(_clamped(goal_source, _steps(state)), capacity)
        goal = get(state.experience, goals.achieved, "the step")[envs, times]
        old_reward = get(experience, goals.reward, "the step")
        reward = _rewards(goals, get(experience, goals.achieved, "the step"), goal,
                          old_reward.dtype, axes=2)  # fmt: skip
        relabeled = put(_put_goal(experience, goals, goal), goals.reward, reward)
        if goals.terminal_fn is not None and goals.terminated is not None:
            relabeled = put(relabeled, goals.terminated, _terminal(goals, reward, axes=2))
        return jax.tree.map(lambda new, old: _where(relabel, new, old), relabeled, experience)

    return Relabel(choose, apply)


def _steps(state: Any) -> int:
    leaf = jax.tree_util.tree_leaves(state.experience)[0]
    return leaf.shape[0] * leaf.shape[1]
