"""Start-up and exit of `canopy serve` at their edges.

- Standard input, output and error closed by whoever starts the daemon:
  it serves, and exits 0 on SIGTERM (libuv's own descriptors once landed
  on 1 and 2 and it aborted closing them).
- More model directories than the 256 a daemon serves: with
  strict-startup false the first 256 in byte order of their names serve
  and the rest are UNAVAILABLE in the index with the reason; with
  strict-startup true start-up stops, naming the bound.
- A SIGTERM while two loads are in flight: exit 0, and under the
  sanitizer build no leak (the requests that waited on the loads were
  once left unfreed).

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_startup.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

from daemon_util import free_port, init_tree_model, wait_ready
from test_settings import BIN, BODY, DEADLINE_S, Started, ask, \
    init_model, serve_argv

MAX_MODELS = 256


class Startup(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="canopy-startup-")
        self.models = os.path.join(self.tmp, "models")
        os.makedirs(self.models)
        self.one = os.path.join(self.tmp, "one")
        init_model(self.one)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_closed_standard_descriptors(self):
        shutil.copytree(self.one, os.path.join(self.models, "t"))
        port = free_port()
        argv = serve_argv(self.models, "--port", str(port))
        p = subprocess.Popen(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh"]
                             + argv)
        try:
            self.assertTrue(wait_ready("http://127.0.0.1:%d" % port, p,
                                       DEADLINE_S))
            st, body = ask(port, "POST", "/v1/models/t/infer", BODY)
            self.assertEqual(st, 200, body)
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            code = p.wait(timeout=DEADLINE_S)
        self.assertEqual(code, 0)
        # the other commands too: `canopy model info` with stdout closed
        p = subprocess.run(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", BIN,
                            "model", "info", self.one], timeout=DEADLINE_S)
        self.assertEqual(p.returncode, 0)

    def test_more_directories_than_served(self):
        names = ["m%03d" % i for i in range(300)]
        for n in names:
            shutil.copytree(self.one, os.path.join(self.models, n))
        d = Started(serve_argv(self.models))
        self.assertFalse(d.wait_for(r"msg=ready"), d.log())
        self.assertEqual(d.stop(), 1)
        self.assertIn("300 model directories, more than the 256", d.log())
        self.assertIn("strict-startup false", d.log())

        d = Started(serve_argv(self.models, "--strict-startup", "false"))
        try:
            self.assertTrue(d.wait_for(r"msg=ready"), d.log())
            self.assertIn("msg=models-over-bound directories=300 served=256 "
                          "first_unserved=\"m256\"", d.log())
            st, body = ask(d.port, "GET", "/v1/models")
            self.assertEqual(st, 200)
            served = sorted(m["name"] for m in json.loads(body)["models"])
            self.assertEqual(served, sorted(names)[:MAX_MODELS])
            st, body = ask(d.port, "POST", "/v2/repository/index")
            self.assertEqual(st, 200)
            index = {e["name"]: e for e in json.loads(body)}
            self.assertEqual(sorted(index), names)
            for n in names[MAX_MODELS:]:
                self.assertEqual(index[n]["state"], "UNAVAILABLE")
                self.assertIn("than the 256 a daemon serves",
                              index[n]["reason"])
            for n in names[:MAX_MODELS]:
                self.assertEqual(index[n]["state"], "READY")
            st, body = ask(d.port, "POST", "/v1/models/m255/infer", BODY)
            self.assertEqual(st, 200, body)
            st, body = ask(d.port, "POST", "/v1/models/m256/infer", BODY)
            self.assertEqual(st, 404, body)
        finally:
            self.assertEqual(d.stop(), 0, d.log()[-2000:])

    def test_sigterm_during_two_loads(self):
        # models big enough that their loads (read, hash, warm-up) are
        # still in flight when the SIGTERM sent on their first log line
        # arrives; if one finished first the drain is tested all the same
        big = os.path.join(self.tmp, "big")
        init_tree_model(big, 512, 512, 2)
        # no grace: the loop stops while the loads are still in flight, and
        # server_stop is left to settle them
        d = Started(serve_argv(self.models, "--model-control", "explicit",
                               "--warmup", "true", "--drain-grace-ms", "0"))
        self.assertTrue(d.wait_for(r"msg=ready"), d.log())
        for n in ("a", "b"):
            shutil.copytree(big, os.path.join(self.models, n))
        port = d.port

        def load(name):
            try:
                return ask(port, "POST",
                           "/v2/repository/models/%s/load" % name)[0]
            except OSError:
                return None  # the connection closed by the exit
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = [pool.submit(load, n) for n in ("a", "b", "a", "b")]
            self.assertTrue(d.wait_for(r"msg=model-loading model=a"),
                            d.log())
            self.assertTrue(d.wait_for(r"msg=model-loading model=b"),
                            d.log())
            d.p.send_signal(signal.SIGTERM)
            code = d.stop()
            statuses = [a.result() for a in answers]
        self.assertEqual(code, 0, d.log()[-3000:])
        self.assertNotIn("LeakSanitizer", d.log())
        for st in statuses:
            self.assertIn(st, (200, 503, None), statuses)


if __name__ == "__main__":
    unittest.main()
