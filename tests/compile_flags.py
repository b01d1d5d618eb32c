"""XLA's CPU compiler set for the test suite: each program compiled in about half the time,
and compiled once per run.

A test's programs are small and run a few times, so the suite's time goes to compiling
them, not to running them: about a thousand tests, each compiling its own programs (the
library's functions eager or jitted at the test's shapes), at 40-140 ms a program on a
2-core machine. These flags make XLA's CPU backend emit plainer machine code faster:

- `--xla_cpu_use_fusion_emitters=false`: fusions through XLA's elemental loop emitter,
  not its MLIR fusion emitters, whose pipeline costs more than the program it builds
  (about a third of the compile time of a small program);
- `--xla_backend_optimization_level=0` and `--xla_llvm_disable_expensive_passes=true`:
  LLVM without its optimization passes;
- `--xla_cpu_parallel_codegen_split_count=1`: one LLVM module per program (a small
  program split for parallel code generation pays for the split).

What a program computes does not change: none of these is a fast-math flag (XLA's CPU
backend keeps IEEE semantics at every level), and the tests that compare floats to the
NumPy references pass under both settings. The benchmarks, the docs' figures and the
GPU check use XLA's defaults, and so do the tests where a GPU plugin is installed. A flag
that the installed jaxlib does not have is left out (jaxlib 0.5 has no
`xla_cpu_use_fusion_emitters` and aborts on an unknown flag), so that the minimum-JAX
environment runs the same files. `XLA_FLAGS` already set by whoever runs the tests comes
after these and wins.

Tests build the same buffers and so compile the same programs (and the two xdist workers
compile the same small ones): one run shares them through JAX's compilation cache in a
folder of its own (`compilation_cache`), which the worker processes and the processes
the tests start (the sharding workers, the killed writers, the notebooks' kernels) find
through the environment; JAX still traces and lowers every program, and the cache is
keyed on the lowered module, the flags and the versions. About a tenth of the time of
the files that build many buffers. JAX writes an entry in place, so a worker can read one
the other is still writing: JAX warns and compiles the program itself (pyproject.toml
lets that warning pass; it is not an error of the code tested).
"""

from __future__ import annotations

import functools
import mmap
import os
import pathlib
import re
import tempfile

FAST_COMPILE = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0",
                "--xla_llvm_disable_expensive_passes=true",
                "--xla_cpu_parallel_codegen_split_count=1")  # fmt: skip


@functools.cache
def _library() -> pathlib.Path:
    """jaxlib's largest shared library: the one that holds XLA and its flags' names."""
    import jaxlib

    return max(pathlib.Path(jaxlib.__file__).parent.glob("*.so"), key=lambda p: p.stat().st_size)


@functools.cache
def known(flag: str) -> bool:
    """Whether the installed jaxlib's XLA has `flag` (`--name=value`): its name is in
    the library (about 0.1 s, 0.7 s where absent)."""
    name = flag.removeprefix("--").split("=")[0].encode()
    with open(_library(), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(name) >= 0


@functools.cache
def plugins() -> tuple[str, ...]:
    """The PJRT plugins installed (`jax_plugins.*`: CUDA, ROCm). Each holds an XLA of its
    own that parses `XLA_FLAGS` against its own flags at start and aborts the process on
    a name it lacks: the CUDA plugin has no `xla_cpu_use_fusion_emitters`, though its
    library holds the name (in XLA's option descriptions), so `known` cannot tell."""
    try:
        import jax_plugins
    except ImportError:
        return ()
    return tuple(p.name for root in jax_plugins.__path__ for p in pathlib.Path(root).iterdir()
                 if p.is_dir() and not p.name.startswith("__"))  # fmt: skip


def fast_compile(flags: str = "") -> str:
    """`XLA_FLAGS` for the tests: the `FAST_COMPILE` flags this jaxlib knows and `flags`
    does not name, then `flags` (set again in a process that inherits it, it is the same).
    With a PJRT plugin installed (a GPU machine), `flags` alone: the tests compile for the
    accelerator there, and the plugin would abort on the CPU backend's flags."""
    if plugins():
        return flags
    named = set(re.findall(r"--(\w+)", flags))
    ours = [f for f in FAST_COMPILE if f[2:].split("=")[0] not in named and known(f)]
    return " ".join([*ours, flags]).strip()


CACHE = "JAX_COMPILATION_CACHE_DIR"


def compilation_cache() -> str | None:
    """Points JAX's compilation cache at a new folder, for this process and those it
    starts, every program cached however small or quick (returns the folder, which the
    caller removes at the end); `None` where a folder is already set (a worker of this
    run, or one that whoever runs the tests chose)."""
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if os.environ.get(CACHE):
        return None
    os.environ[CACHE] = tempfile.mkdtemp(prefix="jaxbuf-tests-compiled-")
    return os.environ[CACHE]
