#!/bin/bash
# Work-conserving batching against the plain window (docs/benchmarks.md):
# the same binary with --work-conserving false|true, interleaved, three
# repetitions, closed-loop clients/loadgen.py at concurrency 1 and 64, one
# tree a request, beside `canopy run --batch 64` offline in the same run.
# usage: scripts/bench/work_conserving.sh   (MODELS: a dir with treelstm/,
#        made if missing; treelstm H=128 on data/ trees)
set -u
cd "$(dirname "$0")/../.."
MODELS=${MODELS:-/tmp/canopy-bench-wc}
[ -f "$MODELS/treelstm/model.json" ] || build/canopy model init treelstm \
  "$MODELS/treelstm" --hidden 128 --embed 128 --classes 5 \
  --vocab-from ${CANOPY_DATA:-data}/trees-binary.jsonl >/dev/null
data=${CANOPY_DATA:-data}/trees-binary.jsonl
for rep in 1 2 3; do
  off=$(build/canopy run --model $MODELS/treelstm --input $data --batch 64 2>&1 >/dev/null | tail -1 | grep -o '"instances_per_s": [0-9.]*')
  echo "rep=$rep offline batch64 $off"
  for wc in false true; do
    port=$((21000 + RANDOM % 1000))
    CANOPY_POLICY_CACHE=$MODELS/cache build/canopy serve --models-dir $MODELS --port $port --log-level warn --work-conserving $wc 2>/dev/null &
    pid=$!; sleep 0.8
    for c in 1 64; do
      out=$(/usr/bin/python3 clients/loadgen.py --url http://127.0.0.1:$port --model treelstm --input $data --concurrency $c --duration 6 --requests 1000000 2>&1)
      echo "rep=$rep wc=$wc c=$c $(echo "$out" | grep -oE '"(requests_per_s|p50_ms|p99_ms|instances_per_run)": [0-9.]*' | tr '\n' ' ')"
    done
    kill $pid; wait $pid 2>/dev/null
  done
done
