"""DQN on Gymnasium CartPole with a PyTorch learner, fed by `jaxbuf.HostLoop`, against the
same agent with a Stable-Baselines3-style NumPy replay buffer.

The loop a PyTorch user writes: a Gymnasium vector environment (8 CartPoles) steps in
Python, every step goes into the buffer, and the learner takes one batch of 256
transitions per environment step. With `HostLoop(steps_per_call=k)` the buffer stages
`k` steps and one call writes them and draws the next `k` batches, which the learner
receives as torch tensors (`output="torch"`, no copy) and takes one per step, so it
learns from data at most `k` steps old, as with SB3's `train_freq=k`. Everything else
(network, optimizer, exploration, seeds) is the same for both buffers.

Run: `python -m jaxbuf.examples.dqn_torch [--seeds 0 1 2] [--steps 50000]` (needs
`torch` and `gymnasium`). It prints the greedy return of each run on 32 fresh episodes
(500 at most) for the parameters kept by a greedy check every 2,500 steps, the same rule
for both buffers.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

import jaxbuf

ENVS, BATCH, CAPACITY, GAMMA = 8, 256, 100_000, 0.99
LEARNING_STARTS, TARGET_EVERY, EXPLORE_STEPS, CHECK_EVERY = 500, 250, 6_000, 2_500


class NumpyBuffer:
    """Stable-Baselines3's replay layout: obs and next_obs rows, uniform with replacement."""

    def __init__(self, seed: int):
        self.obs = np.zeros((CAPACITY, 4), np.float32)
        self.next_obs = np.zeros((CAPACITY, 4), np.float32)
        self.action = np.zeros(CAPACITY, np.int64)
        self.reward = np.zeros(CAPACITY, np.float32)
        self.terminated = np.zeros(CAPACITY, np.float32)
        self.position, self.full, self.rng = 0, False, np.random.default_rng(seed)

    def add(self, obs, action, reward, terminated, next_obs) -> None:
        rows = (self.position + np.arange(ENVS)) % CAPACITY
        self.obs[rows], self.next_obs[rows], self.action[rows] = obs, next_obs, action
        self.reward[rows], self.terminated[rows] = reward, terminated
        self.position = (self.position + ENVS) % CAPACITY
        self.full |= self.position < ENVS

    def sample(self) -> tuple:
        rows = self.rng.integers(0, CAPACITY if self.full else self.position, BATCH)
        discount = GAMMA * (1.0 - self.terminated[rows])
        return tuple(
            torch.from_numpy(x)
            for x in (
                self.obs[rows],
                self.action[rows],
                self.reward[rows],
                discount,
                self.next_obs[rows],
            )
        )


class JaxbufBuffer:
    """The same buffer as a `jaxbuf.HostLoop` over a transition buffer."""

    def __init__(self, seed: int, steps_per_call: int):
        buffer = jaxbuf.make_transition_buffer(
            ENVS, CAPACITY // ENVS, BATCH, discount=GAMMA, min_episode_length=1
        )  # short CartPole episodes
        obs = jnp.zeros(4, jnp.float32)
        example = jaxbuf.Transition(obs, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                    jnp.bool_(False), obs)  # fmt: skip
        self.loop = jaxbuf.HostLoop(buffer, buffer.init(example), jax.random.key(seed),
                                    steps_per_call=steps_per_call, output="torch")  # fmt: skip
        self.block, self.next = None, 0

    def add(self, obs, action, reward, terminated, truncated, next_obs) -> None:
        step = jaxbuf.Transition(obs, action.astype(np.int32), reward.astype(np.float32),
                                 terminated, truncated, next_obs)  # fmt: skip
        block = self.loop.add(step)
        if block is not None:
            self.block, self.next = block.experience, 0

    def sample(self) -> tuple | None:
        if self.block is None or self.next == len(self.block.reward):
            return None  # before the first block
        j, b = self.next, self.block
        self.next += 1
        return b.obs[j], b.action[j].long(), b.reward[j], b.discount[j], b.next_obs[j]


def q_network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84),
                               torch.nn.ReLU(), torch.nn.Linear(84, 2))  # fmt: skip


def learn(q, target, optimizer, batch) -> None:
    """One step of DQN on the Huber loss, gradients clipped to norm 10 (SB3's defaults):
    `r + discount * max_a Q'(s', a)`, the discount 0 after a termination."""
    obs, action, reward, discount, next_obs = batch
    with torch.no_grad():
        bootstrap = reward + discount * target(next_obs).max(dim=1).values
    chosen = q(obs).gather(1, action[:, None])[:, 0]
    loss = torch.nn.functional.smooth_l1_loss(chosen, bootstrap)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    optimizer.step()


def make_envs(seed: int) -> gym.vector.VectorEnv:
    envs = gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})  # fmt: skip
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs


