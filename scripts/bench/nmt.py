#!/usr/bin/python3
"""lstm-nmt: decoding batched across requests vs padded to the longest.

Each instance advances at its own step and leaves the batch when it emits
</s> (program-counter autobatching). A padded decoder runs every instance
of a batch for as many steps as the longest one. This prints, for runs of
64 instances, the decoder steps actually computed (sum of T_i) against the
padded count (sum over runs of 64 x max T_i), and canopy's throughput.
The model leans towards </s> so output lengths vary (the reference's
--eos-bias); weights are random, so lengths, not translations, matter.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def make_model(model, data, hidden, cap):
    """The lstm-nmt model both decoding benchmarks run (this one and
    decode.py): seeded random weights by the reference's --make-model,
    leaning towards </s> (--eos-bias) so that output lengths vary, at most
    cap steps."""
    subprocess.run(["/usr/bin/python3",
                    os.path.join(ROOT, "tests", "reference", "canopy_ref.py"),
                    "--make-model", model, "--family", "lstm-nmt",
                    "--hidden", str(hidden), "--embed", str(hidden),
                    "--seed", "5", "--vocab-from", data, "--eos-bias", "1",
                    "--model-max-decode-len", str(cap)],
                   check=True, stdout=subprocess.DEVNULL)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument("--canopy", default=os.path.join(root, "build", "canopy"))
    ap.add_argument("--data", required=True)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--cap", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="canopy-nmt-")
    model = os.path.join(work, "nmt")
    make_model(model, a.data, a.hidden, a.cap)
    rates, out, summ = [], None, None
    for _ in range(a.repeat):
        p = subprocess.run([a.canopy, "run", "--model", model, "--input",
                            a.data, "--batch", str(a.batch)],
                           capture_output=True, text=True, check=True)
        out = p.stdout
        summ = json.loads(p.stderr.strip().splitlines()[-1])
        rates.append(summ["instances_per_s"])
    steps = []
    for line in out.splitlines():
        n = len(json.loads(line)["output_ids"])
        steps.append(n + 1 if n < a.cap else a.cap)  # the </s> step counts
    batched = sum(steps)
    padded = sum(len(steps[i:i + a.batch]) * max(steps[i:i + a.batch])
                 for i in range(0, len(steps), a.batch))
    print(f"# lstm-nmt H={a.hidden}, {len(steps)} sentences, runs of "
          f"{a.batch}, cap {a.cap}; output steps min/median/max "
          f"{min(steps)}/{statistics.median(steps):.0f}/{max(steps)}")
    print()
    print("| decoding | decoder steps computed | vs batched |")
    print("|---|---:|---:|")
    print(f"| batched across requests (canopy) | {batched} | 1.00 |")
    print(f"| padded to the longest in each run | {padded} | "
          f"{padded / batched:.2f} |")
    print()
    print(f"canopy: {statistics.median(rates):,.0f} instances/s "
          f"(spread {min(rates):,.0f}..{max(rates):,.0f}), "
          f"{summ['batches']} batches, lower bound {summ['lower_bound']}")
    subprocess.run(["rm", "-rf", work])

if __name__ == "__main__":
    main()
