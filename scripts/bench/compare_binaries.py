#!/usr/bin/python3
"""Two canopy binaries side by side: instances/s of `canopy run` on the
same models, inputs and flags, interleaved, median of --reps.

Made for issue 32 (products by gemm.c against OpenBLAS): build the old
commit in another worktree, then
  scripts/bench/compare_binaries.py OLD/build/canopy build/canopy
Prints one row per (family, H, batch, jobs) with both figures and their
ratio (new / old). Runs whatever OPENBLAS_CORETYPE the environment has;
say which when quoting it.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

p = argparse.ArgumentParser()
p.add_argument("old")
p.add_argument("new")
p.add_argument("--data", default=os.environ.get(
    "CANOPY_DATA", os.path.join(os.path.dirname(__file__), "../../data")))
p.add_argument("--hidden", default="128,512")
p.add_argument("--batch", default="1,8,64")
p.add_argument("--jobs", default="1,2")
p.add_argument("--families", default="treelstm,bilstm-tagger")
p.add_argument("--lines", type=int, default=400)
p.add_argument("--reps", type=int, default=5)
a = p.parse_args()

FILES = {"treelstm": "trees-binary.jsonl", "bilstm-tagger": "sequences.jsonl",
         "childsum-treelstm": "trees-nary.jsonl", "lstm-nmt": "sequences.jsonl",
         "latticegru": "dags.jsonl"}
work = tempfile.mkdtemp(prefix="canopy-cmp-")


def ips(binary, model, inp, batch, jobs):
    out = subprocess.run([binary, "run", "--model", model, "--input", inp,
                          "--batch", str(batch), "--jobs", str(jobs)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         check=True)
    return json.loads(out.stderr.decode().strip().splitlines()[-1])["instances_per_s"]


print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}, "
      f"{os.cpu_count()} cores, median of {a.reps}")
print(f"{'family':<16}{'H':>5}{'batch':>7}{'jobs':>5}{'old inst/s':>13}"
      f"{'new inst/s':>13}{'new/old':>9}")
for fam in a.families.split(","):
    src = os.path.join(a.data, FILES[fam])
    inp = os.path.join(work, fam + ".jsonl")
    with open(src) as f, open(inp, "w") as o:
        o.writelines(f.readlines()[:a.lines])
    for H in map(int, a.hidden.split(",")):
        model = os.path.join(work, f"{fam}-{H}")
        subprocess.run([a.new, "model", "init", fam, model, "--hidden", str(H),
                        "--embed", str(H), "--vocab-from", src, "--seed", "1"],
                       check=True, stderr=subprocess.DEVNULL)
        for batch in map(int, a.batch.split(",")):
            for jobs in map(int, a.jobs.split(",")):
                old, new = [], []
                for _ in range(a.reps):
                    old.append(ips(a.old, model, inp, batch, jobs))
                    new.append(ips(a.new, model, inp, batch, jobs))
                mo, mn = statistics.median(old), statistics.median(new)
                print(f"{fam:<16}{H:>5}{batch:>7}{jobs:>5}{mo:>13.1f}"
                      f"{mn:>13.1f}{mn / mo:>9.2f}", flush=True)
