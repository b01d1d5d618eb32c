"""Environments beside the buffers: examples from Gymnasium spaces, gymnax environments
in a pure-function form, and filling a buffer from a policy before training.

Each name is imported on first use; the `if TYPE_CHECKING:` imports are the list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxbuf import _public

if TYPE_CHECKING:
    from jaxbuf.rl.prefill import Environment as Environment
    from jaxbuf.rl.prefill import gymnax_env as gymnax_env
    from jaxbuf.rl.prefill import prefill as prefill
    from jaxbuf.rl.spaces import example_from_space as example_from_space

__getattr__, __dir__, __all__ = _public.attach(__name__, __file__)
