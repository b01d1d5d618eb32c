"""PPO on gymnax CartPole-v1 with a jaxbuf rollout buffer, the whole loop jitted.

Run with `python -m jaxbuf.examples.ppo_cartpole [--seed N] [--quiet]`.

Every update collects `num_steps` steps from vmapped environments into the
rollout buffer, computes GAE advantages with `finish` (time-limit truncations
bootstrap from the value of the true final observation, read from gymnax's
`info["final_observation"]`), and runs several epochs of clipped-PPO updates on
the buffer's shuffled, normalized minibatches: all of it one `lax.scan` step
(the PureJaxRL recipe). Training runs as jitted chunks of updates, printing
progress between them; the final greedy policy is evaluated on fresh episodes.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxbuf
from jaxbuf.examples._common import command_line, evaluate_and_report

CONFIG = dict(
    num_envs=4,
    num_steps=128,
    total_timesteps=500_000,
    update_epochs=4,
    num_minibatches=4,
    learning_rate=2.5e-4,
    discount=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    entropy_coef=0.01,
    value_coef=0.5,
    max_grad_norm=0.5,
    num_chunks=10,
    eval_envs=64,
)


class ActorCritic(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        def mlp(x, out, scale):
            for _ in range(2):
                x = nn.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(scale))(x)

        return mlp(obs, self.num_actions, 0.01), mlp(obs, 1, 1.0)[..., 0]


class Runner(NamedTuple):
    params: Any
    opt_state: Any
    rollout: jaxbuf.types.RolloutBufferState
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array  # [num_envs] return of the running episodes
    last_returns: jax.Array  # [num_envs] return of each environment's last episode
    key: jax.Array


def make_train(config: dict, env, env_params):
    network = ActorCritic(env.action_space(env_params).n)
    num_updates = config["total_timesteps"] // (config["num_envs"] * config["num_steps"])
    steps_per_update = config["update_epochs"] * config["num_minibatches"]
    schedule = optax.linear_schedule(config["learning_rate"], 0.0, num_updates * steps_per_update)
    optimizer = optax.chain(
        optax.clip_by_global_norm(config["max_grad_norm"]), optax.adam(schedule, eps=1e-5)
    )
    buffer = jaxbuf.make_rollout_buffer(
        config["num_steps"], config["num_envs"],
        discount=config["discount"], gae_lambda=config["gae_lambda"],
    )  # fmt: skip
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key: jax.Array) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(env_key, config["num_envs"]), env_params)
        params = network.init(net_key, obs[0])
        example = {
            "obs": obs[0],
            "action": jnp.int32(0),
            "log_prob": jnp.float32(0),
            "reward": jnp.float32(0),
            "value": jnp.float32(0),
            "final_value": jnp.float32(0),
            "terminated": jnp.bool_(False),
            "truncated": jnp.bool_(False),
        }
        zeros = [jnp.zeros(config["num_envs"], jnp.float32) for _ in range(2)]
        return Runner(
            params, optimizer.init(params), buffer.init(example), env_state, obs, *zeros, key
        )

    def env_step(runner: Runner, key: jax.Array) -> tuple[Runner, None]:
        action_key, step_key = jax.random.split(key)
        logits, value = network.apply(runner.params, runner.obs)
        action = jax.random.categorical(action_key, logits).astype(jnp.int32)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
        obs, env_state, reward, terminated, truncated, info = step_env(
            jax.random.split(step_key, config["num_envs"]), runner.env_state, action, env_params
        )
        _, final_value = network.apply(runner.params, info["final_observation"])
        step = {
            "obs": runner.obs, "action": action, "log_prob": log_prob,
            "reward": reward.astype(jnp.float32), "value": value, "final_value": final_value,
            "terminated": terminated, "truncated": truncated,
        }  # fmt: skip
        done = terminated | truncated
        episode_return = runner.episode_return + reward
        return runner._replace(
            rollout=buffer.add(runner.rollout, step), env_state=env_state, obs=obs,
            episode_return=jnp.where(done, 0.0, episode_return),
            last_returns=jnp.where(done, episode_return, runner.last_returns),
        ), None  # fmt: skip

    def loss_fn(params, batch: jaxbuf.types.RolloutBatch) -> jax.Array:
        steps = batch.experience
        logits, value = network.apply(params, steps["obs"])
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, steps["action"][:, None], 1)[:, 0]
        clip = config["clip_eps"]
        value_clipped = steps["value"] + jnp.clip(value - steps["value"], -clip, clip)
        value_loss = (
            0.5
            * jnp.maximum((value - batch.returns) ** 2, (value_clipped - batch.returns) ** 2).mean()
        )
        ratio = jnp.exp(log_prob - steps["log_prob"])
        advantages = batch.advantages
        actor_loss = -jnp.minimum(
            ratio * advantages, jnp.clip(ratio, 1 - clip, 1 + clip) * advantages
        ).mean()
        entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
        return actor_loss + config["value_coef"] * value_loss - config["entropy_coef"] * entropy

    def learn(carry, batch: jaxbuf.types.RolloutBatch):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    def update(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, collect_key, epoch_key = jax.random.split(runner.key, 3)
        runner = runner._replace(rollout=buffer.clear(runner.rollout), key=key)
        keys = jax.random.split(collect_key, config["num_steps"])
        runner, _ = jax.lax.scan(env_step, runner, keys)
        _, last_value = network.apply(runner.params, runner.obs)
        rollout = buffer.finish(runner.rollout, last_value)

        def epoch(carry, key):
            batches = buffer.minibatches(rollout, key, config["num_minibatches"])
            return jax.lax.scan(learn, carry, batches)

        epoch_keys = jax.random.split(epoch_key, config["update_epochs"])
        (params, opt_state), losses = jax.lax.scan(
            epoch, (runner.params, runner.opt_state), epoch_keys
        )
        runner = runner._replace(params=params, opt_state=opt_state, rollout=rollout)
        return runner, losses.mean()

    def train_chunk(runner: Runner) -> tuple[Runner, jax.Array]:
        runner, losses = jax.lax.scan(update, runner, length=num_updates // config["num_chunks"])
        return runner, losses.mean()

    return init, jax.jit(train_chunk, donate_argnums=0), network


def main(seed: int = 0, quiet: bool = False) -> float:
    env, env_params = gymnax.make("CartPole-v1")
    init, train_chunk, network = make_train(CONFIG, env, env_params)
    runner = init(jax.random.key(seed))
    per_chunk = (
        CONFIG["total_timesteps"]
        // (CONFIG["num_envs"] * CONFIG["num_steps"])
        // CONFIG["num_chunks"]
        * CONFIG["num_envs"]
        * CONFIG["num_steps"]
    )
    start = time.perf_counter()
    for chunk in range(1, CONFIG["num_chunks"] + 1):
        runner, loss = train_chunk(runner)
        if not quiet:
            print(
                f"[{time.perf_counter() - start:6.1f}s] timesteps {chunk * per_chunk:>7d}"
                f"  episode return {float(runner.last_returns.mean()):6.1f}"
                f"  loss {float(loss):.4f}",
                flush=True,
            )

    def greedy(params, obs):
        return jnp.argmax(network.apply(params, obs)[0], axis=1)

    return evaluate_and_report(
        greedy, env, env_params, runner.params, seed, start, CONFIG["eval_envs"]
    )


if __name__ == "__main__":
    command_line(main, __doc__)
