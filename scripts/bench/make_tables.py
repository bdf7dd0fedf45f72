#!/usr/bin/python3
"""Markdown tables from docs/bench/{results,sgemm,daemon}.csv and summary.json.

usage: scripts/bench/make_tables.py [--dir docs/bench]   (prints to stdout;
run_bench.py writes the same text to docs/bench/tables.md)
"""
import argparse
import csv
import json
import os


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return []
    with open(p, newline="") as fh:
        return list(csv.DictReader(fh))


def tables(d):
    rows = load(d, "results.csv")
    sg = load(d, "sgemm.csv")
    dm = load(d, "daemon.csv")
    summ = json.load(open(os.path.join(d, "summary.json")))
    peak = summ["sgemm_peak_gflops"]
    out = []
    w = out.append
    w("Machine: %s; %d threads everywhere; %s; PyTorch %s; OpenBLAS `%s`; "
      "sweep took %.0f s. Load average (1 min) during the points: %s..%s."
      % (summ["machine"], summ["threads"], summ["date"], summ["torch"], summ["openblas"],
         summ["seconds"], min(float(r["loadavg_1m"]) for r in rows),
         max(float(r["loadavg_1m"]) for r in rows)))
    w("")
    w("sgemm peak used below: **%.1f GFLOP/s** (median over the large shapes, M >= 256)." % peak)
    w("")
    pts = []
    for r in rows:
        k = (r["family"], int(r["hidden"]), int(r["batch"]))
        if r["system"] != "torch-per-instance" and k not in pts:
            pts.append(k)
    w("| family | H | batch | MFLOP/inst | PyTorch per-instance | PyTorch level-batched | canopy none | canopy depth | canopy agenda | canopy fsm | best canopy / per-inst | best canopy / level-b. | best canopy % of peak |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def fmt(r):
        return "%.0f [%.0f..%.0f]" % (float(r["ips_median"]), float(r["ips_min"]), float(r["ips_max"]))

    def ratio(a, b):
        # median ratio, spread = worst..best combination of the two ranges
        return "%.2f× [%.2f..%.2f]" % (float(a["ips_median"]) / float(b["ips_median"]),
                                      float(a["ips_min"]) / float(b["ips_max"]),
                                      float(a["ips_max"]) / float(b["ips_min"]))
    for f, h, b in pts:
        sel = [r for r in rows if r["family"] == f and int(r["hidden"]) == h]
        pi = [r for r in sel if r["system"] == "torch-per-instance"]
        lb = [r for r in sel if r["system"] == "torch-level-batched" and int(r["batch"]) == b]
        cs = {r["policy"]: r for r in sel if r["system"] == "canopy" and int(r["batch"]) == b}
        if not (pi and lb and cs):
            continue
        best = max(cs.values(), key=lambda r: float(r["ips_median"]))
        w("| %s | %d | %d | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %.1f%% (%s) |" % (
            f, h, b, float(pi[0]["mflop_per_inst"]), fmt(pi[0]), fmt(lb[0]),
            *(fmt(cs[p]) if p in cs else "-" for p in ("none", "depth", "agenda", "fsm")),
            ratio(best, pi[0]), ratio(best, lb[0]), 100 * float(best["frac_peak"]), best["policy"]))
    w("")
    w("Fraction of the sgemm peak (achieved GFLOP/s = instances/s × MFLOP/inst):")
    w("")
    w("| family | H | batch | PyTorch per-inst | PyTorch level-b. | canopy none | canopy depth | canopy agenda | canopy fsm |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f, h, b in pts:
        sel = [r for r in rows if r["family"] == f and int(r["hidden"]) == h]
        cells = []
        for sysn, pol, bb in (("torch-per-instance", "", 0), ("torch-level-batched", "", b),
                              ("canopy", "none", b), ("canopy", "depth", b),
                              ("canopy", "agenda", b), ("canopy", "fsm", b)):
            r = [x for x in sel if x["system"] == sysn and x["policy"] == pol and int(x["batch"]) == bb]
            cells.append("%.1f%% (%.1f GF/s)" % (100 * float(r[0]["frac_peak"]), float(r[0]["gflops_median"]))
                         if r else "-")
        w("| %s | %d | %d | %s |" % (f, h, b, " | ".join(cells)))
    w("")
    cb = [r for r in rows if r["system"] == "canopy"]
    if cb:
        w("canopy batches launched / lower bound (Σ depth), per policy, same points:")
        w("")
        w("| family | H | batch | none | depth | agenda | fsm |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for f, h, b in pts:
            cs = {r["policy"]: r for r in cb if r["family"] == f and int(r["hidden"]) == h and int(r["batch"]) == b}
            w("| %s | %d | %d | %s |" % (f, h, b, " | ".join(
                "%s / %s" % (cs[p]["batches"], cs[p]["lower_bound"]) if p in cs else "-"
                for p in ("none", "depth", "agenda", "fsm"))))
        w("")
    if sg:
        w("sgemm (OpenBLAS, row-major A[M,K]·W[N,K]ᵀ, %d threads), GFLOP/s:" % summ["threads"])
        w("")
        w("| shape | M | N | K | GFLOP/s |")
        w("|---|---:|---:|---:|---:|")
        for r in sg:
            w("| %s | %s | %s | %s | %s |" % (r["what"], r["M"], r["N"], r["K"], r["gflops"]))
        w("")
    if dm:
        w("Daemon (`canopy serve`, loopback, `clients/loadgen.py` closed loop on the same 2 cores):")
        w("")
        w("| model | policy | max-instances | per request | concurrency | instances/s | GFLOP/s | p50 ms | p99 ms | instances/run | batches / lower bound | errors |")
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in dm:
            w("| %s H=%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |" % (
                r["family"], r["hidden"], r["policy"], r["max_instances"], r["per_request"],
                r["concurrency"], r["instances_per_s"], r["gflops"], r["p50_ms"], r["p99_ms"],
                r["instances_per_run"], r["batches"], r["lower_bound"], r["errors"]))
        w("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))), "docs", "bench"))
    a = ap.parse_args()
    print(tables(a.dir))


if __name__ == "__main__":
    main()