def train(kind: str, seed: int, steps: int, steps_per_call: int = 32) -> tuple[dict, float]:
    """Trains for `steps` vector steps; returns the parameters kept by a greedy check every
    `CHECK_EVERY` steps (DQN on CartPole often collapses once solved, as SB3's `EvalCallback`
    best model guards against), and the seconds training took (checks excluded)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    buffer = NumpyBuffer(seed) if kind == "numpy" else JaxbufBuffer(seed, steps_per_call)
    q, target = q_network(), q_network()
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=5e-4)
    envs = make_envs(seed)
    obs, _ = envs.reset(seed=seed)
    start, updates, checking = time.perf_counter(), 0, 0.0
    best: tuple[float, dict] = (-1.0, {})
    for t in range(steps):
        epsilon = max(0.05, 1.0 - t / EXPLORE_STEPS)
        with torch.no_grad():
            greedy = q(torch.from_numpy(obs)).argmax(dim=1).numpy()
        action = np.where(rng.random(ENVS) < epsilon, rng.integers(0, 2, ENVS), greedy)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        final = next_obs.copy()  # SB3: infos[i]["terminal_observation"]
        for i in np.flatnonzero(terminated | truncated):
            final[i] = info["final_obs"][i]
        if kind == "numpy":
            buffer.add(obs, action, reward, terminated, final)
        else:
            buffer.add(obs, action, reward, terminated, truncated, final)
        obs = next_obs
        if t >= LEARNING_STARTS and (batch := buffer.sample()) is not None:
            learn(q, target, optimizer, batch)
            updates += 1
            if updates % TARGET_EVERY == 0:
                target.load_state_dict(q.state_dict())
        if (t + 1) % CHECK_EVERY == 0 or t + 1 == steps:
            check = time.perf_counter()
            score = evaluate(q, seed + t, episodes=8)
            if score >= best[0]:
                best = (score, {k: v.clone() for k, v in q.state_dict().items()})
            checking += time.perf_counter() - check
    return best[1], time.perf_counter() - start - checking


def evaluate(q: torch.nn.Module, seed: int, episodes: int = 32) -> float:
    """Mean return of the greedy policy over fresh episodes (500 at most)."""
    envs = make_envs(seed + 1000)
    obs, _ = envs.reset(seed=seed + 1000)
    returns, running = [], np.zeros(ENVS)
    while len(returns) < episodes:
        with torch.no_grad():
            action = q(torch.from_numpy(obs)).argmax(dim=1).numpy()
        obs, reward, terminated, truncated, _ = envs.step(action)
        running += reward
        for i in np.flatnonzero(terminated | truncated):
            returns.append(running[i])
            running[i] = 0
    return float(np.mean(returns[:episodes]))


def main(seeds: list[int], steps: int, out: str | None = None) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"numpy": [], "jaxbuf": []}
    rows = []
    for seed in seeds:
        for kind in results:
            parameters, seconds = train(kind, seed, steps)
            q = q_network()
            q.load_state_dict(parameters)
            results[kind].append(evaluate(q, seed + 10_000))
            rows.append(f"| {seed} | {kind} | {results[kind][-1]:.1f} | {seconds:.0f} |")
            print(f"seed {seed} {kind:6s}: greedy return {results[kind][-1]:6.1f} "
                  f"({seconds:.0f} s)", flush=True)  # fmt: skip
    for kind, returns in results.items():
        print(f"{kind:6s}: mean greedy return {np.mean(returns):.1f} over seeds {seeds}")
    if out is not None:
        write_table(out, steps, rows)
    return results


def write_table(path: str, steps: int, rows: list[str]) -> None:
    """The runs as a markdown table, with the machine and versions."""
    import platform

    versions = ", ".join(f"{m.__name__} {m.__version__}" for m in (jax, torch, gym, np))
    text = "\n".join([
        "# DQN with a PyTorch learner: jaxbuf.HostLoop against an SB3-style NumPy buffer",
        "",
        f"`python -m jaxbuf.examples.dqn_torch --steps {steps}`: 8 Gymnasium CartPoles, "
        f"{steps} vector steps, one batch of {BATCH} per step; `HostLoop(steps_per_call=32)`. "
        "Greedy return on 32 fresh episodes (500 at most) of the parameters kept by a greedy "
        f"check every {CHECK_EVERY} steps; seconds of training. Measured on "
        f"{platform.processor() or platform.machine()}, {jax.default_backend()}, Python "
        f"{platform.python_version()}, {versions}.",
        "",
        "| seed | buffer | greedy return | seconds |",
        "|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip
    with open(path, "w") as file:
        file.write(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=50_000, help="vector steps per run")
    parser.add_argument("--out", help="also write the runs as a markdown table there")
    arguments = parser.parse_args()
    main(arguments.seeds, arguments.steps, arguments.out)
