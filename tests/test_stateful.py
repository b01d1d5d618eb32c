"""Stateful property tests: Hypothesis drives random interleavings of every
operation of every sampled kind × sampler (and of the queue and the rollout
buffer) against plain-Python models of what is stored and what may be drawn.

Operations: `add` of random sizes (zero included, which must raise and change
nothing), `sample` (every valid row checked against the history), `take`,
`set_priorities` with extreme, duplicate and invalid values, `save`/`restore`,
and a `DatasetWriter` following the buffer, flushed and compared at the end.
Counters start at 0, near 2**31 or near 2**32 (where `added` wraps).

CI runs the `ci` profile; `HYPOTHESIS_PROFILE=long pytest tests/test_stateful.py`
runs 50 times more examples.
"""

import functools
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import jaxbuf

settings.register_profile(
    "ci", max_examples=6, stateful_step_count=12, deadline=None, derandomize=True,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip
settings.register_profile(
    "long", max_examples=300, stateful_step_count=40, deadline=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

NUM_ENVS, CAPACITY, BATCH, LENGTH, N_STEP, GAMMA = 2, 7, 5, 3, 2, 0.5
ENV_STRIDE = 10**6
STARTS = [0, 2**31 - 3, 2**32 - 5]  # where `added` starts
PRIORITIES = [0.0, 1e-45, 1e-40, 1e-30, 0.5, 1.0, 7.0, 1e30, 3e38, -1.0, np.nan, np.inf]


def sampler_of(name):
    return jaxbuf.uniform() if name == "uniform" else jaxbuf.prioritized(0.7)


@functools.cache
def compiled(kind, sampler):
    """One buffer and its jitted functions per kind × sampler, shared by every run."""
    s = sampler_of(sampler)
    if kind == "replay":
        buffer = jaxbuf.make_replay_buffer(CAPACITY, BATCH, sampler=s)
    elif kind == "trajectory":
        buffer = jaxbuf.make_trajectory_buffer(NUM_ENVS, CAPACITY, BATCH, LENGTH, sampler=s)
    elif kind == "transition":
        buffer = jaxbuf.make_transition_buffer(
            NUM_ENVS, CAPACITY, BATCH, n_step=N_STEP, discount=GAMMA, sampler=s
        )
    else:
        buffer = jaxbuf.make_episode_buffer(
            NUM_ENVS, CAPACITY, BATCH, 4, done_fn=lambda step: step["done"], sampler=s
        )
    functions = {
        "add": jax.jit(buffer.add),
        "sample": jax.jit(buffer.sample),
        "take": jax.jit(buffer.take),
        "set_priorities": None if buffer.set_priorities is None else jax.jit(buffer.set_priorities),
    }
    return buffer, functions


def steps_of(kind, ids, done, truncated):
    """Data for one add: ids `[N, T]` (or `[B]` for replay) with flags."""
    if kind == "replay":
        return {"id": jnp.asarray(ids, jnp.int32), "done": jnp.asarray(done)}
    obs = jnp.asarray(ids, jnp.float32)[..., None]
    if kind == "transition":
        return jaxbuf.Transition(
            obs=obs, action=jnp.asarray(ids, jnp.int32), reward=jnp.asarray(ids % 5, jnp.float32),
            terminated=jnp.asarray(done & ~truncated), truncated=jnp.asarray(truncated),
            next_obs=-obs - 0.5,
        )  # fmt: skip
    return {"id": jnp.asarray(ids, jnp.int32), "done": jnp.asarray(done | truncated)}


class BufferMachine(RuleBasedStateMachine):
    """A sampled buffer against the history of everything added to it."""

    kind = "replay"
    sampler = "uniform"

    @initialize(start=st.sampled_from(STARTS), seed=st.integers(0, 2**16))
    def begin(self, start, seed):
        self.buffer, self.fn = compiled(self.kind, self.sampler)
        self.rng = np.random.default_rng(seed)
        per_env = self.kind != "replay"
        example = jax.tree.map(lambda x: x[0, 0] if per_env else x[0],
                               steps_of(self.kind, np.zeros((1, 1) if per_env else 1, int),
                                        np.zeros((1, 1) if per_env else 1, bool),
                                        np.zeros((1, 1) if per_env else 1, bool)))  # fmt: skip
        state = self.buffer.init(example)
        state = state.replace(added=jnp.uint32(start))
        if self.kind == "episode":
            state = state.replace(side=state.side.replace(
                open_start=jnp.full(NUM_ENVS, start, jnp.uint32)))  # fmt: skip
        self.state = state
        self.history = [[] for _ in range(NUM_ENVS if per_env else 1)]  # step dicts
        self.last_indices = None
        self.folder = tempfile.mkdtemp()
        self.writer = jaxbuf.io.DatasetWriter(f"{self.folder}/data", self.state)
        self.appended = 0

    # -- adds -------------------------------------------------------------------

    @rule(count=st.sampled_from([0, 1, 3, CAPACITY]), done_rate=st.sampled_from([0.0, 0.3, 0.8]))
    def add(self, count, done_rate):
        lead = (count,) if self.kind == "replay" else (NUM_ENVS, count)
        # Step ids: env * 10**6 + the step's number in its environment, from 1.
        first = 1 + len(self.history[0]) + ENV_STRIDE * np.arange(len(self.history))[:, None]
        ids = (first + np.arange(count)).reshape(lead)
        done = self.rng.random(lead) < done_rate
        truncated = done & (self.rng.random(lead) < 0.5)
        data = steps_of(self.kind, ids, done, truncated)
        if count == 0:
            before = jax.device_get(self.state)
            with pytest.raises(ValueError, match=r"no (items|steps)"):
                self.fn["add"](self.state, data)
            jax.tree.map(np.testing.assert_array_equal, jax.device_get(self.state), before)
            return
        self.state = self.fn["add"](self.state, data)
        rows = ids[None] if self.kind == "replay" else ids
        for env, row in enumerate(rows):
            for j, i in enumerate(row):
                flags = (done[env, j], truncated[env, j]) if self.kind != "replay" else (done[j], 0)
                self.history[env].append({"id": int(i), "done": bool(flags[0]),
                                          "truncated": bool(flags[1])})  # fmt: skip
        self.appended += self.writer.append(self.state)

    # -- what is stored -----------------------------------------------------------

    @invariant()
    def stored_is_the_newest_history(self):
        if not hasattr(self, "state"):
            return
        columns = jaxbuf.io.stored_items(self.state)
        key = "action" if self.kind == "transition" else "id"
        got = np.asarray(columns[key])
        if self.kind == "replay":
            want = [s["id"] for s in self.history[0][-CAPACITY:]]
            assert sorted(got.tolist()) == sorted(want)
            return
        for env in range(NUM_ENVS):
            want = [s["id"] for s in self.history[env][-CAPACITY:]]
            assert got[np.asarray(columns["env"]) == env].tolist() == want

    # -- sampling -----------------------------------------------------------------

    @rule(seed=st.integers(0, 2**31 - 1), beta=st.sampled_from([0.0, 0.4, 1.0]))
    def sample(self, seed, beta):
        options = {"importance_exponent": beta} if self.sampler == "prioritized" else {}
        batch = jax.device_get(self.fn["sample"](self.state, jax.random.key(seed), **options))
        if not bool(self.buffer.can_sample(self.state)):
            assert not batch.valid.any()
        taken = jax.device_get(self.fn["take"](self.state, jnp.asarray(batch.indices)))
        for row in np.flatnonzero(batch.valid):
            one = jax.tree.map(lambda x, row=row: x[row], batch)
            again = jax.tree.map(lambda x, row=row: x[row], taken)
            jax.tree.map(np.testing.assert_array_equal, again, one.experience)
            self.check_row(one)
            if batch.weights is not None:
                assert 0 < one.weights <= 1 and one.probabilities > 0
        self.last_indices = np.asarray(batch.indices)

    def stored_ids(self, env):
        return [s["id"] for s in self.history[env][-CAPACITY:]]

    @staticmethod
    def env_of(step_id):
        return int(step_id) // ENV_STRIDE

    def check_row(self, one):
        if self.kind == "replay":
            assert int(one.experience["id"]) in self.stored_ids(0)
        elif self.kind == "trajectory":
            ids = one.experience["id"].tolist()
            stored = self.stored_ids(self.env_of(ids[0]))
            assert ids == list(range(ids[0], ids[0] + LENGTH)) and set(ids) <= set(stored)
        elif self.kind == "transition":
            self.check_transition(one)
        else:
            self.check_episode(one)

    def check_transition(self, one):
        start = int(one.experience.action)
        env = self.env_of(start)
        history, stored = self.history[env], self.stored_ids(env)
        index = [s["id"] for s in history].index(start)
        assert start in stored and index + N_STEP < len(history)  # n following steps stored
        assert start + N_STEP in stored
        reward, j = 0.0, 0
        for j in range(N_STEP):
            step = history[index + j]
            reward += GAMMA**j * (step["id"] % 5)
            if step["done"]:
                break
        np.testing.assert_allclose(one.experience.reward, reward, rtol=1e-6)
        ended = history[index + j]
        terminated = ended["done"] and not ended["truncated"]
        assert bool(one.experience.terminated) == terminated
        assert int(one.length) == j + 1
        want_discount = 0.0 if terminated else GAMMA ** (j + 1)
        np.testing.assert_allclose(one.experience.discount, want_discount)
        following = -ended["id"] - 0.5 if ended["done"] else history[index + N_STEP]["id"]
        np.testing.assert_allclose(one.experience.next_obs[0], following)

    def check_episode(self, one):
        length = int(one.length)
        ids = one.experience["id"][: min(length, 4)].tolist()
        env = self.env_of(ids[0])
        history = self.history[env]
        index = [s["id"] for s in history].index(ids[0])
        assert index == 0 or history[index - 1]["done"]  # starts an episode
        episode = history[index : index + length]
        assert len(episode) == length and episode[-1]["done"]  # complete
        assert not any(s["done"] for s in episode[:-1])
        assert {s["id"] for s in episode} <= set(self.stored_ids(env))  # every step stored
        assert ids == [s["id"] for s in episode[:4]]

    # -- priorities -----------------------------------------------------------------

    @precondition(lambda self: self.sampler == "prioritized" and self.last_indices is not None)
    @rule(data=st.data())
    def set_priorities(self, data):
        count = len(self.last_indices)
        picks = data.draw(st.lists(st.sampled_from(PRIORITIES), min_size=count, max_size=count))
        indices = self.last_indices.copy()
        if data.draw(st.booleans()):
            indices[-1] = indices[0]  # a duplicate: the last one wins
        before = int(self.state.sampler.rejected)
        self.state = self.fn["set_priorities"](
            self.state, jnp.asarray(indices), jnp.asarray(picks, jnp.float32)
        )
        bad = sum(not (np.isfinite(p) and p >= 0) for p in picks)
        assert int(self.state.sampler.rejected) >= before + bad
        tree = self.state.sampler.tree
        assert np.isfinite(float(tree.total)) and float(tree.total) >= 0
        slots = jnp.arange(self.buffer.layout.num_slots)
        leaves = np.asarray(jaxbuf.core.sumtree.tree.leaves(tree, slots))
        usable = np.asarray(self.buffer.layout.usable(self.state, slots))
        assert not (leaves > 0)[~usable].any()  # only drawable slots carry mass

    # -- persistence ------------------------------------------------------------------

    @rule()
    def save_and_restore(self):
        folder = jaxbuf.save(f"{self.folder}/ckpt", self.state, self.buffer)
        template = jax.eval_shape(lambda: self.state)
        restored = jaxbuf.restore(folder, template, self.buffer)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored),
                     jax.device_get(self.state))  # fmt: skip
        self.state = restored

    def teardown(self):
        if not hasattr(self, "writer"):
            return
        self.writer.flush()
        data = jaxbuf.io.read_dataset(self.writer.path)
        got = np.asarray(data["action"] if self.kind == "transition" else data["id"])
        if self.kind == "replay":
            want = [s["id"] for s in self.history[0]]
        else:  # time-major: every environment's step t, then t + 1
            want = [h[t]["id"] for t in range(len(self.history[0])) for h in self.history]
        assert got.tolist() == want and self.appended == len(got) // max(1, len(self.history))


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
@pytest.mark.parametrize("kind", ["replay", "trajectory", "transition", "episode"])
def test_buffer_state_machine(kind, sampler):
    machine = type(f"{kind}_{sampler}", (BufferMachine,), {"kind": kind, "sampler": sampler})
    machine.TestCase().runTest()


