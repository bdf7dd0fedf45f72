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
# With DAEMON=1, then the daemon's CPU per answered request: each binary
# serves the treelstm model (--workers 1), wrk posts one tree a request
# at c=64 for 4 s (after 1 s of warm-up), and the daemon's utime + stime
# over that (/proc/PID/stat, 10 ms ticks) over the requests answered is
# the figure, interleaved, median of REPEAT.
#
# usage: scripts/bench/host.sh OLD_CANOPY [NEW_CANOPY]
#        (or OLD=... NEW=...; NEW defaults to build/canopy; REPEAT=5,
#         FAMILIES="treelstm latticelstm bilstm-tagger", WORK=a directory,
#         DAEMON=1 for the daemon too: needs wrk)
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

exec /usr/bin/python3 - "$OLD" "$NEW" "$REPEAT" "$DATA" "$WORK" "${DAEMON:-0}" \
  $FAMILIES <<'EOF'
import json, os, re, socket, statistics, subprocess, sys, time
import urllib.request

old, new, repeat, data, work, daemon = sys.argv[1:7]
families = sys.argv[7:]
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

if daemon != "1":
    sys.exit(0)
models = os.path.join(work, "served")
os.makedirs(models, exist_ok=True)
if not os.path.exists(os.path.join(models, "treelstm")):
    os.symlink(setup("treelstm")[0], os.path.join(models, "treelstm"))
bodies = os.path.join(work, "bodies.txt")
with open(os.path.join(data, "trees-binary.jsonl")) as f, \
        open(bodies, "w") as out:
    for line in f.read().splitlines():
        out.write(json.dumps({"instances": [json.loads(line)]}) + "\n")
lua = os.path.join(os.getcwd(), "scripts", "bench", "infer.lua")


def proc_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, secs):
    out = subprocess.run(["wrk", "-t1", "-c64", "-d%ds" % secs, "-s", lua,
                          "http://127.0.0.1:%d/v1/models/treelstm/infer" %
                          port, "--", bodies], capture_output=True,
                         text=True).stdout
    m = re.search(r"(\d+) requests in", out)
    return int(m.group(1)) if m else 0


def serve_once(binary):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = subprocess.Popen([binary, "serve", "--models-dir", models, "--port",
                          str(port), "--workers", "1", "--log-level",
                          "warn"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port,
                                       timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        wrk(port, 1)
        c0 = proc_cpu(d.pid)
        n = wrk(port, 4)
        c1 = proc_cpu(d.pid)
    finally:
        d.terminate()
        d.wait()
    return (c1 - c0) / n * 1e6 if n else float("nan")


per = {"old": [], "new": []}
for rep in range(repeat):
    for side, binary in (("old", old), ("new", new)):
        per[side].append(serve_once(binary))
o, n = statistics.median(per["old"]), statistics.median(per["new"])
print("\n# the daemon, one tree a request, wrk -c64, --workers 1: CPU µs per "
      "answered request (median of %d)" % repeat)
print("| old | new | old/new |\n|---|---|---|\n| %.1f | %.1f | %.2f× |" %
      (o, n, o / n))
EOF
