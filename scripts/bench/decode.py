#!/usr/bin/python3
"""lstm-nmt in the daemon: continuous decoding against whole-run batching.

One sentence a request, open loop: arrivals are a Poisson process (the
client sends each request at its scheduled time whether or not earlier
ones were answered, and a latency runs from that scheduled time, so a
stalled daemon cannot hide its backlog: no coordinated omission).

Requests go over keep-alive connections, at most --conns of them, opened
before the clock starts: a request that finds none idle waits for one,
and that wait counts in its latency (which runs from its scheduled
arrival). Without the cap an overloaded daemon would see a connection per
outstanding request, past max-connections, and the kernel's SYN retries
(1, 2, 4 ... s) would measure the listen backlog, not the batching.

1. Capacity: a closed loop of --clients connections against the daemon
   with whole-run batching (continuous-decoding false), requests/s.
2. For 50% and 90% of that capacity, the same arrival times against both
   daemons (--continuous-decoding true, then false), each freshly started
   with the same flags: p50/p99/mean latency, answers/s achieved, and the
   decode metrics (instances that joined a session in flight, answered
   while others still decoded).
3. Outputs: every answer of every point against `canopy run` over the same
   sentences (JSON equality: the same floats), and the two modes against
   each other.

The model is the reference's (tests/reference/canopy_ref.py) with
--eos-bias so that output lengths vary, as scripts/bench/nmt.py. The
client is Python asyncio on the same machine as the daemon: it takes CPU
from it, the same for both modes.
"""
import argparse, asyncio, json, os, random, shutil, signal, socket
import statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "python"))
from daemon_util import free_port, pct  # noqa: E402
from nmt import make_model  # noqa: E402  (beside this file)


class Daemon:
    def __init__(self, canopy, models, flags, log):
        self.port = free_port()
        self.log = open(log, "w")
        self.p = subprocess.Popen(
            [canopy, "serve", "--models-dir", models, "--port",
             str(self.port), "--log-level", "warn"] + flags,
            stdout=subprocess.DEVNULL, stderr=self.log)
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                if self.p.poll() is not None:
                    sys.exit(f"canopy serve exited; see {log}")
                time.sleep(0.02)
        sys.exit("canopy serve did not come up")

    def metrics(self):
        import urllib.request
        t = urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/metrics").read().decode()
        out = {}
        for line in t.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait()
        self.log.close()


POOL = []  # idle keep-alive connections (one event loop at a time)
SLOTS = None  # asyncio.Semaphore: connections in use


async def pool_open(port, n):
    global SLOTS
    SLOTS = asyncio.Semaphore(n)
    for _ in range(n):
        POOL.append(await asyncio.open_connection("127.0.0.1", port))


async def request(port, body):
    """One POST on an idle keep-alive connection."""
    async with SLOTS:
        return await request_on(port, body)


async def request_on(port, body):
    if POOL:
        r, w = POOL.pop()
    else:  # the daemon closed one (drain, idle timeout): reopen
        r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /v1/models/nmt/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    n, close = 0, False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
        elif k.strip().lower() == b"connection" and b"close" in v.lower():
            close = True
    payload = await r.readexactly(n)
    if close:
        w.close()
    else:
        POOL.append((r, w))
    return status, payload


def pool_close():
    while POOL:
        POOL.pop()[1].close()


def bodies(sentences):
    return [json.dumps({"instances": [s]}).encode() for s in sentences]


async def closed_loop(port, reqs, clients, seconds):
    await pool_open(port, clients)
    done = 0
    stop = time.perf_counter() + seconds

    async def one(c):
        nonlocal done
        i = c
        while time.perf_counter() < stop:
            st, _ = await request(port, reqs[i % len(reqs)])
            if st != 200:
                sys.exit(f"status {st} in the closed loop")
            done += 1
            i += clients
    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(clients)))
    rate = done / (time.perf_counter() - t0)
    pool_close()
    return rate


