#!/usr/bin/env bash
# Creates one demo model per family under models/ (generated, ignored by
# git; $CANOPY_MODELS_DIR, the daemon's models-dir variable, puts them
# elsewhere), with vocabularies from the evaluation data beside the
# checkout (data/) or the small sample bundled in scripts/.
# usage: scripts/models.sh [BUILD_DIR]   (idempotent; FORCE=1 rebuilds)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
canopy=$build/canopy
models=${CANOPY_MODELS_DIR:-models}
mkdir -p "$models"
data=${CANOPY_DATA:-data}
[ -f "$data/trees-binary.jsonl" ] || data=scripts/demo-data
mk() { # family dir data-file [options]
  local fam=$1 dir=$models/$2 src=$data/$3
  shift 3
  [ -f "$src" ] || src=scripts/demo-data/$(basename "$src")
  if [ -f "$dir/model.json" ] && [ -z "${FORCE:-}" ]; then return; fi
  "$canopy" model init "$fam" "$dir" --vocab-from "$src" "$@"
}
mk treelstm treelstm trees-binary.jsonl --hidden 128 --embed 128 --classes 5
mk treelstm-2type treelstm-2type trees-binary.jsonl --hidden 128 --embed 128
mk treegru treegru trees-binary.jsonl --hidden 128 --embed 128
mk childsum-treelstm childsum-treelstm trees-nary.jsonl --hidden 128 --embed 128
mk mvrnn mvrnn trees-binary.jsonl --hidden 32 --embed 32
mk bilstm-tagger bilstm-tagger sequences.jsonl --hidden 128 --embed 128
mk latticelstm latticelstm lattices.jsonl --hidden 128 --embed 128 \
   --lexicon "$( [ -f "$data/lexicon.txt" ] && echo "$data/lexicon.txt" \
                 || echo scripts/demo-data/lexicon.txt)"
mk latticegru latticegru dags.jsonl --hidden 128 --embed 128
if "$canopy" model --help | grep -q lstm-nmt && \
   "$canopy" model init lstm-nmt /tmp/canopy-nmt-probe >/dev/null 2>&1; then
  rm -rf /tmp/canopy-nmt-probe
  mk lstm-nmt lstm-nmt sequences.jsonl --hidden 128 --embed 128
fi
# The two demo models trained on real English (scripts/train_demo.py,
# committed under scripts/demo-models/): served as `tagger` and `phrases`.
for d in scripts/demo-models/*/; do
  n=$(basename "$d")
  if [ ! -f "$models/$n/model.json" ] || [ -n "${FORCE:-}" ]; then
    rm -rf "${models:?}/$n"
    cp -r "$d" "$models/$n"
  fi
done
