#!/usr/bin/python3
"""reliability.py - the hardening checks of docs/daemon.md against a real
daemon, printed as one table (scripts/bench/reliability.sh sets it up).

Each check starts its own `canopy serve` on a free loopback port:

  overload   closed-loop peak first (Python, c=64; --peak-client c: from
             canopy-load --closed), then an open-loop
             client at twice that rate: how much is refused (429 with
             Retry-After), the goodput against the peak, and the p99 of the
             requests admitted. The open loop is canopy-load (tools/load,
             C) when it is built beside the canopy binary, else the Python
             client below (--client picks); the row names which, with its
             CPU and the daemon's.
  sigterm    64 keep-alive clients in a closed loop; SIGTERM mid-stream.
             Lost = requests written whole on a connection that then closed
             without an answer (a refused reconnect is not a loss: the load
             balancer sends it elsewhere).
  sigterm-pipelined
             the same with each client writing 3 requests in one write
             before reading their 3 answers (HTTP/1.1 pipelining): a
             request behind one answered with Connection: close is lost.
  slow       N connections trickle header bytes, then N body bytes (at the
             default max-connections); a normal request's latency
             beside the same with none open.
  soak       a steady closed loop for --soak-s seconds: RSS over the first
             and the last minute, and after the load stops.
  weights    weights.safetensors overwritten with other weights, then
             truncated, under a serving daemon: answers must not change.

Standard library only. Figures, not assertions: a check that breaks a rule
it states is marked "FAIL" in the last column, and the exit status is 1.
"""
import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, pct, status_kb  # noqa: E402


