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


if __name__ == "__main__":
    unittest.main()
