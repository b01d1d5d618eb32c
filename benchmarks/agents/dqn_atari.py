"""CleanRL's Atari DQN (`dqn_atari_jax.py`) with its Stable-Baselines3 buffer, and with jaxbuf.

The training loop of CleanRL's `dqn_atari_jax.py`: the same Atari wrappers (from
Stable-Baselines3), Q-network, optimizer, exploration schedule and hyperparameters, in a
Gymnasium loop of one environment. Only the replay buffer differs:

- `--buffer sb3`: what CleanRL uses, SB3's `ReplayBuffer(optimize_memory_usage=True)`, which
  stores every 4-frame stack (1M steps: 26.3 GiB);
- `--buffer jaxbuf`: `jaxbuf.make_transition_buffer(frames={"obs": 4}, min_episode_length=20)`
  fed by `jaxbuf.HostLoop(steps_per_call=4, batches_per_call=1)`: each frame stored once
  (1M steps: 7 GB), one call per 4 environment steps that writes them and draws the one batch
  the learner trains on (none before `learning_starts`).

Each run writes `benchmarks/results/dqn_atari/<buffer>_<buffer_size>_<seed>.json`: steps/s
while learning, the microseconds per environment step spent in the buffer (adding and
sampling, after the learner's pending update and the first 1,000 learning steps), peak
resident memory, and the episodic returns; `--summarize` turns them into
`dqn_atari_cpu.md`. Needs the `atari` extra (`pip install -e ".[atari]"`).

Run: `python -m benchmarks.agents.dqn_atari --buffer jaxbuf --buffer-size 100000
--total-timesteps 120000 --learning-starts 10000`; then `--summarize`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import resource
import time

import flax
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import jaxbuf
from benchmarks.common import _version as package_version

RESULTS = pathlib.Path(__file__).parents[1] / "results"
WARMUP = 1000  # learning steps left out of the buffer's time (compilation)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffer", choices=("sb3", "jaxbuf"), default="jaxbuf")
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=120_000)
    parser.add_argument("--buffer-size", type=int, default=100_000)
    parser.add_argument("--learning-starts", type=int, default=10_000)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--target-network-frequency", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-frequency", type=int, default=4)
    parser.add_argument("--exploration-steps", type=int, default=100_000,
                        help="steps over which epsilon falls from 1 to 0.01")  # fmt: skip
    parser.add_argument("--summarize", action="store_true", help="write dqn_atari_cpu.md")
    return parser.parse_args()


def make_env(env_id: str, seed: int):
    """CleanRL's Atari pipeline, on Gymnasium 0.29 (CleanRL's pin) or 1.x."""
    import ale_py
    from stable_baselines3.common import atari_wrappers as aw

    if hasattr(gym, "register_envs"):  # Gymnasium 1.x registers ALE's ids on request
        gym.register_envs(ale_py)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    env = aw.EpisodicLifeEnv(aw.MaxAndSkipEnv(aw.NoopResetEnv(env, noop_max=30), skip=4))
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = aw.FireResetEnv(env)
    env = gym.wrappers.ResizeObservation(aw.ClipRewardEnv(env), (84, 84))
    gray = getattr(gym.wrappers, "GrayscaleObservation", None) or gym.wrappers.GrayScaleObservation
    stack = getattr(gym.wrappers, "FrameStackObservation", None) or gym.wrappers.FrameStack
    env = stack(gray(env), 4)
    env.action_space.seed(seed)
    return env


def vector_env(env_id: str, seed: int) -> gym.vector.SyncVectorEnv:
    """One environment, reset in the step that ends an episode (Gymnasium 0.29's only
    mode; 1.x's `SAME_STEP`), so `final_obs` holds the true last observation."""
    options = {}
    if hasattr(gym.vector, "AutoresetMode"):
        options["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
    return gym.vector.SyncVectorEnv([lambda: make_env(env_id, seed)], **options)


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """`next_obs` with the true final observation where an episode ended (Gymnasium
    1.x: `final_obs`; 0.29: `final_observation`)."""
    final = infos.get("final_obs", infos.get("final_observation"))
    real = np.array(next_obs)
    if final is not None:
        for i in np.flatnonzero(infos.get("_final_obs", infos.get("_final_observation"))):
            real[i] = np.asarray(final[i])
    return real


def episode_returns(infos: dict) -> list[float]:
    """Episodic returns of the episodes that ended this step (0.29 and 1.x layouts)."""
    info = infos.get("final_info")
    if isinstance(info, dict):  # 1.x: a dict of arrays (no "episode" after a lost life)
        ended = (
            zip(info["episode"]["r"], info["_episode"], strict=True) if "episode" in info else ()
        )
        return [float(r) for r, done in ended if done]
    if info is not None:  # 0.29: one dict (or None) per environment
        return [float(i["episode"]["r"]) for i in info if i and "episode" in i]
    return []


class QNetwork(nn.Module):
    """CleanRL's Nature-DQN network on `[B, 4, 84, 84]` uint8 stacks."""

    action_dim: int

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
        x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
        x = nn.relu(nn.Dense(512)(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.action_dim)(x)


class QState(TrainState):
    target_params: flax.core.FrozenDict


def learner(network: QNetwork, gamma: float):
    @jax.jit
    def update(q_state, observations, actions, next_observations, rewards, dones):
        q_next = jnp.max(network.apply(q_state.target_params, next_observations), axis=-1)
        target = rewards + (1 - dones) * gamma * q_next

        def mse_loss(params):
            q = network.apply(params, observations)[jnp.arange(actions.shape[0]), actions]
            return ((q - target) ** 2).mean(), q

        (loss, q), grads = jax.value_and_grad(mse_loss, has_aux=True)(q_state.params)
        return loss, q, q_state.apply_gradients(grads=grads)

    return update


class SB3Buffer:
    """CleanRL's buffer: SB3's `ReplayBuffer`, one batch every `train_frequency` steps."""

    def __init__(self, args: argparse.Namespace, envs: gym.vector.SyncVectorEnv):
        from stable_baselines3.common.buffers import ReplayBuffer

        self.args = args
        self.rb = ReplayBuffer(args.buffer_size, envs.single_observation_space,
                               envs.single_action_space, "cpu", optimize_memory_usage=True,
                               handle_timeout_termination=False)  # fmt: skip
        self.nbytes = sum(getattr(self.rb, name).nbytes
                          for name in ("observations", "actions", "rewards", "dones"))  # fmt: skip

    def add(self, obs, real_next_obs, actions, rewards, terminations, truncations, step: int):
        """Adds a step; returns the batch to train on, when the learner trains."""
        self.rb.add(obs, real_next_obs, actions, rewards, terminations, [{}])
        if step <= self.args.learning_starts or step % self.args.train_frequency:
            return None
        data = self.rb.sample(self.args.batch_size)
        return (data.observations.numpy(), data.actions.numpy().ravel(),
                data.next_observations.numpy(), data.rewards.numpy().ravel(),
                data.dones.numpy().ravel())  # fmt: skip


class JaxbufBuffer:
    """Frames stored once; HostLoop writes 4 steps and draws the learner's one batch
    per call (no batch before `learning_starts`)."""

    def __init__(self, args: argparse.Namespace, envs: gym.vector.SyncVectorEnv):
        self.args = args
        size, batch = args.buffer_size, args.batch_size
        buffer = jaxbuf.make_transition_buffer(1, size, batch, frames={"obs": 4},
                                               min_episode_length=20)  # fmt: skip
        frame = jnp.zeros(envs.single_observation_space.shape[1:], jnp.uint8)  # one frame
        example = jaxbuf.Transition(frame, jnp.int32(0), jnp.float32(0), jnp.bool_(False),
                                    jnp.bool_(False), frame)  # fmt: skip
        self.nbytes = jaxbuf.memory(buffer, example).total
        self.loop = jaxbuf.HostLoop(buffer, buffer.init(example), jax.random.key(args.seed),
                                    steps_per_call=args.train_frequency,
                                    batches_per_call=1)  # fmt: skip

    def add(self, obs, real_next_obs, actions, rewards, terminations, truncations, step: int):
        """Adds a step (the newest frame of each stack); returns the batch to train on
        when a block arrives."""
        step_data = jaxbuf.Transition(obs[:, -1], actions.astype(np.int32),
                                      rewards.astype(np.float32), terminations, truncations,
                                      real_next_obs[:, -1])  # fmt: skip
        block = self.loop.add(step_data, draw=step > self.args.learning_starts)
        if block is None:
            return None
        b = block.experience
        return b.obs[0], b.action[0], b.next_obs[0], b.reward[0], (b.discount[0] == 0) * 1.0


def train(args: argparse.Namespace) -> dict:
    random.seed(args.seed)
    np.random.seed(args.seed)
    envs = vector_env(args.env_id, args.seed)
    obs, _ = envs.reset(seed=args.seed)
    network = QNetwork(action_dim=envs.single_action_space.n)
    params = network.init(jax.random.split(jax.random.PRNGKey(args.seed))[1], obs)
    q_state = QState.create(apply_fn=network.apply, params=params, target_params=params,
                            tx=optax.adam(learning_rate=args.learning_rate))  # fmt: skip
    act, update = jax.jit(network.apply), learner(network, args.gamma)
    buffer = (SB3Buffer if args.buffer == "sb3" else JaxbufBuffer)(args, envs)
    record = {"returns": [], "buffer_seconds": 0.0, "updates": 0, "buffer_bytes": buffer.nbytes}
    for step in range(args.total_timesteps):
        if step == args.learning_starts + 1:
            record["learning_since"] = time.perf_counter()
        epsilon = max(1 - 0.99 * step / args.exploration_steps, 0.01)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample()])
        else:
            actions = np.asarray(act(q_state.params, obs).argmax(axis=-1))
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        record["returns"] += [(step, r) for r in episode_returns(infos)]
        real_next_obs = final_observations(next_obs, infos)
        timed = step > args.learning_starts + WARMUP
        if timed:  # the buffer's own time, not a learner's update running beside it
            jax.block_until_ready(q_state)
        start = time.perf_counter()
        batch = buffer.add(obs, real_next_obs, actions, rewards, terminations, truncations, step)
        if timed:
            record["buffer_seconds"] += time.perf_counter() - start
        obs = next_obs
        if batch is not None:
            _, _, q_state = update(q_state, *batch)
            record["updates"] += 1
        if step > args.learning_starts and step % args.target_network_frequency == 0:
            q_state = q_state.replace(target_params=q_state.params)
        if step % 10_000 == 0:
            print(f"step {step}: {len(record['returns'])} episodes", flush=True)
    jax.block_until_ready(q_state)
    return finished(args, record)


def finished(args: argparse.Namespace, record: dict) -> dict:
    learning_steps = args.total_timesteps - args.learning_starts - 1
    return {
        "buffer": args.buffer, "buffer_size": args.buffer_size, "seed": args.seed,
        "env_id": args.env_id, "total_timesteps": args.total_timesteps,
        "learning_starts": args.learning_starts, "updates": record["updates"],
        "sps_learning": learning_steps / (time.perf_counter() - record["learning_since"]),
        "buffer_us": record["buffer_seconds"] / (learning_steps - WARMUP) * 1e6,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "buffer_gib": record["buffer_bytes"] / 2**30, "returns": record["returns"],
        "versions": {p: package_version(p) for p in ("jaxbuf", "jax", "gymnasium", "ale-py",
                                                    "stable_baselines3")},
    }  # fmt: skip


def main() -> None:
    args = arguments()
    if args.summarize:
        from benchmarks.reports.dqn_atari_report import summarize

        summarize(RESULTS / "dqn_atari", RESULTS)
        return
    folder = RESULTS / "dqn_atari"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{args.buffer}_{args.buffer_size}_{args.seed}.json"
    try:
        result = train(args)
    except MemoryError as error:  # SB3's buffer of 1M stacks on a machine of 24 GiB
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result = {"buffer": args.buffer, "buffer_size": args.buffer_size, "seed": args.seed,
                  "error": f"MemoryError: {error}", "peak_rss_gib": peak}  # fmt: skip
    path.write_text(json.dumps(result, indent=1))
    print({k: v for k, v in result.items() if k != "returns"})


if __name__ == "__main__":
    main()
