"""The HER bit-flipping example: the environment against a Python model, and
learning on a small instance."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuf.examples import her_bitflip


def test_bitflip_steps_reward_terminate_truncate_and_reset_like_the_paper():
    n, rng = 5, np.random.default_rng(0)
    env = her_bitflip.reset(jax.random.key(0), n)
    assert bool(jnp.any(env.bits != env.goal)) and int(env.t) == 0
    step = jax.jit(her_bitflip.step, static_argnums=3)
    bits, goal, t = np.array(env.bits), np.array(env.goal), 0
    ends = {"terminated": 0, "truncated": 0}
    for i in range(200):
        # aim for the goal half of the time, so both kinds of episode end occur
        wrong = np.flatnonzero(bits != goal)
        action = int(wrong[0]) if rng.random() < 0.5 else int(rng.integers(n))
        env, obs, reward, terminated, truncated, final = step(
            env, jnp.int32(action), jax.random.key(i + 1), n
        )
        bits[action] = ~bits[action]
        t += 1
        reached = bool((bits == goal).all())
        assert float(reward) == (0.0 if reached else -1.0)
        assert bool(terminated) == reached and bool(truncated) == (not reached and t == n)
        np.testing.assert_array_equal(final["achieved_goal"], bits)
        if reached or t == n:
            ends["terminated" if reached else "truncated"] += 1
            bits, goal, t = np.array(env.bits), np.array(env.goal), 0
            assert int(env.t) == 0 and (bits != goal).any()
        np.testing.assert_array_equal(obs["achieved_goal"], bits)
        np.testing.assert_array_equal(obs["desired_goal"], goal)
    assert min(ends.values()) > 5


def test_dqn_with_relabeling_learns_eight_bits():
    """120 cycles on 8 bits: with relabeling the greedy policy reaches its goals (1.00 for
    seeds 0-2), without it, in as many cycles, it rarely does (0.01-0.09). At the 240
    cycles this test ran before, both reach 1.00: the shorter run is what tells them apart."""
    config = {"cycles": 120, "num_chunks": 2, "eval_envs": 128}
    with jax.numpy_dtype_promotion("standard"):  # optax's adam mixes int32 and float32
        relabeled = her_bitflip.main(seed=0, bits=8, her=True, quiet=True, config=config)
        plain = her_bitflip.main(seed=0, bits=8, her=False, quiet=True, config=config)
    assert relabeled >= 0.9 and plain <= 0.5
