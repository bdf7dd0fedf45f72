#!/usr/bin/python3
"""cell_report.py - an ED-Batch Table-2-style report of the compiled
vertex functions: per vertex type of every family with an IR cell, kernels
and bytes copied per execution, latency at (batch 8, H 64) and (batch 64,
H 256), naive against pq, and compile time. Prints a markdown table (docs/cells.md).

usage: scripts/bench/cell_report.py [--canopy build/canopy] [--iters 300]
Models are made with `canopy model init` in a temporary directory; the
figures come from `canopy model bench` (one process per model, all layouts
in one run, so ratios are side by side).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

DATA = os.environ.get("CANOPY_DATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")
FAMILIES = [  # family, data file
    ("treelstm", "trees-binary.jsonl"),
    ("treelstm-2type", "trees-binary.jsonl"),
    ("treegru", "trees-binary.jsonl"),
    ("childsum-treelstm", "trees-nary.jsonl"),
    ("bilstm-tagger", "sequences.jsonl"),
    ("latticegru", "dags.jsonl"),
    ("latticelstm", "lattices.jsonl"),
]
# Not here: lstm-nmt (its graph grows while it runs, and `canopy model
# bench` re-runs batches of a static run only; its encoder and decoder
# steps are the LSTM cell bilstm-tagger reports) and mvrnn (H×H states: a
# bench run of 256 trees at H = 256 would take 2.6 GB; docs/benchmarks.md
# has its whole-run figures).
SHAPES = [(8, 64), (64, 256)]  # (batch, hidden)


def bench(canopy, family, data, hidden, batch, iters, tmp):
    d = os.path.join(tmp, "%s-%d" % (family, hidden))
    if not os.path.isdir(d):
        subprocess.run([canopy, "model", "init", family, d, "--hidden",
                        str(hidden), "--embed", str(hidden), "--vocab-from",
                        os.path.join(DATA, data)], check=True,
                       stdout=subprocess.DEVNULL)
    out = subprocess.run([canopy, "model", "bench", d, "--input",
                          os.path.join(DATA, data), "--runsize", "256",
                          "--batch", str(batch), "--iters", str(iters)],
                         check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        r = json.loads(line)
        rows[(r["type"], r["layout"])] = r
    return rows


def ratio(a, b):
    return "%.1f×" % (a / b) if b > 0 else ("∞" if a > 0 else "1×")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canopy", default="build/canopy")
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    print("| family / vertex type | kernels naive → pq | copy kernels "
          "naive → pq | bytes copied in the cell naive → pq | µs b=8 H=64 "
          "naive / pq | µs b=64 H=256 naive / pq | compile ms (pq) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fam, data in FAMILIES:
            res = [bench(a.canopy, fam, data, h, b, a.iters, tmp)
                   for b, h in SHAPES]
            types = []
            for (t, lay) in res[0]:
                if lay == "pq" and t not in types:
                    types.append(t)
            for t in types:
                s = res[0]
                nv, pq = s[(t, "naive")], s[(t, "pq")]
                lat = []
                for r in res:
                    if (t, "pq") not in r:
                        lat.append("–")
                        continue
                    lat.append("%.1f / %.1f (%s)" % (
                        r[(t, "naive")]["us"], r[(t, "pq")]["us"],
                        ratio(r[(t, "naive")]["us"], r[(t, "pq")]["us"])))
                print("| %s / %s | %d → %d | %d → %d | %d → %d (%s) | "
                      "%s | %s | %.2f |" % (
                          fam, t, nv["kernels"], pq["kernels"],
                          nv["copy_kernels"],
                          pq["copy_kernels"], nv["cell_bytes"],
                          pq["cell_bytes"],
                          ratio(nv["cell_bytes"], pq["cell_bytes"]),
                          lat[0], lat[1], pq["compile_ms"]))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
