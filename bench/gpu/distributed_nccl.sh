#!/usr/bin/env bash
# Distributed profiling on GPUs over NCCL (was bench/dist_gpu.sh; the lead's run on the 2-GPU
# device machine, nvidia-h200-x2):
#   bash bench/gpu/distributed_nccl.sh   # from the repository root; logs: $OUT or ./dist_gpu_out
# A 2-process torchrun job on NCCL (tests/_dist_job.py, one GPU per rank) with sampling on and
# CPU+CUDA activities; then: did both ranks record the same steps (reports), does each rank's
# trace carry distributedInfo with backend nccl, the ranks side by side (torch-profiled
# summarize), and, where holistictraceanalysis is installed, HTA's view of both ranks.
set -uo pipefail
OUT="${OUT:-./dist_gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PROFILED_EXPORTERS=trace,json PROFILED_TRACE_DIR="$OUT/traces" PROFILED_TRACE_KEEP=1
export PROFILED_JSON_PATH="$OUT/reports.jsonl" PROFILED_SCHEDULE=warmup=1,active=2
export PROFILED_EVERY=4 PROFILED_SAMPLE_RATE=0.5 PROFILED_SEED=4
rm -rf "$OUT/traces" "$OUT/reports.jsonl"
python3 -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29533 \
  tests/_dist_job.py 24 --backend nccl 2>&1 | grep -v USDT | tee "$OUT/job.log"
rc=${PIPESTATUS[0]}
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/check.log"
import gzip, json, os, sys
out = sys.argv[1]
steps = {}
for line in open(os.path.join(out, "reports.jsonl")):
    d = json.loads(line)
    steps.setdefault(d["rank"], []).append((d["window"], d["steps"], d["device"]))
print("windows per rank:", json.dumps(steps))
print("same steps on both ranks:", len({json.dumps([s for _, s, _ in v]) for v in steps.values()}) == 1)
for name in sorted(os.listdir(os.path.join(out, "traces"))):
    with gzip.open(os.path.join(out, "traces", name), "rt") as f:
        info = json.load(f)["distributedInfo"]
    print(name, {k: info.get(k) for k in ("backend", "rank", "world_size")})
try:
    from hta.trace_analysis import TraceAnalysis
except ImportError:
    print("holistictraceanalysis not installed: HTA check skipped")
else:
    a = TraceAnalysis(trace_dir=os.path.join(out, "traces"), include_last_profiler_step=True)
    print("HTA ranks:", a.t.get_ranks())
    print(a.get_temporal_breakdown(visualize=False))
PY
python3 -m instrument summarize "$OUT/traces" --rows 8 2>&1 | tee "$OUT/summarize.log"
exit "$rc"
