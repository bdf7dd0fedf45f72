"""Model lifecycle end to end (docs/api.md "Model repository"): a real
`canopy serve` on a free port, its weights swapped under concurrent load,
broken versions refused while the old one serves, directories appearing
and disappearing, and the guards on the mutating routes.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_lifecycle.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import http.client
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest
from daemon_util import (BIN, DATA, DEADLINE_S, free_port, init_tree_model,
                         request, wait_until)

TOKEN = "t0ken"


def init_model(path, seed):
    init_tree_model(path, 8, 8, 3, "--seed", str(seed))


def weights_version(path):
    import hashlib
    with open(os.path.join(path, "weights.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def swap_link(link, target):
    """Points link at target atomically (a new symlink renamed over it)."""
    tmp = link + ".new"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


class Daemon:
    def __init__(self, models, *flags):
        self.port = free_port()
        self.log_path = os.path.join(os.path.dirname(models),
                                     "serve-%d.log" % self.port)
        self.log = open(self.log_path, "w")
        env = dict(os.environ, CANOPY_POLICY_CACHE=os.path.join(
            os.path.dirname(models), "policies"))
        self.p = subprocess.Popen(
            [BIN, "serve", "--models-dir", models, "--port", str(self.port),
             "--max-delay-us", "1000"] + list(flags),
            stderr=self.log, env=env)
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        with open(self.log_path) as f:
            raise RuntimeError("canopy serve did not start: " + f.read())

    def request(self, method, path, body=None, headers=None):
        st, _, data = request(self.port, method, path, body, headers, 30)
        return st, json.loads(data) if data[:1] in b"{[" else data

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, token=TOKEN, body=b""):
        h = {"Authorization": "Bearer " + token} if token else {}
        return self.request("POST", path, body, h)

    def log_count(self, what):
        """How many times what occurs in the daemon's log."""
        with open(self.log_path) as f:
            return f.read().count(what)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(timeout=30)
        self.log.close()
        return self.p.returncode


