#!/usr/bin/python3
"""Engine benchmark: `canopy run` instances/s per batching policy.

Prints a Markdown table (median of REPEATS runs, with min..max spread)
for one model over one data file. Measures, never asserts.

usage: scripts/bench/engine.py [--canopy build/canopy] [--family treelstm]
       [--hidden 128] [--embed 128] [--classes 5] [--data FILE]
       [--batch 64] [--repeat 5] [--copies 5] [--outputs root]
"""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time

def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--canopy", default=os.path.join(root, "build", "canopy"))
    ap.add_argument("--family", default="treelstm")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--data", default=os.path.join(
        os.environ.get("CANOPY_DATA") or os.path.join(root, "data"),
        "trees-binary.jsonl"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--copies", type=int, default=5,
                    help="the data file is repeated this many times")
    ap.add_argument("--outputs", default="root")
    ap.add_argument("--policies", default="none,depth,agenda")
    ap.add_argument("--lexicon", help="latticelstm: lexicon for model init")
    ap.add_argument("--model", help="use this model directory as it is")
    ap.add_argument("--extra", default="", help="more canopy run flags")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="canopy-bench-")
    model = a.model or os.path.join(work, a.family)
    if not a.model:
        init = [a.canopy, "model", "init", a.family, model,
                "--hidden", str(a.hidden), "--embed", str(a.embed),
                "--classes", str(a.classes), "--vocab-from", a.data]
        if a.lexicon:
            init += ["--lexicon", a.lexicon]
        subprocess.run(init, check=True, stderr=subprocess.DEVNULL)
    lines = open(a.data).read().splitlines() * a.copies
    data = os.path.join(work, "input.jsonl")
    with open(data, "w") as f:
        f.write("\n".join(lines) + "\n")

    print(f"# {a.family} H={a.hidden} D={a.embed} C={a.classes}, "
          f"{len(lines)} instances ({os.path.basename(a.data)} x{a.copies}), "
          f"batch {a.batch}, outputs={a.outputs}")
    print(f"# {platform.node()} {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}, median of {a.repeat} runs")
    print()
    print("| policy | instances/s (median) | spread (min..max) | batches "
          "| lower bound | batches / bound | kernels |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = None
    for pol in a.policies.split(","):
        rates, summ = [], None
        for _ in range(a.repeat):
            p = subprocess.run([a.canopy, "run", "--model", model, "--input",
                                data, "--policy", pol, "--batch",
                                str(a.batch), "--outputs", a.outputs,
                                "--policy-cache", os.path.join(work, "pc")]
                               + a.extra.split(),
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, check=True)
            summ = json.loads(p.stderr.strip().splitlines()[-1])
            rates.append(summ["instances_per_s"])
        med = statistics.median(rates)
        base = base or med
        print(f"| {pol} | {med:,.0f} | {min(rates):,.0f}..{max(rates):,.0f} "
              f"| {summ['batches']} | {summ['lower_bound']} "
              f"| {summ['batches'] / summ['lower_bound']:.2f} "
              f"| {summ['kernels']} |")
    subprocess.run(["rm", "-rf", work])

if __name__ == "__main__":
    main()
