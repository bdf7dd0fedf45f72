#!/usr/bin/env bash
# host.sh - the host's cost per instance and per vertex, this build against
# an older one: `canopy run --jobs 1 --batch 1024 --threads 1` at H=8 (the
# products cost next to nothing there: what is measured is the CPU work
# around them) on treelstm (4,000 trees), latticelstm (2,000 lattices)
# and bilstm-tagger (4,000 sentences), the DEV data repeated. The two
# binaries run interleaved, REPEAT times each (default 5); each figure is
# the median. CPU time (utime + stime of the run, getrusage) is the
# measure, so a busy machine slows both sides alike; instances per
# second of wall time are printed too. Stage times (parse_s, schedule_s,
# execute_s, output_s of the summary) are shown where a binary prints
# them, per instance in µs and per vertex in ns.
#
# usage: scripts/bench/host.sh OLD_CANOPY [NEW_CANOPY]
#        (or OLD=... NEW=...; NEW defaults to build/canopy; REPEAT=5,
#         FAMILIES="treelstm latticelstm bilstm-tagger", WORK=a directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${1:-${OLD:-}}
NEW=${2:-${NEW:-build/canopy}}
[ -n "$OLD" ] || { echo "usage: $0 OLD_CANOPY [NEW_CANOPY]" >&2; exit 2; }
REPEAT=${REPEAT:-5}
FAMILIES=${FAMILIES:-"treelstm latticelstm bilstm-tagger"}
DATA=${CANOPY_DATA:-data}
WORK=${WORK:-$(mktemp -d /tmp/canopy-host.XXXXXX)}
mkdir -p "$WORK"

exec /usr/bin/python3 - "$OLD" "$NEW" "$REPEAT" "$DATA" "$WORK" $FAMILIES <<'EOF'
import json, os, statistics, subprocess, sys, time

old, new, repeat, data, work = sys.argv[1:6]
families = sys.argv[6:]
repeat = int(repeat)
# family: (data file, copies of its 400 lines, extra `model init` flags)
FAM = {"treelstm": ("trees-binary.jsonl", 10, []),
       "latticelstm": ("lattices.jsonl", 5,
                       ["--lexicon", os.path.join(data, "lexicon.txt")]),
       "bilstm-tagger": ("sequences.jsonl", 10, [])}
STAGES = ("parse_s", "schedule_s", "execute_s", "output_s")


def setup(fam):
    src, k, extra = FAM[fam]
    inp = os.path.join(work, "%s-x%d.jsonl" % (src[:-6], k))
    if not os.path.exists(inp):
        with open(os.path.join(data, src)) as f:
            text = f.read()
        with open(inp, "w") as f:
            f.write(text * k)
    model = os.path.join(work, fam + "-8")
    if not os.path.exists(os.path.join(model, "model.json")):
        subprocess.run([new, "model", "init", fam, model, "--hidden", "8",
                        "--embed", "8", "--classes", "5", "--vocab-from",
                        os.path.join(data, src)] + extra, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return model, inp


def run(binary, model, inp):
    t0 = time.monotonic()
    p = subprocess.Popen([binary, "run", "--model", model, "--input", inp,
                          "--jobs", "1", "--batch", "1024", "--threads", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("%s failed: %s" % (binary, err))
    s = json.loads(err.strip().splitlines()[-1])
    s["cpu_s"] = ru.ru_utime + ru.ru_stime
    s["wall_s"] = wall
    return s


setups = {f: setup(f) for f in families}
res = {(f, side): [] for f in families for side in ("old", "new")}
for rep in range(repeat):
    for f in families:
        for side, binary in (("old", old), ("new", new)):
            res[(f, side)].append(run(binary, *setups[f]))

load = open("/proc/loadavg").read().split()[:3]
print("# %s UTC, %d cores, load %s; canopy run --jobs 1 --batch 1024 "
      "--threads 1, H=8, median of %d, interleaved" %
      (time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.cpu_count(),
       " ".join(load), repeat))
print("# old: %s\n# new: %s" % (old, new))


def med(rows, key):
    v = [r[key] for r in rows if key in r]
    return statistics.median(v) if v else None


hdr = ("family", "side", "inst", "vert", "cpu µs/inst", "ns/vertex",
       "inst/cpu-s", "inst/s wall") + tuple(k[:-2] + " µs/i" for k in STAGES)
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for f in families:
    row = {}
    for side in ("old", "new"):
        rs = res[(f, side)]
        n, v = rs[0]["instances"], rs[0]["vertices"]
        cpu = med(rs, "cpu_s")
        row[side] = cpu
        cells = [f, side, str(n), str(v), "%.2f" % (cpu / n * 1e6),
                 "%.1f" % (cpu / v * 1e9), "%.0f" % (n / cpu),
                 "%.0f" % statistics.median(r["instances"] / r["wall_s"]
                                            for r in rs)]
        for k in STAGES:
            m = med(rs, k)
            cells.append("-" if m is None else "%.2f" % (m / n * 1e6))
        print("| " + " | ".join(cells) + " |")
    print("| %s | old/new CPU | | | **%.2f×** | | | |%s" %
          (f, row["old"] / row["new"], " |" * len(STAGES)))
EOF