QUEUE = jaxbuf.make_queue(capacity=7, add_batch_size=3, sample_batch_size=2)
QUEUE_ADD, QUEUE_POP = jax.jit(QUEUE.add), jax.jit(QUEUE.pop)


class QueueMachine(RuleBasedStateMachine):
    """The queue against a Python deque; counters start near their limits."""

    @initialize(added=st.sampled_from(STARTS), dropped=st.sampled_from([0, 2**31 - 4]))
    def begin(self, added, dropped):
        state = QUEUE.init(jnp.int32(0))
        self.state = state.replace(added=jnp.uint32(added), dropped=jnp.int32(dropped))
        self.queue, self.dropped, self.next_id = [], dropped, 0

    @rule()
    def add(self):
        items = self.next_id + np.arange(3)
        self.next_id += 3
        self.state = QUEUE_ADD(self.state, jnp.asarray(items, jnp.int32))
        if len(self.queue) + 3 <= 7:
            self.queue += items.tolist()
        else:
            self.dropped = min(self.dropped + 3, 2**31 - 1)

    @rule()
    def pop(self):
        self.state, batch = QUEUE_POP(self.state)
        if len(self.queue) >= 2:
            assert batch.valid.all() and batch.experience.tolist() == self.queue[:2]
            self.queue = self.queue[2:]
        else:
            assert not batch.valid.any()

    @invariant()
    def agrees(self):
        if hasattr(self, "state"):
            assert jaxbuf.io.stored_items(self.state)[""].tolist() == self.queue
            assert int(self.state.dropped) == self.dropped and int(self.state.size) == len(
                self.queue
            )


