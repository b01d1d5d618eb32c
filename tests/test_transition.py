"""n-step transitions, observations stored once, against naive full transitions in NumPy."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accelerators_form
from reference import add_size, env_time, rejects_and_keeps_state

import jaxbuf
from jaxbuf.core import lowering as _lowering

EXAMPLE = jaxbuf.Transition(
    obs={"x": jnp.zeros(2), "id": jnp.int32(0)},
    action=jnp.int32(0),
    reward=jnp.float32(0),
    terminated=jnp.bool_(False),
    truncated=jnp.bool_(False),
    next_obs={"x": jnp.zeros(2), "id": jnp.int32(0)},
)


class Environments:
    """Auto-resetting environments: after an episode end the next `obs` is a reset
    observation, while `next_obs` is the final one. Every observation is unique."""

    def __init__(self, num_envs, done_probability, rng):
        self.rng, self.p, self.num_envs = rng, done_probability, num_envs
        self.fresh = 0
        self.current = [self.observation() for _ in range(num_envs)]

    def observation(self):
        self.fresh += 1
        return {"x": self.rng.normal(size=2).astype(np.float32), "id": np.int32(self.fresh)}

    def steps(self, length):
        rows = [[] for _ in range(self.num_envs)]
        for env, row in enumerate(rows):
            for _ in range(length):
                end = self.rng.random() < self.p
                terminated = bool(end and self.rng.random() < 0.5)
                following = self.observation()
                row.append({
                    "obs": self.current[env], "action": np.int32(self.rng.integers(5)),
                    "reward": np.float32(self.rng.normal()), "terminated": terminated,
                    "truncated": end and not terminated, "next_obs": following,
                })  # fmt: skip
                self.current[env] = self.observation() if end else following
        stack = lambda *xs: np.stack(xs)  # noqa: E731
        return rows, jaxbuf.Transition(
            **jax.tree.map(stack, *[jax.tree.map(stack, *row) for row in rows])
        )


class Reference:
    """Every full transition ever added; n-step targets computed from them."""

    def __init__(self, num_envs, capacity, n_step, discount, final_capacity):
        self.history = [[] for _ in range(num_envs)]
        self.capacity, self.n, self.discount, self.k = capacity, n_step, discount, final_capacity

    def allowed(self, env):
        """Step numbers that may start a transition."""
        history = self.history[env]
        total = len(history)
        size = min(total, self.capacity)
        ends = [i for i, s in enumerate(history) if s["terminated"] or s["truncated"]]
        lost = ends[-self.k - 1] if len(ends) > self.k else -1
        return list(range(max(total - size, lost + 1), total - self.n))

    def number(self, env, time_index):
        total = len(self.history[env])
        oldest = total - min(total, self.capacity)
        return oldest + (time_index - oldest) % self.capacity

    def target(self, env, start):
        history, ret = self.history[env], 0.0
        for j in range(self.n):
            step = history[start + j]
            ret += self.discount**j * float(step["reward"])
            if step["terminated"] or step["truncated"]:
                break
        discount = 0.0 if step["terminated"] else self.discount ** (j + 1)
        return history[start], ret, discount, step["next_obs"], j + 1


@pytest.mark.parametrize(
    "n_step, min_episode_length, done_probability, platform_path",
    [(1, 1, 0.3, "cpu path"), (3, 1, 0.3, "cpu path"), (4, 1, 0.05, "cpu path"),
     (3, 4, 0.3, "cpu path"), (2, 6, 0.5, "cpu path"),
     (3, 1, 0.3, "accelerator path"), (3, 4, 0.3, "accelerator path")],
    indirect=["platform_path"],
)  # fmt: skip
def test_samples_match_naive_full_transitions(
    n_step, min_episode_length, done_probability, platform_path
):
    num_envs, capacity, batch, discount = 3, 12, 512, 0.9
    buffer = jaxbuf.make_transition_buffer(
        num_envs, capacity, batch, n_step=n_step, discount=discount,
        min_episode_length=min_episode_length,
    )  # fmt: skip
    add, sample = jax.jit(buffer.add, donate_argnums=0), jax.jit(buffer.sample)
    state = buffer.init(EXAMPLE)
    rng = np.random.default_rng(n_step * 10 + min_episode_length)
    envs = Environments(num_envs, done_probability, rng)
    reference = Reference(num_envs, capacity, n_step, discount, -(-capacity // min_episode_length))
    saw_stale = False
    for call in range(40):
        rows, steps = envs.steps(add_size(rng, capacity))
        state = add(state, steps)
        for env, row in enumerate(rows):
            reference.history[env].extend(row)
        allowed = [reference.allowed(env) for env in range(num_envs)]
        saw_stale |= bool(np.asarray(state.side.stale).any())
        assert bool(buffer.can_sample(state)) == any(allowed)
        if not any(allowed):
            continue
        got = jax.device_get(sample(state, jax.random.key(call)))
        assert got.valid.all()
        envs_got, times = (x.tolist() for x in env_time(got, capacity))
        starts = [reference.number(e, t) for e, t in zip(envs_got, times, strict=True)]
        for env, start in zip(envs_got, starts, strict=True):
            assert start in allowed[env], (call, env, start, allowed[env])
        seen = set(zip(envs_got, starts, strict=True))
        targets = [reference.target(e, s) for e, s in zip(envs_got, starts, strict=True)]
        first, ret, disc, following, length = (list(x) for x in zip(*targets, strict=True))
        np.testing.assert_array_equal(got.length, length)
        np.testing.assert_allclose(got.experience.reward, ret, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.experience.discount, disc, rtol=1e-6)
        np.testing.assert_array_equal(got.experience.action, [f["action"] for f in first])
        for name in ("x", "id"):
            np.testing.assert_array_equal(
                got.experience.obs[name], np.stack([f["obs"][name] for f in first])
            )
            np.testing.assert_array_equal(
                got.experience.next_obs[name], np.stack([f[name] for f in following])
            )
        assert seen == {(e, s) for e in range(num_envs) for s in allowed[e]}
    assert saw_stale == (min_episode_length > 1)


def test_truncation_bootstraps_from_the_final_observation_and_termination_does_not():
    buffer = jaxbuf.make_transition_buffer(1, 8, 64, n_step=3, discount=0.5, min_episode_length=1)
    obs = jnp.array([0.0, 1.0, 2.0, 50.0, 4.0, 5.0])  # 50: reset observation after step 2
    steps = jaxbuf.Transition(
        obs=obs[None, :, None],
        action=jnp.arange(6, dtype=jnp.int32)[None],
        reward=jnp.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]),
        terminated=jnp.array([[False, False, False, False, True, False]]),
        truncated=jnp.array([[False, False, True, False, False, False]]),
        next_obs=jnp.array([1.0, 2.0, 99.0, 4.0, 77.0, 6.0])[None, :, None],
    )
    add, sample = jax.jit(buffer.add), jax.jit(buffer.sample)
    state = add(buffer.init(jax.tree.map(lambda x: x[0, 0], steps)), steps)
    batch = sample(state, jax.random.key(0))
    by_start = {int(t): i for i, t in enumerate(batch.indices)}
    assert sorted(by_start) == [0, 1, 2]  # starts 3, 4, 5 lack their 3 following steps
    expected = {  # start: (return, discount, next_obs, length)
        0: (1 + 0.5 * 2 + 0.25 * 3, 0.125, 99.0, 3),
        1: (2 + 0.5 * 3, 0.25, 99.0, 2),
        2: (3.0, 0.5, 99.0, 1),
    }
    for start, (ret, disc, following, length) in expected.items():
        i = by_start[start]
        assert batch.experience.reward[i] == ret and batch.experience.discount[i] == disc
        assert batch.experience.next_obs[i, 0] == following and batch.length[i] == length
    state = add(state, jax.tree.map(lambda x: x[:, :2], steps))
    batch = sample(state, jax.random.key(1))
    i = list(batch.indices).index(3)  # 50 -> 4 -> terminated (final obs 77)
    assert batch.experience.reward[i] == 4 + 0.5 * 5 and batch.experience.discount[i] == 0.0
    assert batch.experience.next_obs[i, 0] == 77.0 and batch.experience.obs[i, 0] == 50.0


def test_memory_is_one_observation_per_step_plus_the_side_ring():
    example = EXAMPLE.replace(obs=jnp.zeros(64), next_obs=jnp.zeros(64))
    buffer = jaxbuf.make_transition_buffer(4, 1000, 8, n_step=3, min_episode_length=100)
    state = buffer.init(example)
    assert state.side.experience.shape == (4, 10, 64) and state.side.slot_of.dtype == jnp.uint8
    step_bytes = 64 * 4 + 4 + 4 + 2  # obs, action, reward, two flags
    per_step = sum(x.nbytes for x in jax.tree.leaves(state)) / (4 * 1000)
    assert step_bytes < per_step < 1.02 * step_bytes


def test_vmap_over_buffers_equals_a_loop():
    buffer = jaxbuf.make_transition_buffer(2, 10, 16, n_step=2, min_episode_length=2)
    rng = np.random.default_rng(0)
    chunks = [Environments(2, 0.4, rng).steps(7)[1] for _ in range(3)]
    both = jax.tree.map(lambda *xs: jnp.stack(xs), *chunks)
    states = jax.vmap(buffer.init)(
        jax.tree.map(lambda x: jnp.zeros((3, *x.shape), x.dtype), EXAMPLE)
    )
    add, sample = jax.jit(buffer.add), jax.jit(buffer.sample)
    states = jax.jit(jax.vmap(buffer.add))(states, both)
    keys = jax.random.split(jax.random.key(3), 3)
    batches = jax.device_get(jax.jit(jax.vmap(buffer.sample))(states, keys))
    for i, chunk in enumerate(chunks):
        one = jax.device_get(sample(add(buffer.init(EXAMPLE), chunk), keys[i]))
        chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: x[i], batches), one)


def test_empty_buffer_samples_invalid_placeholders():
    buffer = jaxbuf.make_transition_buffer(2, 8, 4, n_step=2)
    state = buffer.init(EXAMPLE)
    assert not buffer.can_sample(state)
    batch = jax.jit(buffer.sample)(state, jax.random.key(0))
    assert not batch.valid.any() and batch.experience.obs["x"].shape == (4, 2)


def test_add_step_equals_add_of_one_step_and_does_not_retrace():
    buffer = jaxbuf.make_transition_buffer(2, 8, 4, n_step=2)
    _, steps = Environments(2, 0.3, np.random.default_rng(1)).steps(5)
    counted = chex.assert_max_traces(buffer.add_step, n=1)
    add_step = jax.jit(counted, donate_argnums=0)
    stepwise = buffer.init(EXAMPLE)
    for t in range(5):
        stepwise = add_step(stepwise, jax.tree.map(lambda x, t=t: x[:, t], steps))
    whole = buffer.add(buffer.init(EXAMPLE), steps)
    chex.assert_trees_all_equal(stepwise, whole)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_step": 8}, ValueError, "n_step must be in [1, 7]"),
        ({"n_step": 0}, ValueError, "n_step must be in [1, 7]"),
        ({"discount": 1.5}, ValueError, "discount must be in [0, 1], got 1.5"),
        ({"discount": "0.9"}, TypeError, "discount must be a number in [0, 1]"),
        ({"min_episode_length": 9}, ValueError, "min_episode_length must be in [1, 8]"),
        ({"min_size": 2, "n_step": 3}, ValueError, "min_size must be in [4, 8]"),
    ],
)
def test_configuration_errors(kwargs, error, match):
    with pytest.raises(error, match=re.escape(match)):
        jaxbuf.make_transition_buffer(2, 8, 4, **kwargs)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda e: e.replace(reward=jnp.int32(0)), TypeError, "example.reward must be a floating"),
        (lambda e: e.replace(truncated=jnp.float32(0)), TypeError, "example.truncated must be"),
        (lambda e: e.replace(next_obs=jnp.zeros(2)), ValueError, "example.next_obs must have"),
        (lambda e: {"obs": e.obs}, TypeError, "must be a jaxbuf.Transition"),
    ],
)
def test_example_errors(change, error, match):
    buffer = jaxbuf.make_transition_buffer(2, 8, 4)
    with pytest.raises(error, match=re.escape(match)):
        buffer.init(change(EXAMPLE))


@pytest.mark.parametrize("wrap", ["eager", "jit", "vmap"])
@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda s: s.replace(reward=s.reward.astype(jnp.float16)), TypeError,
         "steps.reward has dtype float16; expected float32"),
        (lambda s: s.replace(next_obs={"x": s.next_obs["x"]}), ValueError,
         "missing leaves .next_obs['id']"),
        (lambda s: s.replace(action=s.action[:, :2]), ValueError, "steps.action has T=2"),
        (lambda s: jax.tree.map(lambda x: jnp.concatenate([x] * 3, axis=1), s), ValueError,
         "T=9 steps per environment, more than steps_per_env=8"),
    ],
)  # fmt: skip
def test_add_errors_name_the_leaf_and_leave_the_state_intact(wrap, change, error, match):
    buffer = jaxbuf.make_transition_buffer(2, 8, 4)
    _, steps = Environments(2, 0.3, np.random.default_rng(2)).steps(3)
    state = buffer.add(buffer.init(EXAMPLE), steps)
    bad = change(steps)
    rejects_and_keeps_state(wrap, buffer.add, state, bad, error=error, match=match)


def test_hundreds_of_environments_with_unequal_counts_draw_alike_on_both_paths(monkeypatch):
    """Above `SMALL` environments the draw searches the environments' running totals: a
    loop on CPU, levels of wide reads on accelerators. Episodes of 1-3 steps under a side
    ring sized for 10 leave every environment its own stale count, so the totals are
    unequal: both paths draw the same transitions, bit for bit."""
    envs, steps, batch = 300, 16, 2048
    buffer = jaxbuf.make_transition_buffer(envs, steps, batch)
    rng = np.random.default_rng(0)
    done = rng.random((envs, 40)) < 0.5
    chunk = jaxbuf.Transition(
        obs=jnp.asarray(rng.normal(size=(envs, 40, 2)), jnp.float32),
        action=jnp.asarray(rng.integers(0, 4, (envs, 40)), jnp.int32),
        reward=jnp.asarray(rng.normal(size=(envs, 40)), jnp.float32),
        terminated=jnp.asarray(done & (rng.random((envs, 40)) < 0.5)),
        truncated=jnp.asarray(done),
        next_obs=jnp.asarray(rng.normal(size=(envs, 40, 2)), jnp.float32),
    )
    chunk = chunk.replace(truncated=chunk.truncated & ~chunk.terminated)
    add = jax.jit(buffer.add)
    state = buffer.init(jax.tree.map(lambda x: x[0, 0], chunk))
    for start in range(0, 40, 8):  # 40 steps in chunks of 8: the ring of 16 wraps twice
        state = add(state, jax.tree.map(lambda x, s=start: x[:, s : s + 8], chunk))
    assert len(set(np.asarray(state.side.stale).tolist())) > 3  # unequal counts
    key = jax.random.key(5)
    on_cpu = jax.jit(lambda s, k: buffer.sample(s, k))(state, key)
    monkeypatch.setattr(_lowering, "choose", accelerators_form)
    on_accelerators = jax.jit(lambda s, k: buffer.sample(s, k))(state, key)
    for a, b in zip(jax.tree.leaves(on_cpu), jax.tree.leaves(on_accelerators), strict=True):
        np.testing.assert_array_equal(a, b)
