"""The actor side of `jaxbuf.examples.apex_cartpole`: NumPy, Gymnasium and a Writer.

An actor process imports only this module (NumPy, Gymnasium, Ray and `jaxbuf.ray`'s
writer), not the learner's JAX, Flax and Optax: it starts in about a second.

Each actor steps its own Gymnasium environments with a NumPy copy of the network, forms
n-step transitions itself (a truncated episode bootstraps from its true final
observation, a terminated one does not) with their initial priorities, |TD error| under
its copy, and sends them with a `jaxbuf.ray.Writer`.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np

from jaxbuf.ray.writer import Writer


def q_values(params: Any, obs: np.ndarray) -> np.ndarray:
    """`QNetwork` in NumPy (an actor's copy): float32 `[B, actions]` for obs `[B, 4]`."""
    layers = params["params"]
    x = obs
    for i in range(len(layers)):
        x = x @ layers[f"Dense_{i}"]["kernel"] + layers[f"Dense_{i}"]["bias"]
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


class NStep:
    """One environment's n-step transitions: `(obs, action, return, discount, next_obs)`
    with discount gamma^k, or 0 where the episode terminated within the k steps."""

    def __init__(self, n: int, discount: float) -> None:
        self.n, self.gamma, self.recent = n, discount, collections.deque()

    def step(self, obs, action, reward, next_obs, terminated: bool, truncated: bool) -> list:
        self.recent.append((obs, action, reward))
        if terminated or truncated:
            out = [self._emit(next_obs, terminated) for _ in range(len(self.recent))]
            return out
        return [self._emit(next_obs, False)] if len(self.recent) == self.n else []

    def _emit(self, next_obs, terminated: bool) -> dict:
        rewards = [r for _, _, r in self.recent]
        obs, action, _ = self.recent.popleft()
        total = sum(self.gamma**i * r for i, r in enumerate(rewards))
        return {"obs": obs, "action": np.int32(action), "reward": np.float32(total),
                "discount": np.float32(0.0 if terminated else self.gamma ** len(rewards)),
                "next_obs": next_obs}  # fmt: skip


class Acting:
    """An actor's environments and policy: Gymnasium's CartPole-v1 stepped in NumPy, the
    network's NumPy copy, n-step transitions with their initial priorities."""

    def __init__(self, index: int, config: dict, seed: int) -> None:
        import gymnasium as gym

        self.config = config
        self.envs = [gym.make("CartPole-v1") for _ in range(config["envs_per_actor"])]
        self.obs = np.stack([env.reset(seed=seed * 1000 + index * 100 + i)[0]
                             for i, env in enumerate(self.envs)]).astype(np.float32)  # fmt: skip
        self.nsteps = [NStep(config["n_step"], config["discount"]) for _ in self.envs]
        self.rng = np.random.default_rng([seed, index])
        self.returns, self._running = [], np.zeros(len(self.envs))

    def step(self, params: Any, epsilon: float) -> tuple[list, np.ndarray]:
        """One step of every environment: the transitions completed, and their priorities."""
        actions = self._act(params, epsilon)
        transitions = []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            obs = obs.astype(np.float32)
            # a copy: the row of `self.obs` is overwritten below, the transition keeps it
            transitions += self.nsteps[i].step(self.obs[i].copy(), actions[i], float(reward), obs,
                                               terminated, truncated)  # fmt: skip
            self._running[i] += reward
            if terminated or truncated:
                self.returns.append(self._running[i])
                self._running[i] = 0.0
                obs = env.reset()[0].astype(np.float32)
            self.obs[i] = obs
        return transitions, self._priorities(params, transitions)

    def epsilon(self, done: int, steps: int) -> float:
        """`dqn_nstep`'s schedule, over this actor's `steps`."""
        c = self.config
        frac = min(done / (c["epsilon_fraction"] * steps), 1.0)
        return c["epsilon_start"] + frac * (c["epsilon_end"] - c["epsilon_start"])

    def _act(self, params: Any, epsilon: float) -> np.ndarray:
        explore = self.rng.random(len(self.envs)) < epsilon
        random_actions = self.rng.integers(0, 2, len(self.envs))
        if params is None:
            return random_actions
        return np.where(explore, random_actions, q_values(params, self.obs).argmax(axis=1))

    def _priorities(self, params: Any, transitions: list) -> np.ndarray:
        if not transitions:
            return np.zeros(0, np.float32)
        if params is None:
            return np.ones(len(transitions), np.float32)
        stacked = {k: np.stack([t[k] for t in transitions]) for k in transitions[0]}
        q = q_values(params, stacked["obs"])[np.arange(len(transitions)), stacked["action"]]
        next_q = q_values(params, stacked["next_obs"]).max(axis=1)
        target = stacked["reward"] + stacked["discount"] * next_q
        return (np.abs(target - q) + self.config["priority_floor"]).astype(np.float32)


class Actor:
    """An actor process (a Ray actor made by `train`): `Acting`, whose transitions a
    `jaxbuf.ray.Writer` sends, with the parameters the learner last published."""

    def __init__(self, inbox: str, index: int, config: dict, seed: int, namespace: str) -> None:
        self.acting = Acting(index, config, seed)
        self.writer = Writer(inbox, f"actor-{index}", block_size=config["block_size"],
                             window=config["window"], namespace=namespace)  # fmt: skip

    def run(self, steps: int) -> dict:
        """Steps every environment until `steps` transitions are sent; returns counts (the
        process's CPU seconds over the run among them)."""
        start, cpu, done, iteration, params = time.perf_counter(), time.process_time(), 0, 0, None
        while done < steps:
            if iteration % self.acting.config["fetch_every"] == 0 or params is None:
                params = self.writer.params()
            transitions, priorities = self.acting.step(params, self.acting.epsilon(done, steps))
            for transition, priority in zip(transitions, priorities, strict=True):
                self.writer.append(transition, priority=priority)
            done += len(self.acting.envs)
            iteration += 1
        self.writer.flush()
        self.writer.wait(timeout=120)
        return {"steps": self.writer.written_steps, "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu,
                "returns": self.acting.returns[-20:]}  # fmt: skip
