#!/usr/bin/python3
"""slow_clients.py - a normal request's latency while N connections trickle
request bytes, beside the same with none open.

For each binary given (--canopy LABEL=PATH, repeatable: e.g. a build of
the previous release and the current one), one daemon on a free loopback
port:

  1. --requests sequential POST .../infer of one tree on a fresh
     connection each: p50 / p99 with no slow connection open;
  2. --slow connections each send a request line, then one header byte a
     second (--body: a head with Content-Length, then one body byte a
     second), and the same requests again while they are open.

Prints one table row per binary, figures side by side, taken in the same
run. Figures only: no threshold is asserted (scripts/bench/reliability.sh may
judge them). Standard library only.

usage: scripts/bench/slow_clients.py [--canopy LABEL=PATH ...] [--slow N]
       [--requests N] [--models DIR] [--body]
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, pct  # noqa: E402


def post(port, path, body, timeout=5):
    """One request on a fresh connection: (status, seconds); status 0: no
    answer within timeout (connect included)."""
    t = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout)
    except OSError:
        return 0, time.monotonic() - t
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n%s" % (path.encode(), len(body),
                                                    body))
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                cl = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length:")]
                if cl and len(rest) >= cl[0]:
                    break
        status = int(data.split(b" ", 2)[1]) if data else 0
    except (OSError, ValueError, IndexError):
        status = 0
    finally:
        s.close()
    return status, time.monotonic() - t


def run_one(label, canopy, models, model, body, n_slow, n_req, trickle_body,
            max_conns):
    port = free_port()
    log = tempfile.TemporaryFile()
    limit = ["--max-connections", str(max_conns)] if max_conns > 0 else []
    p = subprocess.Popen(
        [canopy, "serve", "--models-dir", models, "--port", str(port),
         "--log-level", "warn"] + limit,
        stdout=log, stderr=log)
    path = "/v1/models/%s/infer" % model
    try:
        wait_listening(port)
        post(port, path, body)  # warm

        def normal():
            lat, ok, other, missed = [], 0, {}, 0
            for _ in range(n_req):
                st, secs = post(port, path, body)
                lat.append(secs)
                ok += st == 200
                if st != 200:
                    other[st] = other.get(st, 0) + 1
                missed = missed + 1 if st == 0 else 0
                if missed == 5:  # 5 s each: stop, say so
                    other["stopped"] = 1
                    break
            return lat, ok, other

        base, base_ok, _ = normal()
        conns = []
        for _ in range(n_slow):
            try:
                s = socket.create_connection(("127.0.0.1", port), 5)
                if trickle_body:
                    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 100000\r\n\r\n"
                              % path.encode())
                else:
                    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n" % path.encode())
                s.setblocking(False)
                conns.append(s)
            except OSError:
                break
        stop = [False]

        def trickle():
            while not stop[0]:
                for s in conns:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
                time.sleep(1.0)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        # a body is evictable once it is 1 s old (docs/daemon.md); before
        # that, at max-connections, a new client is refused (503)
        time.sleep(1.5 if trickle_body else 1.0)
        during, during_ok, during_other = normal()
        stop[0] = True
        t.join()
        for s in conns:
            s.close()
    finally:
        stop(p)
    return {"binary": label, "slow": len(conns),
            "none_p50_ms": pct(base, 50) * 1e3,
            "none_p99_ms": pct(base, 99) * 1e3, "none_ok": base_ok,
            "slow_p50_ms": pct(during, 50) * 1e3,
            "slow_p99_ms": pct(during, 99) * 1e3, "slow_ok": during_ok,
            "slow_other": during_other, "requests": n_req}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def wait_listening(port):
    """Until the daemon on port takes a connection (at most about 15 s:
    after that the first request says what is wrong)."""
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.05)


def stop(p):
    """Stops a daemon: SIGTERM, and SIGKILL if it has not exited in 30 s."""
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def binaries_args(ap, models):
    """The options of a benchmark that compares canopy binaries on one tree
    model (this script and big_bodies.py): the binaries, where the model is
    made (models), which one, the data it is made from, JSON lines out."""
    ap.add_argument("--canopy", action="append", default=[],
                    help="LABEL=PATH of a canopy binary (repeatable; "
                         "default: this tree's build/canopy)")
    ap.add_argument("--models", default=models)
    ap.add_argument("--model", default="treelstm")
    ap.add_argument("--input", default=os.path.join(
        os.environ.get("CANOPY_DATA") or os.path.join(ROOT, "data"),
        "trees-binary.jsonl"))
    ap.add_argument("--json", action="store_true", help="JSON lines out")


def binaries_and_model(a):
    """For binaries_args' options: the (label, path) of each binary, after
    making the model with the first one where it is not made yet, and a
    one-instance request body (the input's first line)."""
    bins = [c.split("=", 1) if "=" in c else (c, c) for c in a.canopy]
    if not bins:
        bins = [("this", os.path.join(ROOT, "build", "canopy"))]
    if not os.path.exists(os.path.join(a.models, a.model, "model.json")):
        subprocess.check_call(
            [bins[0][1], "model", "init", a.model,
             os.path.join(a.models, a.model), "--vocab-from", a.input],
            stdout=subprocess.DEVNULL)
    with open(a.input) as f:
        body = json.dumps({"instances": [json.loads(f.readline())]}).encode()
    return bins, body


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    binaries_args(ap, "/tmp/canopy-bench-slow")
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--body", action="store_true",
                    help="trickle body bytes after a whole head instead")
    ap.add_argument("--max-connections", type=int, default=-1,
                    help="the daemons' max-connections (default: --slow + "
                         "64, room for every slow one; 0: the daemon's "
                         "default, 1024)")
    a = ap.parse_args()
    bins, body = binaries_and_model(a)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.slow + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))
    n_slow = min(a.slow, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256)
    mc = a.max_connections if a.max_connections >= 0 else n_slow + 64
    rows = [run_one(label, path, a.models, a.model, body, n_slow, a.requests,
                    a.body, mc) for label, path in bins]
    what = "body" if a.body else "header"
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print("| binary | slow connections (%s bytes), max-connections %s | none "
          "open p50 / p99 ms | %d open p50 / p99 ms | answered 200 (none / "
          "open) | other answers while open |" %
          (what, mc if mc > 0 else "default", n_slow))
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print("| %s | %d | %.2f / %.2f | %.2f / %.2f | %d / %d of %d | %s |" %
              (r["binary"], r["slow"], r["none_p50_ms"], r["none_p99_ms"],
               r["slow_p50_ms"], r["slow_p99_ms"], r["none_ok"], r["slow_ok"],
               r["requests"],
               ", ".join("stopped after 5 unanswered in a row"
                         if k == "stopped" else
                         "%d x %s" % (v, k if k else "no answer in 5 s")
                         for k, v in sorted(r["slow_other"].items(), key=str))
               or "-"))


if __name__ == "__main__":
    sys.exit(main())
