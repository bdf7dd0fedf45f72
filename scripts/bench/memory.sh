#!/bin/bash
# Memory (docs/memory.md): `canopy run` with every vertex's
# state kept to the end of its run (--no-arena-reuse: before), with rows
# reused after their last reader batch in the policy's order (liveness),
# in the memory order (the default) and under --memory-budget BUDGET, on
# the same runs: arena bytes peak (states + scratch), the states, batches
# and instances per second (median of REPEAT, the modes interleaved so
# they see the same noise); answers compared byte for byte.
# treelstm at H=128 and H=512, childsum-treelstm and latticelstm at H=128,
# each on its 400 data instances repeated to 1,024, in one run of 1,024.
# Measures; asserts nothing.
#
# usage: scripts/bench/memory.sh [REPEAT=3]  (CANOPY: the binary, default
#        build/canopy; THREADS: --threads, default 1; POLICY, default
#        sufficient; BUDGET, default 16000000)
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
REPEAT=${1:-3}
THREADS=${THREADS:-1}
POLICY=${POLICY:-sufficient}
BUDGET=${BUDGET:-16000000}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-data}
WORK=$(mktemp -d /tmp/canopy-memory-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CASES="treelstm:128:trees-binary treelstm:512:trees-binary childsum-treelstm:128:trees-nary latticelstm:128:lattices"

. scripts/bench/runs_1024.sh
runs_1024_init || exit 1
for rep in $(seq "$REPEAT"); do
  for c in $CASES; do
    IFS=: read -r fam h data <<<"$c"
    for mode in before liveness order budget; do
      flag=; envs=
      case $mode in
        before) flag=--no-arena-reuse ;;
        liveness) envs=CANOPY_MEMORY_ORDER=0 ;;
        budget) flag="--memory-budget $BUDGET" ;;
      esac
      env $envs $CANOPY run --model "$WORK/$fam-$h" \
        --input "$WORK/$data-1024.jsonl" --batch 1024 --jobs 1 \
        --threads "$THREADS" --policy "$POLICY" $flag \
        2>"$WORK/err" >"$WORK/out-$mode"
      echo "$fam $h $mode $(tail -1 "$WORK/err")"
    done
    for mode in liveness order budget; do
      cmp -s "$WORK/out-before" "$WORK/out-$mode" ||
        echo "# $fam H=$h: the answers differ ($mode)" >&2
    done
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
modes = ["before", "liveness", "order", "budget"]
print()
print("| family | H | lower bound | " + " | ".join(
    "%s: arena (states), batches" % m for m in modes) + " |")
print("|---|---:|---:|" + "---:|" * len(modes))
for (fam, h), m in rows.items():
    cells = []
    lb = next(iter(m.values()))[0]["lower_bound"]
    for k in modes:
        if k not in m:
            cells.append("refused"); continue
        x = m[k][0]
        cells.append("%s (%s), %s" % (f(x["arena_bytes_peak"]),
                     f(x["state_bytes_peak"]), f(x["batches"])))
    print("| %s | %d | %s | %s |" % (fam, h, f(lb), " | ".join(cells)))
print()
print("| family | H | " + " | ".join("%s inst/s" % k for k in modes) + " |")
print("|---|---:|" + "---:|" * len(modes))
for (fam, h), m in rows.items():
    rate = lambda k: (f(round(statistics.median(x["instances_per_s"]
                      for x in m[k]))) if k in m else "-")
    print("| %s | %d | %s |" % (fam, h, " | ".join(rate(k) for k in modes)))
print()
print("arena = states + scratch; states = the live high-water mark. before:")
print("every row kept (--no-arena-reuse); liveness: rows reused, the")
print("policy'"'"'s order (CANOPY_MEMORY_ORDER=0); order: the memory order at")
print("the policy'"'"'s batch count (the default); budget: --memory-budget")
'
