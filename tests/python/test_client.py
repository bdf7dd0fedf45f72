"""clients/canopy_client.py against a real `canopy serve` on a free port,
and against a tiny fake server for the 429 retries:
one output line per input line, a bad line never costs the good ones their
outputs, Retry-After honoured a bounded number of times, a clear message
and no traceback when the daemon is down.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_client.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from daemon_util import Served, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT = os.path.join(ROOT, "clients", "canopy_client.py")
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA",
                      os.path.join(ROOT, "data"))
PY = "/usr/bin/python3"


def run_client(args, stdin=None, env=None):
    """stdin: str, or bytes for input that is not valid UTF-8; env: added
    to the environment (CANOPY_URL removed from it unless given here)."""
    raw = isinstance(stdin, bytes)
    e = {k: v for k, v in os.environ.items() if k != "CANOPY_URL"}
    e.update(env or {})
    p = subprocess.run([PY, CLIENT] + args, input=stdin, capture_output=True,
                       text=not raw, timeout=60, env=e)
    if raw:
        return (p.returncode, p.stdout.decode().splitlines(),
                p.stderr.decode())
    return p.returncode, p.stdout.splitlines(), p.stderr


class AgainstDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-client-")
        cls.model = os.path.join(cls.tmp, "models", "treelstm")
        data = os.path.join(DATA, "trees-binary.jsonl")
        subprocess.run([BIN, "model", "init", "treelstm", cls.model,
                        "--hidden", "8", "--embed", "8", "--classes", "3",
                        "--vocab-from", data], check=True,
                       capture_output=True)
        with open(data) as f:
            cls.lines = [next(f).strip() for _ in range(40)]
        cls.served = Served(BIN, os.path.join(cls.tmp, "models"), cls.tmp)
        cls.url = cls.served.url

    @classmethod
    def tearDownClass(cls):
        cls.served.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def offline(self, lines):
        p = subprocess.run([BIN, "run", "--model", self.model, "--input", "-"],
                           input="\n".join(lines) + "\n", capture_output=True,
                           text=True)
        return [json.loads(l) for l in p.stdout.splitlines()]

    def assert_near(self, a, b):
        self.assertEqual(a["label"], b["label"])
        for x, y in zip(a["logits"], b["logits"]):
            self.assertAlmostEqual(x, y, delta=1e-5)

    def test_canopy_url_is_read(self):
        """No --url: $CANOPY_URL names the daemon (the demo's banner and
        curl-examples.sh use it); --url wins over it."""
        lines = self.lines[:3]
        stdin = "\n".join(lines) + "\n"
        code, out, err = run_client(["--model", "treelstm", "--input", "-"],
                                    stdin=stdin, env={"CANOPY_URL": self.url})
        self.assertEqual(code, 0, err)
        for a, b in zip([json.loads(l) for l in out], self.offline(lines)):
            self.assert_near(a, b)
        dead = "http://127.0.0.1:%d" % free_port()
        code, out, err = run_client(["--url", self.url, "--model", "treelstm",
                                     "--input", "-"], stdin=stdin,
                                    env={"CANOPY_URL": dead})
        self.assertEqual((code, len(out)), (0, 3), err)
        # and CANOPY_URL is what is tried when it names nothing listening
        code, out, err = run_client(["--model", "treelstm", "--input", "-"],
                                    stdin=stdin, env={"CANOPY_URL": dead})
        self.assertEqual(code, 3, err)
        self.assertIn(dead, err)

    def test_bad_line_costs_nothing_else(self):
        lines = list(self.lines[:32])
        lines[5] = '{"tree": "(2 a"}'          # bad tree
        lines[17] = 'not json at all'          # not JSON
        code, out, err = run_client(["--url", self.url, "--model", "treelstm",
                                     "--input", "-", "--batch", "32"],
                                    stdin="\n".join(lines) + "\n")
        self.assertEqual(code, 2, err)
        self.assertEqual(len(out), 32, "one output line per input line")
        ref = self.offline([l for i, l in enumerate(lines) if i not in (5, 17)])
        k = 0
        for i, line in enumerate(out):
            o = json.loads(line)
            if i == 5:
                self.assertEqual(o["error"]["code"], "bad_tree")
            elif i == 17:
                self.assertEqual(o["error"]["code"], "bad_json")
            else:
                self.assertNotIn("error", o, "line %d" % (i + 1))
                self.assert_near(o, ref[k])
                k += 1
        self.assertIn("line 6", err)
        self.assertIn("line 18", err)
        self.assertNotIn("Traceback", err)

    def test_all_good_exit_zero(self):
        code, out, err = run_client(["--url", self.url, "--model", "treelstm",
                                     "--input", "-", "--batch", "7"],
                                    stdin="\n".join(self.lines) + "\n")
        self.assertEqual(code, 0, err)
        ref = self.offline(self.lines)
        self.assertEqual(len(out), len(ref))
        for line, r in zip(out, ref):
            self.assert_near(json.loads(line), r)

    def test_daemon_down(self):
        url = "http://127.0.0.1:%d" % free_port()
        code, out, err = run_client(["--url", url, "--model", "treelstm",
                                     "--input", "-"],
                                    stdin="\n".join(self.lines[:3]) + "\n")
        self.assertEqual(code, 3)
        self.assertEqual(len(out), 3)
        for line in out:
            self.assertEqual(json.loads(line)["error"]["code"], "unavailable")
        self.assertIn("is `canopy serve` running?", err)
        self.assertNotIn("Traceback", err)


class Busy(http.server.BaseHTTPRequestHandler):
    """429 with Retry-After: `retry_after` for the first `busy` requests,
    then 200."""
    busy = 2
    seen = 0
    retry_after = "0"

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n))
        Busy.seen += 1
        if Busy.seen <= Busy.busy:
            out = json.dumps({"error": {"code": "overloaded",
                                        "message": "busy"}}).encode()
            self.send_response(429)
            self.send_header("Retry-After", Busy.retry_after)
        else:
            out = json.dumps({"outputs": [{"label": 0}
                                          for _ in body["instances"]],
                              "stats": {"batches": 1,
                                        "lower_bound": 1}}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


class Retries(unittest.TestCase):
    def serve(self, busy, retry_after="0"):
        Busy.busy, Busy.seen, Busy.retry_after = busy, 0, retry_after
        srv = http.server.HTTPServer(("127.0.0.1", 0), Busy)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        self.addCleanup(srv.shutdown)
        return "http://127.0.0.1:%d" % srv.server_address[1]

    def test_retry_after_honoured(self):
        url = self.serve(busy=2)
        code, out, err = run_client(["--url", url, "--model", "m", "--input",
                                     "-", "--retries", "3"],
                                    stdin='{"tree": "(1 a)"}\n')
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out[0]), {"label": 0})
        self.assertEqual(Busy.seen, 3)

    def test_retries_are_bounded(self):
        url = self.serve(busy=100)
        code, out, err = run_client(["--url", url, "--model", "m", "--input",
                                     "-", "--retries", "2"],
                                    stdin='{"tree": "(1 a)"}\n')
        self.assertEqual(code, 2)
        self.assertEqual(Busy.seen, 3, "1 try + 2 retries")
        self.assertEqual(json.loads(out[0])["error"]["code"], "overloaded")
        self.assertNotIn("Traceback", err)

    def test_unparsable_retry_after_is_absent(self):
        # a server that is not Canopy may send anything; "nan" once made
        # time.sleep raise, a traceback instead of a retry
        for value in ("nan", "-inf", "soon"):
            url = self.serve(busy=1, retry_after=value)
            code, out, err = run_client(["--url", url, "--model", "m",
                                         "--input", "-", "--retries", "1"],
                                        stdin='{"tree": "(1 a)"}\n')
            self.assertEqual((code, Busy.seen), (0, 2), (value, err))
            self.assertEqual(json.loads(out[0]), {"label": 0})
            self.assertNotIn("Traceback", err)

    def test_invalid_utf8_is_one_bad_line(self):
        # a line that is not UTF-8 once crashed the client (no output at
        # all); it is an error line like any other bad line
        url = self.serve(busy=0)
        stdin = b'{"tree": "(1 a)"}\n{"tree": "(1 \xff\xfe)"}\n' \
            b'{"tree": "(1 b)"}\n'
        code, out, err = run_client(["--url", url, "--model", "m", "--input",
                                     "-"], stdin=stdin)
        self.assertEqual(code, 2, err)
        self.assertEqual(len(out), 3, "one output line per input line")
        self.assertEqual(json.loads(out[0]), {"label": 0})
        self.assertEqual(json.loads(out[1])["error"]["code"], "bad_json")
        self.assertIn("UTF-8", json.loads(out[1])["error"]["message"])
        self.assertEqual(json.loads(out[2]), {"label": 0})
        self.assertIn("line 2", err)
        self.assertNotIn("Traceback", err)
        path = os.path.join(tempfile.mkdtemp(prefix="canopy-client-"), "in")
        self.addCleanup(shutil.rmtree, os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(stdin)
        code, out, err = run_client(["--url", url, "--model", "m", "--input",
                                     path])
        self.assertEqual((code, len(out)), (2, 3), err)
        self.assertNotIn("Traceback", err)


LOADGEN = os.path.join(ROOT, "clients", "loadgen.py")


def requests_total(url):
    """The daemon's canopy_requests_total over every label, or None."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(float(l.rpartition(" ")[2]) for l in text.splitlines()
               if l.startswith("canopy_requests_total{"))