class Lifecycle(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="canopy-lifecycle-")
        self.models = os.path.join(self.tmp, "models")
        os.makedirs(self.models)
        self.versions = []
        for k in range(3):
            d = os.path.join(self.tmp, "v%d" % k)
            init_model(d, seed=k + 1)
            self.versions.append(d)
        with open(os.path.join(DATA, "trees-binary.jsonl")) as f:
            self.lines = [next(f).strip() for _ in range(24)]
        self.daemons = []

    def tearDown(self):
        codes = []
        for d in self.daemons:
            code = d.stop()
            if code != 0:
                with open(d.log_path) as f:
                    codes.append((code, f.read()[-2000:]))
        shutil.rmtree(self.tmp, ignore_errors=True)
        # a clean drain, and under ASan no leak or error report at exit
        self.assertEqual(codes, [])

    def start(self, *flags):
        d = Daemon(self.models, *flags)
        self.daemons.append(d)
        return d

    def offline(self, model_dir):
        p = subprocess.run([BIN, "run", "--model", model_dir, "--input", "-"],
                           input="\n".join(self.lines) + "\n",
                           capture_output=True, text=True, check=True)
        return [json.loads(l) for l in p.stdout.splitlines()]

    def test_swap_under_load_loses_nothing(self):
        link = os.path.join(self.models, "t")
        swap_link(link, self.versions[0])
        ref = {weights_version(v): self.offline(v) for v in self.versions}
        d = self.start("--model-control", "explicit", "--repository-token",
                       TOKEN)
        stop = threading.Event()
        results, errors = [], []

        def client(seed):
            rnd = random.Random(seed)
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
            while not stop.is_set():
                i = rnd.randrange(len(self.lines))
                try:
                    c.request("POST", "/v1/models/t/infer",
                              body=self.lines[i])
                    r = c.getresponse()
                    body = json.loads(r.read())
                except (OSError, http.client.HTTPException) as e:
                    errors.append(repr(e))
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", d.port,
                                                   timeout=30)
                    continue
                results.append((r.status, i, body))
            c.close()

        threads = [threading.Thread(target=client, args=(k,))
                   for k in range(8)]
        for t in threads:
            t.start()
        seen_versions = set()
        try:
            for swap in range(20):
                target = self.versions[(swap + 1) % 3]
                want = weights_version(target)
                swap_link(link, target)
                if swap % 2 == 0:
                    d.p.send_signal(signal.SIGHUP)
                else:
                    st, body = d.post("/v2/repository/models/t/load")
                    self.assertEqual(st, 200, body)
                    self.assertEqual(body["version"], want)
                ready = lambda: d.get("/v2/models/t/ready")
                st, body = wait_until(
                    ready, lambda r: r[0] == 200 and r[1]["version"] == want)
                self.assertEqual(body.get("version"), want,
                                 "swap %d not served" % swap)
                seen_versions.add(want)
                # traffic on this version before the next swap: a few
                # answers more (the clients count them)
                n = len(results)
                wait_until(lambda: len(results), lambda k: k >= n + 12)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(errors, [], "connection errors during swaps")
        self.assertGreater(len(results), 200, "too little traffic")
        bad = [(st, b) for st, _, b in results if st != 200]
        self.assertEqual(bad[:3], [], "%d failed requests" % len(bad))
        per_version = {}
        for _, i, body in results:
            v = body["model_version"]
            self.assertIn(v, ref, "unknown version %s" % v)
            per_version[v] = per_version.get(v, 0) + 1
            out, want = body["outputs"][0], ref[v][i]
            self.assertEqual(out["label"], want["label"])
            for a, b in zip(out["logits"], want["logits"]):
                self.assertAlmostEqual(a, b, delta=1e-5)
        self.assertEqual(len(per_version), 3,
                         "every version answered: %s" % per_version)
        st, body = d.get("/metrics")
        self.assertIn(b'canopy_model_loads_total{model="t",result="ok"} 21',
                      body)

    def test_broken_version_keeps_the_old_one(self):
        link = os.path.join(self.models, "t")
        swap_link(link, self.versions[0])
        good = weights_version(self.versions[0])
        d = self.start("--model-control", "explicit", "--repository-token",
                       TOKEN)
        broken = []
        # cut short
        b1 = os.path.join(self.tmp, "cut")
        shutil.copytree(self.versions[1], b1)
        w = os.path.join(b1, "weights.safetensors")
        os.truncate(w, os.path.getsize(w) // 2)
        broken.append((b1, "weights.safetensors"))
        # a NaN in a tensor the family uses
        b2 = os.path.join(self.tmp, "nan")
        shutil.copytree(self.versions[1], b2)
        w = os.path.join(b2, "weights.safetensors")
        with open(w, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
            b, _ = hdr["leaf.W"]["data_offsets"]
            f.seek(8 + n + b + 4)
            f.write(struct.pack("<f", float("nan")))
        broken.append((b2, "NaN"))
        # the wrong shape: a model of another hidden size, same name
        b3 = os.path.join(self.tmp, "shape")
        shutil.copytree(self.versions[1], b3)
        other = os.path.join(self.tmp, "h16")
        init_tree_model(other, 16, 8, 3)
        shutil.copy(os.path.join(other, "weights.safetensors"),
                    os.path.join(b3, "weights.safetensors"))
        broken.append((b3, "shape"))
        for target, says in broken:
            swap_link(link, target)
            st, body = d.post("/v2/repository/models/t/load")
            self.assertNotEqual(st, 200, "%s loaded" % says)
            # a load that fails is 400, {"error": message} (the model
            # repository extension's words), never a 500
            self.assertEqual(st, 400, body)
            self.assertIn(says, body["error"])
            st, body = d.get("/v2/models/t/ready")
            self.assertEqual((st, body["version"]), (200, good))
            st, body = d.request("POST", "/v1/models/t/infer",
                                 self.lines[0])
            self.assertEqual((st, body["model_version"]), (200, good))
            st, index = d.post("/v2/repository/index")
            entry = [e for e in index if e["name"] == "t"][0]
            self.assertEqual(entry["state"], "READY")
            self.assertIn("the last load failed", entry["reason"])
            self.assertIn(says, entry["reason"])
        st, body = d.get("/metrics")
        self.assertIn(
            b'canopy_model_loads_total{model="t",result="failed"} 3', body)

    def test_directories_appear_and_disappear(self):
        os.symlink(self.versions[0], os.path.join(self.models, "a"))
        d = self.start("--model-control", "explicit")
        self.assertEqual(d.request("POST", "/v1/models/b/infer",
                                   self.lines[0])[0], 404)
        st, index = d.post("/v2/repository/index", token=None)
        self.assertEqual([e["name"] for e in index], ["a"])
        os.symlink(self.versions[1], os.path.join(self.models, "b"))
        d.p.send_signal(signal.SIGHUP)
        wait_until(lambda: d.get("/v2/models/b/ready")[0] == 200)
        st, body = d.request("POST", "/v1/models/b/infer", self.lines[0])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["model_version"],
                         weights_version(self.versions[1]))
        # b removed while clients use it: accepted requests are answered,
        # later ones are 404, nothing else
        stop = threading.Event()
        statuses = []

        def client():
            while not stop.is_set():
                try:
                    statuses.append(d.request("POST", "/v1/models/b/infer",
                                              self.lines[1])[0])
                except OSError as e:
                    statuses.append(repr(e))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: statuses.count(200) >= 8)  # b serves them
        os.remove(os.path.join(self.models, "b"))
        d.p.send_signal(signal.SIGHUP)
        # the rescan's time depends on the machine's load: wait for it
        # (the clients keep asking meanwhile), then a little more traffic
        wait_until(lambda: 404 in statuses)
        n = len(statuses)
        wait_until(lambda: len(statuses) >= n + 8)
        stop.set()
        for t in threads:
            t.join()
        self.assertTrue(set(statuses) <= {200, 404}, set(statuses))
        self.assertIn(200, statuses)
        self.assertEqual(statuses[-1], 404)
        first404 = statuses.index(404)
        self.assertEqual(d.request("POST", "/v1/models/b/infer",
                                   self.lines[0])[0], 404)
        # b's directory is gone: no longer in the repository's index (its
        # slot is freed once no request holds it)
        # once the last request has let go of b
        st, index = wait_until(
            lambda: d.post("/v2/repository/index", token=None),
            lambda r: len(r[1]) == 1)
        self.assertEqual({e["name"]: e["state"] for e in index},
                         {"a": "READY"})
        self.assertGreater(first404, 0)
        # unloaded through the route: a rescan leaves it unloaded until its
        # files change, then loads the new version
        self.assertEqual(d.post("/v2/repository/models/a/unload",
                                token=None)[0], 200)
        rescans = d.log_count("msg=rescan why=sighup")
        d.p.send_signal(signal.SIGHUP)
        wait_until(lambda: d.log_count("msg=rescan why=sighup") > rescans)
        self.assertEqual(d.get("/v2/models/a/ready")[0], 503)
        swap_link(os.path.join(self.models, "a"), self.versions[2])
        d.p.send_signal(signal.SIGHUP)
        st, body = wait_until(lambda: d.get("/v2/models/a/ready"),
                              lambda r: r[0] == 200)
        self.assertEqual((st, body.get("version")),
                         (200, weights_version(self.versions[2])))
        with open(d.log_path) as f:
            self.assertEqual(f.read().count("msg=model-loading model=a"), 1,
                             "a reloaded only once its files changed")

    def test_guards_on_the_mutating_routes(self):
        os.symlink(self.versions[0], os.path.join(self.models, "a"))
        d = self.start("--model-control", "explicit", "--repository-token",
                       TOKEN)
        for path in ("/v2/repository/models/a/load",
                     "/v2/repository/models/a/unload"):
            self.assertEqual(d.post(path, token=None)[0], 401, path)
            self.assertEqual(d.post(path, token="wrong")[0], 401, path)
            self.assertEqual(d.post(path, token=TOKEN + "x")[0], 401, path)
        self.assertEqual(d.get("/v2/repository/index")[0], 405)
        # a load of a name with no model directory is 404 and leaves no
        # entry behind (junk names once filled the 256 slots for good)
        for k in range(3):
            st, body = d.post("/v2/repository/models/junk%d/load" % k,
                              token=TOKEN)
            self.assertEqual(st, 404, body)
            self.assertIn("no model directory", body["error"])
        # a name that differs from a model's in case only is told it
        st, body = d.post("/v2/repository/models/A/load", token=TOKEN)
        self.assertEqual(st, 404, body)
        self.assertIn("did you mean 'a'?", body["error"])
        # models-dir's parent (and models-dir itself) hold a model's files:
        # '..' and '.' once loaded them as models of those names
        for f in os.listdir(self.versions[0]):
            shutil.copy(os.path.join(self.versions[0], f), self.tmp)
            shutil.copy(os.path.join(self.versions[0], f), self.models)
        for name in ("..", "%2e%2e", ".", "%2E", ".hidden"):
            st, body = d.post("/v2/repository/models/%s/load" % name,
                              token=TOKEN)
            self.assertEqual(st, 404, (name, body))
            self.assertIn("no such model", body["error"])
        st, index = d.post("/v2/repository/index", token=None)
        self.assertEqual([e["name"] for e in index], ["a"])
        self.assertEqual(d.post("/v2/repository/index", token=None)[0], 200,
                         "the index only reads: no token needed")
        # model-control none: the routes refuse, SIGHUP is ignored
        none = Daemon(self.models)
        self.daemons.append(none)
        self.assertEqual(none.post("/v2/repository/models/a/load",
                                   token=None)[0], 403)
        os.symlink(self.versions[1], os.path.join(self.models, "c"))
        none.p.send_signal(signal.SIGHUP)
        # the signal handled, however loaded
        wait_until(lambda: none.log_count("msg=sighup action=ignored"))
        self.assertEqual(none.get("/v2/models/c/ready")[0], 404)
        with open(none.log_path) as f:
            self.assertIn("msg=sighup action=ignored", f.read())

    def test_strict_startup(self):
        os.symlink(self.versions[0], os.path.join(self.models, "a"))
        bad = os.path.join(self.models, "b")
        shutil.copytree(self.versions[1], bad)
        os.truncate(os.path.join(bad, "weights.safetensors"), 100)
        with self.assertRaises(RuntimeError) as cm:
            self.start()  # strict-startup true: exits 1, saying the way out
        self.assertIn("model b:", str(cm.exception))
        self.assertIn("strict-startup false", str(cm.exception))
        d = self.start("--strict-startup", "false")
        self.assertEqual(d.get("/readyz")[0], 200)
        self.assertEqual(d.get("/v2/models/a/ready")[0], 200)
        st, body = d.get("/v2/models/b/ready")
        self.assertEqual(st, 503, body)
        st, index = d.request("POST", "/v2/repository/index")
        self.assertEqual(st, 200)
        entry = [e for e in index if e["name"] == "b"][0]
        self.assertEqual(entry["state"], "UNAVAILABLE")
        self.assertIn("weights.safetensors", entry["reason"])
        names = {m["name"] for m in d.get("/v1/models")[1]["models"]}
        self.assertEqual(names, {"a"})
        # a directory added after start-up was never loaded: UNKNOWN (as
        # Triton says), not UNAVAILABLE, which is b's failed load
        os.symlink(self.versions[0], os.path.join(self.models, "c"))
        st, index = d.request("POST", "/v2/repository/index")
        states = {e["name"]: (e["state"], e.get("reason", "")) for e in index}
        self.assertEqual(states["c"][0], "UNKNOWN", states)
        self.assertIn("not loaded", states["c"][1])
        self.assertEqual(states["b"][0], "UNAVAILABLE", states)

    def test_names_too_long_to_serve(self):
        # a model's name is its directory's, at most 127 bytes; a longer
        # directory was once skipped without a word, and a longer name in a
        # load request was cut to 127 bytes and loaded as the cut name
        os.symlink(self.versions[0], os.path.join(self.models, "a"))
        long_name = "m" * 130
        os.symlink(self.versions[1], os.path.join(self.models, long_name))
        os.symlink(self.versions[2], os.path.join(self.models, "m" * 127))
        with self.assertRaises(RuntimeError) as cm:
            self.start()  # strict-startup true: exits 1, naming it
        self.assertIn("name has 130 bytes", str(cm.exception))
        os.remove(os.path.join(self.models, "m" * 127))
        d = self.start("--strict-startup", "false", "--model-control",
                       "explicit", "--repository-token", TOKEN)
        st, index = d.post("/v2/repository/index", token=None)
        self.assertEqual(st, 200)
        entry = [e for e in index if e["name"] == long_name][0]
        self.assertEqual(entry["state"], "UNAVAILABLE")
        self.assertIn("130 bytes", entry["reason"])
        with open(d.log_path) as f:
            self.assertIn("msg=model-load-failed model=mmm", f.read())
        os.symlink(self.versions[2], os.path.join(self.models, "m" * 127))
        for path in ("/v2/repository/models/%s/load" % long_name,
                     "/v1/models/%s/infer" % long_name,
                     "/v2/models/%s/ready" % long_name):
            st, body = d.post(path, token=TOKEN, body=self.lines[0]) \
                if not path.endswith("ready") else d.get(path)
            err = body["error"]  # /v1's object, the protocol's string
            msg = err["message"] if path.startswith("/v1/") else err
            if path.startswith("/v1/"):
                self.assertEqual(err["code"], "no_such_model")
            self.assertEqual(st, 404, (path, body))
            self.assertIn("at most 127", msg)
        st, index = d.post("/v2/repository/index", token=None)
        states = {e["name"]: e["state"] for e in index}
        self.assertNotEqual(states.get("m" * 127), "READY",
                            "the cut name was not loaded")
        self.assertEqual(states["a"], "READY")

    def test_files_that_are_not_regular(self):
        # A FIFO for weights once hung start-up for good, vocab.txt linked
        # to /dev/zero grew memory without bound, and a model.json that was
        # a directory or a FIFO made the model silently skipped even under
        # strict-startup true. Each is now a load error naming the file.
        os.symlink(self.versions[0], os.path.join(self.models, "a"))
        fifo = os.path.join(self.models, "fifo")
        shutil.copytree(self.versions[1], fifo)
        os.remove(os.path.join(fifo, "weights.safetensors"))
        os.mkfifo(os.path.join(fifo, "weights.safetensors"))
        with self.assertRaises(RuntimeError) as cm:
            self.start()  # strict-startup true: exits 1, naming the file
        self.assertIn("weights.safetensors' is not a regular file (a FIFO)",
                      str(cm.exception))
        self.assertIn("model fifo", str(cm.exception))
        zero = os.path.join(self.models, "zero")
        shutil.copytree(self.versions[2], zero)
        os.remove(os.path.join(zero, "vocab.txt"))
        os.symlink("/dev/zero", os.path.join(zero, "vocab.txt"))
        jdir = os.path.join(self.models, "jdir")
        shutil.copytree(self.versions[1], jdir)
        os.remove(os.path.join(jdir, "model.json"))
        os.mkdir(os.path.join(jdir, "model.json"))
        with self.assertRaises(RuntimeError) as cm:
            self.start()  # the directory is seen before any model loads
        self.assertIn("'jdir': 'model.json' is not a regular file "
                      "(a directory)", str(cm.exception))
        jfifo = os.path.join(self.models, "jfifo")
        shutil.copytree(self.versions[1], jfifo)
        os.remove(os.path.join(jfifo, "model.json"))
        os.mkfifo(os.path.join(jfifo, "model.json"))
        d = self.start("--strict-startup", "false")
        self.assertEqual(d.get("/v2/models/a/ready")[0], 200)
        st, index = d.request("POST", "/v2/repository/index")
        self.assertEqual(st, 200)
        got = {e["name"]: (e["state"], e.get("reason", "")) for e in index}
        self.assertEqual(got["a"][0], "READY")
        for name, why in (("fifo", "weights.safetensors' is not a regular "
                           "file (a FIFO)"),
                          # a symlink out of the model directory (to
                          # /dev/zero) is refused before its kind is read
                          ("zero", "vocab.txt' leads outside the model "
                           "directory"),
                          ("jdir", "'model.json' is not a regular file "
                           "(a directory)"),
                          ("jfifo", "'model.json' is not a regular file "
                           "(a FIFO)")):
            self.assertEqual(got[name][0], "UNAVAILABLE", (name, got))
            self.assertIn(why, got[name][1], name)
        with open(d.log_path) as f:
            log = f.read()
        self.assertIn("msg=model-load-failed model=jfifo ", log)
        self.assertIn("msg=model-load-failed model=zero ", log)


if __name__ == "__main__":
    unittest.main()
