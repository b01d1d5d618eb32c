"""Reinforcement-learning tools beside the buffers: returns and advantages
(`returns`), Reverb's rate limiter (`rate_limit`, exact in `binary64` and `limbs`),
filling a buffer from a policy (`prefill`), examples from Gymnasium spaces
(`spaces`).

Rule (tests/test_layout.py): rl imports the core only.
"""
