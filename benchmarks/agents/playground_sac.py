"""MuJoCo Playground's own SAC configuration, with Brax's queue and with `jaxbuf.brax`.

A Playground user's script: `registry.load(env)`, `brax_sac_config(env)` and Brax's
`sac.train` with Playground's `wrap_for_brax_training`, as Playground's training script
calls them. Two changes a user makes on Brax 0.14.2, each printed in the table:

- `num_resets_per_eval` is dropped from the configuration: Playground 0.2 passes it, and
  Brax 0.14.2's `sac.train` refuses it (`TypeError: unexpected keyword argument`);
- the environment's `impl` is `"jax"`: DM Control tasks default to `"warp"` (MuJoCo Warp),
  which needs an NVIDIA GPU.

The jaxbuf variant wraps the call in `jaxbuf.brax.use_in_brax(num_envs=..., report=True)`
and logs `report.metrics()` in `progress_fn` (`C` in `--order`: without the report, whose
callback runs once per training step). Variants take turns (`--order`, per seed).
Recorded per run: the evaluation rewards, environment steps per second of the training
epochs after the first (compiled), the wall time, the buffer state's bytes (from the
configuration: Brax's queue holds one float32 row of every field, `next_observation`
included; jaxbuf's `bytes_per_transition`) and what the report said.

`--num-timesteps` shortens Playground's 5M steps (on this CPU), `--episode-length` makes
episodes end (and auto-reset) inside the run. Needs the `playground` extra
(`pip install -e ".[playground]"`). Results: `benchmarks/results/playground_sac_<backend>`.

Run: `python -m benchmarks.agents.playground_sac --num-timesteps 300000 --seeds 0 1`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import time
import warnings

import jax
import numpy as np

import jaxbuf.brax
from benchmarks import common

REFUSED = ("num_resets_per_eval",)  # Playground 0.2 passes it; Brax 0.14.2 refuses it


def playground_call(env_name: str, num_timesteps: int, num_evals: int,
                    episode_length: int | None):  # fmt: skip
    """What Playground's training script builds: the environment, its SAC config as
    `sac.train` keywords (less what Brax 0.14.2 refuses), and the wrapper."""
    from brax.training.agents.sac import networks as sac_networks
    from mujoco_playground import registry, wrapper
    from mujoco_playground.config import dm_control_suite_params

    env_config = registry.get_default_config(env_name)
    env_config.impl = "jax"  # the default, "warp", needs an NVIDIA GPU
    if episode_length:
        env_config.episode_length = episode_length
    environment = registry.load(env_name, config=env_config)
    params = dm_control_suite_params.brax_sac_config(env_name)
    keywords = {k: v for k, v in params.to_dict().items() if k not in REFUSED}
    factory = keywords.pop("network_factory")
    keywords.update(
        num_timesteps=num_timesteps,
        num_evals=num_evals,
        episode_length=env_config.episode_length,
        network_factory=functools.partial(sac_networks.make_sac_networks, **factory),
        wrap_env_fn=wrapper.wrap_for_brax_training,
    )
    eval_env = registry.load(env_name, config=env_config)
    return environment, eval_env, keywords


def queue_bytes(environment, keywords) -> dict[str, int]:
    """Bytes of both buffers' states for this environment and configuration."""
    obs = environment.observation_size
    obs = obs if isinstance(obs, int) else math.prod(obs)
    act = environment.action_size
    # Brax's Transition: observation, action, reward, discount, next_observation and
    # extras (truncation) flattened into one float32 row
    brax_row = 4 * (obs + act + 1 + 1 + obs + 1)
    dummy = _dummy(obs, act)
    ours = jaxbuf.brax.BraxReplay(
        keywords["max_replay_size"], dummy, 8, num_envs=keywords["num_envs"]
    ).bytes_per_transition()
    return {"brax_row": brax_row, "jaxbuf_row": ours}


def _dummy(obs: int, act: int):
    from brax.training.types import Transition

    zeros = np.zeros
    return Transition(zeros(obs, np.float32), zeros(act, np.float32), np.float32(0),
                      np.float32(0), zeros(obs, np.float32),
                      {"state_extras": {"truncation": np.float32(0)},
                       "policy_extras": {}})  # fmt: skip


