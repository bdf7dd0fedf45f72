"""Every numeric setting at its edges, and the memory budget's floor.

The sweep reads the settings from `canopy serve --help` (each key of
config/config.c's table prints "(default D, LO..HI)"), so a new numeric
key is swept without a change here. Each key is tried at 0, 1, one under
its minimum, its maximum and one past it, one daemon per value: the
daemon either refuses the value at start-up (a non-zero exit whose
message names the key) or it starts, answers an infer request and a
/metrics scrape without dying, and exits 0 on SIGTERM. A value outside
the range --help states must be refused.

The memory budget: a budget under which a model can run not even its
smallest instance is refused at start-up by `canopy serve` and
`canopy run`, naming the smallest budget that works (found by planning,
checked here by running at it and one under it); a model loaded through
the repository under such a budget is answered 413, and the daemon lives.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_settings.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import unittest
from daemon_util import BIN, init_tree_model, request

BODY = json.dumps({"instances": [{"tree": "(S (W a) (S (W b) (W c)))"}]})
# a deadline against a hung daemon only; every wait below ends on an event
DEADLINE_S = 120


def init_model(path):
    """The smallest model `canopy model init` makes that serves trees."""
    init_tree_model(path, 4, 4, 2)


def numeric_settings():
    """[(key, lo, hi)] of every key whose --help line states a range."""
    p = subprocess.run([BIN, "serve", "--help"], capture_output=True,
                       text=True, check=True, timeout=60)
    out = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s+--(\S+)\s", line)
        at = line.rfind("(default ")
        if m is None or at < 0:
            continue
        r = re.search(r", (-?\d+)\.\.(-?\d+)( bytes)?(,|\)$)", line[at:])
        if r is not None:
            out.append((m.group(1), int(r.group(1)), int(r.group(2))))
    return out


class Started:
    """`canopy serve` with stderr read line by line on a thread, so a test
    waits for a line (the listening port, an exit) instead of a time."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  errors="replace")
        self.lines = []
        self.cv = threading.Condition()
        self.port = None
        self.ended = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            with self.cv:
                self.lines.append(line)
                m = re.search(r"msg=listening .*port=(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                self.cv.notify_all()
        with self.cv:
            self.ended = True
            self.cv.notify_all()

    def wait_for(self, pattern):
        """True once a line matches pattern; False if the process ended
        (all its stderr read) first."""
        with self.cv:
            ok = self.cv.wait_for(
                lambda: any(re.search(pattern, l) for l in self.lines)
                or self.ended, timeout=DEADLINE_S)
            return ok and any(re.search(pattern, l) for l in self.lines)

    def log(self):
        with self.cv:
            return "".join(self.lines)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            code = self.p.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.p.kill()
            code = self.p.wait()
        self.reader.join(DEADLINE_S)
        self.p.stderr.close()
        return code


def ask(port, method, path, body=None):
    st, _, data = request(port, method, path, body, timeout=DEADLINE_S)
    return st, data


def serve_argv(models, *flags):
    """canopy serve on an ephemeral loopback port, one worker, no warm-up
    (short starts), flags winning over those defaults."""
    base = {"--models-dir": models, "--port": "0", "--warmup": "false",
            "--workers": "1"}
    given = dict(zip(flags[::2], flags[1::2]))
    base.update(given)
    argv = [BIN, "serve"]
    for k, v in base.items():
        argv += [k, v]
    return argv


class SettingsSweep(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-settings-")
        cls.models = os.path.join(cls.tmp, "models")
        init_model(os.path.join(cls.models, "t"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def one(self, key, value, lo, hi):
        """None when the value was refused well, "served" when the daemon
        served with it, else a failure message."""
        argv = serve_argv(self.models, "--" + key, str(value))
        d = Started(argv)
        what = "--%s %s" % (key, value)
        outside = value < lo or value > hi
        if not d.wait_for(r"msg=ready"):
            code = d.stop()
            log = d.log()
            if code == 0 or code < 0:
                return "%s: exited %s before ready: %s" % (what, code,
                                                           log[-800:])
            if key not in log:
                return "%s: refused without naming the key: %s" % (
                    what, log[-800:])
            return None
        if outside:
            d.stop()
            return "%s: outside %d..%d but the daemon started" % (what, lo,
                                                                 hi)
        port = d.port
        try:
            st, body = ask(port, "POST", "/v1/models/t/infer", BODY)
            if st >= 500 and st not in (503, 504):
                return "%s: infer answered %d %s" % (what, st, body[:300])
            st, body = ask(port, "GET", "/metrics")
            if st != 200 or b"canopy_requests_total" not in body:
                return "%s: /metrics answered %d" % (what, st)
        except OSError as e:
            d.stop()
            return "%s: the daemon stopped answering (%s): %s" % (
                what, e, d.log()[-800:])
        code = d.stop()
        if code != 0:
            return "%s: exit status %d after SIGTERM: %s" % (what, code,
                                                             d.log()[-800:])
        return "served"

    def test_every_numeric_setting_at_its_edges(self):
        keys = numeric_settings()
        names = {k for k, _, _ in keys}
        # the table's numeric keys, as --help states them (a sanity check
        # of the parse, not a list to keep up to date)
        for k in ("max-nodes", "workers", "memory-budget", "port",
                  "max-body-bytes", "max-loads"):
            self.assertIn(k, names)
        cases = []
        for key, lo, hi in keys:
            for v in sorted({0, 1, lo - 1, hi, hi + 1}):
                cases.append((key, v, lo, hi))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda c: self.one(*c), cases))
        failures = [r for r in results if r not in (None, "served")]
        self.assertEqual(failures, [], "%d of %d starts failed" % (
            len(failures), len(cases)))
        # most values of the ranges serve (a daemon that refused them all,
        # naming the key, would pass the loop above)
        served = results.count("served")
        self.assertGreater(served, len(cases) // 3, "%d of %d served" % (
            served, len(cases)))


class BudgetFloor(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="canopy-budget-")
        self.models = os.path.join(self.tmp, "models")
        init_model(os.path.join(self.models, "t"))
        self.input = os.path.join(self.tmp, "in.jsonl")
        with open(self.input, "w") as f:
            f.write(json.dumps({"tree": "(S (W a) (W b))"}) + "\n")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_at(self, budget):
        return subprocess.run(
            [BIN, "run", "--model", os.path.join(self.models, "t"),
             "--input", self.input, "--memory-budget", str(budget)],
            capture_output=True, text=True, timeout=DEADLINE_S)

    def floor_named(self, text):
        m = re.search(r"at least (\d+)", text)
        self.assertIsNotNone(m, text)
        return int(m.group(1))

    def test_run_refuses_a_budget_under_the_floor(self):
        # budgets under 64 bytes divided by zero on the first instance
        for budget in (1, 63, 64):
            p = self.run_at(budget)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("memory-budget", p.stderr)
        floor = self.floor_named(p.stderr)
        p = self.run_at(floor)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(p.stdout.splitlines()), 1, p.stdout)
        p = self.run_at(floor - 1)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(self.floor_named(p.stderr), floor)

    def test_serve_refuses_a_budget_under_the_floor(self):
        d = Started(serve_argv(self.models, "--memory-budget", "1"))
        self.assertFalse(d.wait_for(r"msg=ready"), d.log())
        self.assertEqual(d.stop(), 1)
        self.assertIn("memory-budget 1 bytes is too small", d.log())
        floor = self.floor_named(d.log())
        d = Started(serve_argv(self.models, "--memory-budget", str(floor)))
        self.assertTrue(d.wait_for(r"msg=ready"), d.log())
        st, body = ask(d.port, "POST", "/v1/models/t/infer", BODY)
        self.assertEqual(st, 200, body)
        self.assertEqual(d.stop(), 0, d.log())

    def test_a_model_loaded_later_is_answered_413(self):
        # no model at start-up: nothing to check the budget against; the
        # model loaded afterwards is planned under 1 byte and refused,
        # where the plan once divided by zero (SIGFPE)
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        d = Started(serve_argv(empty, "--memory-budget", "1",
                               "--model-control", "explicit"))
        self.assertTrue(d.wait_for(r"msg=ready"), d.log())
        shutil.copytree(os.path.join(self.models, "t"),
                        os.path.join(empty, "t"))
        st, body = ask(d.port, "POST", "/v2/repository/models/t/load")
        self.assertEqual(st, 200, body)
        for _ in range(2):
            st, body = ask(d.port, "POST", "/v1/models/t/infer", BODY)
            self.assertEqual(st, 413, body)
            self.assertIn(b"over_memory_budget", body)
        self.assertEqual(d.stop(), 0, d.log())


if __name__ == "__main__":
    unittest.main()
