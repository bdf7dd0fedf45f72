#!/usr/bin/python3
"""Many concurrent loads of one model: the daemon's peak
memory (VmHWM) and what the load requests were answered.

Starts `canopy serve --model-control explicit` on a free loopback port over
one treelstm model (H=512 by default: ~17 MB of weights), sends N load
requests for it at once from N threads, and prints VmHWM before and after
and the count of each status. Run it against two binaries to compare.

usage: load_storm.py CANOPY [--n 100] [--hidden 512] [--data DIR]
"""
import argparse, collections, http.client, os, subprocess, sys
import tempfile, threading, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, status_kb, wait_ready  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("canopy")
ap.add_argument("--n", type=int, default=100)
ap.add_argument("--hidden", type=int, default=512)
ap.add_argument("--data", default=os.environ.get(
    "CANOPY_DATA", os.path.join(os.path.dirname(__file__), "../../data")))
a = ap.parse_args()

work = tempfile.mkdtemp(prefix="canopy-storm-")
models = os.path.join(work, "models")
os.makedirs(models)
subprocess.run([a.canopy, "model", "init", "treelstm", os.path.join(models, "m"),
                "--hidden", str(a.hidden), "--embed", str(a.hidden), "--vocab-from",
                os.path.join(a.data, "trees-binary.jsonl")], check=True,
               stderr=subprocess.DEVNULL)
size = sum(os.path.getsize(os.path.join(models, "m", f))
           for f in os.listdir(os.path.join(models, "m")))
port = free_port()
log = open(os.path.join(work, "serve.log"), "w")
srv = subprocess.Popen([a.canopy, "serve", "--models-dir", models, "--port",
                        str(port), "--model-control", "explicit"],
                       stdout=log, stderr=subprocess.STDOUT)


def hwm():
    kb = status_kb(srv.pid, "VmHWM")
    return -1 if kb is None else kb // 1024


try:
    if not wait_ready(f"http://127.0.0.1:{port}", srv, 60):
        sys.exit("canopy serve was not ready within 60 s: " +
                 os.path.join(work, "serve.log"))
    before = hwm()
    got = collections.Counter()
    go = threading.Event()

    def load():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        go.wait()
        try:
            c.request("POST", "/v2/repository/models/m/load", b"{}",
                      {"Content-Type": "application/json"})
            got[c.getresponse().status] += 1
        except OSError as e:
            got[type(e).__name__] += 1

    ts = [threading.Thread(target=load) for _ in range(a.n)]
    for t in ts:
        t.start()
    t0 = time.time()
    go.set()
    for t in ts:
        t.join()
    dt = time.time() - t0
    time.sleep(0.5)
    print(f"{a.canopy}: model {size / 1e6:.1f} MB; {a.n} concurrent loads in "
          f"{dt:.2f} s; answers {dict(got)}; VmHWM {before} MB before, "
          f"{hwm()} MB after")
finally:
    srv.terminate()
    srv.wait(timeout=30)
