#!/usr/bin/env bash
# Windows of one thread against all threads on a GPU, end to end (the GPU run for issue 15, never
# break the program; was bench/gpu_issue15.sh), as sent to the device machine (H200, torch with
# CUDA, no network):
#   bash bench/gpu/window_threads.sh   # from the repository root; logs in $OUT
# 1. the CUDA-marked tests, the deferred-stop tests and the crash stress tests on a GPU;
# 2. the seed demo at its sizes;
# 3. the sampled window's end-to-end cost with the new default (windows record their own
#    thread, stopped with torch's synchronising stop) against PROFILED_ALL_THREADS=1 (the old
#    default: every thread, deferred stop), each next to plain torch.profiler, ROUNDS rounds.
set -uo pipefail
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
  tests/test_deferred_stop.py tests/test_never_crash.py 2>&1 | grep -v USDT | tail -30 \
  | tee "$OUT/tests.log"
(cd "$(mktemp -d)" && timeout 120 python3 "$OLDPWD/examples/01_matmul_bias.py") 2>&1 \
  | grep -v USDT | tee "$OUT/example.log"
for mode in thread all; do
  if [ "$mode" = all ]; then export PROFILED_ALL_THREADS=1; else unset PROFILED_ALL_THREADS; fi
  timeout 150 python3 bench/e2e_overhead.py --rounds "${ROUNDS:-5}" \
    --only sampled,torch_profiler 2>&1 | grep -v USDT | tee "$OUT/e2e_$mode.log"
done
