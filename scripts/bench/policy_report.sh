#!/usr/bin/env bash
# policy_report.sh - regenerates docs/policies-report.md: batches / lower bound for
# every family x batching policy, training time and iterations
# per family, and instances/s per policy.
#
# Each family gets a fresh demo model (hidden/embed 64, mvrnn 32). Policies
# are learned on the first 200 lines of its data file in data
# (`canopy policy train --outputs all`) and every policy runs on the other
# 200 lines (held out), trees with --outputs all, --batch 64. "fsm-E" is what
# `canopy run --policy fsm --encoding E` executes: the learned FSM, or the
# heuristic that beat it on the training graphs (marked); "fsm-E, no
# fallback" is the FSM itself. "optimum" is `canopy policy optimum` on the
# same held-out graphs: exact, or a proven range where the search runs out
# of BUDGET states a graph. instances/s: best of REPEAT runs (CPU). The
# "ceiling" table trains each encoding's FSM on the held-out lines
# themselves (no fallback) and runs it there: an estimate (Q-learning and
# polish stop at a local optimum) of the best any table over that encoding
# can do on those graphs, whatever it learns from.
#
# usage: scripts/bench/policy_report.sh [BUILD_DIR]   (writes $OUT, default
#        docs/policies-report.md; REPEAT=3, BUDGET=5000000)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
canopy=$PWD/$build/canopy
data=${CANOPY_DATA:-$PWD/data}
out=${OUT:-docs/policies-report.md}
repeat=${REPEAT:-3}
budget=${BUDGET:-5000000}
plan_width=${PLAN_WIDTH:-16}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x "$canopy" ] || { echo "no $canopy: build first" >&2; exit 1; }

families="treelstm:trees-binary treelstm-2type:trees-binary
treegru:trees-binary childsum-treelstm:trees-nary mvrnn:trees-binary
bilstm-tagger:sequences lstm-nmt:sequences latticelstm:lattices
latticegru:dags"
policies="none depth agenda sufficient lookahead lookahead2 plan"
encodings="base max sort bound"

