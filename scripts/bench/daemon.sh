#!/bin/bash
# The daemon under load, driven by wrk: a real
# `canopy serve` on a free port, wrk with scripts/bench/infer.lua posting
# bodies built from the 400 real data trees (cycled), closed loop, at
# concurrency 1/8/64/256 x 1/4 instances a request. One table: req/s,
# instances/s, p50/p99 latency, the ratio to the offline throughput of
# `canopy run --jobs 2` on the same trees (measured in this run, before and
# after the daemon's points), the cores the daemon used (utime + stime from
# /proc/PID/stat over each point, split into the loop thread, the workers
# and the rest), how many of the daemon's threads were on average runnable
# but waiting for a core (/proc/PID/task/*/schedstat: other processes on
# the machine, or its own threads outnumbering the cores), and the cores
# wrk itself used (it shares the machine: its one thread is part of the
# load). "per daemon CPU s / offline per CPU s" divides the daemon's
# instances per CPU second of its own (every thread) by the engine's
# offline instances per CPU second: how efficiently the daemon turns the
# CPU it gets into answers, apart from what wrk and the kernel's loopback
# TCP take from it on a shared machine.
# Then the latency and throughput targets, each with its figure.
# Measures; asserts nothing.
#
# usage: scripts/bench/daemon.sh [SECONDS_A_POINT=5]
#   CANOPY   the binary (default build/canopy)
#   SERVE_BIN  the daemon's binary, for a before/after (default $CANOPY;
#            the offline reference always uses $CANOPY run --jobs 2)
#   HIDDEN   treelstm hidden and embed size (128)
#   PIN      "daemon=CPUS wrk=CPUS" taskset lists (default: no pinning)
#   SERVE    more `canopy serve` flags (e.g. "--workers 1")
set -u
cd "$(dirname "$0")/../.."
CANOPY=${CANOPY:-build/canopy}
SERVE_BIN=${SERVE_BIN:-$CANOPY}
DUR=${1:-5}
HIDDEN=${HIDDEN:-128}
SERVE=${SERVE:-}
PIN=${PIN:-}
PY=/usr/bin/python3
DATA=${CANOPY_DATA:-data}/trees-binary.jsonl
WORK=$(mktemp -d /tmp/canopy-benchd-XXXXXX)
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
command -v wrk >/dev/null || { echo "bench/daemon.sh: wrk is missing (scripts/deps.sh wrk)" >&2; exit 1; }

pin_daemon=() pin_wrk=()
for p in $PIN; do
  case $p in
    daemon=*) pin_daemon=(taskset -c "${p#daemon=}") ;;
    wrk=*) pin_wrk=(taskset -c "${p#wrk=}") ;;
  esac
done

$CANOPY model init treelstm "$WORK/models/treelstm" --hidden "$HIDDEN" \
  --embed "$HIDDEN" --classes 5 --vocab-from "$DATA" >/dev/null 2>&1 || exit 1
# offline input: the trees x5; bodies: the same trees, 1 or 4 a request
for i in 1 2 3 4 5; do cat "$DATA"; done >"$WORK/input.jsonl"
$PY - "$DATA" "$WORK" <<'EOF'
import json, sys
trees = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for per in (1, 4):
    with open("%s/bodies-%d.txt" % (sys.argv[2], per), "w") as f:
        for i in range(0, len(trees) - per + 1, per):
            f.write(json.dumps({"instances": trees[i:i + per]},
                               separators=(",", ":")) + "\n")
EOF

offline() { # median of 3: trees/s, and trees per CPU second (user + sys)
  local n r
  n=$(wc -l <"$WORK/input.jsonl")
  for r in 1 2 3; do
    TIMEFORMAT='%U %S'
    { time $CANOPY run --model "$WORK/models/treelstm" --input "$WORK/input.jsonl" \
        --batch 64 --jobs 2 2>"$WORK/off.err" >/dev/null; } 2>"$WORK/off.time"
    echo "$(tail -1 "$WORK/off.err" | grep -o '"instances_per_s": [0-9.]*' | cut -d' ' -f2)" \
      "$(awk -v n="$n" '{ s = $1 + $2; print (s > 0 ? n / s : 0) }' "$WORK/off.time")"
  done | sort -n | sed -n 2p
}

ticks() { # utime + stime in clock ticks: the whole process, its loop
  # thread (the main one), its workers (cn-worker-N), the rest
  local all loop=0 work=0 other=0 t c v
  all=$(awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0)
  local wait=0 w
  for t in /proc/$1/task/*; do
    # schedstat: ns on a CPU, ns runnable but waiting for one, timeslices
    w=$(awk '{print int($2 / 1e6)}' "$t/schedstat" 2>/dev/null) && wait=$((wait + w))
    c=$(cat "$t/comm" 2>/dev/null) || continue
    v=$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $12 + $13}') || continue
    if [ "${t##*/}" = "$1" ]; then loop=$((loop + v))
    elif [[ $c == cn-worker* ]]; then work=$((work + v))
    else other=$((other + v)); fi
  done
  echo "$all,$loop,$work,$other,$wait"
}

OFF1=$(offline)
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
CANOPY_POLICY_CACHE="$WORK/cache" "${pin_daemon[@]}" $SERVE_BIN serve \
  --models-dir "$WORK/models" --port "$port" --log-level warn $SERVE \
  2>"$WORK/serve.log" &
