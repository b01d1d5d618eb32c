"""A Python loop's way in: `HostLoop` (`host_loop`), its staging of steps on the
host (`stage`) and its calls (`calls`).

Rule (tests/test_layout.py): the loop imports the wings below it, never `io` or
`rl`.
"""
