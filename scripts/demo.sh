#!/usr/bin/env bash
# The main job (README): installs the Debian packages, builds, creates the
# demo models, and runs every demo model over the bundled parse trees with
# the batching engine, printing the outputs' first lines and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
scripts/models.sh build
data=../shared/data
[ -f "$data/trees-binary.jsonl" ] || data=scripts/demo-data
for fam in treelstm treelstm-2type treegru childsum-treelstm mvrnn; do
  input=$data/trees-binary.jsonl
  [ "$fam" = childsum-treelstm ] && input=$data/trees-nary.jsonl
  echo "== $fam on $input (first 2 outputs, then the run summary)"
  build/canopy run --model "models/$fam" --input "$input" --batch 64 \
      --policy agenda >"build/demo-$fam.jsonl" 2>"build/demo-$fam.log"
  head -2 "build/demo-$fam.jsonl" | cut -c1-160
  tail -1 "build/demo-$fam.log"
done
