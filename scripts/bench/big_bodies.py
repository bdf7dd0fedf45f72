#!/usr/bin/python3
"""big_bodies.py - the daemon's peak memory and a normal request's latency
while clients send hostile 8 MiB bodies.

For each binary given (--canopy LABEL=PATH, repeatable: e.g. a build of
the previous release and the current one) and each kind of hostile body,
one fresh daemon on a
free loopback port (so that VmHWM, from /proc/PID/status, is that kind's):

  - --hostile clients each send --rounds bodies of max-body-bytes (8 MiB),
    one after another on fresh connections;
  - meanwhile another client sends one-tree requests, one at a time,
    until they are done: p50 / p99 of those.

Kinds: tiny (2.8 M `{}` instances), tokens (one instance, a list of 2 M
one-letter tokens), wide_tree (one JSON tree node with 700 k leaf
children), objects (one instance with 2.8 M `{}` under a key it ignores).

Prints a table, binaries side by side for each kind, taken in the same
run. Figures only: nothing is asserted. Standard library only.

usage: scripts/bench/big_bodies.py [--canopy LABEL=PATH ...]
       [--hostile N] [--rounds N] [--kinds K,K] [--models DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_clients import (binaries_and_model, binaries_args,  # noqa: E402
                          post, stop, wait_listening)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, pct, status_kb  # noqa: E402

MAX_BODY = 8388608


def filled(head, item, tail):
    n = (MAX_BODY - len(head) - len(tail)) // (len(item) + 1)
    return head + b",".join([item] * n) + tail


KINDS = {
    "tiny": lambda: filled(b'{"instances":[', b"{}", b"]}"),
    "tokens": lambda: filled(b'{"tokens":[', b'"a"', b"]}"),
    "wide_tree": lambda: filled(b'{"tree":{"label":"S","children":[',
                                b'{"word":"a"}', b"]}}"),
    "objects": lambda: filled(b'{"tree":"(a b)","junk":[', b"{}", b"]}"),
}


def hwm_kb(pid):
    kb = status_kb(pid, "VmHWM")
    return -1 if kb is None else kb


def run_one(label, canopy, models, model, small, kind, body, n_hostile,
            rounds):
    port = free_port()
    p = subprocess.Popen(
        [canopy, "serve", "--models-dir", models, "--port", str(port),
         "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = "/v1/models/%s/infer" % model
    try:
        wait_listening(port)
        for _ in range(20):
            post(port, path, small)  # warm
        base_kb = hwm_kb(p.pid)
        statuses = {}
        lock = threading.Lock()

        def hostile():
            for _ in range(rounds):
                st, _ = post(port, path, body, timeout=60)
                with lock:
                    statuses[st] = statuses.get(st, 0) + 1

        ts = [threading.Thread(target=hostile) for _ in range(n_hostile)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        lat, ok = [], 0
        while any(t.is_alive() for t in ts):
            st, secs = post(port, path, small, timeout=30)
            lat.append(secs)
            ok += st == 200
        for t in ts:
            t.join()
        wall = time.monotonic() - t0
        peak_kb = hwm_kb(p.pid)
    finally:
        stop(p)
    return {"binary": label, "kind": kind, "base_mb": base_kb / 1024.0,
            "peak_mb": peak_kb / 1024.0, "p50_ms": pct(lat, 50) * 1e3,
            "p99_ms": pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3
            if lat else float("nan"), "normal": len(lat), "normal_ok": ok,
            "hostile": statuses, "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    binaries_args(ap, "/tmp/canopy-bench-big")
    ap.add_argument("--hostile", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    a = ap.parse_args()
    bins, small = binaries_and_model(a)
    rows = []
    for kind in a.kinds.split(","):
        body = KINDS[kind]()
        for label, path in bins:
            r = run_one(label, path, a.models, a.model, small, kind, body,
                        a.hostile, a.rounds)
            rows.append(r)
            if a.json:
                print(json.dumps(r), flush=True)
    if a.json:
        return
    print("| body (%d clients x %d x 8 MiB) | binary | VmHWM MB (idle -> "
          "peak) | one-tree p50 / p99 / max ms meanwhile | one-tree 200 | "
          "hostile answers |" % (a.hostile, a.rounds))
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        print("| %s | %s | %.0f -> %.0f | %.2f / %.1f / %.1f | %d of %d | %s |"
              % (r["kind"], r["binary"], r["base_mb"], r["peak_mb"],
                 r["p50_ms"], r["p99_ms"], r["max_ms"], r["normal_ok"],
                 r["normal"], ", ".join("%d x %s" % (v, k) for k, v in
                                        sorted(r["hostile"].items()))))


if __name__ == "__main__":
    sys.exit(main())
