#!/usr/bin/python3
"""grpc_vs_http.py - the daemon's three inference transports side by side, in
one run, on one `canopy serve`: gRPC ModelInfer (INSTANCE in
raw_input_contents, as tritonclient.grpc sends it), HTTP/JSON (/v2 with
INSTANCE in "data", and /v1 as the baseline) and HTTP/binary (/v2 with
Triton's binary tensor data both ways, tritonclient.http's defaults).
One tree a request, treelstm (H 128 by default), closed loop at
concurrency 1 and 64, the same load generator for all of them: h2load
(Debian's nghttp2-client), a C client whose own cost is small, speaking
HTTP/1.1 (--h1) to the HTTP port and h2c to the gRPC port. A gRPC call
is a POST of a length-prefixed protobuf message to
/inference.GRPCInferenceService/ModelInfer, which is what h2load sends
with the headers gRPC defines (content-type application/grpc, te
trailers). At c=64 gRPC is measured twice: 64 streams on one connection
(what one gRPC channel does: tritonclient, perf_analyzer) and 64
connections of one stream (as the HTTP rows).

Per point: requests/s and mean latency (h2load), and the daemon's CPU
time per request (utime + stime of every thread, /proc/PID/stat, over
the point, divided by the requests answered): what the transport costs
the daemon apart from what the client and the kernel's loopback take on
a shared machine. Every answer is checked first (each transport's
answer to the body sent is /v1's, bit for bit) and every point's
requests are counted by the daemon itself (canopy_requests_total with
status 200 must grow by as many requests as h2load saw succeed: a gRPC
error is an HTTP 200 with grpc-status in the trailers, which h2load
counts as a success). Measures; asserts no time.

usage: scripts/bench/grpc_vs_http.py [--seconds 5] [--hidden 128] [--repeat 3]
       (CANOPY: the binary, default build/canopy)
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from test_grpc import generate_stubs  # noqa: E402
from test_kserve import decode_answer, pack_elements  # noqa: E402

CANOPY = os.environ.get("CANOPY", os.path.join(ROOT, "build", "canopy"))
DATA = os.path.join(os.environ.get("CANOPY_DATA", os.path.join(ROOT,
                                                               "data")),
                    "trees-binary.jsonl")
MODEL = "treelstm"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_s(pid):
    """utime + stime of every thread of pid, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def answered_200(port):
    """canopy_requests_total of the model with status 200, every label."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    n = 0
    for line in text.splitlines():
        if (line.startswith("canopy_requests_total{")
                and 'model="%s"' % MODEL in line
                and 'status="200"' in line):
            n += float(line.rsplit(" ", 1)[1])
    return n


def h2load(args, seconds):
    """Runs h2load; returns (succeeded, req/s, mean latency ms)."""
    out = subprocess.run(["h2load", "-D", str(seconds),
                          "--warm-up-time", "1"] + args,
                         capture_output=True, text=True)
    text = out.stdout + out.stderr
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, "
                  r"(\d+) succeeded, (\d+) failed, (\d+) errored", text)
    r = re.search(r"finished in [0-9.]+m?s, ([0-9.]+) req/s", text)
    lat = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
    if not (m and r and lat):
        raise RuntimeError("h2load failed: " + text[-2000:])
    mean = lat.group(3)
    ms = (float(mean[:-2]) if mean.endswith("ms") else
          float(mean[:-2]) / 1000 if mean.endswith("us") else
          float(mean[:-1]) * 1000)
    if int(m.group(2)) or int(m.group(3)):
        raise RuntimeError("h2load: failed or errored requests: " + text)
    return int(m.group(1)), float(r.group(1)), ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every point, interleaved; the table "
                    "gives each figure's median")
    ap.add_argument("--serve", default="", help="more `canopy serve` flags")
    a = ap.parse_args()
    if not shutil.which("h2load"):
        sys.exit("grpc_vs_http.py: h2load is missing (scripts/deps.sh "
                 "nghttp2-client)")
    work = tempfile.mkdtemp(prefix="canopy-benchgrpc-")
    proc = None
    try:
        subprocess.run([CANOPY, "model", "init", MODEL,
                        os.path.join(work, "models", MODEL), "--hidden",
                        str(a.hidden), "--embed", str(a.hidden),
                        "--classes", "5", "--vocab-from", DATA],
                       check=True, capture_output=True)
        with open(DATA) as f:
            tree = json.loads(next(f))
        inst = json.dumps(tree).encode()
        pb, rpc = generate_stubs(work)

        # the bodies, one tree each
        bodies = {}
        bodies["v1"] = json.dumps({"instances": [tree]}).encode()
        bodies["v2-json"] = json.dumps({"inputs": [{
            "name": "INSTANCE", "datatype": "BYTES", "shape": [1],
            "data": [inst.decode()]}]}).encode()
        head = json.dumps({"inputs": [{
            "name": "INSTANCE", "datatype": "BYTES", "shape": [1],
            "parameters": {"binary_data_size": 4 + len(inst)}}],
            "parameters": {"binary_data_output": True}}).encode()
        bodies["v2-binary"] = head + pack_elements([inst])
        req = pb.ModelInferRequest(model_name=MODEL)
        req.inputs.add(name="INSTANCE", datatype="BYTES", shape=[1])
        req.raw_input_contents.append(pack_elements([inst]))
        msg = req.SerializeToString()
        bodies["grpc"] = struct.pack(">BI", 0, len(msg)) + msg
        for k, b in bodies.items():
            with open(os.path.join(work, k + ".body"), "wb") as f:
                f.write(b)

        port, gport = free_port(), free_port()
        log = open(os.path.join(work, "serve.log"), "w")
        proc = subprocess.Popen(
            [CANOPY, "serve", "--models-dir", os.path.join(work, "models"),
             "--port", str(port), "--grpc-port", str(gport),
             "--log-level", "warn"] + a.serve.split(),
            stderr=log, env=dict(os.environ, CANOPY_POLICY_CACHE=os.path.join(
                work, "cache")))
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit("grpc_vs_http.py: the daemon did not start: " +
                     open(os.path.join(work, "serve.log")).read())

        # every transport's answer is /v1's, bit for bit
        def post(path, body, headers=None):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", path, body=body, headers=headers or {})
            r = c.getresponse()
            raw = r.read()
            assert r.status == 200, raw
            return {k.lower(): v for k, v in r.getheaders()}, raw
        _, raw = post("/v1/models/%s/infer" % MODEL, bodies["v1"])
        want = [struct.unpack("<f", struct.pack("<f", x))[0]
                for x in json.loads(raw)["outputs"][0]["logits"]]
        h, raw = post("/v2/models/%s/infer" % MODEL, bodies["v2-json"])
        got = decode_answer(h, raw)["outputs"][0]["data"]
        assert [struct.unpack("<f", struct.pack("<f", x))[0]
                for x in got] == want, (got, want)
        h, raw = post("/v2/models/%s/infer" % MODEL, bodies["v2-binary"],
                      {"Inference-Header-Content-Length": str(len(head))})
        got = decode_answer(h, raw)["outputs"][0]["data"]
        assert got == want, (got, want)
        import grpc
        ch = grpc.insecure_channel("127.0.0.1:%d" % gport)
        resp = rpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
        ch.close()
        names = [t.name for t in resp.outputs]
        raw = resp.raw_output_contents[names.index("LOGITS")]
        assert list(struct.unpack("<%df" % (len(raw) // 4), raw)) == want

        http_url = "http://127.0.0.1:%d" % port
        grpc_url = "http://127.0.0.1:%d/inference.GRPCInferenceService/" \
                   "ModelInfer" % gport
        kinds = [
            ("gRPC ModelInfer", grpc_url, "grpc",
             ["-H", "content-type: application/grpc", "-H", "te: trailers"]),
            ("HTTP/binary /v2", http_url + "/v2/models/%s/infer" % MODEL,
             "v2-binary", ["--h1", "-H", "inference-header-content-length: "
                           "%d" % len(head), "-H",
                           "content-type: application/octet-stream"]),
            ("HTTP/JSON /v2", http_url + "/v2/models/%s/infer" % MODEL,
             "v2-json", ["--h1"]),
            ("HTTP/JSON /v1", http_url + "/v1/models/%s/infer" % MODEL,
             "v1", ["--h1"]),
        ]
        rows = {}
        points = []
        for conc in (1, 64):
            for label, url, body, extra in kinds:
                shapes = [(conc, 1)]
                if body == "grpc" and conc > 1:
                    shapes = [(1, conc), (conc, 1)]
                for clients, streams in shapes:
                    points.append((conc, label, url, body, extra, clients,
                                   streams))
        for _ in range(a.repeat):
            for conc, label, url, body, extra, clients, streams in points:
                n0, c0 = answered_200(port), cpu_s(proc.pid)
                ok, rps, ms = h2load(
                    ["-c", str(clients), "-m", str(streams),
                     "-d", os.path.join(work, body + ".body")] + extra +
                    [url], a.seconds)
                c1, n1 = cpu_s(proc.pid), answered_200(port)
                done = n1 - n0
                # the warm-up second's requests are answered but not
                # in h2load's count: the daemon's count is at least it
                if done < ok:
                    raise RuntimeError("%s: h2load saw %d succeed, the "
                                       "daemon answered %d with 200"
                                       % (label, ok, done))
                rows.setdefault((label, conc, "%d x %d" % (
                    clients, streams)), []).append(
                    (rps, ms, (c1 - c0) / done * 1e6))
        print("# %s UTC, %d cores, load %s; %s H=%d, one tree of %s a "
              "request; h2load %d s a point (1 s warm-up), closed loop; "
              "median of %d interleaved rounds"
              % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                 os.cpu_count(), " ".join(open("/proc/loadavg").read()
                                          .split()[:3]),
                 MODEL, a.hidden, os.path.basename(DATA), a.seconds,
                 a.repeat))
        print("# %s serve --grpc-port, defaults%s" % (
            os.path.relpath(CANOPY, ROOT), " plus " + a.serve if a.serve
            else ""))
        print()
        print("| transport | concurrency | connections x streams | req/s | "
              "mean latency ms | daemon CPU us / request |")
        print("|---|---:|---|---:|---:|---:|")
        for (label, conc, shape), got in rows.items():
            rps, ms, us = (statistics.median(x) for x in zip(*got))
            print("| %s | %d | %s | %s | %.2f | %.0f |"
                  % (label, conc, shape, format(round(rps), ","), ms, us))
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
