#!/usr/bin/python3
"""cells.py - a built-in model against the same model described as
cells (docs/cells.md "model.json: cells"), in one run of this script:
`canopy run` over the same input, alternating, REPEAT times each; prints
the median instances/s, kernels and batches of each, side by side. It
measures; it asserts nothing.

    /usr/bin/python3 scripts/bench/cells.py --canopy build/canopy \\
        --model models/treelstm --input data/trees-binary.jsonl

The cells description is tests/cells/gen_cells.py's for the family, at the
built-in model's hidden and embed sizes, over its vocabulary and weights.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "cells"))
import gen_cells  # noqa: E402


def run(canopy, model, layout, inp, extra):
    p = subprocess.run([canopy, "run", "--model", model, "--layout", layout,
                        "--input", inp, "--threads", "1"] + extra,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, check=True)
    return json.loads(p.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--canopy", default="build/canopy")
    ap.add_argument("--model", required=True, help="a built-in model dir")
    ap.add_argument("--input", required=True)
    ap.add_argument("--times", type=int, default=5,
                    help="copies of the input, one after another")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with open(os.path.join(a.model, "model.json")) as f:
        built = json.load(f)
    fam = built["family"]
    if fam not in gen_cells.ALL:
        sys.exit("no cells description of family %s" % fam)
    tmp = tempfile.mkdtemp(prefix="canopy-bench-cells-")
    try:
        cdir = os.path.join(tmp, "cells")
        os.mkdir(cdir)
        desc = gen_cells.ALL[fam](built["hidden"], built["embed"])
        desc["classes"] = built["classes"]
        if "labels" in built:
            desc["labels"] = built["labels"]
        with open(os.path.join(cdir, "model.json"), "w") as f:
            json.dump(desc, f)
        for name in ("vocab.txt", "weights.safetensors"):
            shutil.copy(os.path.join(a.model, name), cdir)
        inp = os.path.join(tmp, "input.jsonl")
        with open(a.input) as f:
            text = f.read()
        with open(inp, "w") as f:
            f.write(text * a.times)
        cases = [("built-in, compiled (pq)", a.model, "pq"),
                 ("cells, compiled (pq)", cdir, "pq")]
        got = {c[0]: [] for c in cases}
        last = {}
        for _ in range(a.repeat):
            for name, model, layout in cases:
                s = run(a.canopy, model, layout, inp, [])
                got[name].append(s["instances_per_s"])
                last[name] = s
        print("| %s, %d instances | instances/s (median of %d) | kernels | "
              "batches |" % (fam, last[cases[0][0]]["instances"], a.repeat))
        print("|---|---:|---:|---:|")
        for name, _, _ in cases:
            print("| %s | %.0f | %d | %d |" % (
                name, statistics.median(got[name]), last[name]["kernels"],
                last[name]["batches"]))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
