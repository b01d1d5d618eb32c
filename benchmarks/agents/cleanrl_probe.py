"""Runs CleanRL's script as `python <script> <args>` would, timing its buffer by environment step.

The child process of `cleanrl_dqn.py`: `python cleanrl_probe.py SCRIPT OUT LEARNING_STARTS --
ARGS...`. It changes nothing the script computes. Before running it (`runpy`, as `__main__`,
with `sys.argv` = the script and ARGS) it registers ALE's v0/v4 ids where Gymnasium has not
(the guide's note), and wraps, by environment step (the calls of `SyncVectorEnv.step`):

- `buffer_s`: the time in the buffer's calls: SB3's `ReplayBuffer.add` and `.sample` (which
  CleanRL 1.2.0's script imports),
  or jaxbuf's `HostLoop.add` (its call draws the batch the learner trains on);
- `parts_s` (jaxbuf): checking a step, copying it into the stage, waiting for the call that
  read the other stage, the call (dispatch), and the block's delivery (NumPy views: waiting
  for the call's result);
- `env_s`: `SyncVectorEnv.step`; `compiles`: `[step, seconds]` of each XLA compilation;
- `returns`: the `charts/episodic_return` scalars; `stale`: `charts/buffer_stale_steps`.

It writes them to OUT as JSON with `learning_s` (from the step after LEARNING_STARTS to the
end) and the peak resident memory.
"""

from __future__ import annotations

import collections
import json
import pathlib
import resource
import runpy
import sys
import time

import numpy as np


class Clock:
    """Seconds spent per environment step, per named bucket."""

    def __init__(self):
        self.step = -1  # the environment step now running (0-based)
        self.buckets: dict[str, collections.defaultdict] = {}

    def wrap(self, owner, name: str, bucket: str) -> None:
        """Times `owner.name` into `bucket` at the current step."""
        seconds = self.buckets.setdefault(bucket, collections.defaultdict(float))
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[self.step] += time.perf_counter() - start

        setattr(owner, name, timed)

    def series(self, bucket: str, steps: int) -> list[float]:
        seconds = self.buckets.get(bucket, {})
        return [seconds.get(t, 0.0) for t in range(steps)]


def register_ale() -> None:
    """ALE's v0/v4 ids (`BreakoutNoFrameskip-v4`): Gymnasium 0.29 with ale-py >= 0.9 does not
    register them by itself; Gymnasium 1.x does at `gym.register_envs(ale_py)`."""
    import gymnasium as gym

    if "BreakoutNoFrameskip-v4" in gym.registry:
        return
    import ale_py
    import ale_py.registration

    if hasattr(gym, "register_envs"):
        gym.register_envs(ale_py)
    if "BreakoutNoFrameskip-v4" not in gym.registry:
        ale_py.registration.register_v0_v4_envs()


def instrument(clock: Clock, record: dict, learning_starts: int) -> None:
    import gymnasium as gym
    import jax
    from torch.utils.tensorboard import SummaryWriter

    env_step = gym.vector.SyncVectorEnv.step

    def step(self, actions):
        clock.step += 1
        if clock.step == learning_starts + 1:
            record["learning_from"] = time.perf_counter()
        return env_step(self, actions)

    gym.vector.SyncVectorEnv.step = step
    clock.wrap(gym.vector.SyncVectorEnv, "step", "env_s")

    def compiled(event: str, seconds: float, **_) -> None:
        if event.endswith("backend_compile_duration"):
            record["compiles"].append([clock.step, seconds])

    jax.monitoring.register_event_duration_secs_listener(compiled)
    add_scalar = SummaryWriter.add_scalar

    def scalar(self, tag, value, *args, **kwargs):
        if tag in ("charts/episodic_return", "charts/buffer_stale_steps"):
            record[tag.split("/")[1]].append([clock.step, float(np.ravel(value)[0])])
        return add_scalar(self, tag, value, *args, **kwargs)

    SummaryWriter.add_scalar = scalar


def time_buffers(clock: Clock, folder: pathlib.Path) -> None:
    sys.path.insert(0, str(folder))  # cleanrl_utils, as from the repository's root
    from stable_baselines3.common.buffers import ReplayBuffer

    import jaxbuf
    from jaxbuf.loop import calls as _calls
    from jaxbuf.loop import host_loop as _host_loop
    from jaxbuf.loop import stage as _stage

    clock.wrap(ReplayBuffer, "add", "buffer")
    clock.wrap(ReplayBuffer, "sample", "buffer")
    clock.wrap(jaxbuf.HostLoop, "add", "buffer")
    clock.wrap(_host_loop.HostLoop, "_checked_leaves", "check the step")
    clock.wrap(_stage.Stage, "put", "copy into the stage")
    clock.wrap(_stage.Stage, "turn", "wait for the call that read the other stage")
    clock.wrap(_calls.Calls, "__call__", "call")
    clock.wrap(_calls, "convert", "deliver the block")


def main() -> None:
    script, out, learning_starts = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
    arguments = sys.argv[sys.argv.index("--") + 1 :]
    clock = Clock()
    record = {"compiles": [], "episodic_return": [], "buffer_stale_steps": []}
    register_ale()
    instrument(clock, record, learning_starts)
    time_buffers(clock, pathlib.Path(script).parent.parent)
    sys.argv = [script, *arguments]
    runpy.run_path(script, run_name="__main__")
    ended = time.perf_counter()
    steps = clock.step + 1
    parts = ("check the step", "copy into the stage", "wait for the call that read the other stage",
             "call", "deliver the block")  # fmt: skip
    result = {
        "buffer_s": clock.series("buffer", steps), "env_s": clock.series("env_s", steps),
        "parts_s": {name: clock.series(name, steps) for name in parts if name in clock.buckets},
        "learning_s": ended - record["learning_from"], "compiles": record["compiles"],
        "returns": [r for _, r in record["episodic_return"]],
        "stale": record["buffer_stale_steps"][-1:],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }  # fmt: skip
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
