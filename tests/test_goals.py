"""Hindsight goal relabeling against a plain-Python model of the episodes.

Every observation carries a unique id as its achieved goal, so a relabeled goal
names the one step whose next observation achieved it: the reference checks that
this step lies in the allowed range of the transition's own episode.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import add_size, env_time

import jaxbuf
from jaxbuf.options import goals as _goals

NUM_ENVS, CAPACITY = 3, 12
OBS = {"achieved_goal": jnp.int32(0), "desired_goal": jnp.int32(0)}
EXAMPLE = jaxbuf.Transition(OBS, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                            jnp.bool_(False), OBS)  # fmt: skip


def reward_fn(achieved, desired):
    return (achieved == desired).astype(jnp.float32) - 1.0  # 0 on success, else -1


def success(reward):
    return reward == 0


class GoalEnvironments:
    """Auto-resetting environments; every observation's achieved goal is a fresh id."""

    def __init__(self, rng, done_probability):
        self.rng, self.p, self.fresh = rng, done_probability, 0
        self.current = [self.observation() for _ in range(NUM_ENVS)]

    def observation(self):
        self.fresh += 1
        return {"achieved_goal": np.int32(self.fresh), "desired_goal": np.int32(-1)}

    def steps(self, length):
        rows = [[] for _ in range(NUM_ENVS)]
        for env, row in enumerate(rows):
            for _ in range(length):
                end = self.rng.random() < self.p
                terminated = bool(end and self.rng.random() < 0.5)
                following = self.observation()
                row.append(
                    {
                        "obs": self.current[env],
                        "action": np.int32(0),
                        "reward": np.float32(-1),
                        "terminated": terminated,
                        "truncated": end and not terminated,
                        "next_obs": following,
                    }
                )
                self.current[env] = self.observation() if end else following
        stack = lambda *xs: np.stack(xs)  # noqa: E731
        return rows, jaxbuf.Transition(
            **jax.tree.map(stack, *[jax.tree.map(stack, *row) for row in rows])
        )


def allowed_sources(history, start, strategy, capacity, final_capacity):
    """Step numbers whose achieved goal may relabel the transition at `start`."""
    total = len(history)
    ends = [i for i, s in enumerate(history) if s["terminated"] or s["truncated"]]
    lost = ends[-final_capacity - 1] if len(ends) > final_capacity else -1
    end = next((e for e in ends if e >= start), total - 2)
    previous = max([e for e in ends if e < start], default=-1)
    first = max(previous + 1, total - min(total, capacity), lost + 1)
    low = {"future": start, "final": end, "episode": first}[strategy]
    return set(range(low, end + 1))


def number(total, time, capacity):
    oldest = total - min(total, capacity)
    return oldest + (time - oldest) % capacity


@pytest.mark.parametrize(
    "strategy, min_episode_length", [("final", 1), ("episode", 1), ("future", 3)]
)
def test_transition_goals_come_from_the_same_episode_as_the_reference(
    strategy, min_episode_length, platform_path
):
    goals = jaxbuf.hindsight(reward_fn, ratio=1.0, strategy=strategy, terminal_fn=success)
    buffer = jaxbuf.make_transition_buffer(NUM_ENVS, CAPACITY, 256, discount=0.9, goals=goals,
                                           min_episode_length=min_episode_length)  # fmt: skip
    add, sample, take = (jax.jit(f) for f in (buffer.add, buffer.sample, buffer.take))
    state, rng = buffer.init(EXAMPLE), np.random.default_rng(len(strategy) + min_episode_length)
    envs, history = GoalEnvironments(rng, 0.3), [[] for _ in range(NUM_ENVS)]
    k = -(-CAPACITY // min_episode_length)
    for call in range(20):
        rows, steps = envs.steps(add_size(rng, CAPACITY))
        state = add(state, steps)
        for env, row in enumerate(rows):
            history[env].extend(row)
        if not bool(buffer.can_sample(state)):
            continue
        got = jax.device_get(sample(state, jax.random.key(call)))
        assert got.relabeled.all()
        step_of = {int(s["next_obs"]["achieved_goal"]): (e, i)
                   for e, h in enumerate(history) for i, s in enumerate(h)}  # fmt: skip
        total = len(history[0])
        for row, (env, time) in enumerate(zip(*env_time(got, CAPACITY), strict=True)):
            start = number(total, int(time), CAPACITY)
            goal = int(got.experience.obs["desired_goal"][row])
            source_env, source = step_of[goal]
            assert source_env == env
            assert source in allowed_sources(history[env], start, strategy, CAPACITY, k), call
            assert got.goal_source[row] == env * CAPACITY + source % CAPACITY
            assert got.experience.next_obs["desired_goal"][row] == goal
            assert got.experience.terminated[row] == (source == start)
            stored = history[env][start]
            ended = stored["terminated"] or stored["truncated"]
            assert got.experience.truncated[row] == (ended and source != start)
            assert got.experience.reward[row] == (0.0 if source == start else -1.0)
            assert got.experience.discount[row] == pytest.approx(0.0 if source == start else 0.9)
        again = take(state, got.indices, got.goal_source)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(again), got.experience)


