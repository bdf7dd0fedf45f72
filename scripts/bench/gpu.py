#!/usr/bin/env python3
"""Canopy's cuda backend against PyTorch eager level-batched on one GPU.

For each family and hidden size: `canopy run --backend cuda --jobs 1` at
runs of R instances, and scripts/bench/torch_models.py's level-batched
model (TensorFlow Fold style) on the same GPU, same instances, batches of
R. Prints one row per (family, H, R): instances/s of both, their ratio,
the FLOP rate as a share of the GPU's FP32 peak, and Canopy's per-run
device counters (launches, syncs, bytes each way) where the binary
reports them. Then the daemon with `--backend cuda`: c=1 p50 and c=64
throughput (a Python client, keep-alive connections).

Needs: a CUDA device (or --device cpu, a smoke test of this script);
python3 with torch (it names the device, even with --no-torch); a canopy
built with `-Dcuda=enabled` (--canopy, default $CANOPY_BIN) whose
libraries the loader finds (LD_LIBRARY_PATH; the cuda module from the
build tree or $CANOPY_CUDA_MODULE); the data files (--data, default
$CANOPY_DATA, else this checkout's data/).
"""
import argparse, http.client, json, os, statistics, subprocess
import sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
from daemon_util import free_port, wait_ready  # noqa: E402
torch = torch_models = None  # imported by main(), so that --help needs neither

FILES = {"treelstm": "trees-binary.jsonl", "latticelstm": "lattices.jsonl",
         "treegru": "trees-binary.jsonl", "bilstm-tagger": "sequences.jsonl",
         "childsum-treelstm": "trees-nary.jsonl"}
COUNTERS = ("launches", "device_syncs", "bytes_to_host", "bytes_to_device",
            "copies_to_device", "device_allocs")


def log(*a):
    print(*a, flush=True)


def make_input(src, dst, n):
    lines = open(src).read().splitlines()
    with open(dst, "w") as f:
        for i in range(n):
            f.write(lines[i % len(lines)] + "\n")


