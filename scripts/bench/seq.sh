#!/usr/bin/env bash
# Sequence, lattice and DAG families: instances/s per policy and
# batches vs the lower bound for bilstm-tagger, latticelstm and latticegru (H=128, batch 64),
# and lstm-nmt decoding batched across requests vs padded to the longest
# output. Prints Markdown; measures, never asserts.
# usage: scripts/bench/seq.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
data=${CANOPY_DATA:-data}
py=/usr/bin/python3
pol=none,depth,agenda,sufficient,fsm
$py scripts/bench/engine.py --canopy $build/canopy --family bilstm-tagger \
    --data $data/sequences.jsonl --policies $pol --repeat 3 --copies 3
echo
$py scripts/bench/engine.py --canopy $build/canopy --family latticelstm \
    --data $data/lattices.jsonl --lexicon $data/lexicon.txt --policies $pol \
    --repeat 3 --copies 1
echo
$py scripts/bench/engine.py --canopy $build/canopy --family latticegru \
    --data $data/dags.jsonl --policies $pol --repeat 3 --copies 1
echo
$py scripts/bench/nmt.py --canopy $build/canopy --data $data/sequences.jsonl