def test_every_allowed_source_is_drawn_and_the_ratio_holds():
    goals = jaxbuf.hindsight(reward_fn, ratio=0.3, strategy="episode")
    buffer = jaxbuf.make_transition_buffer(
        NUM_ENVS, CAPACITY, 512, min_episode_length=1, goals=goals
    )  # every source kept: short episodes
    rng = np.random.default_rng(7)
    envs, history = GoalEnvironments(rng, 0.25), [[] for _ in range(NUM_ENVS)]
    state = buffer.init(EXAMPLE)
    for _ in range(3):  # wraps the ring
        rows, steps = envs.steps(7)
        state = buffer.add(state, steps)
        for env, row in enumerate(rows):
            history[env].extend(row)
    sample = jax.jit(buffer.sample)
    seen, relabeled, drawn = set(), 0, 0
    for call in range(40):
        got = jax.device_get(sample(state, jax.random.key(call)))
        relabeled, drawn = relabeled + int(got.relabeled.sum()), drawn + got.relabeled.size
        envs_, times = env_time(got, CAPACITY)
        for env, time, source in zip(envs_, times, got.goal_source, strict=True):
            if source >= 0:
                seen.add((int(env), number(21, int(time), CAPACITY), number(21, source % 12, 12)))
    want = {
        (env, start, source)
        for env in range(NUM_ENVS)
        for start in range(21 - CAPACITY, 20)
        for source in allowed_sources(history[env], start, "episode", CAPACITY, CAPACITY)
    }
    assert seen == want
    assert abs(relabeled / drawn - 0.3) < 4 * np.sqrt(0.3 * 0.7 / drawn)


EPISODE_STEP = {"achieved": jnp.int32(0), "desired": jnp.int32(0), "reward": jnp.float32(0),
                "terminated": jnp.bool_(False), "done": jnp.bool_(False)}  # fmt: skip


def episode_history(rng, length):
    """Steps whose `achieved` is the step number + 1 (unique), episodes ending at random."""
    done = rng.random(length) < 0.3
    return {"achieved": np.arange(1, length + 1, dtype=np.int32),
            "desired": np.full(length, -1, np.int32), "reward": -np.ones(length, np.float32),
            "terminated": done, "done": done}  # fmt: skip


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_episode_steps_get_goals_from_their_own_episode(strategy):
    max_length = 4
    goals = jaxbuf.hindsight(
        reward_fn,
        achieved="achieved",
        desired="desired",
        ratio=0.7,
        strategy=strategy,
        terminal_fn=success,
        terminated="terminated",
    )
    buffer = jaxbuf.make_episode_buffer(1, 16, 64, max_length, goals=goals,
                                        done_fn=lambda step: step["done"])  # fmt: skip
    rng = np.random.default_rng(len(strategy))
    steps = episode_history(rng, 40)
    ends = np.flatnonzero(steps["done"])
    state = buffer.init(EPISODE_STEP)
    for chunk in range(5):  # 40 steps through a ring of 16
        state = buffer.add(
            state, jax.tree.map(lambda x, c=chunk: x[None, 8 * c : 8 * c + 8], steps)
        )
    sample, take = jax.jit(buffer.sample), jax.jit(buffer.take)
    for call in range(5):
        got = jax.device_get(sample(state, jax.random.key(call)))
        assert got.goal_source.shape == (64, max_length)
        for row in range(64):
            first = int(got.experience["achieved"][row, 0]) - 1  # a step number
            assert got.experience["achieved"][row, 0] != 0
            end = int(ends[np.searchsorted(ends, first)])
            for i in range(max_length):
                goal, step = int(got.experience["desired"][row, i]), first + i
                if not got.mask[row, i]:
                    assert got.goal_source[row, i] == -1 and goal == 0
                    continue
                if got.goal_source[row, i] < 0:
                    assert goal == -1
                    continue
                source = goal - 1
                low = {"future": step, "final": end, "episode": first}[strategy]
                assert low <= source <= end and got.goal_source[row, i] == source % 16
                assert got.experience["reward"][row, i] == (0.0 if source == step else -1.0)
                assert got.experience["terminated"][row, i] == (source == step)
        again = take(state, got.indices, got.goal_source)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(again), got.experience)
    assert np.asarray(got.relabeled)[np.asarray(got.mask)].mean() == pytest.approx(0.7, abs=0.15)


