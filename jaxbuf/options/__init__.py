"""Options: what a buffer can add to its kind's layout.

Frame stacking (`frames`), goal relabeling (`goals`), storage precision
(`precision`), host-memory placement (`host_memory`). Each takes a layout and
returns one.

Rule (tests/test_layout.py): options import the core only.
"""
