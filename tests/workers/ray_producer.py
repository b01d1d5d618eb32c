"""An actor process for tests/test_ray.py: a `jaxbuf.ray.Writer` sending numbered steps.

Each step carries who wrote it (`actor`, `incarnation`, `block`, `step`), so the learner's
buffer tells which blocks it holds and how often. Every acknowledgement the writer hears
is appended to a log file (`incarnation last_block` per line), which outlives a killed
process: the blocks a writer was told are written.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from jaxbuf.ray.writer import Writer


class Producer:
    """Sends steps from a thread until `stop` (a Ray actor, made by the test)."""

    def __init__(self, inbox: str, index: int, log: str, block_size: int, window: int,
                 delay: float, namespace: str | None = None) -> None:  # fmt: skip
        self.writer = Writer(inbox, f"actor-{index}", block_size=block_size, window=window,
                             namespace=namespace)  # fmt: skip
        self.index, self.log, self.delay, self.stopped = index, log, delay, False
        self.sent_blocks, self.max_in_flight = 0, 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        heard = (self.writer.incarnation, -1)
        step = 0
        while not self.stopped:
            block, within = divmod(step, self.writer.block_size)
            self.writer.append({
                "ids": np.array([self.index, self.writer.incarnation, block, within], np.int32),
                "obs": np.full(3, step, np.float32)})  # fmt: skip
            self.max_in_flight = max(self.max_in_flight, self.writer.in_flight)
            step += 1
            if self.writer.written_through != heard:
                heard = self.writer.written_through
                with open(self.log, "a") as log:
                    log.write(f"{heard[0]} {heard[1]}\n")
            time.sleep(self.delay)

    def stop(self) -> dict:
        """Stops sending; waits for the blocks in flight; returns the writer's counts."""
        self.stopped = True
        self.thread.join()
        self.writer.wait(timeout=30)
        with open(self.log, "a") as log:
            log.write(f"{self.writer.written_through[0]} {self.writer.written_through[1]}\n")
        writer = self.writer
        return {"written_blocks": writer.written_blocks, "in_flight": writer.in_flight,
                "max_in_flight": self.max_in_flight, "params": writer.params_version}  # fmt: skip

    def node(self) -> str:
        """The id of the Ray node this process runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def incarnation(self) -> int:
        """This process's incarnation of the writer's name (a restart gets a new one)."""
        return self.writer.incarnation

    def params(self) -> tuple[int, object, bool]:
        """The newest parameters the learner published, their version, and whether a JAX
        backend was started in this process (it should not be)."""
        from jax._src import xla_bridge

        params = self.writer.params()
        return self.writer.params_version, params, bool(xla_bridge._backends)
