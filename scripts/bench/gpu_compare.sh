#!/usr/bin/env bash
# Before and after on one GPU, in one invocation: the current build
# (CANOPY_BIN) against an older one (CANOPY_OLD_BIN, with its cuda module),
# then the current build with each change turned off in turn (SWITCHES:
# CANOPY_RUN_OVERLAP=0: no host/device overlap, in canopy run and in the
# daemon's workers; CANOPY_CUDA_LT=0: bias kernel + cublasSgemm;
# CANOPY_CUDA_BATCH_STAGING=0: every call uploads its own indices), then
# several jobs. Every step has a timeout; logs under $OUT. Without
# CANOPY_OLD_BIN the older build's steps are skipped.
# What it needs comes from the environment (gpu_env.sh; --help says it).
#
# usage: scripts/bench/gpu_compare.sh
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
gpu_start "$@"
bench() { timeout "$1" python3 scripts/bench/gpu.py --data "$D" "${@:2}" 2>&1; }
# The older build, if there is one: its module, then the command.
old() {
  if [ -z "$OLD_B" ]; then echo "(no CANOPY_OLD_BIN: skipped)"; return; fi
  CANOPY_CUDA_MODULE=$OLD_MODULE "$@"
}
step GPU
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
step test_cuda
if [ -n "$TEST_CUDA" ]; then
  timeout 150 "$TEST_CUDA" --verbose >"$OUT/test_cuda.log" 2>&1
  echo "test_cuda exit $?"; grep -E "launches|Synthesis" "$OUT/test_cuda.log" | tail -12
else
  echo "no test_cuda beside $B: skipped (CANOPY_TEST_CUDA)"
fi
step "stats: which product path"
head -256 "$D/trees-binary.jsonl" >"$OUT/t256.jsonl"
timeout 60 "$B" model init treelstm "$OUT/m" --hidden 128 --embed 128 \
  --vocab-from "$OUT/t256.jsonl" --seed 3 >/dev/null 2>&1
CANOPY_CUDA_STATS=1 timeout 60 "$B" run --backend cuda --model "$OUT/m" \
  --input "$OUT/t256.jsonl" --batch 64 --jobs 1 2>&1 >/dev/null | tail -3
step "new: treelstm, with PyTorch and the daemon"
bench 200 --canopy "$B" --families treelstm --hidden 128,512 \
  --runs 64,256,1024,4096 | tee "$OUT/new_tree.txt"
step "old: treelstm"
old bench 120 --canopy "$OLD_B" \
  --families treelstm --hidden 128,512 --runs 64,256,1024,4096 --no-torch \
  --no-daemon | tee "$OUT/old_tree.txt"
SWITCHES=${SWITCHES:-"CANOPY_RUN_OVERLAP=0 CANOPY_CUDA_LT=0 CANOPY_CUDA_BATCH_STAGING=0"}
for sw in $SWITCHES; do
  step "new, $sw"
  env "$sw" timeout 100 python3 scripts/bench/gpu.py --data "$D" --canopy "$B" \
    --families treelstm --hidden 128,512 --runs 256,1024,4096 --no-torch \
    --no-daemon 2>&1 | tee "$OUT/new_${sw%%=*}.txt"
done
step "daemon: overlap off, batch staging off (c=1 p50, c=64)"
for sw in CANOPY_RUN_OVERLAP=0 CANOPY_CUDA_BATCH_STAGING=0; do
  env "$sw" timeout 90 python3 scripts/bench/gpu.py --data "$D" --canopy "$B" \
    --families treelstm --hidden 128 --runs 64 --no-torch 2>&1 |
    grep daemon | sed "s/^/$sw: /" | tee -a "$OUT/daemon_off.txt"
done
step "latticelstm new, old"
bench 120 --canopy "$B" --families latticelstm --hidden 128,512 --runs 64,1024 \
  --no-daemon | tee "$OUT/new_lattice.txt"
old bench 90 --canopy "$OLD_B" \
  --families latticelstm --hidden 128,512 --runs 64,1024 --no-torch \
  --no-daemon | tee "$OUT/old_lattice.txt"
step "jobs"
for j in 4 8; do
  bench 60 --canopy "$B" --jobs $j --families treelstm --hidden 128,512 \
    --runs 1024 --instances 16384 --no-torch --no-daemon | tee -a "$OUT/jobs.txt"
  old bench 60 --canopy "$OLD_B" \
    --jobs $j --families treelstm --hidden 128,512 --runs 1024 \
    --instances 16384 --no-torch --no-daemon | sed "s/^/old /" | tee -a "$OUT/jobs.txt"
done
step done
