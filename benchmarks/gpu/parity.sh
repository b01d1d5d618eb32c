#!/usr/bin/env bash
# Issue 66's measurements on a lent GPU: where the transition and prioritized kinds' time
# goes against Flashbax's flat buffer, at the shapes users run. Run after the standing
# check (`bash .device/check.sh`), in the same checkout (it uses .device/setup.sh and the
# probes ../shared/tools/gpu/prepare.sh copied there), with the device tool:
#   run carry=[".whl", ".device"], timeout_s=420, command "bash benchmarks/gpu/parity.sh"
# Each step under its own time limit; into $OUT (default /tmp/gpu-out):
#   kernels_gpu.md, kernel_list_gpu.md  bench_kernels: kernels per call, device and wall
#                  microseconds per call and their ratios to Flashbax's, kernel by kernel,
#                  at the five shapes of the issue's table (benchmarks/micro/bench_kernels.py);
#   scale_users_gpu.md  bench_scale --users --apart: add alone and sample alone at those shapes;
#   per_gae.log    the PER step and prioritized sampling against the uniform step (probe);
#   hostloop.log   HostLoop on CartPole at k = 1 ... 128 against a NumPy ring (probe);
#   parity.txt     the GPU, versions, every step's exit and time.
# Copy what you keep into benchmarks/results/ (naming the GPU) and quote the ratios.
set -u
cd "$(dirname "$0")/../.." || exit 1
. .device/setup.sh || true
[ -d .device/brax_queue ] && export PYTHONPATH=$PWD/.device/brax_queue:$PYTHONPATH
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
s="$OUT/parity.txt"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
  git log -1 --format='commit %h %s' 2>/dev/null; } > "$s"
step() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2; local t0=$(date +%s)
  timeout "$secs" "$@" >> "$OUT/parity.log" 2>&1; local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s (limit $secs)" >> "$s"
}
step kernels 150 python3 -m benchmarks.micro.bench_kernels --out "$OUT"
step scale_users 120 python3 -m benchmarks.micro.bench_scale --users --apart --table scale_users --out "$OUT"
step per_gae 60 env CAP=1000000 STEPS=200 python3 .device/probes/per_gae_probe.py
step hostloop 50 python3 .device/probes/hostloop_gpu.py
grep -h "" "$OUT"/kernels_gpu.md >> "$s" 2>/dev/null
cat "$s"
