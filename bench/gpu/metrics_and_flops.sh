#!/usr/bin/env bash
# Always-on metrics' cost and achieved FLOP/s / MFU on a GPU (the run for issues 17 and 18; was
# bench/gpu_issues17_18.sh), as sent to the device machine (an H200 is what the issues name;
# torch with CUDA, no network; opentelemetry from wheels carried in .whl/):
#   bash bench/gpu/metrics_and_flops.sh   # from the repository root; logs in $OUT
# 1. the CUDA-marked tests (issue 17's device-time test among them);
# 2. issue 17: the end-to-end bench with metrics on (device sampling at the default 100), the
#    per-call bench and the metrics-only path piece by piece (this host's Python and CPU);
# 3. issue 18: achieved TFLOP/s and MFU of the 4096x4096 bf16 matmul+bias against the trace's
#    kernel time and CUDA events; the examples 01 and 03 at the seed's sizes (FLOPs lines).
set -uo pipefail
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  git log --oneline -1 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
} 2>&1 | tee "$OUT/machine.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_flops.py \
  2>&1 | grep -v USDT > "$OUT/tests.log"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/test_gate.py \
  2>&1 | grep -v USDT | tail -15 | tee "$OUT/tests_gate.log"
timeout 200 python3 bench/e2e_overhead.py --rounds "${ROUNDS:-7}" --only idle,metrics,sampled \
  --json "$OUT/e2e.json" 2>&1 | grep -v USDT | tee "$OUT/e2e.log"
timeout 120 python3 bench/overhead.py --json "$OUT/overhead.json" 2>&1 | grep -v USDT \
  | tee "$OUT/overhead.log" | grep -E "PASS|MISS"
timeout 60 python3 bench/metrics_pieces.py 2>&1 | grep -v USDT | tee "$OUT/pieces.log"
timeout 120 python3 bench/flops_gpu.py --json "$OUT/flops.json" 2>&1 | grep -v USDT \
  | tee "$OUT/flops.log"
for ex in 01_matmul_bias 03_mlp; do
  timeout 180 python3 "examples/$ex.py" 2>&1 | grep -v USDT | tee "$OUT/$ex.log" | grep -E "FLOP|range"
done
