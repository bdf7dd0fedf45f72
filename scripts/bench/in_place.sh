#!/bin/bash
# Products read in place (docs/memory.md "Products over
# concatenations"): `canopy run` with each product's operand rows gathered
# into a copy first (CANOPY_ROWS_IN_PLACE=0: before) and read where they
# lie, as a sum of partial products (the default: after), on the same runs:
# bytes gathered, kernels, scratch, instances per second (median of
# REPEAT, the two modes interleaved so they see the same noise); answers
# compared byte for byte (they must be identical: gemm.h).
# treelstm at H=128 and H=512, latticelstm and treegru at H=128, with the
# hand-written cells (fused) and the compiled op IR (pq), each on its 400
# data instances repeated to 1,024, in one run of 1,024.
# Measures; asserts nothing.
#
# usage: scripts/bench/in_place.sh [REPEAT=5]  (CANOPY: the binary, default
#        build/canopy; THREADS: --threads, default 1; POLICY, default
#        sufficient)
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
REPEAT=${1:-5}
THREADS=${THREADS:-1}
POLICY=${POLICY:-sufficient}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-data}
WORK=$(mktemp -d /tmp/canopy-in-place-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CASES="treelstm:128:trees-binary treelstm:512:trees-binary treegru:128:trees-binary latticelstm:128:lattices"

. scripts/bench/runs_1024.sh
runs_1024_init || exit 1
for rep in $(seq "$REPEAT"); do
  for c in $CASES; do
    IFS=: read -r fam h data <<<"$c"
    for layout in fused pq; do
      for mode in gathered in_place; do
        rows=1
        [ $mode = gathered ] && rows=0
        CANOPY_ROWS_IN_PLACE=$rows $CANOPY run --model "$WORK/$fam-$h" \
          --input "$WORK/$data-1024.jsonl" --batch 1024 --jobs 1 \
          --threads "$THREADS" --policy "$POLICY" --layout $layout \
          2>"$WORK/err" >"$WORK/out-$mode"
        echo "$fam $h $layout $mode $(tail -1 "$WORK/err")"
      done
      cmp -s "$WORK/out-gathered" "$WORK/out-in_place" ||
        echo "# $fam H=$h $layout: the answers differ" >&2
    done
  done
done | $PY -c '
import json, statistics, sys
rows = {}
for l in sys.stdin:
    fam, h, layout, mode, js = l.split(" ", 4)
    try:
        s = json.loads(js)
    except ValueError:
        print("# %s %s %s %s: %s" % (fam, h, layout, mode, js.strip()))
        continue
    rows.setdefault((fam, int(h), layout), {}).setdefault(mode, []).append(s)
f = lambda x: format(x, ",")
print()
print("| family | H | cell | gathered bytes before -> after | kernels | "
      "arena bytes | inst/s before -> after | ratio |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
for (fam, h, lay), m in rows.items():
    if "gathered" not in m or "in_place" not in m:
        continue
    b, a = m["gathered"], m["in_place"]
    g = lambda x: x[0]["gather_bytes_copied"] + x[0]["cell_bytes_copied"]
    rb = statistics.median(x["instances_per_s"] for x in b)
    ra = statistics.median(x["instances_per_s"] for x in a)
    print("| %s | %d | %s | %s -> %s | %s -> %s | %s -> %s | %s -> %s | %.2f |"
          % (fam, h, lay, f(g(b)), f(g(a)), f(b[0]["kernels"]),
             f(a[0]["kernels"]), f(b[0]["arena_bytes_peak"]),
             f(a[0]["arena_bytes_peak"]), f(round(rb)), f(round(ra)),
             ra / rb))
print()
print("gathered bytes: children states and concatenated operands copied")
print("(gather_bytes_copied + cell_bytes_copied; embedding rows the fused")
print("cells gather are not counted, the pq cells count them apart).")
print("fused: the hand-written cells; pq: the compiled op IR.")
'