def rss_mb(pid):
    kb = status_kb(pid, "VmRSS")
    return float("nan") if kb is None else kb / 1024.0


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Daemon:
    def __init__(self, canopy, models, extra=(), env=None):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(
            [canopy, "serve", "--models-dir", models, "--port",
             str(self.port), "--log-level", "warn"] + list(extra),
            stdout=self.log, stderr=self.log, env=e)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                break
            try:
                if http(self.port, "GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        self.log.seek(0)
        sys.exit("reliability: the daemon did not become ready:\n" +
                 self.log.read().decode(errors="replace")[-2000:])

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def http(port, method, path, body=None, headers=None, timeout=30):
    """One request on its own connection: (status, headers dict, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        head = "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" % (
            method, path)
        for k, v in (headers or {}).items():
            head += "%s: %s\r\n" % (k, v)
        if body is not None:
            head += "Content-Type: application/json\r\n"
            head += "Content-Length: %d\r\n" % len(body)
        s.sendall(head.encode() + b"\r\n" + (body or b""))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, rest


def request_bytes(port, model, body):
    return (b"POST /v1/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (model.encode(), port, len(body)) + body)


async def read_response(rd):
    line = await rd.readline()
    parts = line.split(None, 2)
    if len(parts) < 2:
        raise ConnectionError("no status line")
    st, length, close, retry = int(parts[1]), 0, False, None
    while True:
        line = await rd.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.partition(b":")
        k, v = k.strip().lower(), v.strip()
        if k == b"content-length":
            length = int(v)
        elif k == b"connection" and v.lower() == b"close":
            close = True
        elif k == b"retry-after":
            retry = v
    body = await rd.readexactly(length) if length else b""
    return st, close, retry, body


async def load(port, reqs, concurrency, seconds, rate=0.0):
    """Closed loop (rate 0) or open loop at `rate` requests/s with at most
    `concurrency` in flight. Returns latencies of 200s and status counts."""
    st = {"lat": [], "status": {}, "retry_missing": 0, "n": 0}
    t0 = time.monotonic()
    end = t0 + seconds

    async def worker():
        rd = wr = None
        while True:
            n = st["n"]
            st["n"] += 1
            if rate > 0:
                at = t0 + n / rate
                if at > end:
                    break
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif time.monotonic() > end:
                break
            start = time.monotonic()
            try:
                if wr is None:
                    rd, wr = await asyncio.open_connection("127.0.0.1", port)
                wr.write(reqs[n % len(reqs)])
                code, close, retry, _ = await asyncio.wait_for(
                    read_response(rd), 60)
            except (OSError, ValueError, asyncio.IncompleteReadError,
                    asyncio.TimeoutError):
                code, close, retry = "conn-error", True, None
            if close and wr is not None:
                wr.close()
                rd = wr = None
            st["status"][code] = st["status"].get(code, 0) + 1
            if code == 200:
                st["lat"].append(time.monotonic() - start)
            elif code in (429, 503) and retry is None:
                st["retry_missing"] += 1
        if wr is not None:
            wr.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    st["seconds"] = time.monotonic() - t0
    return st


def bodies(path, per_request, model):
    insts = [json.loads(l) for l in open(path) if l.strip()]
    out = []
    for i in range(0, len(insts) - per_request + 1, per_request):
        out.append(json.dumps({"instances": insts[i:i + per_request]})
                   .encode())
    return out


# ---- the checks ---------------------------------------------------------

def load_c(a, port, rate, body_list, connections=1024):
    """The open loop from canopy-load (tools/load), or its closed loop
    with rate 0: its JSON report in the shape load() returns, plus the
    client's own CPU seconds."""
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl") as f:
        f.write(b"\n".join(body_list) + b"\n")
        f.flush()
        p = subprocess.run(
            [a.load_client, "--port", str(port), "--path",
             "/v1/models/%s/infer" % a.model, "--bodies", f.name,
             "--duration", str(a.seconds), "--connections",
             str(connections), "--timeout-s", "60"] +
            (["--rate", "%.3f" % rate] if rate else ["--closed"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    status = {int(k): v for k, v in r["status"].items()}
    errors = sum(r["errors"].values())
    if errors:
        status["conn-error"] = errors
    lat = r["latency_ms_200"] or {}
    return {"good": status.get(200, 0), "seconds": r["elapsed_s"],
            "status": status, "p99_ms": lat.get("p99", float("nan")),
            "retry_missing": status.get(429, 0) - r["retry_after_429"],
            "not_sent": r["not_sent"], "cpu_s": r["cpu_s"]}


def load_python(port, reqs, rate, seconds):
    """The same from load() in this process (the fallback)."""
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    over = asyncio.run(load(port, reqs, 1024, seconds, rate=rate))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"good": len(over["lat"]), "seconds": over["seconds"],
            "status": over["status"], "p99_ms": pct(over["lat"], 99) * 1e3,
            "retry_missing": over["retry_missing"], "not_sent": 0,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) +
            (ru1.ru_stime - ru0.ru_stime)}


def overload_client(a):
    """canopy-load where it is built (beside the canopy binary), else the
    Python client; --client forces one."""
    built = os.access(a.load_client, os.X_OK)
    if a.client == "c" and not built:
        sys.exit("reliability: --client c but %s is not built" %
                 a.load_client)
    if a.client == "python" or not built:
        if a.client == "auto":
            print("reliability: %s not built: the Python client" %
                  a.load_client, file=sys.stderr)
        return "python"
    return "c"


def check_overload(a, rows):
    client = overload_client(a)
    d = Daemon(a.canopy, a.models, ["--queue-depth", str(a.queue_depth)])
    try:
        body_list = bodies(a.input, 1, a.model)
        reqs = [request_bytes(d.port, a.model, b) for b in body_list]
        peak_c = a.peak_client == "c" and client == "c"

        def measure_peak():
            """(req/s, p99 ms, daemon cores) of the closed loop c=64."""
            cpu0, t0 = cpu_s(d.p.pid), time.monotonic()
            if peak_c:
                pk = load_c(a, d.port, 0, body_list, connections=64)
                rps, p99 = pk["good"] / pk["seconds"], pk["p99_ms"]
            else:
                pk = asyncio.run(load(d.port, reqs, 64, a.seconds))
                rps = len(pk["lat"]) / pk["seconds"]
                p99 = pct(pk["lat"], 99) * 1e3
            return rps, p99, (cpu_s(d.p.pid) - cpu0) / (time.monotonic() - t0)

        peak_rps, peak_p99, peak_cores = measure_peak()
        rate = 2 * peak_rps
        d_cpu0 = cpu_s(d.p.pid)
        if client == "c":
            over = load_c(a, d.port, rate, body_list)
        else:
            over = load_python(d.port, reqs, rate, a.seconds)
        d_cpu = cpu_s(d.p.pid) - d_cpu0
        # the same closed loop again: how far the machine moved meanwhile
        after = measure_peak() if a.peak_after else None
    finally:
        rc = d.stop()
    good = over["good"] / over["seconds"]
    sent = sum(over["status"].values())
    refused = over["status"].get(429, 0)
    other = {k: v for k, v in over["status"].items() if k not in (200, 429)}
    ratio = good / peak_rps if peak_rps else 0
    ok = ratio >= 0.9 and over["retry_missing"] == 0 and not other
    rows.append(("overload: peak, closed loop c=64",
                 "%.0f req/s, p99 %.1f ms (%s); daemon CPU %.2f cores%s" %
                 (peak_rps, peak_p99, "canopy-load --closed"
                  if peak_c else "Python asyncio", peak_cores,
                  "; after the overload: %.0f req/s, daemon CPU %.2f cores"
                  % (after[0], after[2]) if after else ""),
                 "reference", ""))
    rows.append(("overload: open loop at 2x peak (%.0f req/s offered)" % rate,
                 "goodput %.0f req/s = %.2fx peak; 429 %d of %d (%d without "
                 "Retry-After); other %s; admitted p99 %.1f ms; exit %d; "
                 "client %s (%s), CPU %.2f s over %.1f s (%.2f of a core; "
                 "not sent %d); daemon CPU %.2f cores" %
                 (good, ratio, refused, sent, over["retry_missing"],
                  other or "none", over["p99_ms"], rc,
                  "canopy-load" if client == "c" else "Python asyncio",
                  "latency from the due time" if client == "c"
                  else "latency from the write",
                  over["cpu_s"], over["seconds"],
                  over["cpu_s"] / over["seconds"], over["not_sent"],
                  d_cpu / over["seconds"]),
                 "goodput >= 0.9x, every 429 with Retry-After",
                 "ok" if ok else "FAIL"))


def check_sigterm(a, rows, depth=1):
    """depth > 1: each client pipelines `depth` requests in one write."""
    d = Daemon(a.canopy, a.models)
    reqs = [request_bytes(d.port, a.model, b)
            for b in bodies(a.input, 1, a.model)]
    st = {"sent": 0, "answered": 0, "lost": 0, "refused": 0, "draining": 0}

    async def client(i, stop_at):
        rd = wr = None
        n = i
        while time.monotonic() < stop_at:
            if wr is None:
                try:
                    rd, wr = await asyncio.open_connection("127.0.0.1",
                                                           d.port)
                except OSError:
                    st["refused"] += 1
                    return
            try:
                wr.write(b"".join(reqs[(n + j) % len(reqs)]
                                  for j in range(depth)))
                await wr.drain()
            except OSError:
                # the write itself failed: the requests never left whole
                wr.close()
                rd = wr = None
                continue
            st["sent"] += depth
            n += 64 * depth
            got, close = 0, False
            while got < depth and not close:
                try:
                    code, close, _, _ = await asyncio.wait_for(
                        read_response(rd), 60)
                except (OSError, ValueError, asyncio.IncompleteReadError,
                        asyncio.TimeoutError):
                    break
                got += 1
                st["answered"] += 1
                if code == 503:
                    st["draining"] += 1
            st["lost"] += depth - got
            if got < depth or close:
                wr.close()
                rd = wr = None

    async def main():
        stop_at = time.monotonic() + 4.0
        tasks = [asyncio.ensure_future(client(i, stop_at)) for i in range(64)]
        await asyncio.sleep(1.5)
        d.p.send_signal(signal.SIGTERM)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    try:
        # the drain ends on its own; a second SIGTERM from stop() while the
        # daemon tears down would meet the default action (exit -15)
        d.p.wait(30)
    except subprocess.TimeoutExpired:
        pass
    rc = d.stop()
    what = "" if depth == 1 else ", %d pipelined a write" % depth
    rows.append(("SIGTERM under 64 keep-alive clients" + what,
                 "%d sent, %d answered (%d of them 503 draining), lost %d; "
                 "exit %d" % (st["sent"], st["answered"], st["draining"],
                              st["lost"], rc),
                 "lost 0, exit 0",
                 "ok" if st["lost"] == 0 and rc == 0 else "FAIL"))


def check_slow(a, rows):
    # the measurement is slow_clients.py's (beside this file); this judges it.
    # At the default max-connections (1,024): beyond it, eviction is what
    # keeps normal clients served (docs/daemon.md "Eviction").
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import slow_clients
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.slow + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))
    n_slow = min(a.slow, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256)
    for trickle_body, what in ((False, "headers"), (True, "bodies")):
        r = slow_clients.run_one("canopy", a.canopy, a.models, a.model,
                                 bodies(a.input, 1, a.model)[0], n_slow, 200,
                                 trickle_body, 0)
        ok = r["slow_ok"] == r["requests"] and r["slow_p99_ms"] < 100
        rows.append(("%d slow connections trickling %s" % (r["slow"], what),
                     "normal p50/p99 %.2f/%.2f ms (none open: %.2f/%.2f ms); "
                     "%d of %d answered; other %s" %
                     (r["slow_p50_ms"], r["slow_p99_ms"], r["none_p50_ms"],
                      r["none_p99_ms"], r["slow_ok"], r["requests"],
                      r["slow_other"] or "none"),
                     "p99 < 100 ms, all answered", "ok" if ok else "FAIL"))