for fd in $families; do
  fam=${fd%%:*} file=$data/${fd#*:}.jsonl dir=$work/$fam
  size=64 extra=()
  [ "$fam" = mvrnn ] && size=32
  [ "$fam" = latticelstm ] && extra=(--lexicon "$data/lexicon.txt")
  "$canopy" model init "$fam" "$dir/m" --vocab-from "$file" --hidden $size \
    --embed $size "${extra[@]}" >/dev/null 2>&1
  head -n 200 "$file" >"$dir/train.jsonl"
  tail -n +201 "$file" >"$dir/test.jsonl"
  echo "== $fam" >&2
  # One cache directory per policy: a cache holds one policy per model, so
  # a second encoding trained into the same directory would replace the
  # first, and `run` would then learn from the held-out lines instead.
  for e in $encodings; do
    "$canopy" policy train --model "$dir/m" --input "$dir/train.jsonl" \
      --outputs all --encoding $e --policy-cache "$dir/cache-$e" \
      >"$dir/train-$e.json" 2>/dev/null
  done
  for e in $encodings; do
    "$canopy" policy train --model "$dir/m" --input "$dir/train.jsonl" \
      --outputs all --encoding $e --no-fallback \
      --policy-cache "$dir/pure-$e" >"$dir/train-pure-$e.json" 2>/dev/null
  done
  for e in $encodings; do # the ceiling: learned on the lines it is run on
    "$canopy" policy train --model "$dir/m" --input "$dir/test.jsonl" \
      --outputs all --encoding $e --no-fallback \
      --policy-cache "$dir/ceil-$e" >"$dir/train-ceil-$e.json" 2>/dev/null
  done
  "$canopy" policy optimum --model "$dir/m" --input "$dir/test.jsonl" \
    --outputs all --budget "$budget" >"$dir/optimum.json" 2>/dev/null
  run() { # name, run options...
    local name=$1
    shift
    for i in $(seq "$repeat"); do
      # --no-learn: a policy learned here would have seen the held-out
      # lines, so a missing one stops the report instead.
      if ! "$canopy" run --model "$dir/m" --input "$dir/test.jsonl" \
        --outputs all --batch 64 --no-learn "$@" 2>"$dir/stderr" \
        >/dev/null; then
        echo "$fam $name: canopy run failed:" >&2
        cat "$dir/stderr" >&2
        exit 1
      fi
      tail -n 1 "$dir/stderr" >>"$dir/run-$name.json"
    done
  }
  for p in $policies; do run "$p" --policy "$p" --plan-width "$plan_width"; done
  for e in $encodings; do
    run "fsm-$e" --policy fsm --encoding $e --policy-cache "$dir/cache-$e"
  done
  for e in $encodings; do
    run "pure-$e" --policy fsm --encoding $e --policy-cache "$dir/pure-$e"
  done
  for e in $encodings; do
    run "ceil-$e" --policy fsm --encoding $e --policy-cache "$dir/ceil-$e"
  done
done

/usr/bin/python3 - "$work" "$out" "$budget" "$plan_width" <<'PY'
import json, os, sys
work, out, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan_width = int(sys.argv[4])
fams = ["treelstm", "treelstm-2type", "treegru", "childsum-treelstm",
        "mvrnn", "bilstm-tagger", "lstm-nmt", "latticelstm", "latticegru"]
encs = ["base", "max", "sort", "bound"]
cols = ["none", "depth", "agenda", "sufficient", "lookahead", "lookahead2",
        "plan"] + \
       ["fsm-" + e for e in encs] + ["pure-sort", "pure-bound"]
head = ["none", "depth", "agenda", "sufficient", "lookahead", "lookahead2",
        "plan"] + \
       ["fsm-" + e for e in encs] + ["fsm-sort, no fallback",
                                     "fsm-bound, no fallback"]
def runs(f, c):
    return [json.loads(l) for l in open(os.path.join(work, f, "run-%s.json" % c))]
def trained(f, e):
    return json.load(open(os.path.join(work, f, "train-%s.json" % e)))
def optimum(f):
    return json.loads(open(os.path.join(work, f, "optimum.json")).read().splitlines()[-1])
def opt_cell(o, lb):
    if o["exact"]:
        return "%d (%.2f×)" % (o["optimum_upper"], o["optimum_upper"] / lb)
    return "%d..%d (%.2f..%.2f×)" % (o["optimum_lower"], o["optimum_upper"],
                                    o["optimum_lower"] / lb,
                                    o["optimum_upper"] / lb)
L = ["# Batching policies: batches against the lower bound", "",
     "Generated by `scripts/bench/policy_report.sh` (do not edit by hand). Demo "
     "models (hidden/embed 64, mvrnn 32); policies learned on the first 200 "
     "lines of each data file in `data`, every policy run on the "
     "other 200 (held out), `--outputs all`, `--batch 64`. Cells: batches "
     "launched / lower bound Σ_t depth_t (docs/models.md), summed over the runs. "
     "`fsm-E` is what `canopy run --policy fsm --encoding E` executes: the "
     "learned FSM, or, marked †, the heuristic (named) that launched fewer "
     "batches on the training graphs. `plan` plans each run by beam search "
     "before it runs (`--plan-width %d`; never more than lookahead2). "
     "`optimum` is `canopy policy optimum` "
     "on the same graphs: the fewest batches any schedule can launch, exact, "
     "or, where the search stopped after %d states a graph, a proven lower "
     "end and the best schedule found." % (plan_width, budget), "",
     "| family | lower bound | optimum | " + " | ".join(head) + " |",
     "|---|---:|---:|" + "---:|" * len(head)]
for f in fams:
    lb = runs(f, "none")[0]["lower_bound"]
    cells = []
    for c in cols:
        r0 = runs(f, c)[0]; b = r0.get("policy_batches", r0["batches"])
        cell = "%d (%.2f×)" % (b, b / lb)
        if c.startswith("fsm-"):
            ex = trained(f, c[4:])["executes"]
            if ex != "fsm": cell += " † " + ex
        cells.append(cell)
    L.append("| %s | %d | %s | %s |" % (f, lb, opt_cell(optimum(f), lb),
                                         " | ".join(cells)))
L += ["", "## Training (on the 200 training lines: 4 graphs of ≤ 64 instances)",
      "", "Seconds and episodes of `canopy policy train` (Q-learning stops "
      "early at the lower bound; then distillation of the sufficient "
      "heuristic and coordinate-descent polish where it is above). "
      "Batches are the learned FSM's on its training graphs.", "",
      "| family | encoding | seconds | iterations | states | FSM batches / bound (train) | executes |",
      "|---|---|---:|---:|---:|---:|---|"]
for f in fams:
    for e in encs:
        t = trained(f, e)
        b = t["batches"]
        L.append("| %s | %s | %.3f | %d | %d | %d / %d | %s |" % (
            f, e, t["train_seconds"], t["iterations"], t["states"], b["fsm"],
            b["lower_bound"], t["executes"]))
L += ["", "## The FSM's ceiling: learned on the held-out runs themselves", "",
      "Each encoding's FSM trained (`--no-fallback`) on the 200 held-out "
      "lines and run on them. This is not a policy anyone can deploy: it "
      "shows how close a table over that encoding gets when it has seen "
      "the very graphs it is scored on (Q-learning and polish find a local "
      "optimum, so it is an estimate of the ceiling, not a proof). Beside "
      "it, `fsm-E, no fallback` from the main table (learned on the "
      "training lines) and the optimum.", "",
      "| family | lower bound | optimum | " + " | ".join(
          "%s: trained on held-out / on training" % e for e in encs) + " |",
      "|---|---:|---:|" + "---:|" * len(encs)]
for f in fams:
    lb = runs(f, "none")[0]["lower_bound"]
    cells = []
    for e in encs:
        b = runs(f, "ceil-" + e)[0]["batches"]
        t = runs(f, "pure-" + e)[0]["batches"]
        cells.append("%d (%.2f×) / %d (%.2f×)" % (b, b / lb, t, t / lb))
    L.append("| %s | %d | %s | %s |" % (f, lb, opt_cell(optimum(f), lb),
                                         " | ".join(cells)))
L += ["", "## Throughput (instances/s, CPU, best of the repeats)", "",
      "| family | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
for f in fams:
    L.append("| %s | %s |" % (f, " | ".join(
        "%.0f" % max(r["instances_per_s"] for r in runs(f, c)) for c in cols)))
L.append("")
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write("\n".join(L))
print("wrote " + out)
PY
