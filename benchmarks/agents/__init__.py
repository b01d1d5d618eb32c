"""Agents and real clients: whole training loops, and upstream scripts (vendored under
`cleanrl/upstream`) run as their authors wrote them and as our guides change them."""