def run(buffer: str, seed: int, args) -> dict:
    from brax.training.agents.sac import train as sac

    environment, eval_env, keywords = playground_call(
        args.env, args.num_timesteps, args.num_evals, args.episode_length
    )
    evaluations: list[dict] = []
    report = None

    def progress(step, metrics):
        row = {"step": int(step), "reward": float(metrics["eval/episode_reward"]),
               "sps": float(metrics.get("training/sps", np.nan))}  # fmt: skip
        if report is not None:
            row.update(report.metrics())
        evaluations.append(row)
        print(buffer, seed, row, flush=True)

    train = functools.partial(sac.train, environment=environment, eval_env=eval_env,
                              seed=seed, progress_fn=progress,
                              **keywords)  # fmt: skip
    start = time.perf_counter()
    # Brax's code relies on JAX's default promotions; it warns about its own deprecations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if buffer.startswith("jaxbuf"):
            reporting = buffer == "jaxbuf"
            with jaxbuf.brax.use_in_brax(num_envs=keywords["num_envs"],
                                         report=reporting) as report:  # fmt: skip
                train()
            report = report if reporting else None
        else:
            train()
    wall = time.perf_counter() - start
    sps = [row["sps"] for row in evaluations[2:]]  # epochs after the first (compiled)
    return {"buffer": buffer, "seed": seed, "wall_s": wall,
            "final_reward": evaluations[-1]["reward"], "rewards": evaluations,
            "sps": float(np.median(sps)) if sps else None,
            "report": report.metrics() if report is not None else None,
            **queue_bytes(environment, keywords),
            "max_replay_size": keywords["max_replay_size"], "num_envs": keywords["num_envs"],
            "batch_size": keywords["batch_size"]}  # fmt: skip


def table(rows: list[dict], args, env: dict) -> str:
    lines = [
        f"# MuJoCo Playground's own SAC configuration ({args.env}), Brax's queue against "
        "jaxbuf.brax",
        "",
        f"Measured {env['date']} on {env['device']} ({env['cpu']}, {env['cpu_count']} cores), "
        f"Python {env['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + ".",
        "",
        f"`brax_sac_config('{args.env}')` less `num_resets_per_eval` (Brax 0.14.2 refuses it), "
        f"`impl='jax'`, `num_timesteps={args.num_timesteps:,}`, `num_evals={args.num_evals}`"
        + (f", `episode_length={args.episode_length}`" if args.episode_length else "")
        + f"; {rows[0]['num_envs']} environments, batch {rows[0]['batch_size']}, "
        f"`max_replay_size={rows[0]['max_replay_size']:,}`. Runs A B B A per seed.",
        "",
        "| buffer | seed | final eval reward | env steps/s (median of epochs) | wall s | "
        "bytes per transition | report |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        per = row["jaxbuf_row"] if row["buffer"].startswith("jaxbuf") else row["brax_row"]
        lines.append(
            f"| {row['buffer']} | {row['seed']} | {row['final_reward']:.1f} | "
            f"{row['sps'] or float('nan'):,.0f} | {row['wall_s']:.0f} | {per} | "
            f"{row['report'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartpoleBalance")
    parser.add_argument("--num-timesteps", type=int, default=300_000)
    parser.add_argument("--num-evals", type=int, default=4)
    parser.add_argument("--episode-length", type=int, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--order",
        default="ABBA",
        help="A: brax queue, B: jaxbuf (report=True), C: jaxbuf (no report)",
    )
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parents[1] / "results"))
    parser.add_argument("--name", default="playground_sac")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for letter in args.order:
            buffer = {"A": "brax queue", "B": "jaxbuf", "C": "jaxbuf, no report"}[letter]
            rows.append(run(buffer, seed, args))
    env = common.environment()
    folder = pathlib.Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{args.name}_{env['backend']}"
    stem.with_suffix(".json").write_text(json.dumps({"environment": env, "args": vars(args),
                                                     "results": rows}, indent=2))  # fmt: skip
    stem.with_suffix(".md").write_text(table(rows, args, env))
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    jax.config.update("jax_numpy_rank_promotion", "allow")
    main()
