"""The table `cleanrl_dqn.py` writes: CleanRL's own script against the guide's, per thread count."""

from __future__ import annotations

import statistics

PARTS = ("check the step", "copy into the stage", "wait for the call that read the other stage")


def table(rows: list[dict], settings: dict) -> str:
    """Markdown: per torch thread setting, each variant's median (and best) buffer µs per
    environment step and steps/s while learning, as ratios to CleanRL's own; then
    jaxbuf's breakdown, the compiles when learning starts, and the first episodes."""
    size = settings["size"]
    lines = [
        "# CleanRL's `dqn_atari_jax.py`, upstream and switched by the guide",
        "",
        f"CleanRL release {settings['release']} (its wheel, read at run time), "
        f"{size['total_timesteps']:,} steps of real "
        f"ALE `BreakoutNoFrameskip-v4`, learning from step {size['learning_starts']:,}, "
        f"`--buffer-size {size['buffer_size']:,}`, seed {size['seed']}, everything else the "
        f"script's defaults; runs in the order {size['order']} per thread setting. Machine: "
        f"{settings['machine']}, Python {settings['python']}; "
        + ", ".join(f"{k} {v}" for k, v in settings["versions"].items() if v)
        + ".",
        "",
        f"Command: `{command(size)}`. Threads: torch's per row (`1`: `OMP_NUM_THREADS=1`; "
        "`default`: torch's own count), XLA's CPU client on every core.",
        "",
        '"buffer µs": time in the buffer\'s calls per environment step while learning, after '
        "the first 1,000 learning steps (CleanRL: `rb.add` and `rb.sample` of SB3's buffer; "
        'jaxbuf: `rb.add`, whose call draws the batch); "with compiles" counts from the first '
        "learning step.",
        "",
        "| torch threads | buffer | runs | buffer µs / step, median (best) | / CleanRL's | "
        "with compiles | steps/s learning, median (best) | / CleanRL's | longest buffer call | "
        "peak resident |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for threads in dict.fromkeys(row["threads"] for row in rows):
        base_us = _median(rows, "cleanrl", threads, "buffer_us")
        base_sps = _median(rows, "cleanrl", threads, "sps_learning")
        for variant in ("cleanrl", "jaxbuf"):
            mine = [r for r in rows if r["variant"] == variant and r["threads"] == threads]
            if not mine:
                continue
            us = [r["buffer_us"] for r in mine]
            sps = [r["sps_learning"] for r in mine]
            lines.append(
                f"| {threads} | {variant} | {len(mine)} | {statistics.median(us):.0f} "
                f"({min(us):.0f}) | {statistics.median(us) / base_us:.2f} | "
                f"{statistics.median(r['buffer_us_with_compiles'] for r in mine):.0f} | "
                f"{statistics.median(sps):.1f} ({max(sps):.1f}) | "
                f"{statistics.median(sps) / base_sps:.2f} | "
                f"{max(r['longest_buffer_call_s'] for r in mine):.2f} s | "
                f"{max(r['peak_rss_gib'] for r in mine):.2f} GiB |"
            )
    lines += ["", *breakdown(rows), "", *episodes(rows)]
    return "\n".join(lines) + "\n"


def command(size: dict) -> str:
    """The command line that measured a table of these settings."""
    flags = {"total_timesteps": 20_000, "learning_starts": 5_000, "buffer_size": 100_000,
             "seed": 1, "order": "ABBA", "out": "cleanrl_dqn_cpu"}  # fmt: skip
    given = [f"--{k.replace('_', '-')} {v}" for k, v in size.items()
             if k in flags and v != flags[k]]  # fmt: skip
    if size.get("threads", ["1", "default"]) != ["1", "default"]:
        given.append("--threads " + " ".join(size["threads"]))
    return " ".join(["python -m benchmarks.agents.cleanrl_dqn", *given])


def breakdown(rows: list[dict]) -> list[str]:
    """jaxbuf's buffer time per environment step, by part (medians over runs)."""
    lines = [
        "jaxbuf's buffer µs per environment step, by part (medians; the call writes 4 steps "
        "and draws the batch, once per 4 steps; delivering its block to NumPy waits for it):",
        "",
        "| torch threads | check the step | copy into the stage | wait for the call that "
        "read the other stage | the call | deliver the block | environment step (apart) | "
        "compiles when learning starts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for threads in dict.fromkeys(row["threads"] for row in rows):
        mine = [r for r in rows if r["variant"] == "jaxbuf" and r["threads"] == threads]
        if not mine:
            continue
        part = {name: statistics.median(r["parts_us"][name] for r in mine)
                for name in mine[0]["parts_us"]}  # fmt: skip
        call = part["call"] - part["deliver the block"]  # the call's timer holds delivery
        compiles = [[round(s, 1) for _, s in r["compiles_when_learning_starts"] if s > 0.2]
                    for r in mine]  # fmt: skip
        lines.append(
            f"| {threads} | "
            + " | ".join(f"{part[name]:.0f}" for name in PARTS)
            + f" | {call:.0f} | {part['deliver the block']:.0f} | "
            f"{statistics.median(r['env_us'] for r in mine):.0f} | "
            f"{compiles[0]} s (the learner's `update` compiles then too) |"
        )
    return lines


def episodes(rows: list[dict]) -> list[str]:
    """Whether every run played the same first episodes (same seeds, actions random or
    greedy from the same network until the buffers' batches differ)."""
    firsts = {tuple(r["returns"][:16]) for r in rows}
    same = "the same" if len(firsts) == 1 else f"{len(firsts)} different sequences of"
    return [f"First 16 episodic returns of every run: {same} "
            f"({list(next(iter(firsts)))[:16]})."]  # fmt: skip


def _median(rows: list[dict], variant: str, threads: str, key: str) -> float:
    return statistics.median(
        r[key] for r in rows if r["variant"] == variant and r["threads"] == threads
    )