def check_soak(a, rows):
    d = Daemon(a.canopy, a.models)
    reqs = [request_bytes(d.port, a.model, b)
            for b in bodies(a.input, 1, a.model)]
    try:
        http(d.port, "POST", "/v1/models/%s/infer" % a.model,
             bodies(a.input, 1, a.model)[0])
        before = rss_mb(d.p.pid)
        samples = []

        async def sampler(end):
            while time.monotonic() < end:
                samples.append((time.monotonic(), rss_mb(d.p.pid)))
                await asyncio.sleep(1.0)

        async def main():
            end = time.monotonic() + a.soak_s
            s = asyncio.ensure_future(sampler(end))
            st = await load(d.port, reqs, 16, a.soak_s)
            await s
            return st

        st = asyncio.run(main())
        time.sleep(3.0)
        after = rss_mb(d.p.pid)
    finally:
        rc = d.stop()
    t0 = samples[0][0]
    win = min(60.0, a.soak_s / 3)
    first = [r for t, r in samples if t - t0 < win]
    last = [r for t, r in samples if t - t0 >= a.soak_s - win]
    f, l = sum(first) / len(first), sum(last) / len(last)
    errors = {k: v for k, v in st["status"].items() if k != 200}
    ok = l <= f * 1.25 and after <= before * 1.25 and not errors
    rows.append(("soak %ds, closed loop c=16" % a.soak_s,
                 "RSS %.1f MB before, %.1f MB first %ds, %.1f MB last %ds, "
                 "%.1f MB 3 s after; %d requests, errors %s; exit %d" %
                 (before, f, win, l, win, after, len(st["lat"]),
                  errors or "none", rc),
                 "last <= 1.25x first; after <= 1.25x before",
                 "ok" if ok else "FAIL"))


