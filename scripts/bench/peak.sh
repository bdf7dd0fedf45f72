#!/bin/bash
# Percent of sgemm peak, all in one run: the machine's
# sgemm peak (numpy/OpenBLAS 2048^3, both cores, and one core for
# reference), then `canopy run` treelstm throughput at H=128 batch 64 and
# H=512 batch 256, --jobs 1 and --jobs 2 side by side, converted to GFLOP/s
# with the model's FLOPs per tree, and the ratio of each to the peak.
#
# FLOPs count the cell's matrix products only (docs/models.md, treelstm):
#   leaf      g = leaf.W x          [3H, D] . [D]    2*3H*D
#   internal  g = internal.U [h1;h2] [5H, 2H] . [2H]  2*5H*2H
#   output    logits = out.W h      [C, H] . [H]     2*C*H  (root only)
# The leaf and internal counts come from the data itself; the script checks
# that leaves + internal + roots equals the run's own vertex count.
# The peak is measured before and after the runs; ratios use the higher.
# On a shared machine wall-clock rates move with other people's load, so
# the last two columns divide GFLOP per CPU second of canopy (user + sys,
# both jobs) by one core's sgemm GFLOP per CPU second: the fraction of
# peak each core-second reaches, which that load disturbs far less.
# Then the comparison table: canopy before and after (OLD: an earlier
# binary, run interleaved with CANOPY on the same input), PyTorch
# level-batched on the same models and trees (TORCH=1: /usr/bin/python3
# with torch, scripts/bench/torch_models.py, the arithmetic timed, not
# the parsing), and DyNet's autobatching as published
# (DyNet is not in Debian: its figures are quoted, not measured here).
# Measures and prints; asserts nothing.
#
# usage: scripts/bench/peak.sh [REPEAT=3]   (CANOPY: the binary,
#        default build/canopy; COPIES: times the 400 trees are repeated, 5;
#        OLD: a "before" binary; TORCH=1: PyTorch level-batched too)
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
OLD=${OLD:-}
TORCH=${TORCH:-0}
REPEAT=${1:-3}
COPIES=${COPIES:-5}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-data}/trees-binary.jsonl
WORK=$(mktemp -d /tmp/canopy-peak-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

for i in $(seq "$COPIES"); do cat "$DATA"; done >"$WORK/input.jsonl"

# sgemm GFLOP/s, best of 5 after a warm-up; $1: OpenBLAS threads (0: its
# own); $2 = cpu: GFLOP per CPU second of the process instead (user + sys)
peak() {
  local env=()
  [ "$1" -gt 0 ] && env=(OPENBLAS_NUM_THREADS="$1")
  env "${env[@]}" $PY - "${2:-wall}" <<'EOF'
import numpy as np, sys, time
clock = time.process_time if sys.argv[1] == "cpu" else time.perf_counter
n = 2048
a = np.random.rand(n, n).astype(np.float32)
b = np.random.rand(n, n).astype(np.float32)
a @ b
best = 0.0
for _ in range(5):
    t = clock(); a @ b; t = clock() - t
    best = max(best, 2 * n**3 / t / 1e9)
print("%.1f" % best)
EOF
}

# PyTorch level-batched trees/s: $1 the model directory, $2 the batch;
# the parsed trees' arithmetic timed (torch_models.py). Debian's torch
# with 2 threads moves by 3x between repetitions on these 2 cores (its
# OpenMP threads wait on each other), so 1 and 2 threads are both run,
# 3 times each, and the better median is PyTorch's figure.
torch_rate() {
  $PY - "$1" "$WORK/input.jsonl" "$2" <<'EOF'
import statistics, sys, time
sys.path.insert(0, "scripts/bench")
import torch, torch_models as tm
m = tm.Model(sys.argv[1])
preps = [m.prepare(i) for i in tm.load_instances(sys.argv[2])]
best = 0.0
with torch.inference_mode():
    for threads in (1, 2):
        torch.set_num_threads(threads)
        m.run(preps[:256], "level-batched", int(sys.argv[3]))  # warm-up
        r = []
        for _ in range(3):
            t = time.perf_counter()
            m.run(preps, "level-batched", int(sys.argv[3]))
            r.append(len(preps) / (time.perf_counter() - t))
        best = max(best, statistics.median(r))
print("%.1f" % best)
EOF
}

# leaves, internal nodes and trees of the input (an S-expression reader
# independent of the engine's parser)
read -r LEAVES INTERNAL TREES < <($PY - "$WORK/input.jsonl" <<'EOF'
import json, sys
leaves = internal = trees = 0
for line in open(sys.argv[1]):
    s = json.loads(line)["tree"]
    toks, cur = [], ""
    for ch in s:
        if ch in "() ":
            if cur: toks.append(cur); cur = ""
            if ch != " ": toks.append(ch)
        else:
            cur += ch
    if cur: toks.append(cur)
    # stack of [child nodes seen] per open node; a node is a leaf when it
    # has a word and no child node
    stack = []
    for i, t in enumerate(toks):
        if t == "(":
            stack.append([0, False, True])  # node children, has word, label next
        elif t == ")":
            kids, word, _ = stack.pop()
            if kids == 0: leaves += 1
            else: internal += 1
            if stack: stack[-1][0] += 1
        else:
            if stack[-1][2]: stack[-1][2] = False  # the label
            else: stack[-1][1] = True
    trees += 1
print(leaves, internal, trees)
EOF
)

PEAK2_BEFORE=$(peak 0)
PEAK1=$(peak 1)
PEAK1CPU=$(peak 1 cpu)
echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# input: $TREES trees ($(basename $DATA) x$COPIES): $LEAVES leaves, $INTERNAL internal nodes"
echo "# sgemm 2048^3 (numpy/OpenBLAS): both cores $PEAK2_BEFORE GFLOP/s, one core $PEAK1 GFLOP/s, one core $PEAK1CPU GFLOP per CPU second"

declare -A RATE CPU VERT ORATE TRATE
for cfg in "128 64" "512 256"; do
  set -- $cfg
  H=$1
  [ -f "$WORK/m$H/model.json" ] || $CANOPY model init treelstm "$WORK/m$H" \
    --hidden "$H" --embed "$H" --classes 5 --vocab-from "$DATA" >/dev/null 2>&1
done
# interleaved repetitions: every configuration sees the same noise
for rep in $(seq "$REPEAT"); do
  for cfg in "128 64" "512 256"; do
    set -- $cfg
    for jobs in 1 2; do
      TIMEFORMAT='%U %S'
      { time $CANOPY run --model "$WORK/m$1" --input "$WORK/input.jsonl" \
          --batch "$2" --jobs $jobs 2>"$WORK/err" >/dev/null; } 2>"$WORK/cpu"
      sum=$(tail -1 "$WORK/err")
      r=$(echo "$sum" | grep -o '"instances_per_s": [0-9.]*' | cut -d' ' -f2)
      RATE[$1,$2,$jobs]="${RATE[$1,$2,$jobs]:-} $r"
      # trees per CPU second (user + sys), the steadier figure on a busy machine
      c=$(awk -v n="$TREES" '{ s = $1 + $2; print (s > 0 ? n / s : 0) }' "$WORK/cpu")
      CPU[$1,$2,$jobs]="${CPU[$1,$2,$jobs]:-} $c"
      VERT[$1]=$(echo "$sum" | grep -o '"vertices": [0-9]*' | cut -d' ' -f2)
    done
    if [ -n "$OLD" ]; then # the before binary, its default --jobs (the cores)
      r=$($OLD run --model "$WORK/m$1" --input "$WORK/input.jsonl" --batch "$2" \
            2>&1 >/dev/null | tail -1 | grep -o '"instances_per_s": [0-9.]*' | cut -d' ' -f2)
      ORATE[$1]="${ORATE[$1]:-} $r"
    fi
    if [ "$TORCH" = 1 ]; then
      TRATE[$1]="${TRATE[$1]:-} $(torch_rate "$WORK/m$1" "$2")"
    fi
  done
done
PEAK2_AFTER=$(peak 0)
PEAK=$(echo "$PEAK2_BEFORE $PEAK2_AFTER" | awk '{print ($1 > $2) ? $1 : $2}')
echo "# sgemm both cores after the runs: $PEAK2_AFTER GFLOP/s; the ratios use $PEAK"
echo
echo "| H | batch | MFLOP/tree | jobs | trees/s (median of $REPEAT) | spread | GFLOP/s | % of peak | goal | GFLOP per CPU s | % of one core's peak per CPU s |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
for cfg in "128 64 60" "512 256 80"; do
  set -- $cfg
  H=$1 B=$2 GOAL=$3
  want=$((LEAVES + INTERNAL + TREES))
  [ "${VERT[$H]}" = "$want" ] || echo "# warning: the run counted ${VERT[$H]} vertices, the script $want"
  for jobs in 1 2; do
    echo "${RATE[$H,$B,$jobs]} | ${CPU[$H,$B,$jobs]}" | $PY -c '
import statistics, sys
H, B, jobs, goal = map(int, sys.argv[1:5])
leaves, internal, trees, peak, peak_cpu = map(float, sys.argv[5:10])
wall, cpu = sys.stdin.read().split("|")
r = sorted(float(x) for x in wall.split())
c = statistics.median(float(x) for x in cpu.split())
flop = (leaves * 2 * 3 * H * H + internal * 2 * 5 * H * 2 * H + trees * 2 * 5 * H) / trees
med = statistics.median(r)
gf = med * flop / 1e9
pct = 100 * gf / peak
gc = c * flop / 1e9
print("| %d | %d | %.2f | %d | %s | %s..%s | %.1f | %.1f%% | >= %d%%: %s | %.1f | %.1f%% |" % (
    H, B, flop / 1e6, jobs, format(round(med), ","), format(round(r[0]), ","),
    format(round(r[-1]), ","), gf, pct, goal,
    "met" if pct >= goal else "missed by %.1f points" % (goal - pct),
    gc, 100 * gc / peak_cpu))
' "$H" "$B" "$jobs" "$GOAL" "$LEAVES" "$INTERNAL" "$TREES" "$PEAK" "$PEAK1CPU"
  done
done

# The comparison: before and after side by side (--jobs 2: the default
# on these 2 cores), with DyNet's published figures
echo
echo "| | canopy before | canopy now | now / before | DyNet autobatch, 2 threads (published figure) | now / DyNet | PyTorch level-batched, best of 1 and 2 threads (this run) | now / PyTorch |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for cfg in "128 64 8854" "512 256 1955"; do
  set -- $cfg
  $PY - "$1" "$2" "$3" "${RATE[$1,$2,2]}" "${ORATE[$1]:-}" "${TRATE[$1]:-}" <<'EOF'
import statistics, sys
H, B, dynet = sys.argv[1], sys.argv[2], float(sys.argv[3])
med = lambda s: statistics.median(float(x) for x in s.split()) if s.strip() else None
now, old, pt = med(sys.argv[4]), med(sys.argv[5]), med(sys.argv[6])
f = lambda x: "-" if x is None else format(round(x), ",")
r = lambda a, b: "-" if a is None or b is None else "%.2fx" % (a / b)
print("| H=%s, runs of %s | %s | %s | %s | %s | %s | %s | %s |" % (
    H, B, f(old), f(now), r(now, old), f(dynet), r(now, dynet), f(pt), r(now, pt)))
EOF
done
