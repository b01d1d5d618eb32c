"""The core: what every buffer is made of.

Records (`records`), the one assembly of a layout and a sampler (`assembly`), ring
storage (`storage`), index draws (`draws`) and the samplers over them (`samplers`),
with the prioritized sampler's sum tree (`sumtree`), the input checks
(`validation`), the byte report (`footprint`), and the lowering seam (`lowering`),
where every choice per platform and every size switch lives.

Rule (tests/test_layout.py): the core imports nothing outside the core.
"""
