#!/usr/bin/env bash
# Where one job's time goes on a GPU: the host alone (--backend cpu at
# H=8, where compute is nothing), then cuda with enough instances that
# start-up is amortised, the current build (CANOPY_BIN) against an older
# one (CANOPY_OLD_BIN; skipped without) and the current build with overlap
# or cublasLt off; then many jobs. Logs under $OUT.
# What it needs comes from the environment (gpu_env.sh; --help says it).
#
# usage: scripts/bench/gpu_host.sh
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
gpu_start "$@"
W=$OUT/w
mkdir -p "$W"
for i in $(seq 82); do cat "$D/trees-binary.jsonl"; done | head -32768 >$W/t32k.jsonl
for i in 1 2; do cat $W/t32k.jsonl; done >$W/t64k.jsonl
for H in 8 128 512; do
  timeout 60 "$B" model init treelstm $W/m$H --hidden $H --embed $H \
    --vocab-from "$D/trees-binary.jsonl" --seed 3 >/dev/null 2>&1
done
ips() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(f\"{d['instances_per_s']:>9,.0f}/s launches {d['launches']} syncs {d['device_syncs']} runs {d['runs']}\")"; }
one() { # tag, env..., then canopy args
  local tag=$1; shift
  printf '%-34s' "$tag"
  env "$@" 2>&1 >/dev/null | ips
}
# One run of the older build, if there is one: tag, then canopy args.
old() {
  local tag=$1; shift
  if [ -z "$OLD_B" ]; then printf '%-34s(no CANOPY_OLD_BIN: skipped)\n' "$tag"; return; fi
  one "$tag" CANOPY_CUDA_MODULE="$OLD_MODULE" timeout 60 "$OLD_B" "$@"
}
step "host alone: --backend cpu, treelstm H=8, 1 job, 32768 trees"
for rep in 1 2; do
  one "new cpu H=8 R=1024" timeout 60 "$B" run --backend cpu --model $W/m8 --input $W/t32k.jsonl --batch 1024 --jobs 1
  old "old cpu H=8 R=1024" run --backend cpu --model $W/m8 --input $W/t32k.jsonl --batch 1024 --jobs 1
done
step "cuda, 1 job, 32768 trees"
for H in 128 512; do for R in 256 1024; do for rep in 1 2; do
  a="run --backend cuda --model $W/m$H --input $W/t32k.jsonl --batch $R --jobs 1"
  one "new H=$H R=$R" timeout 60 "$B" $a
  one "new overlap off H=$H R=$R" CANOPY_RUN_OVERLAP=0 timeout 60 "$B" $a
  one "new cublasLt off H=$H R=$R" CANOPY_CUDA_LT=0 timeout 60 "$B" $a
  old "old H=$H R=$R" $a
done; done; done
step "cuda, many jobs, 65536 trees, H=512 R=1024"
for j in 8 16; do for rep in 1 2; do
  a="run --backend cuda --model $W/m512 --input $W/t64k.jsonl --batch 1024 --jobs $j"
  one "new jobs=$j" timeout 60 "$B" $a
  old "old jobs=$j" $a
done; done
step "cpu, 16 jobs, H=128 R=256 (the host's compute, for scale)"
one "new cpu 16 jobs H=128" timeout 60 "$B" run --backend cpu --model $W/m128 --input $W/t32k.jsonl --batch 256 --jobs 16
rm -rf $W
step done
