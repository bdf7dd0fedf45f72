#!/bin/bash
# End-to-end `canopy run` throughput of every batching policy on CPU
# (the default of serve and run is the fastest measured,
# docs/policies.md). A tree, a sequence, a lattice and a DAG family at
# H=128 on their 400 real inputs repeated COPIES times, runs of 64, the
# default --jobs; the fsm policy is learned first (canopy policy train) on the same
# data, so its cost is the learned table's, not learning. Policies are
# interleaved within each repetition so they see the same noise; the
# median of REPEAT, with the spread, of instances per wall second and per
# CPU second (user + sys: on a shared machine the steadier figure), and
# batches / lower bound.
# Measures; asserts nothing.
#
# usage: scripts/bench/policy_speed.sh [REPEAT=3]  (CANOPY: the binary,
#        default build/canopy; POLICIES, FAMILIES to narrow it)
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
REPEAT=${1:-3}
COPIES=${COPIES:-3}
POLICIES=${POLICIES:-"depth agenda sufficient lookahead lookahead2 plan fsm"}
FAMILIES=${FAMILIES:-"treelstm:trees-binary bilstm-tagger:sequences latticelstm:lattices latticegru:dags"}
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/canopy-polspeed-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export CANOPY_POLICY_CACHE=$WORK/cache

echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); H=128, runs of 64, default --jobs, median of $REPEAT"
for fd in $FAMILIES; do
  fam=${fd%%:*} data=${CANOPY_DATA:-data}/${fd##*:}.jsonl
  $CANOPY model init "$fam" "$WORK/$fam" --hidden 128 --embed 128 \
    --classes 5 --vocab-from "$data" >/dev/null 2>&1 || { echo "init $fam failed" >&2; exit 1; }
  for i in $(seq "$COPIES"); do cat "$data"; done >"$WORK/$fam.jsonl"
  $CANOPY policy train --model "$WORK/$fam" --input "$data" >/dev/null 2>&1 ||
    echo "# $fam: policy train failed; fsm runs agenda" >&2
done
for rep in $(seq "$REPEAT"); do
  for fd in $FAMILIES; do
    fam=${fd%%:*}
    for pol in $POLICIES; do
      TIMEFORMAT='%U %S'
      { time $CANOPY run --model "$WORK/$fam" --input "$WORK/$fam.jsonl" \
          --batch 64 --policy "$pol" 2>"$WORK/err" >/dev/null; } 2>"$WORK/cpu"
      echo "$fam $pol $(cat "$WORK/cpu") $(tail -1 "$WORK/err")"
    done
  done
done | $PY -c '
import json, statistics, sys
rows = {}
for l in sys.stdin:
    fam, pol, u, sy, js = l.split(" ", 4)
    try:
        s = json.loads(js)
    except ValueError:
        print("# %s %s: %s" % (fam, pol, js.strip())); continue
    s["per_cpu_s"] = s["instances"] / max(1e-9, float(u) + float(sy))
    rows.setdefault(fam, {}).setdefault(pol, []).append(s)
pols = sys.argv[1].split()
print()
print("| family | " + " | ".join(pols) + " | fastest |")
print("|---|" + "---:|" * len(pols) + "---|")
for fam, byp in rows.items():
    cells, best = [], None
    for p in pols:
        ss = byp.get(p, [])
        if not ss: cells.append("-"); continue
        r = sorted(x["instances_per_s"] for x in ss)
        med = statistics.median(r)
        c = sorted(x["per_cpu_s"] for x in ss)
        cmed = statistics.median(c)
        ratio = ss[0]["batches"] / max(1, ss[0]["lower_bound"])
        cells.append("%s [%s..%s] / %s [%s..%s] %.2fx" % (format(round(med), ","),
                     format(round(r[0]), ","), format(round(r[-1]), ","),
                     format(round(cmed), ","), format(round(c[0]), ","),
                     format(round(c[-1]), ","), ratio))
        if best is None or cmed > best[1]: best = (p, cmed)
    print("| %s | %s | %s |" % (fam, " | ".join(cells), best[0]))
print()
print("cells: instances per wall second, median [min..max] / instances per CPU")
print("second (user + sys of the process), median [min..max]; batches / lower")
print("bound. fastest: by CPU seconds, which other work on a shared machine")
print("disturbs far less than wall time")
' "$POLICIES"
