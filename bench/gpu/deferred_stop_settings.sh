#!/usr/bin/env bash
# A sampled window's cost on a GPU under each deferred-stop setting (first written for issue 6;
# was bench/gpu_window.sh), as sent to the device machine (H200, torch+CUDA, no network;
# OpenTelemetry wheels carried in .whl/, see the device README):
#   bash bench/gpu/deferred_stop_settings.sh   # from the repository root; logs: $OUT or ./gpu_out
# The CUDA tests of the deferred stop first, then the end-to-end figures of the sampled window
# against plain torch.profiler (same windows) for: the defaults (deferred stop, at most
# 4 steps, export 0.3 s after the stop, no CPU ops recorded meanwhile; the first run also
# times the same with CPU ops recorded), at most 2 steps, no export delay, and no deferred
# stop (torch's synchronising stop). ROUNDS=7 rounds each. Expect ~7-8 minutes on an H200.
set -uo pipefail
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_deferred_stop.py \
  2>&1 | grep -v USDT | tail -30 | tee "$OUT/tests.log"
run() {  # name, extra e2e arguments
  local name=$1; shift
  timeout 150 python3 bench/e2e_overhead.py --rounds "${ROUNDS:-7}" \
    --only "${ONLY:-sampled,torch_profiler}" "$@" 2>&1 | grep -v USDT | tee "$OUT/e2e_$name.log"
}
ONLY=sampled,sampled_drain_cpu,torch_profiler run defaults
run drain2 --max-drain 2
run nodelay --export-delay 0
run nodefer --max-drain 0
