#!/usr/bin/python3
"""canopy_loadgen.py - load generator for `canopy serve` (standard library
only); the `canopy-loadgen` command of `pip install ./clients`, and
clients/loadgen.py.

Closed loop (--concurrency N: N connections, each sends its next request
as soon as the previous answer arrives) or open loop (--rate R: requests
start at R per second whatever the answers do, up to --concurrency in
flight). Always bounded, and by what was asked: --duration alone runs
that long, --requests alone sends that many (within 600 s), both stop at
whichever comes first, neither sends 2,000 requests or runs 20 s. The
target must be a loopback address unless --allow-remote is given.

Prints one JSON line: throughput (requests/s, instances/s), p50/p90/p99
latency, errors by status ("conn-error": no answer), and the batches vs
lower bound the daemon reports in /metrics (null when /metrics could not
be read, e.g. the daemon went away during the run: the summary is still
printed, exit 1).
"""
import argparse
import asyncio
import http.client
import ipaddress
import json
import os
import socket
import sys
import time
import urllib.parse


def metrics(host, port):
    """/metrics as {series: value}, or None when the daemon cannot be
    asked (gone, or not answering 200)."""
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
        c.close()
    except (OSError, http.client.HTTPException, UnicodeDecodeError):
        return None
    if r.status != 200:
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            out[name] = float(v)
            # a family's total over its labels too (histograms are per model)
            bare = name.split("{", 1)[0]
            if bare != name and "le=" not in name:
                out[bare] = out.get(bare, 0.0) + float(v)
    return out


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except where there is none to
    show (None, a flag's False: the Bounds text says what happens)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False \
                or action.required:
            return action.help
        return super()._get_help_string(action)


DEFAULT_REQUESTS, DEFAULT_DURATION = 2000, 20
MAX_REQUESTS, MAX_DURATION = 1_000_000, 600


def bounds(requests, duration):
    """(requests, seconds) the run stops at, from the options given (None:
    not given): what was asked wins; the defaults bound only a run that
    asked for neither; MAX_* bound every run."""
    if requests is None and duration is None:
        requests, duration = DEFAULT_REQUESTS, DEFAULT_DURATION
    elif requests is None:
        requests = MAX_REQUESTS
    elif duration is None:
        duration = MAX_DURATION
    return (max(1, min(requests, MAX_REQUESTS)),
            max(0.1, min(duration, MAX_DURATION)))


def main():
    ap = argparse.ArgumentParser(
        description="load generator for `canopy serve` (closed or open "
        "loop); prints one JSON summary line",
        formatter_class=_Defaults,
        epilog="Bounds: --duration alone runs that long; --requests alone "
        "sends that many (within %d s); both: whichever comes first; "
        "neither: %d requests or %d s, whichever comes first."
        % (MAX_DURATION, DEFAULT_REQUESTS, DEFAULT_DURATION))
    ap.add_argument("--url", default=os.environ.get("CANOPY_URL") or
                    "http://127.0.0.1:8080",
                    help="the daemon; $CANOPY_URL when set")
    ap.add_argument("--model", default="treelstm", help="model to load")
    ap.add_argument("--input", required=True, help="JSONL of INSTANCE objects")
    ap.add_argument("--per-request", type=int, default=1,
                    help="instances per request")
    ap.add_argument("--concurrency", type=int, default=8,
                    help="connections (closed loop), most requests in "
                    "flight (open loop)")
    ap.add_argument("--rate", type=float, default=0,
                    help="open loop: requests per second (0: closed loop)")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests to send (see Bounds)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds to run (see Bounds)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow a target that is not a loopback address")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    addr = socket.gethostbyname(host)
    if not ipaddress.ip_address(addr).is_loopback and not a.allow_remote:
        sys.exit("loadgen: %s is not a loopback address (--allow-remote)" % host)
    a.requests, a.duration = bounds(a.requests, a.duration)
    a.concurrency = max(1, min(a.concurrency, 1024))
    insts = [json.loads(l) for l in open(a.input) if l.strip()]
    bodies = []
    for i in range(0, len(insts), a.per_request):
        chunk = insts[i:i + a.per_request]
        if len(chunk) == a.per_request:
            bodies.append(json.dumps({"instances": chunk}).encode())
    path = "/v1/models/%s/infer" % a.model
    # Requests are sent as prepared bytes over asyncio streams, one event
    # loop for every connection: http.client in a thread per connection cost
    # ~170 us of client CPU a request, most of a core at concurrency 64, on
    # the very cores the daemon was being measured on.
    head = ("POST %s HTTP/1.1\r\nHost: %s:%d\r\n"
            "Content-Type: application/json\r\nContent-Length: " %
            (path, host, port)).encode()
    reqs = [head + b"%d\r\n\r\n" % len(b) + b for b in bodies]
    state = {"next": 0, "lat": [], "status": {}, "inst": 0}
    m0 = metrics(host, port)
    if m0 is None:
        sys.exit("loadgen: cannot read %s/metrics; is `canopy serve` "
                 "running there?" % a.url)
    t0 = time.monotonic()
    deadline = t0 + a.duration

    def take():
        n = state["next"]
        if (n >= a.requests or time.monotonic() > deadline
                or state.get("stopped")):
            return None
        state["next"] = n + 1
        return n

    async def roundtrip(rd, wr, req):
        wr.write(req)
        status_line = await rd.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2:
            raise ConnectionError("no status line")
        st, length, chunked, close = int(parts[1]), 0, False, False
        while True:
            line = await rd.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.partition(b":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"transfer-encoding" and v == b"chunked":
                chunked = True
            elif k == b"connection" and v == b"close":
                close = True
        if chunked:
            while True:
                size = int((await rd.readline()).split(b";")[0], 16)
                await rd.readexactly(size + 2)
                if size == 0:
                    break
        elif length:
            await rd.readexactly(length)
        return st, close

    async def worker():
        rd = wr = None
        while True:
            n = take()
            if n is None:
                break
            if a.rate > 0:  # open loop: request n starts at t0 + n / rate
                delay = t0 + n / a.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            start = time.monotonic()
            try:
                if wr is None:
                    try:
                        rd, wr = await asyncio.open_connection(host, port)
                    except ConnectionRefusedError:
                        # nothing listens any more: the daemon went away,
                        # and every further request would be refused too
                        state["stopped"] = ("connection refused: the daemon "
                                            "went away during the run")
                        raise
                st, close = await asyncio.wait_for(
                    roundtrip(rd, wr, reqs[n % len(reqs)]), 60)
            except (OSError, ValueError, EOFError,
                    asyncio.IncompleteReadError, asyncio.TimeoutError):
                st, close = "conn-error", True
            if close and wr is not None:
                wr.close()
                rd = wr = None
            lat = time.monotonic() - start
            state["status"][st] = state["status"].get(st, 0) + 1
            if st == 200:
                state["lat"].append(lat)
                state["inst"] += a.per_request
        if wr is not None:
            wr.close()

    async def run_all():
        await asyncio.gather(*(worker() for _ in range(a.concurrency)))

    asyncio.run(run_all())
    secs = time.monotonic() - t0
    m1 = metrics(host, port)
    lat = state["lat"]
    ok = len(lat)
    d = lambda k: (m1 or m0).get(k, 0) - m0.get(k, 0)
    runs = d("canopy_runs_total") if m1 is not None else 0
    res = {
        "mode": "open %.0f/s" % a.rate if a.rate else "closed",
        "concurrency": a.concurrency, "per_request": a.per_request,
        "requests": sum(state["status"].values()), "ok": ok,
        "seconds": round(secs, 3),
        "requests_per_s": round(ok / secs, 1),
        "instances_per_s": round(state["inst"] / secs, 1),
        "p50_ms": round(pct(lat, 50) * 1e3, 3) if lat else None,
        "p90_ms": round(pct(lat, 90) * 1e3, 3) if lat else None,
        "p99_ms": round(pct(lat, 99) * 1e3, 3) if lat else None,
        "errors": {str(k): v for k, v in state["status"].items() if k != 200},
        "runs": int(runs),
        "instances_per_run": round(d("canopy_batch_size_instances_sum") /
                                   runs, 2) if runs else 0,
        "batches": int(d("canopy_batches_total")),
        "lower_bound": int(d("canopy_lower_bound_batches_total")),
        "median_compute_ms_approx": round(
            d("canopy_compute_duration_seconds_sum") / runs * 1e3, 3)
        if runs else 0,
    }
    if state.get("stopped"):
        res["stopped"] = state["stopped"]
    if m1 is None:  # the daemon went away: its counters are unknown
        for k in ("runs", "instances_per_run", "batches", "lower_bound",
                  "median_compute_ms_approx"):
            res[k] = None
        res["metrics"] = "unavailable after the run"
    print(json.dumps(res))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
