#!/usr/bin/env bash
# The GPU validation run (was bench/gpu_run.sh), as sent to the device machine (an H200 with
# torch+CUDA, no network):
#   bash bench/gpu/validation.sh     # from the repository root; logs under $OUT (or ./gpu_out)
# It runs the whole test suite (CUDA-marked tests included) against the machine's torch, the seed
# demo at the seed's sizes, the seed tables next to plain torch.profiler, and the overhead bench.
set -uo pipefail
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
  lscpu | grep -E "Model name|^CPU\(s\)"
} 2>&1 | tee "$OUT/machine.txt"
python3 -m pytest ${PYTEST_ARGS:-tests} -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/tests.log"
rc=${PIPESTATUS[0]}
(cd "$(mktemp -d)" && python3 "$OLDPWD/examples/01_matmul_bias.py") 2>&1 | grep -v USDT | tee "$OUT/example.log"
python3 bench/seed_tables.py 2>&1 | grep -v USDT | tee "$OUT/seed_tables.log"
python3 bench/analysis_speed.py --json "$OUT/analysis_speed.json" 2>&1 | grep -v USDT | tee "$OUT/analysis_speed.log"
if [ -f bench/overhead.py ]; then
  python3 bench/overhead.py --json "$OUT/overhead.json" 2>&1 | grep -v USDT | tee "$OUT/overhead.log"
fi
exit "$rc"
