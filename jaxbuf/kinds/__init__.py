"""The buffer kinds: `replay`, `trajectory`, `transition`, `episode` (each a layout
assembled with a sampler), and the `queue` and the `rollout` buffer.

Rule (tests/test_layout.py): kinds import the core and the options only.
"""
