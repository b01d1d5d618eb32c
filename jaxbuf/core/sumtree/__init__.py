"""The prioritized sampler's sum and min tree: its state and node arithmetic
(`nodes`), `update` and `find` (`tree`), and the accelerators' walk, several levels per
wide access (`blocks`)."""
