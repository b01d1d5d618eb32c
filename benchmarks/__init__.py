"""jaxbuf's benchmarks, run from the repository root as modules: `python -m benchmarks.run_all`,
`python -m benchmarks.micro.bench_replay`."""
