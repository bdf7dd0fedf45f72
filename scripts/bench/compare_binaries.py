#!/usr/bin/python3
"""Two canopy binaries side by side: instances/s of `canopy run` on the
same models, inputs and flags, interleaved, median of --reps.

For example, products by gemm.c against OpenBLAS: build the old
commit in another worktree, then
  scripts/bench/compare_binaries.py OLD/build/canopy build/canopy
Prints one row per (family, H, batch, jobs) with both figures and their
ratio (new / old). Runs whatever OPENBLAS_CORETYPE the environment has;
say which when quoting it. --copies repeats the --lines lines (runs of
1,024 need more than data/'s 400); --cpu adds instances per CPU second of
the process (user + system), the steadier figure on a shared machine.
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
p.add_argument("--copies", type=int, default=1)
p.add_argument("--cpu", action="store_true")
a = p.parse_args()

FILES = {"treelstm": "trees-binary.jsonl", "bilstm-tagger": "sequences.jsonl",
         "childsum-treelstm": "trees-nary.jsonl", "lstm-nmt": "sequences.jsonl",
         "latticegru": "dags.jsonl", "latticelstm": "lattices.jsonl",
         "mvrnn": "trees-binary.jsonl", "treegru": "trees-binary.jsonl"}
work = tempfile.mkdtemp(prefix="canopy-cmp-")


def ips(binary, model, inp, batch, jobs):
    """(instances per wall second, per CPU second) of one run."""
    p = subprocess.Popen([binary, "run", "--model", model, "--input", inp,
                          "--batch", str(batch), "--jobs", str(jobs)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"{binary} run failed: {err.decode()[-300:]}")
    s = json.loads(err.decode().strip().splitlines()[-1])
    return s["instances_per_s"], s["instances"] / max(ru.ru_utime + ru.ru_stime, 1e-9)


print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}, "
      f"{os.cpu_count()} cores, median of {a.reps}")
print(f"{'family':<16}{'H':>5}{'batch':>7}{'jobs':>5}{'old inst/s':>13}"
      f"{'new inst/s':>13}{'new/old':>9}" +
      (f"{'old /CPU-s':>13}{'new /CPU-s':>13}{'new/old':>9}" if a.cpu else ""))
for fam in a.families.split(","):
    src = os.path.join(a.data, FILES[fam])
    inp = os.path.join(work, fam + ".jsonl")
    with open(src) as f, open(inp, "w") as o:
        o.writelines(f.readlines()[:a.lines] * a.copies)
    for H in map(int, a.hidden.split(",")):
        model = os.path.join(work, f"{fam}-{H}")
        lex = (["--lexicon", os.path.join(a.data, "lexicon.txt")]
               if fam == "latticelstm" else [])
        subprocess.run([a.new, "model", "init", fam, model, "--hidden", str(H),
                        "--embed", str(H), "--vocab-from", src, "--seed", "1"]
                       + lex, check=True, stderr=subprocess.DEVNULL)
        for batch in map(int, a.batch.split(",")):
            for jobs in map(int, a.jobs.split(",")):
                old, new = [], []
                for _ in range(a.reps):
                    old.append(ips(a.old, model, inp, batch, jobs))
                    new.append(ips(a.new, model, inp, batch, jobs))
                mo = statistics.median(x[0] for x in old)
                mn = statistics.median(x[0] for x in new)
                co = statistics.median(x[1] for x in old)
                cn = statistics.median(x[1] for x in new)
                print(f"{fam:<16}{H:>5}{batch:>7}{jobs:>5}{mo:>13.1f}"
                      f"{mn:>13.1f}{mn / mo:>9.2f}" +
                      (f"{co:>13.1f}{cn:>13.1f}{cn / co:>9.2f}" if a.cpu
                       else ""), flush=True)