async def open_loop(port, reqs, arrivals, conns):
    """Sends request k at arrivals[k] (seconds from start); returns
    latencies (s) and the outputs by request index."""
    await pool_open(port, conns)
    lat = [None] * len(arrivals)
    outs = [None] * len(arrivals)
    t0 = time.perf_counter() + 0.05

    async def one(k):
        delay = t0 + arrivals[k] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        st, payload = await request(port, reqs[k % len(reqs)])
        lat[k] = time.perf_counter() - (t0 + arrivals[k])
        if st != 200:
            sys.exit(f"status {st}: {payload[:200]!r}")
        outs[k] = json.loads(payload)["outputs"][0]
    await asyncio.gather(*(one(k) for k in range(len(arrivals))))
    span = time.perf_counter() - t0
    pool_close()
    return lat, outs, len(arrivals) / span


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument("--canopy", default=os.path.join(root, "build", "canopy"))
    ap.add_argument("--data", required=True, help="sequences.jsonl")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--cap", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=64,
                    help="closed-loop connections for the capacity")
    ap.add_argument("--seconds", type=float, default=8.0,
                    help="per point (open loop) and for the capacity")
    ap.add_argument("--loads", default="0.5,0.9")
    ap.add_argument("--conns", type=int, default=256,
                    help="open-loop connections at most (below "
                         "max-connections 1024)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="repetitions of every point, the modes interleaved")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="canopy-decode-")
    models = os.path.join(work, "models")
    model = os.path.join(models, "nmt")
    make_model(model, a.data, a.hidden, a.cap)
    sentences = [json.loads(l) for l in open(a.data) if l.strip()]
    ref = subprocess.run([a.canopy, "run", "--model", model, "--input",
                          a.data], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    ref = [json.loads(l) for l in ref]
    steps = [len(r["output_ids"]) for r in ref]
    reqs = bodies(sentences)
    common = ["--workers", str(a.workers)]

    def start(cont):
        return Daemon(a.canopy, models,
                      common + ["--continuous-decoding",
                                "true" if cont else "false"],
                      os.path.join(work, f"serve-{cont}.log"))

    d = start(False)
    cap = asyncio.run(closed_loop(d.port, reqs, a.clients, a.seconds))
    d.stop()
    d = start(True)
    cap_cont = asyncio.run(closed_loop(d.port, reqs, a.clients, a.seconds))
    d.stop()

    print(f"# lstm-nmt H={a.hidden}, cap {a.cap}, {len(sentences)} sentences "
          f"(output lengths min/median/max {min(steps)}/"
          f"{statistics.median(steps):.0f}/{max(steps)}), one a request; "
          f"{a.workers} workers")
    print(f"# capacity (closed loop, {a.clients} connections, {a.seconds:.0f}"
          f" s): whole-run {cap:,.0f} req/s, continuous {cap_cont:,.0f} "
          f"req/s; the open-loop rates below are fractions of whole-run's")
    print()
    print("| load | rep | offered req/s | decoding | answered req/s | p50 ms | "
          "p99 ms | mean ms | joined in flight | answered early |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    rng = random.Random(a.seed)
    mismatches = 0
    points = [(float(x), rep) for x in a.loads.split(",")
              for rep in range(1, a.repeat + 1)]
    for load, rep in points:
        rate = load * cap
        n = max(1, int(rate * a.seconds))
        t, arrivals = 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            arrivals.append(t)
        outs_by_mode = {}
        for cont in (True, False):
            d = start(cont)
            lat, outs, got = asyncio.run(open_loop(d.port, reqs, arrivals,
                                                   a.conns))
            m = d.metrics()
            d.stop()
            outs_by_mode[cont] = outs
            for k, o in enumerate(outs):
                if o != ref[k % len(ref)]:
                    mismatches += 1
            ms = [x * 1e3 for x in lat]
            print(f"| {load:.0%} | {rep} | {rate:,.0f} | "
                  f"{'continuous' if cont else 'whole-run'} | {got:,.0f} | "
                  f"{pct(ms, 50):.1f} | {pct(ms, 99):.1f} | "
                  f"{statistics.mean(ms):.1f} | "
                  f"{m.get('canopy_decode_joined_instances_total', 0):,.0f} | "
                  f"{m.get('canopy_decode_early_instances_total', 0):,.0f} |")
        if outs_by_mode[True] != outs_by_mode[False]:
            mismatches += 1
    print()
    print("outputs: " + ("every answer equals `canopy run` and the two modes "
                         "agree, bit for bit" if mismatches == 0 else
                         f"{mismatches} MISMATCHES"))
    shutil.rmtree(work)
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
