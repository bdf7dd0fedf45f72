#!/bin/bash
# One kitchen: every family's speed on the compiled op
# IR side by side with the hand-written kernels it replaces. Each case is
# one `canopy run` of 4,096 instances in runs of 1,024 (the data's
# instances repeated; mvrnn, whose states are H×H matrices: 512 in runs
# of 64, at H = 128 only), at H = 128 and 512, --jobs 1 and 2 (--threads
# 2 and 1); instances per second and per CPU-second, each the best of
# REPEAT (other tenants of a shared machine only ever slow a run down, so
# the fastest is the least disturbed: timeit's rule), the two binaries
# interleaved so they see the same noise; and the answers
# compared (identical bytes, or the largest difference when the
# arithmetic order changed).
#   OLD: a build from before the change (default: build/canopy) and
#        OLD_ARGS its options (default "--layout fused": the hand-written
#        kernels);
#   NEW: this build (default build/canopy) and NEW_ARGS (default none).
# Measures; asserts nothing.
#
# usage: OLD=/path/to/old/canopy scripts/bench/kitchens.sh [REPEAT=3]
#        (FAMILIES: a subset, e.g. "treegru mvrnn"; HS: default "128 512")
set -u
cd "$(dirname "$0")/../.."
OLD=${OLD:-build/canopy}
NEW=${NEW:-build/canopy}
OLD_ARGS=${OLD_ARGS---layout fused}
NEW_ARGS=${NEW_ARGS-}
REPEAT=${1:-3}
HS=${HS:-128 512}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-data}
WORK=$(mktemp -d /tmp/canopy-kitchens-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ALL="treelstm:trees-binary treegru:trees-binary childsum-treelstm:trees-nary
mvrnn:trees-binary latticelstm:lattices latticegru:dags
bilstm-tagger:sequences lstm-nmt:sequences"
FAMILIES=${FAMILIES:-$(for c in $ALL; do echo "${c%%:*}"; done)}
# The data file a family runs on (empty: not a family of $ALL).
data_of() {
  local c
  for c in $ALL; do [ "${c%%:*}" = "$1" ] && echo "${c#*:}"; done
}

echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; 4,096 instances in runs of 1,024, best of $REPEAT"
echo "# OLD: $OLD $OLD_ARGS"
echo "# NEW: $NEW $NEW_ARGS"
for fam in $FAMILIES; do
  data=$(data_of "$fam")
  [ -n "$data" ] || { echo "unknown family $fam" >&2; exit 1; }
  for k in 4096 512; do
    [ -f "$WORK/$data-$k.jsonl" ] || $PY -c 'import sys
k, l = int(sys.argv[2]), open(sys.argv[1]).read().splitlines()
print("\n".join((l * (k // len(l) + 1))[:k]))' "$DATA/$data.jsonl" "$k" \
      >"$WORK/$data-$k.jsonl"
  done
  for h in $HS; do
    [ "$fam" = mvrnn ] && [ "$h" != 128 ] && continue
    extra=
    [ "$fam" = latticelstm ] && extra="--lexicon $DATA/lexicon.txt"
    $OLD model init "$fam" "$WORK/$fam-$h" --hidden "$h" --embed "$h" \
      --classes 5 --vocab-from "$DATA/$data.jsonl" $extra >/dev/null 2>&1 ||
      { echo "init $fam failed" >&2; exit 1; }
  done
done

TIMEFORMAT='%U %S' # user and system CPU seconds of each run
for rep in $(seq "$REPEAT"); do
  for fam in $FAMILIES; do
    data=$(data_of "$fam")
    for h in $HS; do
      [ "$fam" = mvrnn ] && [ "$h" != 128 ] && continue
      batch=1024 input=$WORK/$data-4096.jsonl
      [ "$fam" = mvrnn ] && batch=64 input=$WORK/$data-512.jsonl
      for j in 1 2; do
        for side in old new; do
          if [ $side = old ]; then bin=$OLD args=$OLD_ARGS
          else bin=$NEW args=$NEW_ARGS; fi
          # shellcheck disable=SC2086
          { time $bin run --model "$WORK/$fam-$h" --input "$input" \
            --batch $batch --jobs $j --threads $((3 - j)) --outputs all \
            $args >"$WORK/$side.out" 2>"$WORK/err"; } 2>"$WORK/time" ||
            { echo "# $fam H=$h j=$j $side failed: $(tail -1 "$WORK/err")" >&2; continue; }
          echo "$fam $h $j $side $(cat "$WORK/time") $(tail -1 "$WORK/err")"
        done
        cmp -s "$WORK/old.out" "$WORK/new.out" && d=same ||
          d=$($PY - "$WORK/old.out" "$WORK/new.out" <<'EOF'
import json, sys
def nums(x):
    if isinstance(x, (int, float)) and not isinstance(x, bool): yield float(x)
    elif isinstance(x, dict):
        for k in sorted(x): yield from nums(x[k])
    elif isinstance(x, list):
        for v in x: yield from nums(v)
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
m = 0.0
for p, q in zip(a, b):
    u, v = list(nums(p)), list(nums(q))
    if len(u) != len(v): print("shape"); sys.exit()
    m = max([m] + [abs(s - t) for s, t in zip(u, v)])
print("%.1e" % m)
EOF
)
        echo "$fam $h $j diff $d"
      done
    done
  done
done >"$WORK/rows"
# Launches per batch of each vertex type where products cannot read their
# parts in place, as on CUDA (no gemm_rows: core gathers the parts first;
# CANOPY_ROWS_IN_PLACE=0 makes the CPU backend take the same calls):
# `canopy model bench`'s kernels per execution of 64 vertices at H=128,
# the old build's hand-written kernels ("fused" where it had the layout,
# else "exec", else its pq cell) against this build's (exec, else pq).
for fam in $FAMILIES; do
  data=$(data_of "$fam")
  for side in old new; do
    if [ $side = old ]; then bin=$OLD; else bin=$NEW; fi
    CANOPY_ROWS_IN_PLACE=0 $bin model bench "$WORK/$fam-128" \
      --input "$DATA/$data.jsonl" --runsize 64 --batch 64 --iters 2 \
      2>/dev/null | sed "s/^/$fam $side /"
  done
done >"$WORK/launches"
$PY - "$WORK/rows" <<'EOF'
import json, sys
rows, diff = {}, {}
for l in open(sys.argv[1]):
    fam, h, j, side, rest = l.split(" ", 4)
    key = (fam, int(h), int(j))
    if side == "diff":
        d = rest.strip()
        if diff.get(key, "same") == "same": diff[key] = d
        continue
    user, sys_, js = rest.split(" ", 2)
    s = json.loads(js)
    cpu = float(user) + float(sys_)
    r = rows.setdefault(key, {})
    r.setdefault(side, []).append(s["instances_per_s"])
    r.setdefault(side + "_cpu", []).append(s["instances"] / cpu if cpu else 0)
# inst/s: wall clock, as the user sees it; per CPU s: instances per second
# of CPU the process used, which other tenants' load disturbs less
print("| family | H | jobs | old inst/s | new inst/s | new/old | old per CPU s | new per CPU s | new/old | answers |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for key in rows:
    m = {k: max(v) for k, v in rows[key].items()}
    o, n = m.get("old", 0), m.get("new", 0)
    oc, nc = m.get("old_cpu", 0), m.get("new_cpu", 0)
    print("| %s | %d | %d | %.0f | %.0f | %.3f | %.0f | %.0f | %.3f | %s |" % (
        key + (o, n, n / o if o else 0, oc, nc, nc / oc if oc else 0,
               diff.get(key, "?"))))
EOF
echo
echo "Launches per batch of 64 vertices at H=128 with every product's parts"
echo "gathered first, as on CUDA (CANOPY_ROWS_IN_PLACE=0; canopy model bench):"
echo
$PY - "$WORK/launches" <<'EOF'
import json, sys
k, seen = {}, {}
for l in open(sys.argv[1]):
    fam, side, rest = l.split(" ", 2)
    o = json.loads(rest)
    seen.setdefault((fam, o["type"]), {}).setdefault(side, {})[o["layout"]] = o["kernels"]
# old: its hand-written kernels ("fused" where the build had the layout,
# else exec()), or its compiled cell; new: exec(), else pq (the default)
prefer = {"old": ("fused", "exec", "pq"), "new": ("exec", "pq")}
for key, sides in seen.items():
    for side, lay in sides.items():
        for name in prefer[side]:
            if name in lay:
                k.setdefault(key, {})[side] = lay[name]
                break
print("| family / vertex type | old launches | new launches |")
print("|---|---:|---:|")
for (fam, t), d in k.items():
    print("| %s / %s | %s | %s |" % (fam, t, d.get("old", "–"), d.get("new", "–")))
EOF
