"""canopy-load (tools/load, docs/benchmarks.md) against a tiny HTTP server
started in the test, which keeps its own counts: every request the
client says it sent arrived, every status the server answered is counted
once, 429s with and without Retry-After are told apart, the bodies go
round in turn, and the schedule does not slow down when the server does.

CANOPY_LOAD names the binary (tests/meson.build sets it).
"""
import collections
import json
import os
import socketserver
import subprocess
import tempfile
import threading
import unittest
from daemon_util import free_port

LOAD = os.environ.get("CANOPY_LOAD", "build/tools/canopy-load")


class Server(socketserver.ThreadingTCPServer):
    """Answers each request by its arrival number n: a 429 with
    Retry-After (n % 6 == 1), a 429 without (n % 6 == 3), a chunked 200
    (n % 6 == 5), a 200 that closes the connection (n % 10 == 8), a 200
    whose length is its EOF (n % 10 == 4), else a plain 200. With
    `delay`, every answer waits that long and is a plain 200."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, delay=0.0):
        self.delay = delay
        self.lock = threading.Lock()
        self.n = 0
        self.sent = collections.Counter()  # status -> answers
        self.retry_after = 0
        self.bodies = collections.Counter()
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        srv = self.server
        while True:
            line = self.rfile.readline()
            if not line:
                return
            length = 0
            while True:
                h = self.rfile.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            body = self.rfile.read(length)
            if srv.delay:
                import time
                time.sleep(srv.delay)
            with srv.lock:
                n = srv.n
                srv.n += 1
                srv.bodies[body] += 1
            ok = b'{"outputs": []}'
            close = False
            if srv.delay:
                status, out = 200, self.plain(200, ok)
            elif n % 6 == 1:
                status, out = 429, self.plain(429, b"{}", b"Retry-After: 1\r\n")
            elif n % 6 == 3:
                status, out = 429, self.plain(429, b"{}")
            elif n % 6 == 5:
                status = 200
                out = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"5\r\n{\"out\r\n5\r\nputs\"\r\n5\r\n: []}\r\n0\r\n\r\n")
            elif n % 10 == 8:
                status, close = 200, True
                out = self.plain(200, ok, b"Connection: close\r\n")
            elif n % 10 == 4:
                status, close = 200, True
                out = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + ok
            else:
                status, out = 200, self.plain(200, ok)
            with srv.lock:
                srv.sent[status] += 1
                if b"Retry-After" in out:
                    srv.retry_after += 1
            self.wfile.write(out)
            self.wfile.flush()
            if close:
                return

    @staticmethod
    def plain(status, body, extra=b""):
        return (b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n" % (status, len(body))
                + extra + b"\r\n" + body)


def run_load(port, bodies_path, *args):
    p = subprocess.run([LOAD, "--port", str(port), "--path", "/v1/x/infer",
                        "--bodies", bodies_path] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    return p


class TestLoad(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.bodies = [json.dumps({"instances": [{"tree": "(S (W a%d))" % i}]})
                      .encode() for i in range(7)]
        cls.path = os.path.join(cls.tmp.name, "bodies.jsonl")
        with open(cls.path, "wb") as f:
            # blank lines and CRLF are skipped / trimmed
            f.write(b"\n".join(cls.bodies[:3]) + b"\r\n\n" +
                    b"\n".join(cls.bodies[3:]) + b"\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def serve(self, delay=0.0):
        srv = Server(delay)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        return srv

    def report(self, p):
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        lines = p.stdout.decode().splitlines()
        self.assertEqual(len(lines), 1, lines)
        return json.loads(lines[0])

    def test_counts_add_up_and_rate_is_kept(self):
        srv = self.serve()
        r = self.report(run_load(srv.server_address[1], self.path,
                                 "--rate", "200", "--duration", "2",
                                 "--connections", "8"))
        # the uniform schedule: exactly rate x duration requests due
        self.assertEqual(r["scheduled"], 400)
        self.assertEqual(r["scheduled"], r["sent"] + r["not_sent"])
        self.assertEqual(sum(r["errors"].values()), 0, r)
        # every request sent arrived and was answered, counted once
        self.assertEqual(r["sent"], srv.n)
        self.assertEqual(r["responses"], r["sent"])
        self.assertEqual({int(k): v for k, v in r["status"].items()},
                         dict(srv.sent))
        self.assertEqual(r["retry_after_429"], srv.retry_after)
        self.assert_sums(r)
        self.assertGreater(srv.retry_after, 0)
        self.assertLess(srv.retry_after, r["status"]["429"])
        # the bodies in turn: the first `sent` of the cycle, each once
        want = collections.Counter(self.bodies[i % len(self.bodies)]
                                   for i in range(r["sent"]))
        self.assertEqual(srv.bodies, want)
        # the rate, so loosely that a busy machine cannot fail it
        self.assertGreaterEqual(r["sent"], 200)
        self.assertGreaterEqual(r["sent_rps"], 100)
        lat = r["latency_ms_200"]
        self.assertLessEqual(lat["p50"], lat["p99"])
        self.assertLessEqual(lat["p99"], lat["max"])

    def test_schedule_does_not_wait_for_the_server(self):
        # 2 connections, 50 ms an answer: at most 40 answers/s against
        # 100 due a second. The k-th request sent (in due order) leaves
        # no earlier than (k - 2) / 40 s and is answered 50 ms later,
        # though due at k / 100 s: latency from the due time grows, where
        # a closed loop would report 50 ms throughout.
        srv = self.serve(delay=0.05)
        r = self.report(run_load(srv.server_address[1], self.path,
                                 "--rate", "100", "--duration", "2",
                                 "--connections", "2"))
        self.assertEqual(r["scheduled"], 200)
        self.assertEqual(r["scheduled"], r["sent"] + r["not_sent"])
        self.assertEqual(r["sent"], srv.n)
        self.assertGreater(r["not_sent"], 0)
        self.assert_sums(r)
        n200 = r["status"]["200"]
        self.assertGreaterEqual(n200, 20, r)
        k = n200 - 1
        bound_ms = 1e3 * ((k - 2) / 40.0 + 0.05 - k / 100.0)
        self.assertGreaterEqual(r["latency_ms_200"]["max"], bound_ms, r)

    def test_closed_loop(self):
        # --closed: no schedule; each connection sends again once
        # answered, so everything sent is answered (or an error) and
        # nothing waits unsent, through the closes and 429s above.
        srv = self.serve()
        r = self.report(run_load(srv.server_address[1], self.path,
                                 "--closed", "--duration", "0.5",
                                 "--connections", "4"))
        self.assertTrue(r["closed"])
        self.assertEqual(r["not_sent"], 0)
        self.assertEqual(r["scheduled"], r["sent"])
        self.assertEqual(r["sent"], srv.n)
        self.assertEqual(r["responses"], r["sent"])
        self.assertEqual(sum(r["errors"].values()), 0, r)
        self.assertEqual({int(k): v for k, v in r["status"].items()},
                         dict(srv.sent))
        self.assertGreater(r["sent"], 20)  # reconnected after each close

    def test_poisson_is_seeded(self):
        srv = self.serve()
        a = self.report(run_load(srv.server_address[1], self.path, "--rate",
                                 "200", "--duration", "1", "--poisson",
                                 "--seed", "7"))
        b = self.report(run_load(srv.server_address[1], self.path, "--rate",
                                 "200", "--duration", "1", "--poisson",
                                 "--seed", "7"))
        c = self.report(run_load(srv.server_address[1], self.path, "--rate",
                                 "200", "--duration", "1", "--poisson",
                                 "--seed", "8"))
        self.assertEqual(a["scheduled"], b["scheduled"])
        self.assertNotEqual(a["scheduled"], c["scheduled"])
        # mean 200, sd about 14: far outside only if the gaps are wrong
        for r in (a, b, c):
            self.assertTrue(120 <= r["scheduled"] <= 280, r)
            self.assertEqual(r["scheduled"], r["sent"] + r["not_sent"])
        self.assertEqual(a["sent"] + b["sent"] + c["sent"], srv.n)

    def assert_sums(self, r):
        errs = sum(v for k, v in r["errors"].items() if k != "connect")
        self.assertEqual(r["sent"], r["responses"] + errs, r)
        self.assertEqual(r["responses"], sum(r["status"].values()), r)

    def test_no_server(self):
        port = free_port()  # nothing listens there now
        r = self.report(run_load(port, self.path, "--rate", "50",
                                 "--duration", "0.3", "--connections", "4"))
        self.assertEqual(r["scheduled"], 15)
        self.assertEqual(r["sent"], 0)
        self.assertEqual(r["not_sent"], 15)
        self.assertGreaterEqual(r["errors"]["connect"], 4)
        self.assertIsNone(r["latency_ms_200"])
        self.assert_sums(r)

    def test_bad_usage(self):
        for args in (["--rate", "0", "--duration", "1"],
                     ["--duration", "1", "--connections", "2"],
                     ["--rate", "ten", "--duration", "1"],
                     ["--duration", "1"],
                     ["--rate", "10", "--duration", "1", "--connections",
                      "0"]):
            p = run_load(1, self.path, *args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(b"canopy-load:", p.stderr)
            self.assertEqual(p.stdout, b"")
        p = run_load(1, os.path.join(self.tmp.name, "missing"),
                     "--rate", "1", "--duration", "1")
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"missing", p.stderr)


if __name__ == "__main__":
    unittest.main()
