"""`pip install ./clients`, as README.md shows it: into a
venv made by /usr/bin/python3 with --system-site-packages (Debian's
python3-torch), offline (--no-build-isolation --no-index, Debian's
setuptools), from a copy of clients/ (pip builds in the tree it is given).
Then the installed commands, not the checkout's scripts:

- canopy-import, canopy-client and canopy-loadgen --help;
- canopy_torch imported from the venv writes a checkpoint, canopy-import
  converts and verifies it (a real `canopy run`), `canopy serve` serves
  the result, canopy-client sends it a JSONL file and canopy-loadgen a
  few requests;
- canopy-import without --canopy finds the binary through CANOPY_BIN,
  PATH, or the build/ of the checkout it runs in;
- canopy-import in a Python without torch names the missing package and
  how to get it, instead of a ModuleNotFoundError traceback;
- the installed version is meson.build's.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_install.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from daemon_util import free_port, wait_ready

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.abspath(os.environ.get("CANOPY_BIN",
                                     os.path.join(ROOT, "build", "canopy")))
DATA = os.environ.get("CANOPY_DATA",
                      os.path.join(ROOT, "data"))
PY = "/usr/bin/python3"


class Installed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-install-")
        src = os.path.join(cls.tmp, "clients")
        shutil.copytree(os.path.join(ROOT, "clients"), src,
                        ignore=shutil.ignore_patterns(
                            "__pycache__", "build", "*.egg-info"))
        cls.venv = os.path.join(cls.tmp, "venv")
        cls.run_ok([PY, "-m", "venv", "--system-site-packages", cls.venv])
        cls.bin = os.path.join(cls.venv, "bin")
        cls.py = os.path.join(cls.bin, "python")
        cls.run_ok([cls.py, "-m", "pip", "install", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--quiet",
                    src])
        # nothing of the checkout on the path: the venv's own files only
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "PYTHONHOME")}
        cls.env["PATH"] = cls.bin + os.pathsep + os.environ.get("PATH", "")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def run_ok(argv, **kw):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                           **kw)
        if p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {p.returncode}\n"
                                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    def cmd(self, name):
        path = os.path.join(self.bin, name)
        self.assertTrue(os.access(path, os.X_OK), f"{name} not installed")
        return path

    def test_help(self):
        for name in ("canopy-import", "canopy-client", "canopy-loadgen"):
            p = self.run_ok([self.cmd(name), "--help"], env=self.env,
                            cwd=self.tmp)
            self.assertTrue(p.stdout.startswith(f"usage: {name} "),
                            p.stdout[:200])
        p = self.run_ok([self.cmd("canopy-import"), "--help"], env=self.env,
                        cwd=self.tmp)
        self.assertIn("torch-tagger -> bilstm-tagger", p.stdout)

    def test_version_is_mesons(self):
        with open(os.path.join(ROOT, "meson.build")) as f:
            want = re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)
        p = self.run_ok([self.py, "-c", "import importlib.metadata as m; "
                         "print(m.version('canopy-tools'))"], env=self.env,
                        cwd=self.tmp)
        self.assertEqual(p.stdout.strip(), want)

    def test_convert_serve_and_client(self):
        work = os.path.join(self.tmp, "work")
        os.makedirs(work)
        vocab = ["<unk>", "the", "cat", "sat", "on", "mat", "."]
        vfile = os.path.join(work, "vocab.txt")
        with open(vfile, "w") as f:
            f.write("\n".join(vocab) + "\n")
        ckpt = os.path.join(work, "ckpt.pt")
        p = self.run_ok([self.py, "-c",
                         "import sys, torch, canopy_torch as ct\n"
                         "print(ct.__file__)\n"
                         "torch.manual_seed(3)\n"
                         "v = open(sys.argv[1]).read().split()\n"
                         "m = ct.TreeLSTM(v, hidden=6, embed=5, classes=3)\n"
                         "torch.save(m.state_dict(), sys.argv[2])\n",
                         vfile, ckpt], env=self.env, cwd=work)
        self.assertTrue(p.stdout.startswith(self.venv), "canopy_torch came "
                        f"from {p.stdout.strip()}, not the venv")
        models = os.path.join(work, "models")
        out = os.path.join(models, "sst")
        p = self.run_ok([self.cmd("canopy-import"), "canopy", ckpt, out,
                         "--vocab", vfile, "--canopy", BIN], env=self.env,
                        cwd=work)
        self.assertIn("(verified)", p.stderr)
        self.assertTrue(os.path.isfile(os.path.join(out, "model.json")))

        port = free_port()
        log = open(os.path.join(work, "serve.log"), "w")
        d = subprocess.Popen([BIN, "serve", "--models-dir", models, "--port",
                              str(port)], stderr=log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, d, 10.0)
            inp = os.path.join(work, "in.jsonl")
            trees = ["(S (W the) (N cat))", "(S (W the) (S (V sat) (PU .)))",
                     "(S (W on) (S (W the) (N mat)))"]
            with open(inp, "w") as f:
                for t in trees:
                    f.write(json.dumps({"tree": t}) + "\n")
            p = self.run_ok([self.cmd("canopy-client"), "--url", url,
                             "--model", "sst", "--input", inp], env=self.env,
                            cwd=work)
            outs = [json.loads(l) for l in p.stdout.splitlines()]
            self.assertEqual(len(outs), 3, p.stdout)
            for o in outs:
                self.assertIn(o["label"], (0, 1, 2), o)
                self.assertEqual(len(o["logits"]), 3)
            p = self.run_ok([self.cmd("canopy-loadgen"), "--url", url,
                             "--model", "sst", "--input", inp, "--requests",
                             "20", "--concurrency", "2"], env=self.env,
                            cwd=work)
            res = json.loads(p.stdout.splitlines()[-1])
            self.assertFalse(res["errors"], res)
        finally:
            d.terminate()
            d.wait(30)
            log.close()

    def test_finds_canopy_without_flag(self):
        """The installed canopy-import lives in the venv, which holds no
        build: without --canopy it verifies with $CANOPY_BIN, else `canopy`
        on PATH, else the build/canopy of the checkout it runs in (as
        README.md's recipe runs it), and else says where it looked."""
        work = os.path.join(self.tmp, "find")
        os.makedirs(work)
        vfile = os.path.join(work, "vocab.txt")
        with open(vfile, "w") as f:
            f.write("<unk>\nthe\ncat\nsat\n")
        ckpt = os.path.join(work, "ckpt.pt")
        self.run_ok([self.py, "-c",
                     "import sys, torch, canopy_torch as ct\n"
                     "torch.manual_seed(5)\n"
                     "v = open(sys.argv[1]).read().split()\n"
                     "m = ct.TreeLSTM(v, hidden=4, embed=3, classes=2)\n"
                     "torch.save(m.state_dict(), sys.argv[2])\n",
                     vfile, ckpt], env=self.env, cwd=work)
        ondir = os.path.join(work, "onpath")
        os.makedirs(ondir)
        os.symlink(BIN, os.path.join(ondir, "canopy"))
        checkout = os.path.join(work, "checkout")
        os.makedirs(os.path.join(checkout, "build"))
        open(os.path.join(checkout, "meson.build"), "w").close()
        os.symlink(BIN, os.path.join(checkout, "build", "canopy"))
        # no canopy anywhere on this PATH but where a case puts it
        base = {k: v for k, v in self.env.items() if k != "CANOPY_BIN"}
        base["PATH"] = os.pathsep.join([self.bin, "/usr/bin", "/bin"])
        cases = [
            ("CANOPY_BIN", dict(base, CANOPY_BIN=BIN), work, BIN),
            ("PATH", dict(base, PATH=ondir + os.pathsep + base["PATH"]),
             work, os.path.join(ondir, "canopy")),
            ("checkout", base, checkout,
             os.path.join(checkout, "build", "canopy")),
        ]
        for i, (what, env, cwd, want) in enumerate(cases):
            out = os.path.join(work, "out%d" % i)
            p = subprocess.run([self.cmd("canopy-import"), "canopy", ckpt,
                                out, "--vocab", vfile], env=env, cwd=cwd,
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, f"{what}: {p.stderr}")
            self.assertIn(f"verifying with {want} on", p.stderr, what)
            self.assertIn("(verified)", p.stderr, what)
        p = subprocess.run([self.cmd("canopy-import"), "canopy", ckpt,
                            os.path.join(work, "none"), "--vocab", vfile],
                           env=base, cwd=work, capture_output=True,
                           text=True, timeout=600)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("cannot find the canopy binary", p.stderr)
        self.assertIn("no canopy on $PATH", p.stderr)
        self.assertIn("set CANOPY_BIN", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(work, "none")))

    def test_missing_torch_is_named(self):
        """A Python whose torch cannot be imported (a torch.py on
        PYTHONPATH that raises as a missing module does): the message
        names the package and how to install it, exit 2, no traceback."""
        fake = os.path.join(self.tmp, "notorch")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "torch.py"), "w") as f:
            f.write("raise ModuleNotFoundError(\"No module named 'torch'\", "
                    "name='torch')\n")
        env = dict(self.env, PYTHONPATH=fake)
        p = subprocess.run([self.cmd("canopy-import"), "--help"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("canopy-import: needs the Python package 'torch'",
                      p.stderr)
        self.assertIn("python3-torch", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        # the client needs no torch
        p = subprocess.run([self.cmd("canopy-client"), "--help"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    unittest.main()
