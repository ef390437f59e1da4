#!/usr/bin/env bash
# A sampled window's cost on a GPU (issue 6), as sent to the device machine (H200, torch+CUDA,
# no network; OpenTelemetry wheels carried in .whl/, see the device README):
#   bash bench/gpu_window.sh        # from the repository root; logs under $OUT or ./gpu_out
# Where a window's time goes with the deferred stop off (0) and on (2, 8, 32 steps at most),
# then the end-to-end figures for 0 and 2, 5 interleaved rounds each (ROUNDS=...).
# Expect ~7-8 minutes on an H200 (the device tool's limit is 10). Seven files come back (the
# device tool returns at most 8): machine.txt, window_cost_{0,2,8,32}.log, e2e_{0,2}.log.
set -uo pipefail
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
for n in 0 2 8 32; do
  timeout 60 python3 bench/window_cost.py --every 50 --steps 300 --max-drain "$n" 2>&1 | grep -v USDT | tee "$OUT/window_cost_$n.log"
done
for n in 0 2; do
  timeout 200 python3 bench/e2e_overhead.py --rounds "${ROUNDS:-5}" --max-drain "$n" \
    2>&1 | grep -v USDT | tee "$OUT/e2e_$n.log"
done
