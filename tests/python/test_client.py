"""clients/canopy_client.py against a real `canopy serve` on a free port,
and against a tiny fake server for the 429 retries (issue 21, finding 10):
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
import subprocess
import tempfile
import threading
import unittest
from daemon_util import free_port, wait_ready

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT = os.path.join(ROOT, "clients", "canopy_client.py")
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA",
                      os.path.join(ROOT, "data"))
PY = "/usr/bin/python3"


def run_client(args, stdin=None):
    """stdin: str, or bytes for input that is not valid UTF-8."""
    raw = isinstance(stdin, bytes)
    p = subprocess.run([PY, CLIENT] + args, input=stdin, capture_output=True,
                       text=not raw, timeout=60)
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
        cls.port = free_port()
        env = dict(os.environ,
                   CANOPY_POLICY_CACHE=os.path.join(cls.tmp, "policies"))
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "w")
        cls.daemon = subprocess.Popen(
            [BIN, "serve", "--models-dir", os.path.join(cls.tmp, "models"),
             "--port", str(cls.port)], stderr=cls.log, env=env)
        cls.url = "http://127.0.0.1:%d" % cls.port
        wait_ready(cls.url, cls.daemon, 6.0)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait(timeout=20)
        cls.log.close()
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


if __name__ == "__main__":
    unittest.main()
