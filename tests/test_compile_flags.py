"""The suite's XLA flags: CPU compile flags where only jaxlib's XLA reads them, none where a
PJRT plugin (a GPU machine) would abort on a CPU backend flag it lacks."""

import sys

import compile_flags


def _plugins_in(monkeypatch, folder, names):
    """Makes `jax_plugins` a namespace package under `folder` holding `names`."""
    for name in names:
        (folder / "jax_plugins" / name).mkdir(parents=True)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "jax_plugins", raising=False)
    compile_flags.plugins.cache_clear()


def test_a_gpu_plugin_gets_the_callers_flags_alone(tmp_path, monkeypatch):
    _plugins_in(monkeypatch, tmp_path, ["xla_cuda13"])
    try:
        assert compile_flags.plugins() == ("xla_cuda13",)
        assert compile_flags.fast_compile("--xla_dump_to=/tmp/x") == "--xla_dump_to=/tmp/x"
    finally:
        compile_flags.plugins.cache_clear()


def test_without_a_plugin_the_known_cpu_flags_come_first(tmp_path, monkeypatch):
    _plugins_in(monkeypatch, tmp_path, [])
    try:
        assert compile_flags.plugins() == ()
        flags = compile_flags.fast_compile("--xla_backend_optimization_level=2")
        assert flags.endswith("--xla_backend_optimization_level=2")
        assert flags.count("xla_backend_optimization_level") == 1
        assert "--xla_cpu_parallel_codegen_split_count=1" in flags
    finally:
        compile_flags.plugins.cache_clear()