ROLLOUT = jaxbuf.make_rollout_buffer(3, 2, discount=0.9, gae_lambda=0.8)
ROLLOUT_ADD, ROLLOUT_FINISH = jax.jit(ROLLOUT.add), jax.jit(ROLLOUT.finish)


class RolloutMachine(RuleBasedStateMachine):
    """The rollout buffer's size, drops and stored steps against a list."""

    @initialize(dropped=st.sampled_from([0, 2**31 - 2]))
    def begin(self, dropped):
        example = {k: jnp.float32(0) for k in ("reward", "value", "final_value")}
        example |= {"terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}
        self.state = ROLLOUT.init(example).replace(dropped=jnp.int32(dropped))
        self.steps, self.dropped = [], dropped

    @rule(reward=st.sampled_from([0.0, 1.0, -2.5]), done=st.booleans())
    def add(self, reward, done):
        step = {"reward": jnp.full(2, reward), "value": jnp.ones(2), "final_value": jnp.zeros(2),
                "terminated": jnp.full(2, done), "truncated": jnp.zeros(2, bool)}  # fmt: skip
        self.state = ROLLOUT_ADD(self.state, step)
        if len(self.steps) < 3:
            self.steps.append(reward)
        else:
            self.dropped = min(self.dropped + 1, 2**31 - 1)

    @rule()
    def finish_and_clear(self):
        self.state = ROLLOUT_FINISH(self.state, jnp.zeros(2))
        returns = jaxbuf.io.stored_items(self.state)["return"]
        assert len(returns) == 2 * len(self.steps) and np.all(np.isfinite(returns))
        self.state, self.steps, self.dropped = ROLLOUT.clear(self.state), [], 0

    @invariant()
    def agrees(self):
        if hasattr(self, "state"):
            assert int(self.state.size) == len(self.steps)
            assert int(self.state.dropped) == self.dropped
            assert (
                jaxbuf.io.stored_items(self.state)["reward"].tolist()
                == np.repeat(self.steps, 2).tolist()
            )


@pytest.mark.parametrize("machine", [QueueMachine, RolloutMachine], ids=["queue", "rollout"])
def test_queue_and_rollout_state_machines(machine):
    machine.TestCase().runTest()
