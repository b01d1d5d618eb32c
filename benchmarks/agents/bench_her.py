"""HER bit-flipping: greedy success rate of DQN with and without goal relabeling.

The task and agent are `jaxbuf.examples.her_bitflip` (the HER paper's bit
flipping, DQN with one hidden layer of 256, 16 episodes and 16 updates per
cycle). For each number of bits and each seed, one agent trains with
`goals=jaxbuf.hindsight(reward_fn, strategy="future", ratio=0.8)` and, for 25
bits, one without relabeling; each is evaluated greedily on 256 fresh episodes
(success: the bits reach the goal within n steps). The time is the wall time of
training one seed in its own process run (compilation included), on this
machine with nothing else running.

Run: `python -m benchmarks.agents.bench_her [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import command_line, write_results
from jaxbuf.examples import her_bitflip

# bits -> training cycles (16 episodes each); 40 and 50 bits get more
RUNS = [(25, 1600, True), (25, 1600, False), (40, 3200, True), (50, 6400, True)]


def main() -> None:
    args = command_line(__doc__)
    seeds = range(2) if args.quick else range(5)
    rows = []
    for bits, cycles, her in RUNS:
        cycles = cycles // 8 if args.quick else cycles
        scores, times = [], []
        for seed in seeds:
            start = time.perf_counter()
            config = {"cycles": cycles}
            scores.append(her_bitflip.main(seed, bits, her, quiet=True, config=config))
            times.append(time.perf_counter() - start)
        rows.append({
            "bits": bits, "relabeling": "future, 0.8" if her else "none", "cycles": cycles,
            "episodes": cycles * her_bitflip.CONFIG["num_envs"], "seeds": len(scores),
            "success": scores, "min_success": min(scores), "mean_success": float(np.mean(scores)),
            "max_seconds": max(times), "mean_seconds": float(np.mean(times)),
        })  # fmt: skip
        print(rows[-1], flush=True)
    columns = [
        ("bits", "bits", "{}"),
        ("relabeling", "relabeling", "{}"),
        ("training episodes", "episodes", "{}"),
        ("success per seed", "success", "{}"),
        ("lowest", "min_success", "{:.2f}"),
        ("mean", "mean_success", "{:.2f}"),
        ("slowest seed (s)", "max_seconds", "{:.0f}"),
    ]
    write_results(args.out, "her", rows, columns, __doc__)


if __name__ == "__main__":
    main()