def test_relabeling_works_vectorized_sharded_from_config_and_through_checkpoints(tmp_path):
    goals = jaxbuf.hindsight(reward_fn, ratio=1.0)
    single = jaxbuf.make_transition_buffer(NUM_ENVS, CAPACITY, 32, goals=goals)
    envs = GoalEnvironments(np.random.default_rng(0), 0.3)
    _, steps = envs.steps(9)
    rebuilt = jaxbuf.io.buffer_from_config(dict(single.config))
    assert rebuilt.config == single.config
    vectorized = jaxbuf.vectorize(rebuilt, 2)
    shifted = steps.replace(obs=jax.tree.map(lambda x: x + 1000, steps.obs),
                            next_obs=jax.tree.map(lambda x: x + 1000, steps.next_obs))  # fmt: skip
    stacked = jax.tree.map(lambda *x: jnp.stack(x), steps, shifted)
    sample = jax.jit(vectorized.sample)
    state = jax.jit(vectorized.add)(vectorized.init(EXAMPLE), stacked)
    got = sample(state, jax.random.key(0))
    again = jax.jit(vectorized.take)(state, got.indices, got.goal_source)
    jax.tree.map(np.testing.assert_array_equal, again, got.experience)
    desired = got.experience.obs["desired_goal"]
    assert ((desired > 1000) == (got.source == 1)).all()  # goals from the item's own buffer
    mapped = jax.jit(jax.vmap(single.sample))(state.replace(sampler=None),
                                              jax.random.split(jax.random.key(2), 2))  # fmt: skip
    assert mapped.goal_source.shape == (2, 32) and mapped.relabeled.all()
    assert (mapped.experience.obs["desired_goal"][1] > 1000).all()
    restored = jaxbuf.restore(jaxbuf.save(tmp_path / "c", state, vectorized), state, vectorized)
    jax.tree.map(np.testing.assert_array_equal, sample(restored, jax.random.key(0)), got)
    mesh = jax.make_mesh((1,), ("data",))
    sharded = jaxbuf.shard(single, mesh)
    state = jax.jit(sharded.add)(sharded.init(EXAMPLE), steps)
    got = jax.jit(sharded.sample)(state, jax.random.key(1))
    again = jax.jit(sharded.take)(state, got.indices, got.goal_source)
    jax.tree.map(np.testing.assert_array_equal, again, got.experience)
    assert got.relabeled.all()


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: jaxbuf.hindsight(reward_fn, strategy="past"), ValueError, "strategy must be"),
        (lambda: jaxbuf.hindsight(reward_fn, ratio=1.5), ValueError, "ratio must be in"),
        (lambda: jaxbuf.hindsight("r"), TypeError, "reward_fn must be callable"),
        (lambda: jaxbuf.hindsight(reward_fn, achieved="a//b"), TypeError, "achieved must be"),
        (lambda: jaxbuf.hindsight(reward_fn, desired=[]), ValueError, "desired names no path"),
        (lambda: jaxbuf.make_transition_buffer(2, 8, 2, n_step=3, goals=jaxbuf.hindsight(
            reward_fn)), ValueError, "n_step=3"),
        (lambda: jaxbuf.make_transition_buffer(2, 8, 2, frames={"obs": 2}, goals=jaxbuf.hindsight(
            reward_fn)), ValueError, "goals and frames"),
        (lambda: jaxbuf.make_transition_buffer(2, 8, 2, goals=reward_fn), TypeError,
         "goals must be jaxbuf.hindsight"),
        (lambda: jaxbuf.make_transition_buffer(2, 8, 2, goals=jaxbuf.hindsight(
            reward_fn, terminated="t")), ValueError, "takes no reward= or terminated="),
        (lambda: jaxbuf.make_episode_buffer(1, 8, 2, 4, done_fn=lambda s: s["done"],
            frames={"achieved": 2}, goals=jaxbuf.hindsight(reward_fn, achieved="achieved")),
         ValueError, re.escape("frames stack ['achieved']")),
        (lambda: jaxbuf.io.buffer_from_config({"kind": "transition", "num_envs": 1,
            "steps_per_env": 8, "sample_batch_size": 2, "goals": {"ratio": 0.5}}), ValueError,
         re.escape("lacks the required key(s) ['reward_fn']")),
    ],
)  # fmt: skip
def test_bad_options_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "goals, example, match",
    [
        (jaxbuf.hindsight(reward_fn, achieved="goal"), EXAMPLE, "has no key 'goal'"),
        (jaxbuf.hindsight(reward_fn), EXAMPLE.replace(obs={**OBS, "desired_goal": jnp.zeros(2)},
         next_obs={**OBS, "desired_goal": jnp.zeros(2)}), "must have the shape and dtype"),
        (jaxbuf.hindsight(lambda a, g: jnp.zeros(2)), EXAMPLE, "reward_fn must return a scalar"),
        (jaxbuf.hindsight(reward_fn, terminal_fn=lambda r: r), EXAMPLE,
         "terminal_fn must return a bool scalar"),
    ],
)  # fmt: skip
def test_goal_leaves_are_checked_at_init(goals, example, match):
    buffer = jaxbuf.make_transition_buffer(1, 8, 2, goals=goals)
    with pytest.raises((ValueError, TypeError), match=match):
        buffer.init(example)


