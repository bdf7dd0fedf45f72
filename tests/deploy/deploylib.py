"""deploylib.py - shared by the deployment tests (tests/deploy/test_*.py).

Starts the real `canopy serve` (and nginx, prometheus) on free loopback
ports under one temp dir, talks HTTP to them with the standard library,
and stops every process it started, even when a check fails or meson's
timeout sends SIGTERM: `Procs` kills what is still running on exit.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# free_port, request and HOST are the Python tests' (tests/python).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
from daemon_util import HOST, free_port, request  # noqa: E402,F401


class Skip(Exception):
    """A test that cannot run here (exit 77: meson's SKIP)."""


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def metrics(port):
    """/metrics as {"name{labels}": value}."""
    _, _, body = request(port, "GET", "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def near(a, b, tol=1e-5, where="$"):
    """Raises Fail where two JSON values differ (numbers within tol)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool):
        check(abs(a - b) <= tol * max(1.0, abs(b)), f"{where}: {a} != {b}")
    elif isinstance(a, dict) and isinstance(b, dict):
        check(a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}")
        for k in a:
            near(a[k], b[k], tol, f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        check(len(a) == len(b), f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            near(x, y, tol, f"{where}[{i}]")
    else:
        check(a == b, f"{where}: {a!r} != {b!r}")


class Procs:
    """Every process a test starts, and the temp dir they live in."""

    def __init__(self, name):
        self.dir = tempfile.mkdtemp(prefix=f"canopy-{name}-")
        self.procs = []
        self.keep = os.environ.get("CANOPY_KEEP_TMP") == "1"

    def start(self, argv, log, env=None, **kw):
        f = open(os.path.join(self.dir, log), "ab")
        e = dict(os.environ)
        e.update(env or {})
        # A session of its own: close() can end what it started too (a
        # script's children), by process group, never by name.
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=e,
                             start_new_session=True, **kw)
        p.log = os.path.join(self.dir, log)
        self.procs.append(p)
        return p

    def log(self, p):
        with open(p.log, errors="replace") as f:
            return f.read()

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.keep:
            print(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def grpc_built():
    """Whether the canopy under test has the gRPC front end (meson's
    grpc feature; CANOPY_GRPC from the test's environment, else assumed)."""
    return os.environ.get("CANOPY_GRPC", "1") == "1"


def canopy_bin():
    b = os.environ.get("CANOPY_BIN")
    if not b:
        raise Skip("CANOPY_BIN is not set")
    return b


def data_dir():
    return os.environ.get("CANOPY_DATA", "data")


def init_model(procs, family="treelstm", name=None):
    """A small model of `family` under procs.dir/models/<name>."""
    d = os.path.join(procs.dir, "models", name or family)
    subprocess.run([canopy_bin(), "model", "init", family, d, "--hidden",
                    "16", "--embed", "16", "--classes", "3", "--vocab-from",
                    os.path.join(data_dir(), "trees-binary.jsonl")],
                   check=True, stdout=subprocess.DEVNULL)
    return d


def start_canopy(procs, port, log, *flags, env=None):
    """`canopy serve` on port with procs.dir/models, policies cached in the
    temp dir (never ~/.cache); returns once /readyz is 200."""
    e = {"CANOPY_POLICY_CACHE": os.path.join(procs.dir, "policies")}
    e.update(env or {})
    p = procs.start([canopy_bin(), "serve", "--port", str(port),
                     "--models-dir", os.path.join(procs.dir, "models"),
                     *flags], log, env=e)
    wait_ready(p, port, procs)
    return p


def wait_ready(p, port, procs, path="/readyz", seconds=60):
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        check(p.poll() is None,
              f"{p.args[0]} exited with {p.returncode}:\n{procs.log(p)}")
        try:
            if request(port, "GET", path, timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise Fail(f"{p.args[0]} on port {port} not ready after {seconds} s:\n"
               f"{procs.log(p)}")


def start_pod(procs, root, args, env, container, port, seconds):
    """The image's entrypoint.sh with args and env as a pod's container
    runs it: this canopy first on PATH, the models mount and the policy
    cache under procs.dir. Returns the process once the container's
    readiness probe answers 200 on port (seconds: a guard against a hang)
    and its liveness probe answers 200 too."""
    bindir = os.path.join(procs.dir, "bin")
    os.makedirs(bindir)
    os.symlink(os.path.abspath(canopy_bin()), os.path.join(bindir, "canopy"))
    e = dict(env)
    e.update({"PATH": f"{bindir}:{os.environ['PATH']}",
              "CANOPY_MODELS_MOUNT": os.path.join(procs.dir, "models"),
              "CANOPY_POLICY_CACHE": os.path.join(procs.dir, "cache")})
    p = procs.start([os.path.join(root, "deploy/image/entrypoint.sh"),
                     *args], "pod.log", env=e)
    wait_ready(p, port, procs, container["readinessProbe"]["httpGet"]["path"],
               seconds)
    st = request(port, "GET", container["livenessProbe"]["httpGet"]["path"])[0]
    check(st == 200, f"liveness {st}")
    return p


def expected_outputs(procs, model_dir, lines):
    """`canopy run` over the given input lines: one JSON output a line."""
    inp = os.path.join(procs.dir, "expected-in.jsonl")
    with open(inp, "w") as f:
        f.writelines(lines)
    r = subprocess.run([canopy_bin(), "run", "--model", model_dir, "--input",
                        inp], check=True, capture_output=True, text=True,
                       env=dict(os.environ, CANOPY_POLICY_CACHE=os.path.join(
                           procs.dir, "policies")))
    out = [json.loads(x) for x in r.stdout.splitlines()]
    check(len(out) == len(lines), f"canopy run: {len(out)} outputs for "
          f"{len(lines)} inputs")
    return out


def fill(text, subs):
    """Replaces each key of subs in text, each of which must occur: a test
    templating a committed config fails loudly when the config drifts."""
    for old, new in subs.items():
        check(old in text, f"template: {old!r} not found in the config")
        text = text.replace(old, new)
    return text


def main(body, name):
    """Runs body(procs); exit 0 pass, 1 fail, 77 skip. SIGTERM (meson's
    timeout) unwinds like an exception so every process is stopped."""
    def on_term(signum, frame):
        raise SystemExit(f"{name}: signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    procs = Procs(name)
    try:
        body(procs)
    except Skip as e:
        print(f"SKIP {name}: {e}")
        return 77
    except Fail as e:
        print(f"FAIL {name}: {e}")
        return 1
    finally:
        procs.close()
    print(f"PASS {name}")
    return 0


if __name__ == "__main__":
    sys.exit("a library for tests/deploy/test_*.py")
