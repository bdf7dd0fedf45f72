#!/bin/bash
# Memory by liveness (issue #35, docs/memory.md): `canopy run` with every
# vertex's state kept to the end of its run (--no-arena-reuse: before) and
# with rows reused after their last reader batch (after), on the same
# runs: arena bytes peak (states + scratch), the states' share, batches,
# bytes gathered between vertices and instances per second (median of
# REPEAT, before and after interleaved so they see the same noise).
# treelstm at H=128 and H=512, childsum-treelstm and latticelstm at H=128,
# each on its 400 data instances repeated to 1,024, in one run of 1,024.
# Measures; asserts nothing.
#
# usage: scripts/bench/memory.sh [REPEAT=3]  (CANOPY: the binary, default
#        build/canopy; THREADS: --threads, default 1; POLICY, default
#        sufficient)
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
REPEAT=${1:-3}
THREADS=${THREADS:-1}
POLICY=${POLICY:-sufficient}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-../shared/data}
WORK=$(mktemp -d /tmp/canopy-memory-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CASES="treelstm:128:trees-binary treelstm:512:trees-binary childsum-treelstm:128:trees-nary latticelstm:128:lattices"

echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; runs of 1,024, --jobs 1 --threads $THREADS, policy $POLICY, median of $REPEAT"
for c in $CASES; do
  IFS=: read -r fam h data <<<"$c"
  $CANOPY model init "$fam" "$WORK/$fam-$h" --hidden "$h" --embed "$h" \
    --classes 5 --vocab-from "$DATA/$data.jsonl" >/dev/null 2>&1 ||
    { echo "init $fam failed" >&2; exit 1; }
  $PY -c 'import sys; l = open(sys.argv[1]).read().splitlines()
print("\n".join((l * (1024 // len(l) + 1))[:1024]))' "$DATA/$data.jsonl" \
    >"$WORK/$data-1024.jsonl"
done
for rep in $(seq "$REPEAT"); do
  for c in $CASES; do
    IFS=: read -r fam h data <<<"$c"
    for mode in before after; do
      flag=; [ "$mode" = before ] && flag=--no-arena-reuse
      $CANOPY run --model "$WORK/$fam-$h" --input "$WORK/$data-1024.jsonl" \
        --batch 1024 --jobs 1 --threads "$THREADS" --policy "$POLICY" $flag \
        2>"$WORK/err" >"$WORK/out-$mode"
      echo "$fam $h $mode $(tail -1 "$WORK/err")"
    done
    cmp -s "$WORK/out-before" "$WORK/out-after" ||
      echo "# $fam H=$h: the answers differ with reuse" >&2
  done
done | $PY -c '
import json, statistics, sys
rows = {}
for l in sys.stdin:
    fam, h, mode, js = l.split(" ", 3)
    try:
        s = json.loads(js)
    except ValueError:
        print("# %s %s %s: %s" % (fam, h, mode, js.strip())); continue
    rows.setdefault((fam, int(h)), {}).setdefault(mode, []).append(s)
f = lambda x: format(x, ",")
print()
print("| family | H | arena bytes peak before -> after | states before -> after | batches | gather bytes before -> after | instances/s before -> after |")
print("|---|---:|---:|---:|---:|---:|---:|")
for (fam, h), m in rows.items():
    b, a = m["before"][0], m["after"][0]
    rate = lambda k: statistics.median(x["instances_per_s"] for x in m[k])
    print("| %s | %d | %s -> %s (%.1f%%) | %s -> %s (%.1f%%) | %s -> %s | %s -> %s | %s -> %s |" % (
        fam, h, f(b["arena_bytes_peak"]), f(a["arena_bytes_peak"]),
        100.0 * a["arena_bytes_peak"] / b["arena_bytes_peak"],
        f(b["state_bytes_peak"]), f(a["state_bytes_peak"]),
        100.0 * a["state_bytes_peak"] / b["state_bytes_peak"],
        f(b["batches"]), f(a["batches"]), f(b["gather_bytes_copied"]),
        f(a["gather_bytes_copied"]), f(round(rate("before"))),
        f(round(rate("after")))))
print()
print("arena = states + scratch (the largest batch'"'"'s); states after = the live")
print("high-water mark, before = every vertex'"'"'s state (state_bytes_total)")
'