def test_episode_terminal_fn_needs_the_termination_leaf_and_take_checks_goal_source():
    goals = jaxbuf.hindsight(reward_fn, achieved="achieved", desired="desired", terminal_fn=success)
    buffer = jaxbuf.make_episode_buffer(1, 8, 2, 4, done_fn=lambda s: s["done"], goals=goals)
    with pytest.raises(ValueError, match="needs terminated="):
        buffer.init(EPISODE_STEP)
    plain = jaxbuf.make_transition_buffer(1, 8, 2)
    state = plain.init(EXAMPLE)
    with pytest.raises(TypeError, match="only for buffers made with goals="):
        plain.take(state, jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32))
    relabeling = jaxbuf.make_transition_buffer(1, 8, 2, goals=jaxbuf.hindsight(reward_fn))
    with pytest.raises(TypeError, match=re.escape("goal_source must be an integer array [2]")):
        relabeling.take(relabeling.init(EXAMPLE), jnp.zeros(2, jnp.int32), jnp.zeros(3, jnp.int32))


@pytest.mark.parametrize("k", [1, 2, 5, 31, 32, 33, 1000, 1 << 16])
def test_wide_search_finds_what_the_binary_search_finds(k):
    """The accelerator path's search (a few wide reads) against the CPU's binary search and
    NumPy's searchsorted, on sorted ends with repeats, every fill level and targets at, between,
    before and after them."""
    rng = np.random.default_rng(k)
    for _ in range(4):
        ends = jnp.asarray(np.sort(rng.integers(-50, 3 * k, k)), jnp.int32)
        size = jnp.asarray(rng.integers(0, k + 1, 64), jnp.int32)
        at = jnp.asarray(rng.integers(-60, 3 * k + 10, 64), jnp.int32)

        def end_at(rank, ends=ends):
            return ends[rank]

        binary = jax.jit(lambda n, a, e=end_at: _goals._binary_search(e, n, a, k))(size, at)
        wide = jax.jit(lambda n, a, e=end_at: _goals._wide_search(e, n, a, k))(size, at)
        expected = [np.searchsorted(np.asarray(ends)[:n], a) for n, a in zip(size, at, strict=True)]
        np.testing.assert_array_equal(binary, expected)
        np.testing.assert_array_equal(wide, expected)


def test_wide_search_reaches_past_the_last_end_of_every_ring_size():
    """A full ring whose every end lies before the target: the answer is the ring's size for
    every K from 1 to 40, at and around powers of two, and between them (a search narrower
    than K stops short of it), and each rank in between is found too."""
    around = [n + d for n in (64, 128, 256, 1024, 1 << 15) for d in (-1, 0, 1)]
    # one compiled program per K (run op by op, each K compiled every operation anew)
    search = jax.jit(lambda ends, size, at, k: _goals._wide_search(lambda rank: ends[rank],
                                                                   size, at, k),
                     static_argnums=3)  # fmt: skip
    for k in [*range(1, 41), *around, 100, 300, 1000, 5000, 1 << 16, 100_000]:
        ends = jnp.arange(k, dtype=jnp.int32) * 2  # end of rank r at 2r
        at = jnp.asarray([2 * k + 5, 2 * k - 2, 2 * k - 3, 0, -1, 2 * (k // 2) + 1], jnp.int32)
        size = jnp.full(at.shape, k, jnp.int32)
        expected = np.minimum(np.maximum((np.asarray(at) + 1) // 2, 0), k)
        wide = search(ends, size, at, k)
        np.testing.assert_array_equal(wide, expected, err_msg=f"K={k}")
