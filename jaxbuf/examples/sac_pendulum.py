"""SAC on gymnax Pendulum-v1 with a jaxbuf transition buffer, the whole loop jitted.

Run with `python -m jaxbuf.examples.sac_pendulum [--seed N] [--truncation-as-termination]`.

Pendulum never terminates: every episode is cut at 200 steps. The transition
buffer keeps `truncated` apart from `terminated` and stores the true final
observation, so the soft Q target bootstraps through every time limit
(`batch.discount` is gamma there, 0 only where an episode terminated). With
`--truncation-as-termination` the same agent stores the time limit as a
termination, the common bug this buffer exists to avoid, and the targets of the
last steps before every time limit lose their future.

Soft actor-critic (Haarnoja et al., 2018): twin critics with polyak-averaged
targets, a tanh-squashed Gaussian policy and a learned temperature whose target
entropy is minus the action dimension. Environments are vmapped; every
iteration steps all of them, adds their steps to the (donated) buffer, and
takes one update of critics, actor and temperature.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import optax

import jaxbuf
from jaxbuf.examples._common import command_line, evaluate_and_report, jitted_chunks

CONFIG = dict(
    num_envs=4,
    hidden=(256, 256),
    total_timesteps=48_000,
    buffer_capacity=12_500,  # steps per environment: everything is kept
    batch_size=256,
    learning_starts=2_000,  # steps (all environments) of uniform random actions first
    learning_rate=1e-3,
    discount=0.99,
    polyak=0.995,  # target critics: polyak * target + (1 - polyak) * online, per update
    num_chunks=12,
    eval_envs=32,
)


class Critic(nn.Module):
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action], axis=-1)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(1)(x)[..., 0]


class TwinCritic(nn.Module):
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        """`[2, ...]`: both critics' values."""
        return jnp.stack([Critic(self.hidden)(obs, action), Critic(self.hidden)(obs, action)])


class Actor(nn.Module):
    action_dim: int
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = obs
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        mean = nn.Dense(self.action_dim)(x)
        log_std = jnp.clip(nn.Dense(self.action_dim)(x), -5.0, 2.0)
        return mean, log_std


def squashed_sample(mean, log_std, key, scale: float) -> tuple[jax.Array, jax.Array]:
    """`(action, log_prob)`: `scale * tanh(u)` for `u ~ N(mean, exp(log_std))`, and
    its log-density, `log N(u) - sum log(scale * (1 - tanh(u)^2))`."""
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    gaussian = -0.5 * (((u - mean) / jnp.exp(log_std)) ** 2 + 2 * log_std + jnp.log(2 * jnp.pi))
    squash = jnp.log(scale) + 2 * (jnp.log(2.0) - u - jax.nn.softplus(-2 * u))
    return scale * jnp.tanh(u), jnp.sum(gaussian - squash, axis=-1)


class Runner(NamedTuple):
    actor: Any
    critic: Any
    target_critic: Any
    log_alpha: jax.Array
    opt_states: Any  # (actor, critic, temperature)
    buffer_state: Any
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array  # [num_envs]
    last_returns: jax.Array  # [num_envs], each environment's last finished episode
    step: jax.Array  # int32 iteration counter
    key: jax.Array


