"""Documentation slips: what the docs and the programs'
own help tell a reader must hold in this tree.

- every `outputs` value the docs show is one the daemon accepts (root or
  all; docs/cells.md once documented `outputs: hidden`, which is refused:
  hidden vectors are `"return_hidden": true`);
- every *.md file named by `canopy run --help`, `canopy serve --help`,
  `canopy-import --help` and the HELP lines of server/metrics.c exists
  under that name (they once said API.md and MODELS.md, files that live
  outside the repository);
- no doc calls a package `pip install ./clients` installs "not
  installed" (docs/cells.md once did, of canopy_torch).

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_docs.py
(env CANOPY_BIN as for the other tests).
"""
import glob
import os
import re
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
PY = "/usr/bin/python3"

# `outputs: X`, "outputs": "X" and outputs=X in prose and examples
OUTPUTS = re.compile(r'''["`]?outputs["`]?\s*[:=]\s*["`]?([a-z_]+)''')
MD = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Za-z_][\w-]*\.md)\b")

# A path into one of the tree's folders, as the docs write it.
TREE_PATH = re.compile(r"(?<![\w./-])((?:scripts|deploy|tests|tools|config|"
                       r"clients|docs|core|server|backends|cli)/[\w./*-]*"
                       r"[\w/*])")
# What the docs write like a path of this tree but is not one.
OUTSIDE = {
    # KServe's repository: the ServingRuntime CRD (docs/deploy.md)
    "config/crd/full/serving.kserve.io_servingruntimes.yaml",
    # the name tests/check_layout.py gives server/serve.h's part
    "server/public",
}


def md_refs(text):
    return set(MD.findall(text))


def exists(ref):
    """docs/api.md, api.md (a doc's sibling) or README.md in the tree."""
    return any(os.path.exists(os.path.join(ROOT, d, ref))
               for d in ("", "docs"))


