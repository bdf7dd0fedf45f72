#!/usr/bin/env bash
# canopy against the independent numpy reference (tests/reference), every
# tree family, every policy and every layout (pq, naive),
# on the real parse trees of data/.
# Two kinds of model per family: one written by `canopy model init`, one
# written by the reference's own safetensors writer (with labels, lowercase
# and type_b_labels), so both the engine and the model reader are checked.
# usage: compare_all.sh CANOPY DATA_DIR WORK_DIR
set -euo pipefail
canopy=$1 data=$2 work=$3/reference-models
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work"
# Makes the reference's model of fam (H = D = hidden, vocabulary from src,
# $extra its further flags) beside canopy's $work/c-fam, and compares both
# against the reference on input; more compare.py flags follow.
ref_and_compare() {
  local fam=$1 hidden=$2 src=$3 input=$4
  shift 4
  "$py" "$here/canopy_ref.py" --make-model "$work/r-$fam" --family "$fam" \
      --hidden "$hidden" --embed "$hidden" --classes 4 --seed 5 --labels \
      --lowercase --vocab-from "$src" "${extra[@]}" >/dev/null
  for m in c r; do
    echo "== $fam ($m model) on $(basename "$input")"
    "$py" "$here/compare.py" --canopy "$canopy" --layouts pq,naive --model "$work/$m-$fam" \
        --input "$input" "$@" --return-hidden --policies none,depth,agenda \
        --batch 1,64 --tol 1e-4 || fail=1
  done
}

fail=0
for fam in treelstm treelstm-2type treegru childsum-treelstm mvrnn; do
  input=$data/trees-binary.jsonl
  [ "$fam" = childsum-treelstm ] && input=$data/trees-nary.jsonl
  H=32
  [ "$fam" = mvrnn ] && H=16
  "$canopy" model init "$fam" "$work/c-$fam" --hidden $H --embed $H \
      --vocab-from "$input" --seed 3 2>/dev/null
  extra=()
  [ "$fam" = treelstm-2type ] && extra=(--type-b-labels NP,VP,PP)
  ref_and_compare "$fam" 12 "$input" "$input" --outputs all
done
# Sequences, lattices (the data's spans, and raw text through the lexicon)
# and DAGs.
lex=$work/lexicon.txt
head -3000 "$data/lexicon.txt" >"$lex"
"$py" - "$data/lattices.jsonl" "$work/lattice-text.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for i, line in enumerate(open(sys.argv[1])):
        if i >= 150: break
        out.write(json.dumps({"text": "".join(json.loads(line)["chars"])}) + "\n")
PY
for spec in bilstm-tagger:sequences.jsonl latticelstm:lattices.jsonl \
            latticelstm:lattice-text.jsonl latticegru:dags.jsonl; do
  fam=${spec%%:*} file=${spec##*:}
  input=$data/$file
  [ -f "$input" ] || input=$work/$file
  src=$data/${file/lattice-text/lattices}
  extra=()
  [ "$fam" = latticelstm ] && extra=(--lexicon "$lex")
  "$canopy" model init "$fam" "$work/c-$fam" --hidden 24 --embed 24 \
      --vocab-from "$src" --seed 3 "${extra[@]}" 2>/dev/null
  ref_and_compare "$fam" 10 "$src" "$input"
done
# bilstm-tagger with the CRF layer ("crf": true): Viterbi tags and
# path_score against the reference's own Viterbi, runs of 1 and of 64.
"$canopy" model init bilstm-tagger "$work/c-bilstm-crf" --hidden 24 --embed 24 \
    --vocab-from "$data/sequences.jsonl" --seed 3 --crf 2>/dev/null
"$py" "$here/canopy_ref.py" --make-model "$work/r-bilstm-crf" --family bilstm-tagger \
    --hidden 10 --embed 10 --classes 4 --seed 5 --labels --lowercase --crf \
    --vocab-from "$data/sequences.jsonl" >/dev/null
for m in c r; do
  echo "== bilstm-tagger crf ($m model) on sequences.jsonl"
  "$py" "$here/compare.py" --canopy "$canopy" --layouts pq,naive --model "$work/$m-bilstm-crf" \
      --input "$data/sequences.jsonl" --return-hidden --policies none,depth,agenda \
      --batch 1,64 --tol 1e-4 || fail=1
done
# lstm-nmt: greedy decoding; the reference-written model leans towards
# </s> (--eos-bias) so output lengths vary inside every run.
"$canopy" model init lstm-nmt "$work/c-nmt" --hidden 16 --embed 16 \
    --vocab-from "$data/sequences.jsonl" --seed 3 2>/dev/null
"$py" "$here/canopy_ref.py" --make-model "$work/r-nmt" --family lstm-nmt \
    --hidden 16 --embed 16 --seed 5 --vocab-from "$data/sequences.jsonl" \
    --eos-bias 1 --model-max-decode-len 20 >/dev/null
for m in c r; do
  echo "== lstm-nmt ($m model) on sequences.jsonl"
  "$py" "$here/compare.py" --canopy "$canopy" --layouts pq,naive --model "$work/$m-nmt" \
      --input "$data/sequences.jsonl" --return-hidden --max-decode-len 12 \
      --policies none,depth,agenda --batch 1,64 --tol 1e-4 || fail=1
done
# The same models over real HTTP: canopy serve on a free port, concurrent
# clients sharing runs, every family against the reference, then SIGTERM.
srv=$work/serve
mkdir -p "$srv"
for d in "$work"/c-* "$work"/r-*; do cp -r "$d" "$srv/"; done
head -100 "$data/trees-binary.jsonl" >"$work/tb.jsonl"
head -100 "$data/trees-nary.jsonl" >"$work/tn.jsonl"
head -100 "$data/sequences.jsonl" >"$work/sq.jsonl"
head -60 "$data/lattices.jsonl" >"$work/la.jsonl"
head -60 "$data/dags.jsonl" >"$work/dg.jsonl"
head -40 "$work/lattice-text.jsonl" >"$work/lt.jsonl"
echo "== every family over HTTP"
"$py" "$here/compare_http.py" --canopy "$canopy" --models-dir "$srv" \
    r-treelstm="$work/tb.jsonl:all:hidden" c-treelstm="$work/tb.jsonl" \
    r-treelstm-2type="$work/tb.jsonl:all:hidden" \
    r-treegru="$work/tb.jsonl:all" r-childsum-treelstm="$work/tn.jsonl:all:hidden" \
    r-mvrnn="$work/tb.jsonl:all:hidden" r-bilstm-tagger="$work/sq.jsonl:hidden" \
    r-bilstm-crf="$work/sq.jsonl:hidden" \
    r-latticelstm="$work/la.jsonl:hidden" c-latticelstm="$work/lt.jsonl" \
    r-latticegru="$work/dg.jsonl:hidden" r-nmt="$work/sq.jsonl:hidden:decode=12" \
    || fail=1
exit $fail