PID=$!
for i in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null ||
  { echo "bench/daemon.sh: the daemon did not start:" >&2; cat "$WORK/serve.log" >&2; exit 1; }
URL="http://127.0.0.1:$port/v1/models/treelstm/infer"
LUA=scripts/bench/infer.lua
"${pin_wrk[@]}" wrk -t1 -c8 -d1s -s $LUA "$URL" -- "$WORK/bodies-1.txt" >/dev/null # warm-up
HZ=$(getconf CLK_TCK)
ROWS=()
for per in 1 4; do
  for c in 1 8 64 256; do
    t0=$(ticks "$PID")
    s0=$(date +%s.%N)
    TIMEFORMAT='%U %S'
    { time "${pin_wrk[@]}" wrk -t1 -c$c -d${DUR}s --timeout 10s -s $LUA "$URL" \
        -- "$WORK/bodies-$per.txt" >"$WORK/wrk.out" 2>&1; } 2>"$WORK/wrk.time"
    s1=$(date +%s.%N)
    t1=$(ticks "$PID")
    line=$(grep '^wrk-json ' "$WORK/wrk.out" | cut -d' ' -f2-)
    [ -n "$line" ] || { echo "bench/daemon.sh: wrk failed:" >&2; cat "$WORK/wrk.out" >&2; exit 1; }
    ROWS+=("$per $c $t0 $t1 $s0 $s1 $(cat "$WORK/wrk.time") $line")
  done
done
kill "$PID"; wait "$PID" 2>/dev/null; PID=""
OFF2=$(offline)

echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); treelstm H=$HIDDEN on the 400 trees of $(basename $DATA)"
echo "# $SERVE_BIN serve, defaults${SERVE:+ plus $SERVE}${PIN:+, pinned: $PIN}; wrk 1 thread, ${DUR} s a point, closed loop"
echo "# offline, canopy run --jobs 2 --batch 64 (median of 3): ${OFF1% *} trees/s before the daemon, ${OFF2% *} after; ratios use the higher"
echo "# offline trees per CPU second (user + sys): ${OFF1#* } before, ${OFF2#* } after; the per-CPU column divides by the higher"
printf '%s\n' "${ROWS[@]}" | $PY -c '
import json, sys
hz = float(sys.argv[1])
(off1, c1), (off2, c2) = (map(float, a.split()) for a in sys.argv[2:4])
off, off_cpu = max(off1, off2), max(c1, c2)
rows = []
for l in sys.stdin:
    per, c, t0, t1, s0, s1, wu, ws, js = l.split(" ", 8)
    w = json.loads(js)
    secs = w["duration_us"] / 1e6
    wall = float(s1) - float(s0)
    errs = sum(w[k] for k in w if k.startswith("errors_"))
    rows.append(dict(per=int(per), c=int(c), rps=w["requests"] / secs,
                     ips=w["requests"] * int(per) / secs,
                     p50=w["p50_us"] / 1e3, p99=w["p99_us"] / 1e3,
                     cores=[(float(b) - float(a)) / hz / wall for a, b in
                            zip(t0.split(",")[:4], t1.split(",")[:4])],
                     waiting=(float(t1.split(",")[4]) - float(t0.split(",")[4])) / 1e3 / wall,
                     wrk=(float(wu) + float(ws)) / wall, errs=errs))
print()
print("| instances a request | concurrency | req/s | instances/s | p50 ms | p99 ms | / offline | per daemon CPU s / offline per CPU s | daemon cores (loop + workers + other) | runnable, no core | wrk cores | errors |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    c = r["cores"]
    print("| %d | %d | %s | %s | %.2f | %.2f | %.2fx | %.2fx | %.2f (%.2f + %.2f + %.2f) | %.2f | %.2f | %d |" % (
        r["per"], r["c"], format(round(r["rps"]), ","), format(round(r["ips"]), ","),
        r["p50"], r["p99"], r["ips"] / off, r["ips"] / max(c[0], 1e-9) / off_cpu,
        c[0], c[1], c[2], c[3], r["waiting"], r["wrk"], r["errs"]))
g = {(r["per"], r["c"]): r for r in rows}
print()
print("targets (1 instance a request):")
a, b = g[(1, 1)], g[(1, 64)]
print("- concurrency 1, p50 <= 0.6 ms: %.2f ms, %s" % (a["p50"], "met" if a["p50"] <= 0.6 else "missed"))
print("- concurrency 64, >= 0.9x offline: %.2fx (%s of %s trees/s), %s" % (
    b["ips"] / off, format(round(b["ips"]), ","), format(round(off), ","),
    "met" if b["ips"] >= 0.9 * off else "missed"))
print("- concurrency 64, p99 <= 10 ms: %.2f ms, %s" % (b["p99"], "met" if b["p99"] <= 10 else "missed"))
print()
print("stricter targets (1 instance a request):")
print("- concurrency 1, p50 <= 0.5 ms: %.2f ms, %s" % (a["p50"], "met" if a["p50"] <= 0.5 else "missed"))
print("- concurrency 64, >= 0.9x offline: %.2fx, %s; per CPU second the daemon is %.2fx the engine" % (
    b["ips"] / off, "met" if b["ips"] >= 0.9 * off else "missed", b["ips"] / max(b["cores"][0], 1e-9) / off_cpu))
' "$HZ" "$OFF1" "$OFF2"
