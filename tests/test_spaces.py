"""Example items from Gymnasium and gymnax spaces."""

import re

import gymnasium.spaces as gym_spaces
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces as gymnax_spaces

import jaxbuf


def shapes(tree):
    return jax.tree.map(lambda x: (x.shape, x.dtype.name), tree)


def test_gymnasium_spaces():
    space = gym_spaces.Dict(
        {
            "image": gym_spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "state": gym_spaces.Box(-1.0, 1.0, (5,), np.float32),
            "mode": gym_spaces.Discrete(3),
            "buttons": gym_spaces.MultiBinary(4),
            "grid": gym_spaces.MultiBinary([2, 3]),
            "levers": gym_spaces.MultiDiscrete([2, 5, 3]),
            "pair": gym_spaces.Tuple((gym_spaces.Discrete(2), gym_spaces.Box(0.0, 1.0, (2,)))),
        }
    )
    assert shapes(jaxbuf.envs.example_from_space(space)) == {
        "image": ((4, 4, 3), "uint8"),
        "state": ((5,), "float32"),
        "mode": ((), "int32"),  # int64 without jax_enable_x64
        "buttons": ((4,), "int8"),
        "grid": ((2, 3), "int8"),
        "levers": ((3,), "int32"),
        "pair": (((), "int32"), ((2,), "float32")),
    }


def test_gymnax_spaces_and_a_whole_transition():
    env_obs = gymnax_spaces.Box(-1.0, 1.0, (4,), jnp.float32)
    example = jaxbuf.envs.example_from_space(
        {
            "obs": env_obs,
            "action": gymnax_spaces.Discrete(2),
            "reward": jnp.float32(0),
            "done": False,
            "extras": gymnax_spaces.Tuple([env_obs, gymnax_spaces.Dict({"a": env_obs})]),
            "history": [np.zeros(2, np.int16)],
        }
    )
    assert shapes(example) == {
        "obs": ((4,), "float32"),
        "action": ((), "int32"),
        "reward": ((), "float32"),
        "done": ((), "bool"),
        "extras": (((4,), "float32"), {"a": ((4,), "float32")}),
        "history": [((2,), "int16")],
    }
    state = jaxbuf.make_replay_buffer(8, 2).init(example)
    assert state.experience["extras"][1]["a"].shape == (8, 4)


def test_unsupported_spaces_are_named():
    space = {"obs": gym_spaces.Box(0.0, 1.0, (2,)), "text": gym_spaces.Text(5)}
    message = "space['text'] is a gymnasium.spaces.text.Text; example_from_space supports"
    with pytest.raises(TypeError, match=re.escape(message)):
        jaxbuf.envs.example_from_space(space)
    with pytest.raises(TypeError, match=re.escape("space[1] is a builtins.str")):
        jaxbuf.envs.example_from_space((gym_spaces.Discrete(2), "x"))
