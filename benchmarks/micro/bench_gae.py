"""GAE: jaxbuf (default, scan, associative) versus PureJaxRL's scan, rlax and a NumPy loop.

Time-major float32 rewards/values `[T, batch]` with terminations and
truncations, at T in {128, 1024, 8192} and batch in {1, 64, 2048}. jaxbuf's
default is `method="auto"`: the scan on CPU, the associative scan on GPU and TPU.
The peers compute the same advantages: PureJaxRL's reverse scan unrolled 16
times, `rlax.truncated_generalized_advantage_estimation` vmapped over the batch
(fed `discount_t = gamma * (1 - done)` and the values with the bootstrap
appended), and a Stable-Baselines3-style NumPy loop over time.
All cases run interleaved in one process; compare the ratios.

Run: `python -m benchmarks.micro.bench_gae [--quick] [--out benchmarks/results]`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuf
from benchmarks.common import command_line, interleaved_medians, write_results

GAMMA, LAMBDA = 0.99, 0.95
ORDER = ("rewards", "values", "next_values", "terminated", "truncated")  # gae's arguments


def make_data(steps: int, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(steps * 7919 + batch)
    shape = (steps, batch)
    terminated = rng.random(shape) < 0.01
    return {
        "rewards": rng.normal(size=shape).astype(np.float32),
        "values": rng.normal(size=shape).astype(np.float32),
        "next_values": rng.normal(size=shape).astype(np.float32),
        "terminated": terminated,
        "truncated": (rng.random(shape) < 0.01) & ~terminated,
    }


def numpy_gae(rewards, values, next_values, terminated, truncated):
    """The Stable-Baselines3 loop: one vectorized step per time index."""
    advantages = np.zeros_like(rewards)
    last = np.zeros_like(rewards[0])
    for t in reversed(range(len(rewards))):
        not_done = 1.0 - (terminated[t] | truncated[t])
        delta = rewards[t] + GAMMA * (1.0 - terminated[t]) * next_values[t] - values[t]
        last = delta + GAMMA * LAMBDA * not_done * last
        advantages[t] = last
    return advantages


def purejaxrl_gae(rewards, values, next_values, terminated, truncated):
    """PureJaxRL's GAE as its PPO computes it: a reverse `lax.scan` unrolled 16 times,
    one done flag (fed terminated | truncated here, the same work)."""
    done = (terminated | truncated).astype(rewards.dtype)

    def step(following, inputs):
        reward, value, next_value, done = inputs
        delta = reward + GAMMA * next_value * (1 - done) - value
        advantage = delta + GAMMA * LAMBDA * (1 - done) * following
        return advantage, advantage

    inputs = (rewards, values, next_values, done)
    return jax.lax.scan(step, jnp.zeros_like(rewards[0]), inputs, reverse=True, unroll=16)[1]


def rlax_inputs(data: dict[str, np.ndarray]) -> tuple[jax.Array, ...]:
    """rlax's form. It bootstraps every step from values[t + 1] and cuts with
    discount_t, so it matches GAE exactly where next_values[t] = values[t + 1]."""
    done = data["terminated"] | data["truncated"]
    discounts = (GAMMA * (1.0 - done)).astype(np.float32)
    values = np.concatenate([data["values"], data["next_values"][-1:]])
    return jnp.asarray(data["rewards"]), jnp.asarray(discounts), jnp.asarray(values)


def cases(steps: int, batch: int, budget: float) -> dict:
    import rlax

    data = make_data(steps, batch)
    arrays = [jnp.asarray(data[k]) for k in ORDER]
    out = {}
    for method in ("auto", "scan", "associative"):

        def advantages(*arrays, method=method):
            return jaxbuf.gae(*arrays, discount=GAMMA, gae_lambda=LAMBDA, method=method)[0]

        jitted = jax.jit(advantages)
        out[f"jaxbuf_{method}"] = lambda fn=jitted: fn(*arrays)

    def rlax_gae_one(rewards, discounts, values):
        return rlax.truncated_generalized_advantage_estimation(rewards, discounts, LAMBDA, values)

    purejaxrl = jax.jit(purejaxrl_gae)
    out["purejaxrl"] = lambda: purejaxrl(*arrays)
    rlax_gae = jax.jit(jax.vmap(rlax_gae_one, in_axes=(1, 1, 1), out_axes=1))
    r, discounts, values = rlax_inputs(data)
    out["rlax"] = lambda: rlax_gae(r, discounts, values)
    out["numpy"] = lambda: numpy_gae(**data)
    calls = {}
    for name, fn in out.items():  # calls per round: about `budget` seconds
        jax.block_until_ready(fn())
        start = time.perf_counter()
        jax.block_until_ready(fn())
        calls[name] = max(1, int(budget / max(time.perf_counter() - start, 1e-6)))
    return {name: (fn, calls[name]) for name, fn in out.items()}


def main() -> None:
    args = command_line(__doc__)
    budget, repeats = (0.02, 3) if args.quick else (0.1, 9)
    rows = []
    for steps in (128, 1024, 8192):
        for batch in (1, 64, 2048):
            times = interleaved_medians(cases(steps, batch, budget), repeats)
            row = {"T": steps, "batch": batch, **{f"{k}_ms": v * 1e3 for k, v in times.items()}}
            row["scan_over_rlax"] = row["jaxbuf_scan_ms"] / row["rlax_ms"]
            row["default_over_purejaxrl"] = row["jaxbuf_auto_ms"] / row["purejaxrl_ms"]
            row["associative_over_scan"] = row["jaxbuf_associative_ms"] / row["jaxbuf_scan_ms"]
            row["numpy_over_scan"] = row["numpy_ms"] / row["jaxbuf_scan_ms"]
            rows.append(row)
            print(
                {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True
            )
    columns = [
        ("T", "T", "{:,}"),
        ("batch", "batch", "{:,}"),
        ("jaxbuf default, auto (ms)", "jaxbuf_auto_ms", "{:.3f}"),
        ("jaxbuf scan (ms)", "jaxbuf_scan_ms", "{:.3f}"),
        ("jaxbuf associative (ms)", "jaxbuf_associative_ms", "{:.3f}"),
        ("PureJaxRL's scan, unroll 16 (ms)", "purejaxrl_ms", "{:.3f}"),
        ("rlax, vmapped (ms)", "rlax_ms", "{:.3f}"),
        ("NumPy loop (ms)", "numpy_ms", "{:.3f}"),
        ("scan / rlax", "scan_over_rlax", "{:.2f}"),
        ("default / PureJaxRL", "default_over_purejaxrl", "{:.2f}"),
        ("associative / scan", "associative_over_scan", "{:.2f}"),
        ("NumPy / scan", "numpy_over_scan", "{:.1f}"),
    ]
    write_results(args.out, "gae", rows, columns, __doc__)


if __name__ == "__main__":
    main()
