"""Actors in other processes feeding a learner's buffer through Ray (`jaxbuf.ray`).

`ledger` decides which blocks are written (each once); `inbox` is the Ray actor between the
writers and the learner; `writer` is the actor's side, `ingest` the learner's.
"""
