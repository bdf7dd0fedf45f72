#!/usr/bin/python3
"""Canopy vs PyTorch benchmark: one command, CSVs and plots.

  /usr/bin/python3 scripts/bench/run_bench.py [--canopy build-bench/canopy]
        [--threads 2] [--repeat 3] [--out docs/bench] [--quick]

Steps (all on the same data, data, and the same thread count):
 1. makes model directories with `canopy model init` (D = H, C = 5);
 2. verifies both PyTorch modes (scripts/bench/torch_models.py) against
    `canopy run` outputs to 1e-4 (absolute, per logit); a mismatch stops;
 3. measures OpenBLAS sgemm GFLOP/s (the library canopy links, via ctypes)
    at the shapes the runs use and on large squares (the peak);
 4. the sweep: PyTorch per-instance, PyTorch level-batched and canopy with
    policies none/depth/agenda/fsm - treelstm batch 1..256 at H=128, H
    64..512 at batch 64, H=512 batch 256, the other families at H=128
    batch 64; every point repeated (median, min..max);
 5. the daemon (`canopy serve` on a free loopback port) through
    clients/loadgen.py at the best setting;
 6. writes docs/bench/{results,sgemm,daemon,verify}.csv, docs/bench/*.png
    and docs/bench/summary.json (read by docs/benchmarks.md).

Timed regions: canopy - its own summary (`seconds`: JSON parsing, graph
building, compute, output printing; not model loading).  PyTorch - the
scheduling (levels, index tensors) and the arithmetic of already parsed
instances (JSON and tree parsing are NOT timed, which favours PyTorch).
"""
import argparse
import csv
import ctypes
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import torch  # noqa: E402
import torch_models as tm  # noqa: E402
from daemon_util import free_port  # noqa: E402

DATA = {
    "treelstm": "trees-binary.jsonl",
    "treegru": "trees-binary.jsonl",
    "childsum-treelstm": "trees-nary.jsonl",
    "bilstm-tagger": "sequences.jsonl",
    "latticelstm": "lattices.jsonl",
}
POLICIES = ("none", "depth", "agenda", "fsm")
TOL = 1e-4


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def stats(xs):
    return statistics.median(xs), min(xs), max(xs)


# --------------------------------------------------------------------------
# sgemm through OpenBLAS: the peak a product reaches on this machine (canopy
# itself computes its products with backends/cpu/gemm.c)
# --------------------------------------------------------------------------