class Loadgen(unittest.TestCase):
    """clients/loadgen.py (the canopy-loadgen command): the bounds it
    stops at are the ones asked for, --help states the defaults, and a
    daemon that goes away mid-run gives the summary, not a traceback."""

    def test_bounds(self):
        sys.path.insert(0, os.path.join(ROOT, "clients"))
        try:
            import canopy_loadgen as lg
        finally:
            sys.path.pop(0)
        self.assertEqual(lg.bounds(None, None), (2000, 20))
        self.assertEqual(lg.bounds(None, 10), (lg.MAX_REQUESTS, 10))
        self.assertEqual(lg.bounds(50, None), (50, lg.MAX_DURATION))
        self.assertEqual(lg.bounds(50, 10), (50, 10))
        self.assertEqual(lg.bounds(10 ** 9, 10 ** 6),
                         (lg.MAX_REQUESTS, lg.MAX_DURATION))

    def test_help_shows_defaults(self):
        p = subprocess.run([PY, LOADGEN, "--help"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        text = " ".join(p.stdout.split())
        for want in ("--concurrency CONCURRENCY", "(default: 8)",
                     "(default: treelstm)", "--duration alone runs that long",
                     "neither: 2000 requests or 20 s", "$CANOPY_URL"):
            self.assertIn(want, text)

    def test_duration_alone_and_daemon_going_away(self):
        """--duration 600 alone: the run goes past the 2,000 requests that
        once capped it silently (seen in the daemon's /metrics); then the
        daemon is stopped under it: the loadgen ends at once with its
        summary (the errors counted, /metrics unavailable), exit 1."""
        tmp = tempfile.mkdtemp(prefix="canopy-loadgen-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        data = os.path.join(DATA, "trees-binary.jsonl")
        subprocess.run([BIN, "model", "init", "treelstm",
                        os.path.join(tmp, "models", "treelstm"), "--hidden",
                        "4", "--embed", "4", "--classes", "3", "--vocab-from",
                        data], check=True, capture_output=True)
        inp = os.path.join(tmp, "in.jsonl")
        with open(data) as f, open(inp, "w") as g:
            for _ in range(20):
                g.write(next(f))
        s = Served(BIN, os.path.join(tmp, "models"), tmp)
        self.addCleanup(s.log.close)
        url, d = s.url, s.proc
        self.addCleanup(lambda: d.poll() is None and (d.kill(), d.wait()))
        lg = subprocess.Popen([PY, LOADGEN, "--url", url, "--input", inp,
                               "--concurrency", "2", "--duration", "600"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        self.addCleanup(lambda: lg.poll() is None and (lg.kill(), lg.wait()))
        # the event: the daemon has answered more than 2,000 requests
        # (generous guard: 120 s)
        t_end = time.monotonic() + 120
        n = 0
        while lg.poll() is None and time.monotonic() < t_end:
            n = requests_total(url) or 0
            if n > 2100:
                break
            time.sleep(0.05)
        if lg.poll() is not None:
            self.fail(f"loadgen stopped on its own after {n} requests:\n"
                      f"{lg.stdout.read()}{lg.stderr.read()}")
        self.assertGreater(n, 2100)
        d.send_signal(signal.SIGTERM)
        self.assertEqual(d.wait(30), 0)
        out, err = lg.communicate(timeout=120)
        self.assertEqual(lg.returncode, 1, err)
        self.assertNotIn("Traceback", err)
        res = json.loads(out.splitlines()[-1])
        self.assertGreater(res["ok"], 2000, res)
        self.assertGreater(res["requests"], res["ok"], res)
        self.assertEqual(sum(res["errors"].values()),
                         res["requests"] - res["ok"], res)
        self.assertIn("went away", res["stopped"])
        self.assertIsNone(res["runs"], res)
        self.assertEqual(res["metrics"], "unavailable after the run")


class CurlExamples(unittest.TestCase):
    """clients/curl-examples.sh against a daemon serving models named
    after their families: it ends cleanly (exit 0, no curl error such as
    a broken pipe's "curl: (23)"), and each example of its errors section
    shows the error it is there for: the status it names and a JSON
    error body."""

    def test_runs_clean_and_errors_show_their_status(self):
        tmp = tempfile.mkdtemp(prefix="canopy-curl-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        models = os.path.join(tmp, "models")
        for fam, data, size in (("treelstm", "trees-binary", 8),
                                ("treegru", "trees-binary", 8),
                                ("mvrnn", "trees-binary", 8),
                                ("treelstm-2type", "trees-binary", 8),
                                ("childsum-treelstm", "trees-nary", 8),
                                ("bilstm-tagger", "sequences", 8)):
            subprocess.run([BIN, "model", "init", fam,
                            os.path.join(models, fam), "--hidden", str(size),
                            "--embed", str(size), "--classes", "3",
                            "--vocab-from",
                            os.path.join(DATA, data + ".jsonl")],
                           check=True, capture_output=True)
        s = Served(BIN, models, tmp)
        self.addCleanup(s.stop)
        url = s.url
        p = subprocess.run(["sh", os.path.join(ROOT, "clients",
                                               "curl-examples.sh")],
                           env=dict(os.environ, CANOPY_URL=url),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertNotIn("curl: (", p.stderr)
        shown = [l for l in p.stdout.splitlines() if l.startswith("HTTP ")]
        self.assertEqual([l.split()[1] for l in shown],
                         ["400", "400", "400", "404", "405", "400"], shown)
        for l in shown:
            err = json.loads(l.split(None, 2)[2])["error"]
            self.assertTrue(err, l)
        self.assertIn("# HELP canopy_", p.stdout)


if __name__ == "__main__":
    unittest.main()
