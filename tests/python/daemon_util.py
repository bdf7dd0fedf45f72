"""What the Python tests and benchmark scripts share about a daemon they
start: where the checkout, the canopy binary and the data are, a small
tree model made with `canopy model init`, a free port on loopback, the
daemon started there (Served), waiting until it answers /readyz, waiting
for any other event it shows (never for a fixed time), one request on a
fresh connection, a JSON POST, a percentile of latencies, the process's
memory from /proc.

tests/python/*.py import it directly (unittest discover puts this folder on
the path); tests/deploy/, tests/reference/ and scripts/bench/ put this
folder on sys.path first. Standard library only.
"""
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

# The checkout this file is in, the canopy binary under test and the data
# files: meson test sets CANOPY_BIN and CANOPY_DATA; run by hand, this
# checkout's build/canopy and data/.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA", os.path.join(ROOT, "data"))

# The daemons the tests and benchmarks start listen on loopback only.
HOST = "127.0.0.1"

# How long a wait for an event may take before the test fails: a guard
# against a hang, not a timing (a busy machine or a sanitizer build is
# slow, never wrong).
DEADLINE_S = 60.0


def free_port():
    """A port nothing listens on now (the daemon binds it next)."""
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Served:
    """`canopy serve` (the binary bin) over the models directory models on
    a free loopback port, its stderr in TMP/serve.log and its learned
    policies in TMP/policies (never the user's cache), flags added to its
    command line. ready says whether it answered /readyz within seconds;
    stop() ends it with SIGTERM."""

    def __init__(self, bin, models, tmp, flags=(), seconds=DEADLINE_S):
        self.port = free_port()
        self.url = "http://%s:%d" % (HOST, self.port)
        env = dict(os.environ,
                   CANOPY_POLICY_CACHE=os.path.join(tmp, "policies"))
        self.log = open(os.path.join(tmp, "serve.log"), "w")
        self.proc = subprocess.Popen(
            [bin, "serve", "--models-dir", models, "--port", str(self.port)]
            + list(flags), stderr=self.log, env=env)
        self.ready = wait_ready(self.url, self.proc, seconds)

    def stop(self):
        """SIGTERM; returns the exit status once the daemon has drained."""
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=DEADLINE_S)
        finally:
            self.log.close()


def wait_until(probe, ok=bool, seconds=DEADLINE_S):
    """Calls probe() every 10 ms until ok(its value) holds or seconds pass;
    returns the last value (the caller asserts on it)."""
    end = time.monotonic() + seconds
    while True:
        v = probe()
        if ok(v) or time.monotonic() >= end:
            return v
        time.sleep(0.01)


def wait_ready(url, proc=None, seconds=DEADLINE_S):
    """Polls url + "/readyz" until it answers 200; False if it never did
    within seconds or proc (the daemon, a Popen) exited first."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(url + "/readyz", timeout=1)
            return True
        except OSError:
            time.sleep(0.02)
    return False


def request(port, method, path, body=None, headers=None, timeout=10):
    """One request to the daemon on port, on a fresh connection: (status,
    headers by lower-case name, body bytes). timeout guards each socket
    operation against a hang."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def post_json(url, body, timeout=120):
    """POSTs body, encoded as JSON, to url: (status, the answer's JSON),
    for an error status too (the daemon's errors are JSON)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def init_tree_model(path, hidden, embed, classes, *extra):
    """`canopy model init treelstm` at path, its vocabulary from the binary
    trees of the data (the model most daemon tests serve); extra: more
    init flags."""
    subprocess.run([BIN, "model", "init", "treelstm", path,
                    "--hidden", str(hidden), "--embed", str(embed),
                    "--classes", str(classes), *extra, "--vocab-from",
                    os.path.join(DATA, "trees-binary.jsonl")],
                   check=True, capture_output=True)


def pct(xs, p):
    """The p-th percentile of xs by nearest rank: the value of rank
    floor(p/100 * n) of the n sorted (the largest at p = 100); NaN when xs
    is empty."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def status_kb(pid, field):
    """A field of /proc/PID/status counted in kB (VmRSS, VmHWM), as an int;
    None when the process or the field is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
