"""What the example agents learn, over 5 seeds: every buffer kind in real training.

- DQN (`jaxbuf.examples.dqn_cartpole`, replay buffer) and PPO
  (`jaxbuf.examples.ppo_cartpole`, rollout buffer with GAE) on CartPole-v1, as the
  demo runs them: the greedy return (of 500) on 64 fresh episodes;
- recurrent Q-learning (`jaxbuf.examples.rdqn_cartpole`, trajectory buffer with
  stored recurrent state and burn-in) on CartPole-v1 without velocities, and the
  same agent feed-forward (no memory), and with prioritized sequences: the
  greedy return (of 500) of the parameters kept by the per-chunk check, and of
  the last parameters, each on 32 fresh episodes;
- SAC (`jaxbuf.examples.sac_pendulum`, transition buffer) on Pendulum-v1, and
  the same agent with time limits stored as terminations: greedy return on 32
  episodes;
- offline CQL (`jaxbuf.examples.offline_cql`): DQN's 300k recorded transitions
  through a `DatasetWriter` dataset, `dataset_to_state` and the epochs sampler;
  greedy return on 64 episodes.

Each seed's time is its wall time in this process, compilation included (the
offline row: recording and offline training together).

Run: `python -m benchmarks.agents.bench_learning [--quick] [--out benchmarks/results]
[--only recurrent] [--table learning]` (`--only`: rerun the rows whose agent or variant
holds that text, keeping the others of the table's last results file).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

import numpy as np

from benchmarks.common import environment, write_results
from jaxbuf.examples import dqn_cartpole, offline_cql, ppo_cartpole, rdqn_cartpole, sac_pendulum


def runs(quick: bool) -> list[tuple[str, str, int, object]]:
    """(agent, variant, seeds, run(seed) -> score or (last, selected))."""
    tiny = {"total_timesteps": 20_000, "num_chunks": 2} if quick else {}
    seeds = 2 if quick else 5
    return [
        ("DQN (replay)", "the demo's", seeds, lambda s: dqn_cartpole.main(s, True)),
        ("PPO (rollout, GAE)", "the demo's", seeds, lambda s: ppo_cartpole.main(s, True)),
        ("recurrent Q (trajectory)", "recurrent", seeds,
         lambda s: rdqn_cartpole.main(s, True, config=tiny)),
        ("recurrent Q (trajectory)", "feed-forward", seeds,
         lambda s: rdqn_cartpole.main(s, True, recurrent=False, config=tiny)),
        ("recurrent Q (trajectory)", "recurrent, prioritized", 2,
         lambda s: rdqn_cartpole.main(s, True, prioritized=True, config=tiny)),
        ("SAC (transition)", "truncation bootstrapped", seeds,
         lambda s: sac_pendulum.main(s, True, config=tiny | {"num_chunks": 2} if quick else {})),
        ("SAC (transition)", "truncation as termination", seeds,
         lambda s: sac_pendulum.main(s, True, True, config=tiny if quick else {})),
        ("offline CQL (dataset, epochs)", "from DQN's recorded experience", seeds,
         lambda s: offline_cql.main(s, True, tempfile.mkdtemp(),
                                    config={"record_timesteps": 20_000} if quick else {})),
    ]  # fmt: skip


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--only", default="", help="rerun only the rows holding this text")
    parser.add_argument("--table", default="learning", help="the table's name")
    return parser.parse_args()


def previous_rows(out: str, table: str) -> list[dict]:
    path = pathlib.Path(out) / f"{table}_{environment()['backend']}.json"
    return json.loads(path.read_text())["results"] if path.exists() else []


def main() -> None:
    args = arguments()
    kept = previous_rows(args.out, args.table) if args.only else []
    rows = []
    for agent, variant, seeds, run in runs(args.quick):
        if args.only and args.only not in agent + variant:
            rows.extend(r for r in kept if (r["agent"], r["variant"]) == (agent, variant))
            continue
        scores, last, times = [], [], []
        for seed in range(seeds):
            start = time.perf_counter()
            result = run(seed)
            times.append(time.perf_counter() - start)
            if isinstance(result, tuple):
                last.append(result[0])
                result = result[1]
            scores.append(round(float(result), 1))
        rows.append({
            "agent": agent, "variant": variant, "returns": scores, "lowest": min(scores),
            "mean": float(np.mean(scores)), "last_returns": [round(x, 1) for x in last] or None,
            "max_seconds": max(times),
        })  # fmt: skip
        print(rows[-1], flush=True)
    columns = [
        ("agent (buffer)", "agent", "{}"),
        ("variant", "variant", "{}"),
        ("greedy return per seed", "returns", "{}"),
        ("lowest", "lowest", "{:.1f}"),
        ("mean", "mean", "{:.1f}"),
        ("last parameters per seed", "last_returns", "{}"),
        ("slowest seed (s)", "max_seconds", "{:.0f}"),
    ]
    write_results(args.out, args.table, rows, columns, __doc__)


if __name__ == "__main__":
    main()
