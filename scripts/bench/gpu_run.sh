#!/usr/bin/env bash
# One invocation on a machine with an NVIDIA GPU and a cuda build, every step
# with a timeout, logs under $OUT (or ./gpu-out). Steps: the GPU;
# test_cuda; batch invariance on cuda (canopy run --batch 1 against 64 and
# everything in one run, byte for byte, reported not asserted:
# docs/api.md); scripts/bench/gpu.py (docs/benchmarks.md's cuda table).
# What it needs comes from the environment (gpu_env.sh; --help says it).
#
# usage: scripts/bench/gpu_run.sh [quick]   (quick: fewer sizes in gpu.py)
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
gpu_start "$@"
step GPU
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
step test_cuda
if [ -n "$TEST_CUDA" ]; then
  timeout 150 "$TEST_CUDA" >"$OUT/test_cuda.log" 2>&1
  echo "test_cuda exit $?"; tail -3 "$OUT/test_cuda.log"
else
  echo "no test_cuda beside $B: skipped (CANOPY_TEST_CUDA)"
fi
step "invariance on cuda"
inv=$(mktemp -d)
head -200 "$D/trees-binary.jsonl" >"$inv/t.jsonl"
for H in 64 512; do
  timeout 60 "$B" model init treelstm "$inv/m$H" --hidden $H --embed $H \
    --vocab-from "$inv/t.jsonl" --seed 3 2>/dev/null
  for b in 1 64 100000; do
    timeout 120 "$B" run --backend cuda --model "$inv/m$H" --input "$inv/t.jsonl" \
      --outputs all --return-hidden --batch $b --jobs 1 >"$inv/out$H-$b" 2>/dev/null
  done
  for b in 64 100000; do
    if cmp -s "$inv/out$H-1" "$inv/out$H-$b"; then r=identical; else r=differ; fi
    echo "treelstm H=$H cuda: --batch $b against --batch 1: $r"
  done
  timeout 120 "$B" run --backend cpu --model "$inv/m$H" --input "$inv/t.jsonl" \
    --outputs all --return-hidden --batch 64 >"$inv/cpu$H" 2>/dev/null
  python3 - "$inv/out$H-1" "$inv/out$H-64" "$inv/cpu$H" <<'PY'
import json, sys
def nums(o, acc):
    if isinstance(o, float): acc.append(o)
    elif isinstance(o, list):
        for x in o: nums(x, acc)
    elif isinstance(o, dict):
        for k in sorted(o): nums(o[k], acc)
    return acc
a, b, c = ([nums(json.loads(l), []) for l in open(p)] for p in sys.argv[1:])
d = lambda x, y: max((abs(p - q) for u, v in zip(x, y) for p, q in zip(u, v)), default=0)
print(f"  max |diff|: cuda b1 vs b64 {d(a, b):.3g}; cuda vs cpu {d(a, c):.3g}")
PY
done
step "gpu.py"
if [ "${1:-}" = quick ]; then
  timeout 300 python3 scripts/bench/gpu.py --canopy "$B" --data "$D" \
    --hidden 128,512 --runs 64,1024 2>&1 | tee "$OUT/gpu_bench.txt"
else
  timeout 420 python3 scripts/bench/gpu.py --canopy "$B" --data "$D" 2>&1 |
    tee "$OUT/gpu_bench.txt"
  step "gpu.py, several jobs"
  for j in 4 8; do
    timeout 150 python3 scripts/bench/gpu.py --canopy "$B" --data "$D" --jobs $j \
      --families treelstm --hidden 128,512 --runs 256,1024 --instances 16384 \
      --no-torch --no-daemon 2>&1 | tee -a "$OUT/gpu_bench_jobs.txt"
  done
fi
step done
