"""Transforms of any sampled buffer: `vectorize` (independent buffers under one
sampler), `sharding` (one buffer per shard of a mesh axis), `mix` (fixed proportions
from several buffers), `blocks` (`k` adds and draws in one call).

Rule (tests/test_layout.py): transforms import the core, the options and the
kinds.
"""
