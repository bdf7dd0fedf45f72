"""The canopy binary's command line:

- `canopy --version` and `canopy serve --version` print meson's project
  version and `git describe` of the checkout at build time (a tree without
  .git is tests/deploy/test_image.py's: the image's build context);
- `canopy run` prints a progress line on stderr when stderr is a
  terminal (a pty here), and none when it is not.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_cli.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from daemon_util import BIN, DATA, ROOT


def project_version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        return re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)


class Version(unittest.TestCase):
    def version(self, *argv):
        p = subprocess.run([BIN] + list(argv), capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def test_version_names_project_and_commit(self):
        v = self.version("--version")
        self.assertEqual(self.version("serve", "--version"), v)
        self.assertEqual(self.version("run", "--version"), v)
        self.assertTrue(v.startswith(f"canopy {project_version()} ("), v)
        if not os.path.exists(os.path.join(ROOT, ".git")) or \
                shutil.which("git") is None:
            self.assertIn("not built from a git checkout", v)
            return
        want = subprocess.run(["git", "-C", ROOT, "describe", "--tags",
                               "--always"], capture_output=True, text=True,
                              check=True).stdout.strip()
        m = re.fullmatch(r"canopy \S+ \(git (\S+)\)\n", v)
        self.assertIsNotNone(m, v)
        # the binary is rebuilt by `meson test`; -dirty when the tree is
        self.assertIn(m.group(1), (want, want + "-dirty"))


def run_on_pty(argv, env=None, stdin=None):
    """Runs argv with stderr on a pseudo-terminal (stdout a pipe); returns
    (status, stdout, what the terminal got)."""
    import pty
    import threading
    master, slave = pty.openpty()
    got = []

    def drain():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:   # EIO: the child closed the terminal
                break
            if not b:
                break
            got.append(b)
    t = threading.Thread(target=drain)
    t.start()
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=slave,
                           input=stdin, env=env, timeout=300)
    finally:
        os.close(slave)
        t.join(10)
        os.close(master)
    return p.returncode, p.stdout, b"".join(got).decode("utf-8", "replace")


class Progress(unittest.TestCase):
    """A progress line while a long run or import works, on a
    terminal only. CANOPY_PROGRESS_AFTER_S=0 makes every run "long"."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-cli-")
        data = os.path.join(DATA, "trees-binary.jsonl")
        cls.model = os.path.join(cls.tmp, "treelstm")
        subprocess.run([BIN, "model", "init", "treelstm", cls.model,
                        "--hidden", "8", "--embed", "8", "--classes", "3",
                        "--vocab-from", data], check=True,
                       capture_output=True)
        with open(data, encoding="utf-8") as f:
            lines = f.read().splitlines()[:200]
        cls.input = os.path.join(cls.tmp, "in.jsonl")
        with open(cls.input, "w", encoding="utf-8") as f:
            f.write("\n".join(lines * 10) + "\n")
        cls.n = len(lines) * 10
        cls.env = dict(os.environ, CANOPY_PROGRESS_AFTER_S="0")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_argv(self):
        return [BIN, "run", "--model", self.model, "--input", self.input,
                "--batch", "8", "--jobs", "1"]

    def test_run_progress_on_a_terminal(self):
        rc, out, term = run_on_pty(self.run_argv(), env=self.env)
        self.assertEqual(rc, 0, term)
        self.assertEqual(len(out.splitlines()), self.n)
        self.assertRegex(term, r"\r\x1b\[Kcanopy run: \d+ instances, 0 "
                         r"errors, \d+/s, \d+% read")
        # erased before the summary, which is the last line as before
        last = term.replace("\r\n", "\n").rstrip("\n").split("\n")[-1]
        self.assertTrue(last.split("\r\x1b[K")[-1].startswith(
            "{\"instances\": %d" % self.n), repr(last[:80]))

    def test_run_no_progress_in_a_pipe(self):
        p = subprocess.run(self.run_argv(), capture_output=True, text=True,
                           env=self.env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("canopy run:", p.stderr)
        self.assertNotIn("\r", p.stderr)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)

    def import_argv(self, out):
        ckpt = os.path.join(self.tmp, "ckpt.pt")
        if not os.path.exists(ckpt):
            subprocess.run(["/usr/bin/python3", "-c",
                            "import sys, torch\n"
                            "sys.path.insert(0, sys.argv[3])\n"
                            "from canopy_torch import load\n"
                            "torch.save(load(sys.argv[1]).state_dict(), "
                            "sys.argv[2])", self.model, ckpt,
                            os.path.join(ROOT, "clients")], check=True)
        return ["/usr/bin/python3", os.path.join(ROOT, "clients",
                                                 "canopy-import"),
                "canopy", ckpt, out, "--vocab",
                os.path.join(self.model, "vocab.txt"), "--canopy", BIN,
                "--check", self.input]

    def test_import_progress_on_a_terminal_only(self):
        out = os.path.join(self.tmp, "imported")
        rc, _, term = run_on_pty(self.import_argv(out), env=self.env)
        self.assertEqual(rc, 0, term)
        self.assertRegex(term, r"\r\x1b\[Kcanopy-import: the PyTorch "
                         r"reference: \d+/%d instances" % self.n)
        self.assertIn("\r\x1b[Kcanopy-import: canopy run on %d instances"
                      % self.n, term)
        self.assertIn("(verified)", term)
        p = subprocess.run(self.import_argv(out + "2"), capture_output=True,
                           text=True, env=self.env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("\r", p.stderr)
        self.assertNotIn("the PyTorch reference:", p.stderr)
        self.assertNotIn("canopy run on", p.stderr)
        self.assertIn("(verified)", p.stderr)
