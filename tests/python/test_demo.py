"""scripts/demo.sh, the README's first command: a
second start reuses the build (nothing compiled or linked) and the demo
models (not remade), CANOPY_PORT and CANOPY_MODELS_DIR are honoured (the
models outside the checkout here), it says what it does, and --help says
what it installs.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_demo.py
(env CANOPY_BIN: its directory is the build the demo reuses).
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest
import urllib.request
from daemon_util import free_port, wait_ready

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.abspath(os.environ.get("CANOPY_BIN",
                                     os.path.join(ROOT, "build", "canopy")))
DEMO = os.path.join(ROOT, "scripts", "demo.sh")


class Demo(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="canopy-demo-")
        self.models = os.path.join(self.tmp, "models")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self):
        """Runs the demo until it serves the tagger, then Ctrl-C; returns
        its stderr."""
        port = free_port()
        env = dict(os.environ, CANOPY_PORT=str(port),
                   CANOPY_MODELS_DIR=self.models,
                   CANOPY_BUILD_DIR=os.path.dirname(BIN))
        err = open(os.path.join(self.tmp, "demo.err"), "w+")
        p = subprocess.Popen([DEMO, "--warmup", "false"], env=env,
                             stdout=subprocess.DEVNULL, stderr=err)
        try:
            url = f"http://127.0.0.1:{port}"
            # a guard, not a wait: the first start may build and make models
            self.assertTrue(wait_ready(url, p, 300.0),
                            "the demo exited or never became ready")
            req = urllib.request.Request(
                url + "/v1/models/tagger/infer",
                data=b'{"text": "The cat sat on the mat ."}')
            out = json.load(urllib.request.urlopen(req, timeout=10))
            self.assertEqual(len(out["outputs"][0]["tags"]), 7)
        finally:
            p.send_signal(signal.SIGINT)
            rc = p.wait(30)
        self.assertEqual(rc, 0)
        err.seek(0)
        text = err.read()
        err.close()
        return text

    def test_second_start_reuses_build_and_models(self):
        first = self.start()
        self.assertIn("made ", first)
        self.assertIn(f"under {self.models}/", first)
        self.assertIn("(CANOPY_PORT)", first)
        stamps = {d: os.stat(os.path.join(self.models, d, "model.json"))
                  .st_mtime_ns for d in os.listdir(self.models)}
        self.assertGreaterEqual(len(stamps), 8, stamps)
        second = self.start()
        self.assertIn(f"reusing {os.path.dirname(BIN)}/", second)
        self.assertIn(f"reusing the {len(stamps)} models", second)
        for word in ("Compiling", "Linking", "installing", "meson setup"):
            self.assertNotIn(word, second)
        self.assertEqual(stamps, {
            d: os.stat(os.path.join(self.models, d, "model.json"))
            .st_mtime_ns for d in os.listdir(self.models)})

    def test_help_says_what_it_installs(self):
        p = subprocess.run([DEMO, "--help"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        for word in ("CANOPY_PORT", "CANOPY_MODELS_DIR", "libuv1-dev",
                     "meson", "git ignores"):
            self.assertIn(word, p.stdout)


if __name__ == "__main__":
    unittest.main()
