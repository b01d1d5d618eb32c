"""Micro-benchmarks: each buffer operation, loop or file path measured alone against its peers."""