class Docs(unittest.TestCase):
    def test_outputs_values_are_accepted(self):
        bad = []
        for path in glob.glob(os.path.join(ROOT, "docs", "*.md")) + \
                [os.path.join(ROOT, "README.md")]:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            for n, line in enumerate(lines, 1):
                for v in OUTPUTS.findall(line):
                    if v not in ("root", "all"):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{n}: "
                                   f"outputs {v!r}: {line.strip()[:100]}")
        self.assertEqual(bad, [], "\n".join(bad))
        with open(os.path.join(ROOT, "docs", "cells.md")) as f:
            cells = f.read()
        self.assertIn('"return_hidden": true', cells)

    def help_text(self, argv):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreater(len(p.stdout), 200, argv)
        return p.stdout

    def test_installable_packages_are_not_called_uninstallable(self):
        """A package clients/pyproject.toml installs is not "not
        installed" / "not installable" in any doc (docs/cells.md once said
        so of canopy_torch), and the pip line the docs show for it is the
        one tests/python/test_install.py runs."""
        with open(os.path.join(ROOT, "clients", "pyproject.toml")) as f:
            pkgs = re.search(r"^packages\s*=\s*\[([^\]]*)\]", f.read(),
                             re.M).group(1)
        pkgs = {p for p in re.findall(r'"([\w.]+)"', pkgs) if "." not in p}
        self.assertIn("canopy_torch", pkgs)
        docs = glob.glob(os.path.join(ROOT, "docs", "*.md")) + [
            os.path.join(ROOT, "README.md"),
            os.path.join(ROOT, "clients", "README.md")]
        for path in docs:
            with open(path) as f:
                raw = f.read()
            text = " ".join(raw.split())
            for sentence in re.split(r"(?<=[.:;])\s", text):
                for p in pkgs:
                    if p in sentence:
                        self.assertNotRegex(
                            sentence, r"not (installed|installable)",
                            f"{os.path.relpath(path, ROOT)}: {sentence}")
            # command lines (a line that starts with the pip command)
            for line in re.findall(r"^\s*\S*pip install [^\n]*\./clients\b",
                                   raw, re.M):
                self.assertIn("--no-build-isolation --no-index ./clients",
                              line, os.path.relpath(path, ROOT))

    def test_help_names_files_that_exist(self):
        texts = {
            "canopy run --help": self.help_text([BIN, "run", "--help"]),
            "canopy serve --help": self.help_text([BIN, "serve", "--help"]),
            "canopy-import --help": self.help_text(
                [PY, os.path.join(ROOT, "clients", "canopy-import"),
                 "--help"]),
        }
        with open(os.path.join(ROOT, "server", "metrics.c")) as f:
            texts["server/metrics.c"] = f.read()
        seen = 0
        for what, text in texts.items():
            for ref in md_refs(text):
                seen += 1
                self.assertTrue(exists(ref), f"{what} names {ref}, which is "
                                "no file of the repository")
        self.assertGreaterEqual(seen, 4, "no .md reference found at all: "
                                "is the pattern still right?")

    def test_paths_named_in_docs_exist(self):
        """Every path into the tree's folders that README.md, docs/*.md,
        scripts/bench/README.md and tests/README.md name (deploy/nginx.conf,
        scripts/bench/daemon.sh, tests/deploy/...) is a file or folder of
        the checkout, so a file that moves takes its references with it.
        Placeholders (an upper-case NAME, a name cut at `_`) and what OUTSIDE
        lists (another project's paths, a part's name) are not checked."""
        docs = glob.glob(os.path.join(ROOT, "docs", "*.md")) + [
            os.path.join(ROOT, "README.md"),
            os.path.join(ROOT, "scripts", "bench", "README.md"),
            os.path.join(ROOT, "tests", "README.md")]
        bad, seen = [], 0
        for path in docs:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    for ref in TREE_PATH.findall(line):
                        ref = ref.rstrip(".")
                        if ref in OUTSIDE or re.search(r"[A-Z]{3}|_$", ref):
                            continue
                        seen += 1
                        if not glob.glob(os.path.join(ROOT, ref)):
                            bad.append(f"{os.path.relpath(path, ROOT)}:{n}: "
                                       f"{ref}")
        self.assertEqual(bad, [], "paths that are no file of the tree:\n"
                         + "\n".join(bad))
        self.assertGreater(seen, 100, "few paths found: is the pattern "
                           "still right?")

    def test_every_benchmark_script_is_in_the_bench_readme(self):
        """scripts/bench/README.md has a row for every script beside it:
        what it measures, the command and the table it produces."""
        bench = os.path.join(ROOT, "scripts", "bench")
        with open(os.path.join(bench, "README.md")) as f:
            rows = [l for l in f if l.startswith("| `")]
        named = {re.match(r"\| `([^`]+)`", r).group(1) for r in rows}
        missing = sorted(n for n in os.listdir(bench)
                         if n != "README.md" and not n.startswith(".")
                         and n != "__pycache__" and n not in named)
        self.assertEqual(missing, [], "scripts/bench/ scripts with no row "
                         "in scripts/bench/README.md")

    def test_every_test_file_is_in_the_tests_readme(self):
        """tests/README.md says in one line what each test file proves:
        every tests/test_*.c, tests/python/test_*.py and
        tests/deploy/test_*.py has its row there."""
        with open(os.path.join(ROOT, "tests", "README.md")) as f:
            rows = {r.split(" | ")[0][2:] for r in f if r.startswith("| ")}
        files = [os.path.relpath(p, ROOT) for pattern in (
            "tests/test_*.c", "tests/python/test_*.py",
            "tests/deploy/test_*.py") for p in
            glob.glob(os.path.join(ROOT, pattern))]
        self.assertGreater(len(files), 50)
        self.assertEqual(sorted(set(files) - rows), [],
                         "test files with no row in tests/README.md")


if __name__ == "__main__":
    unittest.main()