def canopy_run(a, model, inp, R):
    """Best of two `canopy run` (the first pays CUDA's start-up)."""
    best = None
    for _ in range(2):
        p = subprocess.run([a.canopy, "run", "--backend", a.backend,
                            "--jobs", str(a.jobs),
                            "--model", model, "--input", inp, "--batch", str(R)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.decode()[-500:])
        s = json.loads(p.stderr.decode().strip().splitlines()[-1])
        if best is None or s["instances_per_s"] > best["instances_per_s"]:
            best = s
    return best


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def torch_run(model_dir, instances, R, dev):
    m = torch_models.Model(model_dir).to(dev)
    if dev != "cpu":
        torch.set_default_device(dev)  # torch >= 2.0
    try:
        preps = [m.prepare(i) for i in instances]
        flops = sum(m.flops(p) for p in preps)
        with torch.inference_mode():
            m.run(preps[:R], "level-batched", R)  # warm-up: kernels, allocator
            sync(dev)
            t = time.perf_counter()
            m.run(preps, "level-batched", R)
            sync(dev)
            dt = time.perf_counter() - t
    finally:
        if dev != "cpu":
            torch.set_default_device("cpu")
    return len(preps) / dt, flops, dt


def post(conn, path, body):
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")


def daemon(a, models_dir, name, inp):
    port = free_port()
    logf = open(os.path.join(models_dir, "..", "serve.log"), "w")
    srv = subprocess.Popen([a.canopy, "serve", "--backend", a.backend,
                            "--models-dir", models_dir, "--port", str(port)],
                           stdout=logf, stderr=subprocess.STDOUT)
    try:
        if not wait_ready(f"http://127.0.0.1:{port}", srv, 120):
            raise RuntimeError("canopy serve was not ready within 120 s "
                               "(serve.log beside the models)")
        lines = open(inp).read().splitlines()
        bodies = ['{"instances":[%s]}' % l for l in lines]
        path = f"/v1/models/{name}/infer"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for b in bodies[:50]:
            post(c, path, b)
        lat = []
        for b in bodies[:1000]:
            t = time.perf_counter()
            post(c, path, b)
            lat.append(time.perf_counter() - t)
        p50 = statistics.median(lat) * 1e3
        p99 = sorted(lat)[int(len(lat) * 0.99)] * 1e3
        done, stop = [0] * 64, time.perf_counter() + 5

        def client(k):
            cc = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            i = k
            while time.perf_counter() < stop:
                post(cc, path, bodies[i % len(bodies)])
                done[k] += 1
                i += 64

        t = time.perf_counter()
        ts = [threading.Thread(target=client, args=(k,)) for k in range(64)]
        for x in ts:
            x.start()
        for x in ts:
            x.join()
        rps = sum(done) / (time.perf_counter() - t)
        log(f"daemon {name} --backend {a.backend}: c=1 p50 {p50:.3f} ms, p99 "
            f"{p99:.3f} ms; c=64 {rps:,.0f} requests/s (one tree each)")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    global torch, torch_models
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--canopy", default=os.environ.get("CANOPY_BIN"),
                    help="canopy built with -Dcuda=enabled "
                         "(default: $CANOPY_BIN)")
    ap.add_argument("--data", default=os.environ.get("CANOPY_DATA") or
                    os.path.join(os.path.dirname(os.path.dirname(HERE)), "data"),
                    help="the data files (default: $CANOPY_DATA, else the "
                         "checkout's data/)")
    ap.add_argument("--families", default="treelstm,latticelstm")
    ap.add_argument("--hidden", default="128,512,1024")
    ap.add_argument("--runs", default="64,256,1024,4096")
    ap.add_argument("--instances", type=int, default=32768)
    ap.add_argument("--peak-tflops", type=float, default=67.0,
                    help="the GPU's FP32 (non-tensor-core) peak")
    ap.add_argument("--no-daemon", action="store_true")
    ap.add_argument("--jobs", type=int, default=1,
                    help="canopy run --jobs: runs computed at once, each on "
                    "its own host thread and stream")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--device", default="cuda",
                    help="cpu: a smoke test of this script without a GPU")
    a = ap.parse_args()
    if not a.canopy:
        ap.error("no canopy binary: give --canopy BIN or set CANOPY_BIN")
    import torch  # noqa: E402 (the device's name and the torch baseline)
    import torch_models  # noqa: E402
    a.backend = "cuda" if a.device == "cuda" else "cpu"
    work = tempfile.mkdtemp(prefix="canopy-gpu-")
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else "none (cpu)"
    log(f"GPU: {gpu}; torch {torch.__version__}; "
        f"FP32 peak taken as {a.peak_tflops} TFLOP/s")
    log(f"canopy run --jobs {a.jobs}")
    log(f"{'family':<12}{'H':>5}{'run':>6}{'canopy/s':>11}{'torch/s':>11}"
        f"{'ratio':>7}{'canopy %peak':>13}{'torch %peak':>12}  canopy per run")
    for fam in a.families.split(","):
        src = os.path.join(a.data, FILES[fam])
        inp = os.path.join(work, fam + ".jsonl")
        make_input(src, inp, a.instances)
        instances = torch_models.load_instances(inp)
        for H in map(int, a.hidden.split(",")):
            model = os.path.join(work, "models", f"{fam}-{H}")
            extra = []
            if fam == "latticelstm":
                extra = ["--lexicon", os.path.join(a.data, "lexicon.txt")]
            subprocess.run([a.canopy, "model", "init", fam, model, "--hidden",
                            str(H), "--embed", str(H), "--vocab-from", src,
                            "--seed", "1"] + extra, check=True,
                           stderr=subprocess.DEVNULL)
            for R in map(int, a.runs.split(",")):
                try:
                    s = canopy_run(a, model, inp, R)
                    if a.no_torch:
                        m = torch_models.Model(model)
                        flops = sum(m.flops(m.prepare(i)) for i in instances)
                        t_ips = float("nan")
                    else:
                        t_ips, flops, _ = torch_run(model, instances, R,
                                                    a.device)
                except Exception as e:  # a row, never the whole table
                    log(f"{fam:<12}{H:>5}{R:>6}  failed: {e}")
                    continue
                c_ips = s["instances_per_s"]
                per = flops / len(instances) / (a.peak_tflops * 1e12) * 100
                runs = s.get("runs") or max(1, -(-len(instances) // R))
                cnt = " ".join(f"{k}={s[k] / runs:,.0f}" for k in COUNTERS
                               if k in s)
                log(f"{fam:<12}{H:>5}{R:>6}{c_ips:>11,.0f}{t_ips:>11,.0f}"
                    f"{c_ips / t_ips:>7.2f}{c_ips * per:>12.2f}%"
                    f"{t_ips * per:>11.2f}%  {cnt}")
    if not a.no_daemon:
        fam = a.families.split(",")[0]
        H = a.hidden.split(",")[0]
        d = os.path.join(work, "serve")
        os.makedirs(d)
        os.symlink(os.path.join(work, "models", f"{fam}-{H}"),
                   os.path.join(d, "m"))
        daemon(a, d, "m", os.path.join(work, fam + ".jsonl"))


if __name__ == "__main__":
    main()
