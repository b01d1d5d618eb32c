"""Building buffers from configuration dicts and YAML/JSON/TOML files."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

from jaxbuf.core.samplers import epochs, prioritized, uniform
from jaxbuf.core.time_ring import DoneKey
from jaxbuf.kinds.episode import make_episode_buffer
from jaxbuf.kinds.queue import make_queue
from jaxbuf.kinds.replay import make_replay_buffer
from jaxbuf.kinds.rollout import make_rollout_buffer
from jaxbuf.kinds.trajectory import make_trajectory_buffer
from jaxbuf.kinds.transition import make_transition_buffer
from jaxbuf.options.goals import hindsight
from jaxbuf.transforms.vectorize import vectorize

#: The factory of each `kind` a configuration can name (`buffer.config.kind`).
FACTORIES = {
    "episode": make_episode_buffer,
    "queue": make_queue,
    "replay": make_replay_buffer,
    "rollout": make_rollout_buffer,
    "trajectory": make_trajectory_buffer,
    "transition": make_transition_buffer,
}
SAMPLERS = {"epochs": epochs, "prioritized": prioritized, "uniform": uniform}


def upgraded(factory: Any, options: dict, *, warn: bool) -> dict:
    """A configuration written by jaxbuf 0.3 in 0.4's keys: a per-environment kind's
    `capacity` (steps per environment) is its `steps_per_env`, the same number. With
    `warn`, a `DeprecationWarning` says so (a configuration file to update)."""
    if "capacity" not in options or "steps_per_env" not in inspect.signature(factory).parameters:
        return options
    if warn:
        warnings.warn(
            f"the configuration's 'capacity' ({options['capacity']!r}) is read as "
            f"'steps_per_env', its name since jaxbuf 0.4 (steps stored per environment); "
            f"write 'steps_per_env' in the file.",
            DeprecationWarning,
            stacklevel=3,
        )
    renamed = {("steps_per_env" if k == "capacity" else k): v for k, v in options.items()}
    return renamed


def _schema(factory) -> tuple[list[str], list[str]]:
    parameters = inspect.signature(factory).parameters.values()
    required = [p.name for p in parameters if p.default is inspect.Parameter.empty]
    return required, [p.name for p in parameters]


def _parser(path: pathlib.Path) -> Any:
    if path.suffix == ".json":
        return json.loads
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError("reading YAML needs PyYAML: `pip install pyyaml`.") from None
        return yaml.safe_load  # plain data only, never Python objects
    raise ValueError(
        f"a buffer configuration file is .json, .toml, .yaml or .yml, got {path.name!r}."
    )


def _read(path: pathlib.Path) -> Any:
    """The file's data; a file that does not parse raises `ValueError` naming it."""
    parse, text = _parser(path), path.read_text()
    try:
        return parse(text)
    except Exception as error:  # each format raises its own error type
        raise ValueError(f"{path} is not valid {path.suffix[1:].upper()}: {error}") from error


def _named(table: dict, what: str, options: dict) -> tuple[str, Any]:
    kind = options.pop("kind", None)
    if not isinstance(kind, str) or kind not in table:
        raise ValueError(f"{what}['kind'] must be one of {sorted(table)}, got {kind!r}.")
    return kind, table[kind]


def _check_keys(kind: str, factory: Any, options: dict, extra: tuple[str, ...]) -> None:
    required, allowed = _schema(factory)
    unknown = sorted(set(options) - set(allowed) - set(extra), key=str)
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in the {kind!r} configuration; it takes "
            f"{allowed + list(extra)}."
        )
    given = set(options) | ({"done_fn"} if "done_key" in options else set())
    missing = [name for name in required if name not in given]
    if missing:
        raise ValueError(f"the {kind!r} configuration lacks the required key(s) {missing}.")


def _sampler(options: dict) -> dict:
    if "sampler" not in options:
        return {}
    config = options.pop("sampler")
    if not isinstance(config, Mapping):
        raise TypeError(f"config['sampler'] is a mapping, got {type(config).__name__}.")
    config = dict(config)
    name, factory = _named(SAMPLERS, "config['sampler']", config)
    _check_keys(f"{name} sampler", factory, config, ())
    return {"sampler": factory(**config)}


def _goals(options: dict) -> dict:
    """`goals` as a `Hindsight`: a mapping of `jaxbuf.hindsight`'s arguments (its
    `reward_fn` and `terminal_fn` are functions, so only a dict can hold them)."""
    config = options.pop("goals", None)
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(f"config['goals'] is a mapping, got {type(config).__name__}.")
    config = {k: v for k, v in config.items() if v is not None}
    _check_keys("goals (hindsight)", hindsight, config, ())
    return {"goals": hindsight(**config)}


def buffer_from_config(config: Mapping[str, Any] | str | os.PathLike) -> Any:
    """Builds a buffer from a configuration dict or file, validated.

    A configuration is what a buffer's `config` holds: the `kind` (`"replay"`,
    `"trajectory"`, `"transition"`, `"episode"`, `"queue"` or `"rollout"`), the
    keyword arguments of its factory (`make_replay_buffer`, ...), for sampled
    kinds an optional `"sampler": {"kind": "uniform" | "prioritized", ...}` with
    the arguments of `jaxbuf.uniform` or `jaxbuf.prioritized`, and for kinds
    with a `done_fn` a `"done_key"`: the `/`-separated path of the bool leaf of
    a step that ends an episode (the file form of `done_fn`), and for transition
    and episode buffers an optional `"goals"` mapping of `jaxbuf.hindsight`'s
    arguments (with its `reward_fn`, so in a dict, not a file). A replay
    configuration may add `num_buffers` to get `vectorize(buffer, num_buffers)`.
    Values are checked by the factories, whose errors name the argument; keys
    are checked here. `buffer_from_config(buffer.config)` rebuilds a buffer.

    Args:
      config: a mapping, or the path of a `.json`, `.toml`, `.yaml` or `.yml`
        file holding one (YAML is read with `safe_load`: plain data only).

    Returns:
      The buffer.

    Raises:
      ValueError: an unknown kind, an unknown key or a missing required key
        (the message names it).
      TypeError: a value of the wrong type (the message names the key).

    Examples:
      >>> import jaxbuf
      >>> buffer = jaxbuf.io.buffer_from_config({"kind": "trajectory", "num_envs": 4,
      ...     "steps_per_env": 1000, "sample_batch_size": 32, "sequence_length": 8,
      ...     "done_key": "done", "sampler": {"kind": "prioritized", "priority_exponent": 0.7}})
      >>> buffer.config.sampler.priority_exponent, buffer.config.done_key
      (0.7, 'done')
    """
    if isinstance(config, (str, os.PathLike)):
        config = _read(pathlib.Path(config))
    if not isinstance(config, Mapping):
        raise TypeError(f"a buffer configuration is a mapping, got {type(config).__name__}.")
    options = {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in config.items()}
    kind, factory = _named(FACTORIES, "config", options)
    options = upgraded(factory, options, warn=True)
    extra: tuple[str, ...] = ("num_buffers",)  # vectorize refuses the kinds it cannot lift
    if "done_fn" in inspect.signature(factory).parameters:
        extra += ("done_key",)
    _check_keys(kind, factory, options, extra)
    num_buffers = options.pop("num_buffers", None)
    done_key = options.pop("done_key", None)
    if done_key is not None:
        options["done_fn"] = DoneKey(done_key)
    sampler, goals = _sampler(options), _goals(options)
    buffer = factory(**options, **sampler, **goals)
    return buffer if num_buffers is None else vectorize(buffer, num_buffers)