def openblas_path(canopy):
    out = subprocess.run(["ldd", canopy], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = re.search(r"(lib(open)?blas[^ ]*\.so[^ ]*) => (\S+)", line)
        if m:
            return m.group(3)
    return "libopenblas.so.0"


class Sgemm(object):
    def __init__(self, path, threads):
        self.lib = ctypes.CDLL(path)
        self.path = path
        if hasattr(self.lib, "openblas_set_num_threads"):
            self.lib.openblas_set_num_threads(ctypes.c_int(threads))
        f = self.lib.cblas_sgemm
        f.restype = None
        P = ctypes.c_void_p
        i, fl = ctypes.c_int, ctypes.c_float
        f.argtypes = [i, i, i, i, i, i, fl, P, i, P, i, fl, P, i]
        self.f = f

    def gflops(self, M, N, K, min_s=0.15):
        """C[M,N] = A[M,K] * W[N,K]^T, row-major (x W^T, as in the models)."""
        A = torch.randn(M, K)
        W = torch.randn(N, K)
        C = torch.zeros(M, N)
        args = (101, 111, 112, M, N, K, 1.0, A.data_ptr(), K, W.data_ptr(), K, 0.0,
                C.data_ptr(), N)
        for _ in range(3):
            self.f(*args)
        reps, best = 1, None
        while True:
            t = time.perf_counter()
            for _ in range(reps):
                self.f(*args)
            dt = time.perf_counter() - t
            if dt >= min_s:
                break
            reps *= 2
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                self.f(*args)
            rates.append(2.0 * M * N * K * reps / (time.perf_counter() - t) / 1e9)
        return max(rates)


def sgemm_only(a):
    sg = Sgemm(openblas_path(a.canopy), a.threads)
    rows = []
    for s in (512, 1024, 2048):
        rows.append({"M": s, "N": s, "K": s, "what": "square", "gflops": round(sg.gflops(s, s, s), 2)})
    for h in [int(x) for x in a.sgemm_hidden.split(",")]:
        for M in (16, 64, 256, 1024, 4096):
            for (N, K, what) in ((5 * h, 2 * h, "treelstm internal"), (3 * h, h, "treelstm leaf")):
                rows.append({"M": M, "N": N, "K": K, "what": what + " H=%d" % h,
                             "gflops": round(sg.gflops(M, N, K, min_s=0.05), 2)})
    with open(a.sgemm_only, "w") as fh:
        json.dump({"path": sg.path, "rows": rows}, fh)


# --------------------------------------------------------------------------
# canopy
# --------------------------------------------------------------------------

def canopy_run(canopy, model, inp, policy, batch, threads, outputs=None, cache=None):
    cmd = [canopy, "run", "--model", model, "--input", inp, "--policy", policy,
           "--batch", str(batch), "--threads", str(threads)]
    if cache:
        cmd += ["--policy-cache", cache]
    p = subprocess.run(cmd, stdout=outputs or subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit("canopy run failed (%s): %s" % (" ".join(cmd), p.stderr[-2000:]))
    lines = [l for l in p.stderr.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--canopy", default=os.path.join(ROOT, "build", "canopy"))
    ap.add_argument("--data", default=os.environ.get("CANOPY_DATA") or
                    os.path.join(ROOT, "data"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench"))
    ap.add_argument("--quick", action="store_true", help="H=128 batch 64 only (smoke test)")
    ap.add_argument("--daemon-seconds", type=float, default=8.0)
    ap.add_argument("--plots-only", action="store_true",
                    help="redraw the plots and tables.md from the CSVs in --out")
    ap.add_argument("--sgemm-only", help=argparse.SUPPRESS)
    ap.add_argument("--sgemm-hidden", default="128", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.canopy = os.path.abspath(a.canopy)
    if a.sgemm_only:
        return sgemm_only(a)
    if a.plots_only:
        return plots_only(a.out)
    if not os.access(a.canopy, os.X_OK):
        raise SystemExit("no canopy binary at %s (build it, or pass --canopy)" % a.canopy)
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)
    t_start = time.time()
    work = tempfile.mkdtemp(prefix="canopy-bench-")
    machine = "%s, %d cores" % (cpu_model(), os.cpu_count())
    date = datetime.date.today().isoformat()
    log("# %s, %s, threads %d, work dir %s" % (machine, date, a.threads, work))

    # ---- the points -----------------------------------------------------
    points = []  # (family, H, batch)
    if a.quick:
        points = [("treelstm", 128, 64)]
    else:
        for b in (1, 8, 32, 64, 128, 256):
            points.append(("treelstm", 128, b))
        for h in (64, 256, 512):
            points.append(("treelstm", h, 64))
        points.append(("treelstm", 512, 256))
        for f in ("treegru", "childsum-treelstm", "bilstm-tagger", "latticelstm"):
            points.append((f, 128, 64))
    models = sorted({(f, h) for f, h, _ in points}, key=lambda x: (x[0] != "treelstm", x))

    # ---- 1. models and inputs --------------------------------------------
    mdirs, inputs, tmodels, preps = {}, {}, {}, {}
    for f, h in models:
        d = os.path.join(work, "%s-%d" % (f, h))
        cmd = [a.canopy, "model", "init", f, d, "--hidden", str(h), "--embed", str(h),
               "--classes", "5", "--vocab-from", os.path.join(a.data, DATA[f])]
        if f == "latticelstm":
            cmd += ["--lexicon", os.path.join(a.data, "lexicon.txt")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mdirs[(f, h)] = d
        tmodels[(f, h)] = tm.Model(d)
    insts = {}
    for f in {f for f, _ in models}:
        insts[f] = tm.load_instances(os.path.join(a.data, DATA[f]))

    def input_file(f, copies):
        key = (f, copies)
        if key not in inputs:
            p = os.path.join(work, "%s-x%d.jsonl" % (f, copies))
            src = open(os.path.join(a.data, DATA[f])).read().splitlines()
            src = [l for l in src if l.strip()]
            with open(p, "w") as fh:
                fh.write("\n".join(src * copies) + "\n")
            inputs[key] = p
        return inputs[key]

    # ---- 2. verification ---------------------------------------------------
    verify_rows = []
    with torch.inference_mode():
        for f, h in models:
            n = 100 if h <= 256 else 32
            sub = os.path.join(work, "verify-%s-%d.jsonl" % (f, h))
            src = [l for l in open(os.path.join(a.data, DATA[f])).read().splitlines() if l.strip()]
            with open(sub, "w") as fh:
                fh.write("\n".join(src[:n]) + "\n")
            outp = os.path.join(work, "verify-%s-%d.out" % (f, h))
            with open(outp, "w") as fh:
                canopy_run(a.canopy, mdirs[(f, h)], sub, "agenda", 64, a.threads, outputs=fh)
            ref = [json.loads(l)["logits"] for l in open(outp) if l.strip()]
            m = tmodels[(f, h)]
            pr = [m.prepare(i) for i in insts[f][:n]]
            for mode in tm.MODES:
                got = m.run(pr, mode, 64)
                worst, where = 0.0, None
                if len(got) != len(ref):
                    raise SystemExit("VERIFY FAILED: %s H=%d %s: %d outputs, canopy gave %d"
                                     % (f, h, mode, len(got), len(ref)))
                for k, (g, r) in enumerate(zip(got, ref)):
                    r = torch.tensor(r, dtype=torch.float32)
                    if g.shape != r.shape:
                        raise SystemExit("VERIFY FAILED: %s H=%d %s instance %d: shape %s vs canopy %s"
                                         % (f, h, mode, k, list(g.shape), list(r.shape)))
                    d = float((g - r).abs().max())
                    if d > worst:
                        worst, where = d, k
                verify_rows.append({"family": f, "hidden": h, "mode": mode, "instances": n,
                                    "max_abs_diff": "%.3g" % worst, "ok": worst <= TOL})
                log("verify %-18s H=%-3d %-13s %d instances: max |torch - canopy| = %.2e"
                    % (f, h, mode, n, worst))
                if worst > TOL:
                    raise SystemExit("VERIFY FAILED: %s H=%d %s: instance %d differs from canopy "
                                     "by %.3g > %g; not timing anything" % (f, h, mode, where, worst, TOL))

    # ---- 3. sgemm (in a child process: OpenBLAS threads started here would
    # keep spinning in this process and slow the PyTorch timings) ---------
    hs_t = sorted({h for f, h in models if f == "treelstm"})
    sgj = os.path.join(work, "sgemm.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--canopy", a.canopy,
                    "--threads", str(a.threads), "--sgemm-only", sgj,
                    "--sgemm-hidden", ",".join(map(str, hs_t))], check=True)
    sg = json.load(open(sgj))
    sg_rows = sg["rows"]
    # the peak: median over the large shapes (M >= 256, squares >= 1024); the
    # maximum would pick up timing outliers on a shared machine
    big = [r["gflops"] for r in sg_rows if r["M"] >= 256 and (r["what"] != "square" or r["M"] >= 1024)]
    peak = statistics.median(big)
    log("sgemm: %s, %d threads, peak %.1f GFLOP/s" % (sg["path"], a.threads, peak))

    def shape_rate(h, M):
        """sgemm GFLOP/s at the treelstm internal shape for H=h, nearest measured M."""
        best = None
        for r in sg_rows:
            if r["what"] == "treelstm internal H=%d" % h:
                if best is None or abs(r["M"] - M) < abs(best["M"] - M):
                    best = r
        return best["gflops"] if best else None

    # ---- 4. sweep --------------------------------------------------------------
    rows = []

    def add(f, h, b, system, policy, n, rates, extra=None):
        med, lo, hi = stats(rates)
        mflop = flop_per_inst[(f, h)] / 1e6
        row = {"family": f, "hidden": h, "embed": h, "batch": b, "system": system,
               "policy": policy, "instances": n, "repeats": len(rates),
               "ips_median": round(med, 1), "ips_min": round(lo, 1), "ips_max": round(hi, 1),
               "mflop_per_inst": round(mflop, 4),
               "gflops_median": round(med * mflop / 1e3, 2),
               "frac_peak": round(med * mflop / 1e3 / peak, 4),
               "loadavg_1m": round(os.getloadavg()[0], 2)}
        row.update(extra or {})
        rows.append(row)
        log("%-18s H=%-3d b=%-3d %-22s %9.1f inst/s [%.1f..%.1f] %6.2f GFLOP/s %5.1f%% of peak"
            % (f, h, b, system + ("/" + policy if policy else ""), med, lo, hi,
               row["gflops_median"], 100 * row["frac_peak"]))

    flop_per_inst = {}
    for f, h in models:
        m = tmodels[(f, h)]
        preps[(f, h)] = [m.prepare(i) for i in insts[f]]
        flop_per_inst[(f, h)] = sum(m.flops(p) for p in preps[(f, h)]) / len(preps[(f, h)])

    def torch_time(f, h, mode, b, n):
        m = tmodels[(f, h)]
        base = preps[(f, h)]
        pr = (base * ((n + len(base) - 1) // len(base)))[:n]
        with torch.inference_mode():
            m.run(pr[:min(n, max(b, 32))], mode, b)          # warm-up
            rates = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                m.run(pr, mode, b)
                rates.append(n / (time.perf_counter() - t))
        return rates

    cache = os.path.join(work, "policy-cache")
    os.makedirs(cache, exist_ok=True)
    done_pi = set()
    for f, h, b in points:
        n_inst = len(insts[f])
        # instance counts: enough work for >= ~0.1 s a run, capped for big H
        copies = 4 if h <= 128 else (2 if h <= 256 else 1)
        n = n_inst * copies
        inp = input_file(f, copies)
        if (f, h) not in done_pi:
            done_pi.add((f, h))
            npi = n_inst if h <= 256 else n_inst // 2
            add(f, h, 0, "torch-per-instance", "", npi, torch_time(f, h, "per-instance", 1, npi))
        add(f, h, b, "torch-level-batched", "", n, torch_time(f, h, "level-batched", b, n))
        for pol in POLICIES:
            canopy_run(a.canopy, mdirs[(f, h)], inp, pol, b, a.threads, cache=cache)  # warm-up / fsm learning
            rates, summ = [], None
            for _ in range(a.repeat):
                summ = canopy_run(a.canopy, mdirs[(f, h)], inp, pol, b, a.threads, cache=cache)
                rates.append(summ["instances_per_s"])
            add(f, h, b, "canopy", pol, n, rates,
                {"batches": summ["batches"], "lower_bound": summ["lower_bound"],
                 "kernels": summ["kernels"]})
        log("  elapsed %.0f s" % (time.time() - t_start))

    # ---- 5. daemon -------------------------------------------------------------
    daemon_rows = []
    f, h, b = "treelstm", 128, 64
    cands = [r for r in rows if r["system"] == "canopy" and (r["family"], r["hidden"], r["batch"]) == (f, h, b)
             and r["policy"] in ("none", "depth", "agenda")]
    if cands:
        best = max(cands, key=lambda r: r["ips_median"])
        mdir = os.path.join(work, "serve-models")
        os.makedirs(mdir, exist_ok=True)
        os.symlink(mdirs[(f, h)], os.path.join(mdir, "treelstm"))
        port = free_port()
        serve_log = open(os.path.join(work, "serve.log"), "w")
        srv = subprocess.Popen([a.canopy, "serve", "--models-dir", mdir, "--port", str(port),
                                "--host", "127.0.0.1", "--policy", best["policy"],
                                "--max-instances", str(b), "--log-level", "warn"],
                               stdout=serve_log, stderr=serve_log)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            for per_req, conc in ((1, 64), (16, 8)):
                p = subprocess.run([sys.executable, os.path.join(ROOT, "clients", "loadgen.py"),
                                    "--url", "http://127.0.0.1:%d" % port, "--model", "treelstm",
                                    "--input", os.path.join(a.data, DATA[f]),
                                    "--per-request", str(per_req), "--concurrency", str(conc),
                                    "--duration", str(a.daemon_seconds), "--requests", "1000000"],
                                   capture_output=True, text=True)
                res = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
                res.update({"family": f, "hidden": h, "policy": best["policy"],
                            "max_instances": b, "gflops": round(res["instances_per_s"]
                                                                * flop_per_inst[(f, h)] / 1e9, 2)})
                res["errors"] = json.dumps(res["errors"])
                daemon_rows.append(res)
                log("daemon %s per_request=%d concurrency=%d: %.1f inst/s, p50 %.2f ms, p99 %.2f ms"
                    % (best["policy"], per_req, conc, res["instances_per_s"], res["p50_ms"], res["p99_ms"]))
        finally:
            srv.terminate()
            try:
                srv.wait(timeout=15)
            except subprocess.TimeoutExpired:
                srv.kill()
            serve_log.close()

    # ---- 6. outputs ------------------------------------------------------------
    def write_csv(name, rs):
        if not rs:
            return
        keys = []
        for r in rs:
            for k in r:
                if k not in keys:
                    keys.append(k)
        with open(os.path.join(a.out, name), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rs)

    write_csv("results.csv", rows)
    write_csv("sgemm.csv", sg_rows)
    write_csv("daemon.csv", daemon_rows)
    write_csv("verify.csv", verify_rows)
    summary = {"machine": machine, "date": date, "threads": a.threads, "sgemm_peak_gflops": round(peak, 2),
               "openblas": sg["path"], "torch": torch.__version__, "seconds": round(time.time() - t_start, 1),
               "flop_per_instance": {"%s-%d" % k: v for k, v in flop_per_inst.items()},
               "sgemm_at_treelstm_internal_M64": {str(h): shape_rate(h, 64) for h in (64, 128, 256, 512)}}
    with open(os.path.join(a.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    plots(rows, summary, a.out)
    import make_tables
    with open(os.path.join(a.out, "tables.md"), "w") as fh:
        fh.write(make_tables.tables(a.out) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    log("done in %.0f s; results in %s" % (time.time() - t_start, a.out))


def plots_only(out):
    num = ("hidden", "embed", "batch", "instances", "repeats")
    rows = []
    with open(os.path.join(out, "results.csv"), newline="") as fh:
        for r in csv.DictReader(fh):
            for k in list(r):
                if k in num:
                    r[k] = int(r[k])
                elif k.startswith(("ips_", "mflop", "gflops", "frac", "loadavg")):
                    r[k] = float(r[k])
            rows.append(r)
    summary = json.load(open(os.path.join(out, "summary.json")))
    plots(rows, summary, out)
    import make_tables
    with open(os.path.join(out, "tables.md"), "w") as fh:
        fh.write(make_tables.tables(out) + "\n")


def plots(rows, summary, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = "%s · %d threads · %s" % (summary["machine"], summary["threads"], summary["date"])
    peak = summary["sgemm_peak_gflops"]
    styles = {("torch-per-instance", ""): ("PyTorch per-instance", "tab:gray", "s"),
              ("torch-level-batched", ""): ("PyTorch level-batched (Fold)", "tab:brown", "D"),
              ("canopy", "none"): ("canopy none", "tab:red", "v"),
              ("canopy", "depth"): ("canopy depth", "tab:blue", "o"),
              ("canopy", "agenda"): ("canopy agenda", "tab:green", "^"),
              ("canopy", "fsm"): ("canopy fsm", "tab:purple", "x")}

    def sel(**kw):
        return [r for r in rows if all(r[k] == v for k, v in kw.items())]

    # (a) treelstm H=128: instances/s against batch
    pi = sel(family="treelstm", hidden=128, system="torch-per-instance")
    if pi:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        bs = sorted({r["batch"] for r in sel(family="treelstm", hidden=128) if r["batch"] > 0})
        for (sysn, pol), (lab, col, mk) in styles.items():
            if sysn == "torch-per-instance":
                r = pi[0]
                ax.axhline(r["ips_median"], color=col, ls="--", label=lab + " (batch-independent)")
                continue
            rs = sorted([r for r in sel(family="treelstm", hidden=128, system=sysn, policy=pol)
                         if r["batch"] in bs], key=lambda r: r["batch"])
            if not rs:
                continue
            x = [r["batch"] for r in rs]
            y = [r["ips_median"] for r in rs]
            err = [[r["ips_median"] - r["ips_min"] for r in rs], [r["ips_max"] - r["ips_median"] for r in rs]]
            ax.errorbar(x, y, yerr=err, label=lab, color=col, marker=mk, capsize=3)
        mf = pi[0]["mflop_per_inst"]
        ax.axhline(peak * 1e3 / mf, color="k", ls=":", label="FLOP bound (sgemm peak %.0f GFLOP/s)" % peak)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (instances per run)")
        ax.set_ylabel("instances / s (median, min..max bars)")
        ax.set_title("treelstm H=128, trees-binary\n" + sub, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "treelstm_batch.png"), dpi=90)
        plt.close(fig)

    # (b) treelstm batch 64: fraction of sgemm peak against H
    hs = sorted({r["hidden"] for r in sel(family="treelstm", batch=64)})
    if len(hs) > 1:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        for (sysn, pol), (lab, col, mk) in styles.items():
            xs, ys = [], []
            for h in hs:
                rs = sel(family="treelstm", hidden=h, system=sysn, policy=pol,
                         batch=0 if sysn == "torch-per-instance" else 64)
                if rs:
                    xs.append(h)
                    ys.append(100 * rs[0]["frac_peak"])
            if xs:
                ax.plot(xs, ys, label=lab, color=col, marker=mk)
        ax.set_xscale("log", base=2)
        ax.set_xticks(hs)
        ax.set_xticklabels([str(h) for h in hs])
        ax.set_xlabel("hidden size H (= embed D)")
        ax.set_ylabel("%% of sgemm peak (%.0f GFLOP/s)" % peak)
        ax.set_title("treelstm batch 64: achieved GFLOP/s / sgemm peak\n" + sub, fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "treelstm_hidden.png"), dpi=90)
        plt.close(fig)

    # (c) every family at H=128 batch 64
    fams = [f for f in ("treelstm", "treegru", "childsum-treelstm", "bilstm-tagger", "latticelstm")
            if sel(family=f, hidden=128, batch=64)]
    if fams:
        fig, ax = plt.subplots(figsize=(8.5, 4.6))
        w = 0.13
        for k, ((sysn, pol), (lab, col, mk)) in enumerate(styles.items()):
            ys, lo, hi = [], [], []
            for f in fams:
                rs = sel(family=f, hidden=128, system=sysn, policy=pol,
                         batch=0 if sysn == "torch-per-instance" else 64)
                r = rs[0] if rs else {"ips_median": 0, "ips_min": 0, "ips_max": 0}
                ys.append(r["ips_median"])
                lo.append(r["ips_median"] - r["ips_min"])
                hi.append(r["ips_max"] - r["ips_median"])
            ax.bar([i + (k - 2.5) * w for i in range(len(fams))], ys, w, yerr=[lo, hi],
                   label=lab, color=col, capsize=2)
        ax.set_xticks(range(len(fams)))
        ax.set_xticklabels(fams, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("instances / s (median, min..max bars)")
        ax.set_title("every family, H=128, batch 64\n" + sub, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "families.png"), dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    main()
