#!/usr/bin/env bash
# Issue 66's measurement on a lent GPU: where the transition and prioritized kinds' add and
# sample spend their time against Flashbax's flat buffer, kernel by kernel, at the shapes
# users run. Run it after the standing check (`bash .device/check.sh`, which measures the
# issue's ratios themselves: bench_scale at 4,096 environments, add and sample apart, the
# PER step, HostLoop), in the same checkout (.device/setup.sh installs the carried wheels):
#   run carry=[".whl", ".device"], timeout_s=330, command "bash benchmarks/gpu/parity.sh"
# About 4 minutes, each step under its own time limit; into $OUT (default /tmp/gpu-out):
#   kernels_gpu.md, kernel_list_gpu.md  kernels per call, device and wall microseconds per
#       call and their ratios to Flashbax's, and every kernel (benchmarks/micro/bench_kernels.py)
#       at 4,096 x 64 (batch 8,192), 4,096 x 512 (32,768) and 512 x 128 (8,192);
#   no_command_buffers/  the same at 4,096 x 64 with XLA's command buffers off, where the
#       profiler names each kernel's HLO (inside a command buffer it may not): a list to
#       read, not times to quote;
#   parity.txt  the GPU, versions, each step's exit and time, the kernels table.
# Copy what you keep into benchmarks/results/ (naming the GPU) and quote the ratios.
set -u
cd "$(dirname "$0")/../.." || exit 1
. .device/setup.sh || true
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT/no_command_buffers"
s="$OUT/parity.txt"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
  git log -1 --format='commit %h %s' 2>/dev/null; } > "$s"
step() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2; local t0=$(date +%s)
  timeout "$secs" "$@" >> "$OUT/parity.log" 2>&1; local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s (limit $secs)" >> "$s"
}
step kernels 180 python3 -m benchmarks.micro.bench_kernels \
  --shapes 4096,64,8192 4096,512,32768 512,128,8192 --out "$OUT"
step kernels_named 90 env XLA_FLAGS=--xla_gpu_enable_command_buffer= \
  python3 -m benchmarks.micro.bench_kernels --shapes 4096,64,8192 --out "$OUT/no_command_buffers"
cat "$OUT/kernels_gpu.md" >> "$s" 2>/dev/null
cat "$s"
