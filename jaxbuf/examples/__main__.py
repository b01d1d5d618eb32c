"""The main demo: DQN with the replay buffer, then PPO with the rollout buffer.

Run with `python -m jaxbuf.examples [--seed N]`. Each agent trains on gymnax
CartPole-v1 with its whole training loop jitted, prints progress, and reports
the mean return of its greedy policy over fresh episodes (the maximum is 500).
"""

import argparse

from jaxbuf.examples import dqn_cartpole, ppo_cartpole

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    seed = parser.parse_args().seed
    print("== DQN (jaxbuf.make_replay_buffer) ==", flush=True)
    dqn = dqn_cartpole.main(seed)
    print("== PPO (jaxbuf.make_rollout_buffer) ==", flush=True)
    ppo = ppo_cartpole.main(seed)
    print(f"greedy evaluation returns: DQN {dqn:.1f}, PPO {ppo:.1f} (of 500)")