def make_train(config: dict, env, env_params, truncation_as_termination: bool = False):
    action_dim = env.action_space(env_params).shape[0]
    scale = float(env.action_space(env_params).high)
    actor, critic = Actor(action_dim, tuple(config["hidden"])), TwinCritic(config["hidden"])
    optimizer = optax.adam(config["learning_rate"])
    buffer = jaxbuf.make_transition_buffer(
        config["num_envs"], config["buffer_capacity"], config["batch_size"],
        discount=config["discount"],
    )  # fmt: skip
    environment = jaxbuf.envs.gymnax_env(env, env_params)
    num_envs, target_entropy = config["num_envs"], -float(action_dim)
    warmup = config["learning_starts"] // num_envs

    def init(key: jax.Array) -> Runner:
        key, actor_key, critic_key, env_key = jax.random.split(key, 4)
        obs, env_state = jax.vmap(environment.reset)(jax.random.split(env_key, num_envs))
        action = jnp.zeros(action_dim, jnp.float32)
        actor_params = actor.init(actor_key, obs[0])
        critic_params = critic.init(critic_key, obs[0], action)
        log_alpha = jnp.zeros((), jnp.float32)
        example = jaxbuf.Transition(obs[0], action, jnp.float32(0), jnp.bool_(False),
                                    jnp.bool_(False), obs[0])  # fmt: skip
        opt_states = tuple(optimizer.init(p) for p in (actor_params, critic_params, log_alpha))
        zeros = lambda: jnp.zeros(num_envs, jnp.float32)  # noqa: E731  (distinct: donated)
        return Runner(actor_params, critic_params, jax.tree.map(jnp.copy, critic_params),
                      log_alpha, opt_states, buffer.init(example), env_state, obs, zeros(),
                      zeros(), jnp.zeros((), jnp.int32), key)  # fmt: skip

    def critic_loss(params, runner: Runner, batch: jaxbuf.Transition, key):
        mean, log_std = actor.apply(runner.actor, batch.next_obs)
        next_action, next_log_prob = squashed_sample(mean, log_std, key, scale)
        next_q = jnp.min(critic.apply(runner.target_critic, batch.next_obs, next_action), axis=0)
        soft = next_q - jnp.exp(runner.log_alpha) * next_log_prob
        target = jax.lax.stop_gradient(batch.reward + batch.discount * soft)
        return jnp.mean((critic.apply(params, batch.obs, batch.action) - target[None]) ** 2)

    def actor_loss(params, runner: Runner, obs, key):
        mean, log_std = actor.apply(params, obs)
        action, log_prob = squashed_sample(mean, log_std, key, scale)
        q = jnp.min(critic.apply(runner.critic, obs, action), axis=0)
        return jnp.mean(jnp.exp(runner.log_alpha) * log_prob - q), log_prob

    def temperature_loss(log_alpha, log_prob):
        return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))

    def step_params(params, grads, opt_state):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def learn(runner: Runner, key: jax.Array) -> tuple[Runner, jax.Array]:
        sample_key, critic_key, actor_key = jax.random.split(key, 3)
        batch = buffer.sample(runner.buffer_state, sample_key).experience
        actor_opt, critic_opt, alpha_opt = runner.opt_states
        loss, grads = jax.value_and_grad(critic_loss)(runner.critic, runner, batch, critic_key)
        critic_params, critic_opt = step_params(runner.critic, grads, critic_opt)
        runner = runner._replace(critic=critic_params)
        grads, log_prob = jax.grad(actor_loss, has_aux=True)(runner.actor, runner, batch.obs,
                                                             actor_key)  # fmt: skip
        actor_params, actor_opt = step_params(runner.actor, grads, actor_opt)
        grads = jax.grad(temperature_loss)(runner.log_alpha, log_prob)
        log_alpha, alpha_opt = step_params(runner.log_alpha, grads, alpha_opt)
        tau = config["polyak"]
        target = jax.tree.map(lambda t, p: tau * t + (1 - tau) * p, runner.target_critic,
                              critic_params)  # fmt: skip
        return runner._replace(actor=actor_params, target_critic=target, log_alpha=log_alpha,
                               opt_states=(actor_opt, critic_opt, alpha_opt)), loss  # fmt: skip

    def act(runner: Runner, key: jax.Array) -> jax.Array:
        policy_key, random_key = jax.random.split(key)
        mean, log_std = actor.apply(runner.actor, runner.obs)
        action, _ = squashed_sample(mean, log_std, policy_key, scale)
        uniform = jax.random.uniform(random_key, action.shape, minval=-scale, maxval=scale)
        return jnp.where(runner.step < warmup, uniform, action)

    def iteration(runner: Runner, _) -> tuple[Runner, jax.Array]:
        key, act_key, step_key, learn_key = jax.random.split(runner.key, 4)
        action = act(runner, act_key)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(environment.step)(
            jax.random.split(step_key, num_envs), runner.env_state, action
        )
        reward = reward.astype(jnp.float32)
        if truncation_as_termination:
            terminated, truncated = terminated | truncated, jnp.zeros_like(truncated)
        step = jaxbuf.Transition(runner.obs, action, reward, terminated, truncated,
                                 info["final_observation"])  # fmt: skip
        done = terminated | truncated
        episode_return = runner.episode_return + reward
        runner = runner._replace(
            buffer_state=buffer.add_step(runner.buffer_state, step), env_state=env_state,
            obs=obs, episode_return=jnp.where(done, 0.0, episode_return),
            last_returns=jnp.where(done, episode_return, runner.last_returns),
            step=runner.step + 1, key=key,
        )  # fmt: skip
        ready = (runner.step >= warmup) & buffer.can_sample(runner.buffer_state)
        return jax.lax.cond(ready, learn, lambda r, _: (r, jnp.zeros((), jnp.float32)), runner,
                            learn_key)  # fmt: skip

    num_iterations = config["total_timesteps"] // num_envs
    chunk = jitted_chunks(iteration, num_iterations // config["num_chunks"])
    return init, chunk, actor, scale


def main(seed: int = 0, quiet: bool = False, truncation_as_termination: bool = False,
         config: dict | None = None) -> float:  # fmt: skip
    """Trains one agent; returns the mean greedy return over fresh episodes."""
    config = {**CONFIG, **(config or {})}
    env, env_params = gymnax.make("Pendulum-v1")
    init, train_chunk, actor, scale = make_train(config, env, env_params,
                                                 truncation_as_termination)  # fmt: skip
    runner = init(jax.random.key(seed))
    start = time.perf_counter()
    for _ in range(config["num_chunks"]):
        runner, loss = train_chunk(runner)
        if not quiet:
            print(f"[{time.perf_counter() - start:6.1f}s] timesteps "
                  f"{int(runner.step) * config['num_envs']:>6d}  episode return "
                  f"{float(runner.last_returns.mean()):8.1f}  alpha "
                  f"{float(jnp.exp(runner.log_alpha)):.3f}  critic loss {float(loss):.3f}",
                  flush=True)  # fmt: skip

    def greedy(params, obs):
        return scale * jnp.tanh(actor.apply(params, obs)[0])

    return evaluate_and_report(greedy, env, env_params, runner.actor, seed, start,
                               config["eval_envs"])  # fmt: skip


if __name__ == "__main__":
    bug = "store time limits as terminations (the bug, for comparison)"
    command_line(main, __doc__, truncation_as_termination={"action": "store_true", "help": bug})
