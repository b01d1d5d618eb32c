"""Building buffers from configuration dicts and YAML/JSON/TOML files."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from jaxbuf._prioritized import make_prioritized_replay_buffer
from jaxbuf._prioritized_steps import (
    make_prioritized_trajectory_buffer,
    make_prioritized_transition_buffer,
)
from jaxbuf._queue import make_queue
from jaxbuf._replay import make_replay_buffer
from jaxbuf._rollout import make_rollout_buffer
from jaxbuf._trajectory import make_trajectory_buffer
from jaxbuf._transition import make_transition_buffer
from jaxbuf._vectorize import vectorize

#: The buffer kinds a configuration can name, and the factory each one calls.
#: (The episode buffer needs a `done_fn`, which no configuration file can hold.)
KINDS = {
    "prioritized_replay": make_prioritized_replay_buffer,
    "prioritized_trajectory": make_prioritized_trajectory_buffer,
    "prioritized_transition": make_prioritized_transition_buffer,
    "queue": make_queue,
    "replay": make_replay_buffer,
    "rollout": make_rollout_buffer,
    "trajectory": make_trajectory_buffer,
    "transition": make_transition_buffer,
}


def _schema(factory) -> tuple[list[str], list[str]]:
    parameters = inspect.signature(factory).parameters.values()
    required = [p.name for p in parameters if p.default is inspect.Parameter.empty]
    return required, [p.name for p in parameters]


def _read(path: pathlib.Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(text)
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError("reading YAML needs PyYAML: `pip install pyyaml`.") from None
        return yaml.safe_load(text)  # plain data only, never Python objects
    raise ValueError(
        f"a buffer configuration file is .json, .toml, .yaml or .yml, got {path.name!r}."
    )


def buffer_from_config(config: Mapping[str, Any] | str | os.PathLike):
    """Builds a buffer from a configuration dict or file, validated.

    The configuration names the `kind` (`"prioritized_replay"`,
    `"prioritized_trajectory"`, `"prioritized_transition"`, `"queue"`, `"replay"`,
    `"rollout"`, `"trajectory"` or `"transition"`) and the keyword arguments of its factory
    (`make_queue`, `make_replay_buffer`, ...); a replay configuration may add `num_buffers` to get
    `vectorize(buffer, num_buffers)`. Values are checked by the factory, whose
    errors name the argument; keys are checked here.

    Args:
      config: a mapping, or the path of a `.json`, `.toml`, `.yaml` or `.yml`
        file holding one (YAML is read with `safe_load`: plain data only).

    Returns:
      The buffer.

    Raises:
      ValueError: an unknown kind, an unknown key or a missing required key
        (the message names it).
      TypeError: a value of the wrong type (the message names the key).

    Example:
      >>> import jaxbuf
      >>> buffer = jaxbuf.buffer_from_config(
      ...     {"kind": "replay", "capacity": 10_000, "sample_batch_size": 64, "num_buffers": 4})
      >>> type(buffer).__name__, buffer.num_buffers, buffer.config.capacity
      ('VectorizedReplayBuffer', 4, 10000)
    """
    if isinstance(config, (str, os.PathLike)):
        config = _read(pathlib.Path(config))
    if not isinstance(config, Mapping):
        raise TypeError(f"a buffer configuration is a mapping, got {type(config).__name__}.")
    options = dict(config)
    kind = options.pop("kind", None)
    if kind not in KINDS:
        raise ValueError(f"config['kind'] must be one of {sorted(KINDS)}, got {kind!r}.")
    num_buffers = options.pop("num_buffers", None) if kind == "replay" else None
    required, allowed = _schema(KINDS[kind])
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in the {kind!r} configuration; it takes {allowed}"
            + (" and num_buffers" if kind == "replay" else "")
            + "."
        )
    missing = [name for name in required if name not in options]
    if missing:
        raise ValueError(f"the {kind!r} configuration lacks the required key(s) {missing}.")
    buffer = KINDS[kind](**options)
    return buffer if num_buffers is None else vectorize(buffer, num_buffers)
