"""Agents and real clients: whole training loops, and peers' released scripts (read out of
their packages at run time) run as their authors wrote them and as our guides change them."""
