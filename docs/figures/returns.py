"""Draws `docs/figures/returns.svg`: GAE targets with exact values, three ways of ending episodes.

One environment, 16 steps, reward 1 per step, discount 0.9, lambda 0.95, and values that are
exact: 10 while an episode can go on forever, `(1 - 0.9^k) / 0.1` with `k` steps left before a
termination. Exact values make the right targets equal the values; wrong episode handling
shows as a gap. Run from the repository root: `python docs/figures/returns.py [OUT.svg]`.
"""

import pathlib
import sys

import jax.numpy as jnp
import numpy as np

import jaxbuf

DISCOUNT, LAMBDA, T = 0.9, 0.95, 16
TRUNCATED_AT, TERMINATED_AT = 5, 11  # a time limit ends the first episode, a failure the second


def trajectory() -> dict[str, np.ndarray]:
    """Rewards, exact values, next values and flags of the 16 steps."""
    steps = np.arange(T)
    left = TERMINATED_AT + 1 - steps  # steps left before the termination (second episode)
    in_second = (steps > TRUNCATED_AT) & (steps <= TERMINATED_AT)
    values = np.where(in_second, (1 - DISCOUNT**left) / (1 - DISCOUNT), 10.0)
    next_values = np.append(values[1:], 10.0)
    next_values[TRUNCATED_AT] = 10.0  # the value of the final observation, not of the reset one
    next_values[TERMINATED_AT] = 0.0
    terminated, truncated = np.zeros(T, bool), np.zeros(T, bool)
    terminated[TERMINATED_AT], truncated[TRUNCATED_AT] = True, True
    return dict(
        rewards=np.ones(T), values=values, next_values=next_values,
        terminated=terminated, truncated=truncated,
    )  # fmt: skip


def targets(rewards, values, next_values, terminated, truncated) -> np.ndarray:
    """GAE's value targets `R = A + V` (float32, as a training loop computes them)."""
    arrays = [jnp.asarray(x, jnp.float32) for x in (rewards, values, next_values)]
    _, returns = jaxbuf.gae(
        *arrays, jnp.asarray(terminated), jnp.asarray(truncated),
        discount=DISCOUNT, gae_lambda=LAMBDA,
    )  # fmt: skip
    return np.asarray(returns)


def three_ways() -> dict[str, np.ndarray]:
    """The targets when the time limit is a truncation, a termination, or ignored with the end."""
    data = trajectory()
    as_termination = dict(data, terminated=data["terminated"] | data["truncated"])
    as_termination["truncated"] = np.zeros(T, bool)
    ignored = dict(data, terminated=np.zeros(T, bool), truncated=np.zeros(T, bool))
    ignored["next_values"] = np.append(data["values"][1:], 10.0)  # the next episode's start
    return {
        "values (exact)": data["values"],
        "truncation bootstraps (jaxbuf)": targets(**data),
        "truncation as termination": targets(**as_termination),
        "episode ends ignored": targets(**ignored),
    }


def draw(path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "jaxbuf"  # the same SVG on every run
    figure, axes = plt.subplots(figsize=(8, 3.4))
    styles = {  # the right targets are drawn last, on top of the values they equal
        "values (exact)": ("k", "--", ""),
        "truncation as termination": ("C1", "-", "s"),
        "episode ends ignored": ("C2", "-", "^"),
        "truncation bootstraps (jaxbuf)": ("C0", ":", "o"),
    }
    lines = three_ways()
    episodes = np.split(np.arange(T), [TRUNCATED_AT + 1, TERMINATED_AT + 1])
    for label, (color, dash, marker) in styles.items():
        for k, steps in enumerate(episodes):  # no line joins two episodes
            axes.plot(steps, lines[label][steps], color=color, linestyle=dash, marker=marker,
                      markersize=4, label=label if k == 0 else None)  # fmt: skip
    axes.axvline(TRUNCATED_AT + 0.5, color="0.5", linewidth=1)
    axes.axvline(TERMINATED_AT + 0.5, color="0.5", linewidth=1)
    axes.text(TRUNCATED_AT + 0.6, 0.6, "time limit\n(truncated)", fontsize=8)
    axes.text(TERMINATED_AT + 0.6, 0.6, "failure\n(terminated)", fontsize=8)
    axes.set(xlabel="step t", ylabel="value target R_t", ylim=(0, 11.5))
    axes.legend(fontsize=8, loc="center", bbox_to_anchor=(0.56, 0.56))
    figure.tight_layout()
    figure.savefig(path, metadata={"Date": None})


if __name__ == "__main__":
    draw(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/figures/returns.svg"))
