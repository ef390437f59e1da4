#!/usr/bin/env bash
# The deferred stop's CPU-op pause on a GPU, end to end, and the per-call overhead there (the GPU
# run for issue 16, the session split; was bench/gpu_issue16.sh), as sent to the device machine
# (H200, torch with CUDA, no network):
#   bash bench/gpu/drain_cpu_pause.sh   # from the repository root; logs in $OUT
# 1. the CUDA-marked tests, the deferred-stop tests and the crash stress tests on a GPU;
# 2. the end-to-end bench after the split, with the deferred stop's CPU-op pause on (sampled)
#    and off (sampled_drain_cpu), next to plain torch.profiler, ROUNDS rounds;
# 3. the per-call overhead bench.
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
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
  tests/test_deferred_stop.py tests/test_never_crash.py 2>&1 | grep -v USDT | tail -30 \
  | tee "$OUT/tests.log"
timeout "${E2E_S:-300}" python3 bench/e2e_overhead.py --rounds "${ROUNDS:-7}" \
  --only idle,sampled,sampled_drain_cpu,torch_profiler --json "$OUT/e2e.json" 2>&1 \
  | grep -v USDT | tee "$OUT/e2e.log"
timeout 60 python3 bench/overhead.py 2>&1 | grep -v USDT | tee "$OUT/overhead.log"
