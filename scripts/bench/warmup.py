#!/usr/bin/python3
"""warmup.py - what the warm-up (the `warmup` key, docs/daemon.md
"Warm-up") changes, the same binary with the key on and off, side by side:

  rss      the rule against a cold start: RSS at msg=ready, 3 s
           later (idle), 2 s after each of six 5 s bursts (32 keep-alive
           clients x 8 trees), and 3 s after the last, of a one-model
           (treelstm) daemon;
  first    the first request's latency on a fresh daemon against the 10th's
           (median over N fresh daemons; client wall time and the answer's
           compute_ms);
  startup  startup_ms of msg=ready and the sum of the msg=model-warmed
           lines, serving a models directory (scripts/models.sh's demo
           models), median over N starts.

usage: scripts/bench/warmup.py --canopy build/canopy --models DIR
           [--model treelstm] [--demo models] [--data data]
           [--runs 10] [--gap S] [CHECK...]
It prints figures; it asserts nothing.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, status_kb  # noqa: E402


def rss_kb(pid):
    kb = status_kb(pid, "VmRSS")
    return -1 if kb is None else kb


def request(port, path, body, sock=None):
    """One POST on sock (or a fresh connection); returns (seconds, body)."""
    own = sock is None
    if own:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    msg = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
           % (path.encode(), len(body))) + body
    t0 = time.perf_counter()
    sock.sendall(msg)
    buf = b""
    while True:
        c = sock.recv(65536)
        if not c:
            break
        buf += c
        if b"\r\n\r\n" in buf:
            head, rest = buf.split(b"\r\n\r\n", 1)
            m = re.search(rb"content-length:\s*(\d+)", head, re.I)
            if m and len(rest) >= int(m.group(1)):
                break
    dt = time.perf_counter() - t0
    if own:
        sock.close()
    return dt, buf.split(b"\r\n\r\n", 1)[1]


class Daemon:
    def __init__(self, canopy, models, warmup, extra=()):
        self.port = free_port()
        self.log = f"/tmp/bench-warmup-{self.port}.log"
        self.lf = open(self.log, "w")
        self.p = subprocess.Popen(
            [canopy, "serve", "--models-dir", models, "--port",
             str(self.port), "--warmup", warmup, *extra],
            stdout=self.lf, stderr=subprocess.STDOUT)
        for _ in range(2000):
            if self.p.poll() is not None:
                raise SystemExit(f"canopy serve exited; see {self.log}")
            if "msg=ready" in open(self.log).read():
                break
            time.sleep(0.005)

    def text(self):
        return open(self.log).read()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(30)
        self.lf.close()
        os.unlink(self.log)


def trees(data, n):
    out = []
    with open(os.path.join(data, "trees-binary.jsonl")) as f:
        for line in f:
            out.append(json.loads(line)["tree"])
            if len(out) == n:
                break
    return out


def check_rss(a):
    body = json.dumps({"instances": [{"tree": t}
                                     for t in trees(a.data, 8)]}).encode()
    path = f"/v1/models/{a.model}/infer"
    rows = {}
    for key in ("true", "false"):
        d = Daemon(a.canopy, a.models, key, ["--log-level", "warn"])
        ready = rss_kb(d.p.pid)
        time.sleep(3)  # idle: a worker gives its run arena back after 1 s
        idle = rss_kb(d.p.pid)
        after = []
        for _ in range(6):
            stop = [False]

            def client():
                s = socket.create_connection(("127.0.0.1", d.port),
                                             timeout=30)
                while not stop[0]:
                    request(d.port, path, body, s)
                s.close()
            ts = [threading.Thread(target=client) for _ in range(32)]
            for t in ts:
                t.start()
            time.sleep(5)
            stop[0] = True
            for t in ts:
                t.join()
            time.sleep(2)
            after.append(rss_kb(d.p.pid))
        time.sleep(1)  # 3 s after the last burst
        last = rss_kb(d.p.pid)
        d.stop()
        rows[key] = (ready, idle, after, last)
    print("RSS, MB (one-model daemon; after: 2 s after each 5 s burst of 32 "
          "clients x 8 trees)")
    print("%-8s %7s %7s %s %9s %9s %9s" % (
        "warmup", "ready", "idle3s",
        " ".join("%6s" % f"b{i + 1}" for i in range(6)), "3s-after",
        "/ready", "/idle3s"))
    for key, (ready, idle, after, last) in rows.items():
        print("%-8s %7.1f %7.1f %s %9.1f %9.2f %9.2f" % (
            key, ready / 1024, idle / 1024,
            " ".join("%6.1f" % (x / 1024) for x in after), last / 1024,
            last / ready, last / idle))


def check_first(a):
    body = json.dumps({"tree": trees(a.data, 1)[0]}).encode()
    path = f"/v1/models/{a.model}/infer"
    print(f"first request vs 10th, one tree, fresh connection each, median "
          f"of {a.runs} fresh daemons (ms; client wall / compute_ms)")
    for key in ("true", "false"):
        first, tenth, c1, c10 = [], [], [], []
        for _ in range(a.runs):
            d = Daemon(a.canopy, a.models, key, ["--log-level", "warn"])
            for k in range(10):
                time.sleep(a.gap)
                dt, b = request(d.port, path, body)
                cm = json.loads(b)["stats"]["compute_ms"]
                if k == 0:
                    first.append(dt * 1e3)
                    c1.append(cm)
                if k == 9:
                    tenth.append(dt * 1e3)
                    c10.append(cm)
            d.stop()
        med = statistics.median
        print("warmup %-5s  1st %6.3f / %6.3f   10th %6.3f / %6.3f   "
              "1st/10th %.2f" % (key, med(first), med(c1), med(tenth),
                                 med(c10), med(first) / med(tenth)))


def check_startup(a):
    print(f"start-up of {a.demo} ({len(os.listdir(a.demo))} entries), "
          f"median of {a.runs} starts (ms)")
    for key in ("true", "false"):
        st, wu = [], []
        for _ in range(a.runs):
            d = Daemon(a.canopy, a.demo, key)
            t = d.text()
            st.append(float(re.search(r"startup_ms=([\d.]+)", t).group(1)))
            wu.append(sum(float(x) for x in re.findall(
                r"msg=model-warmed .* ms=([\d.]+) ", t)))
            d.stop()
        print("warmup %-5s  startup_ms %7.1f   warm-up lines sum %6.1f" %
              (key, statistics.median(st), statistics.median(wu)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--canopy", default="build/canopy")
    ap.add_argument("--models", required=True,
                    help="models-dir with the one model of rss and first")
    ap.add_argument("--model", default="treelstm")
    ap.add_argument("--demo", default="models")
    ap.add_argument("--data", default=os.environ.get("CANOPY_DATA",
                                                     "data"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--gap", type=float, default=0.0,
                    help="first: seconds before each request (default 0)")
    ap.add_argument("checks", nargs="*",
                    default=["rss", "first", "startup"])
    a = ap.parse_args()
    for c in a.checks:
        {"rss": check_rss, "first": check_first,
         "startup": check_startup}[c](a)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
