"""Reinforcement-learning tools beside the buffers: returns (`discounted_returns`,
`lambda_returns`, `n_step_returns`; `gae` is at the top level, `jaxbuf.gae`) and the keys a
rollout buffer's step holds (`STEP_KEYS`).

Modules: returns and advantages (`returns`), Reverb's rate limiter (`rate_limit`, exact
in `binary64` and `limbs`), filling a buffer from a policy (`prefill`), examples from
Gymnasium spaces (`spaces`). Each public name is imported on first use; the `if
TYPE_CHECKING:` imports are the list.

Rule (tests/test_layout.py): rl imports the core only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxbuf import _public

if TYPE_CHECKING:
    from jaxbuf.rl.returns import STEP_KEYS as STEP_KEYS
    from jaxbuf.rl.returns import discounted_returns as discounted_returns
    from jaxbuf.rl.returns import lambda_returns as lambda_returns
    from jaxbuf.rl.returns import n_step_returns as n_step_returns

__getattr__, __dir__, __all__ = _public.attach(__name__, __file__)