def check_weights(a, rows):
    work = tempfile.mkdtemp(prefix="canopy-rel-")
    try:
        mdir = os.path.join(work, "models")
        os.makedirs(mdir)
        shutil.copytree(os.path.join(a.models, a.model),
                        os.path.join(mdir, a.model))
        other = os.path.join(work, "other")
        # the same shapes, other values: a plausible wrong file
        subprocess.run([a.canopy, "model", "init", a.family, other] +
                       a.init_args.split() + ["--seed", "99"],
                       check=True, stdout=subprocess.DEVNULL)
        d = Daemon(a.canopy, mdir)
        bs = bodies(a.input, 4, a.model)[:50]

        def answers():
            out = []
            for b in bs:
                code, _, body = http(d.port, "POST",
                                     "/v1/models/%s/infer" % a.model, b)
                if code != 200:
                    return None
                out.append(json.dumps(json.loads(body)["outputs"],
                                      sort_keys=True))
            return out

        try:
            ref = answers()
            w = os.path.join(mdir, a.model, "weights.safetensors")
            shutil.copyfile(os.path.join(other, "weights.safetensors"), w)
            after_copy = answers()
            with open(w, "r+b") as f:
                f.truncate(100)
            after_trunc = answers()
            alive = d.p.poll() is None
        finally:
            rc = d.stop()
        ok = ref is not None and after_copy == ref and after_trunc == ref \
            and alive and rc == 0
        rows.append(("weights overwritten, then truncated, while serving",
                     "answers (%d requests) after overwrite: %s; after "
                     "truncate: %s; daemon alive: %s; exit %d" %
                     (len(bs), "same" if after_copy == ref else "CHANGED",
                      "same" if after_trunc == ref else "CHANGED", alive, rc),
                     "unchanged, alive", "ok" if ok else "FAIL"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


CHECKS = {"overload": check_overload, "sigterm": check_sigterm,
          "sigterm-pipelined": lambda a, rows: check_sigterm(a, rows, 3),
          "slow": check_slow, "soak": check_soak, "weights": check_weights}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--canopy", default="build/canopy")
    ap.add_argument("--models", required=True,
                    help="a models dir holding MODEL/")
    ap.add_argument("--model", default="treelstm")
    ap.add_argument("--family", default="treelstm")
    ap.add_argument("--init-args", default="",
                    help="the `canopy model init` options MODEL was made "
                    "with (the weights check writes other weights of the "
                    "same shapes)")
    ap.add_argument("--input", required=True, help="JSONL instances")
    ap.add_argument("--seconds", type=float, default=8.0,
                    help="length of each overload phase")
    ap.add_argument("--queue-depth", type=int, default=256)
    ap.add_argument("--load-client", default=None,
                    help="canopy-load, the overload check's open-loop "
                    "client (default: tools/canopy-load beside --canopy)")
    ap.add_argument("--client", choices=("auto", "c", "python"),
                    default="auto", help="the overload check's open loop: "
                    "canopy-load (c) where built, else Python (auto)")
    ap.add_argument("--peak-after", action="store_true",
                    help="the overload check measures the peak again after "
                    "the open loop (reported, not used in the ratio)")
    ap.add_argument("--peak-client", choices=("python", "c"),
                    default="python", help="the overload check's closed "
                    "loop for the peak: Python (as before) or canopy-load "
                    "--closed (only with the C open loop)")
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--soak-s", type=int, default=600)
    ap.add_argument("checks", nargs="*", default=list(CHECKS))
    a = ap.parse_args()
    if a.load_client is None:
        a.load_client = os.path.join(os.path.dirname(a.canopy) or ".",
                                     "tools", "canopy-load")
    rows = []
    for c in a.checks:
        if c not in CHECKS:
            sys.exit("reliability: no check %r (%s)" % (c, ", ".join(CHECKS)))
        t = time.monotonic()
        print("reliability: %s ..." % c, file=sys.stderr, flush=True)
        CHECKS[c](a, rows)
        print("reliability: %s done in %.0f s" % (c, time.monotonic() - t),
              file=sys.stderr, flush=True)
    print("| check | measured | rule | |")
    print("|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %s |" % r)
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
