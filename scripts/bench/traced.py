#!/usr/bin/python3
"""A traced cell against the built-in it imitates: the binary Tree-LSTM
written as two PyTorch cells (canopy_torch.save_cells) and the built-in
`treelstm` family, with the same weights, run by `canopy run` on the same
trees in the same process tree, side by side. Measures, never asserts
(but prints the largest difference between the two models' logits).

usage: scripts/bench/traced.py [--canopy build/canopy] [--hidden 64]
       [--trees 400] [--repeat 5] [--threads 1]
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
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import canopy_torch as ct  # noqa: E402


class Leaf(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D, 3 * H)

    def forward(self, x):
        i, o, u = self.W(x).chunk(3, -1)
        c = torch.sigmoid(i) * torch.tanh(u)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], -1)


class Internal(nn.Module):
    def __init__(self, H):
        super().__init__()
        self.H = H
        self.U = nn.Linear(2 * H, 5 * H)

    def forward(self, s1, s2):
        H = self.H
        h1, c1 = s1.split(H, -1)
        h2, c2 = s2.split(H, -1)
        i, f1, f2, o, u = self.U(torch.cat([h1, h2], -1)).chunk(5, -1)
        c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f1) * c1
             + torch.sigmoid(f2) * c2)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], -1)


class Model(nn.Module):
    def __init__(self, V, D, H, C):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.leaf, self.internal = Leaf(D, H), Internal(H)
        self.out = nn.Linear(H, C)


def run(canopy, model, data, extra):
    p = subprocess.run([canopy, "run", "--model", model, "--input", data]
                       + extra, capture_output=True, text=True, check=True)
    return ([json.loads(l) for l in p.stdout.splitlines()],
            json.loads(p.stderr.strip().splitlines()[-1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--canopy", default=os.path.join(ROOT, "build", "canopy"))
    ap.add_argument("--data", default=os.path.join(
        os.environ.get("CANOPY_DATA") or os.path.join(ROOT, "data"),
        "trees-binary.jsonl"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--trees", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    H, D, C = a.hidden, a.embed, 5
    with open(a.data, encoding="utf-8") as f:
        rows = f.read().splitlines()[:a.trees]
    words = []
    for r in rows:
        for w in ct.parse_tree(json.loads(r)["tree"]).leaves():
            if w not in words:
                words.append(w)
    vocab = ["<unk>"] + words
    torch.manual_seed(0)
    builtin = ct.TreeLSTM(vocab, hidden=H, embed=D, classes=C)
    with torch.no_grad():
        for p in builtin.parameters():
            p.uniform_(-0.3, 0.3)
    m = Model(len(vocab), D, H, C)
    with torch.no_grad():       # the same numbers, the user's names
        m.embed.weight.copy_(builtin.embed)
        m.leaf.W.weight.copy_(builtin.leaf.W)
        m.leaf.W.bias.copy_(builtin.leaf.b)
        m.internal.U.weight.copy_(builtin.internal.U)
        m.internal.U.bias.copy_(builtin.internal.b)
        m.out.weight.copy_(builtin.out.W)
        m.out.bias.copy_(builtin.out.b)
    work = tempfile.mkdtemp(prefix="canopy-bench-traced-")
    try:
        data = os.path.join(work, "trees.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
        dirs = {"built-in treelstm": ct.save(builtin, os.path.join(work, "b")),
                "traced cells": ct.save_cells(
                    os.path.join(work, "t"), "tree",
                    {"leaf": m.leaf, "internal": m.internal}, state=2 * H,
                    hidden=(0, H), output=m.out, embed=m.embed, vocab=vocab,
                    model=m)}
        configs = [("built-in treelstm", "pq"), ("traced cells", "pq"),
                   ("traced cells", "naive")]
        outs, rate, summ = {}, {}, {}
        for _ in range(a.repeat):           # interleaved, so load hits all
            for name, layout in configs:
                o, s = run(a.canopy, dirs[name], data,
                           ["--layout", layout, "--threads", str(a.threads),
                            "--outputs", "all"])
                outs[name, layout] = o
                rate.setdefault((name, layout), []).append(s["instances_per_s"])
                summ[name, layout] = s
        ref = outs["built-in treelstm", "pq"]
        print(f"{len(rows)} trees of {os.path.basename(a.data)}, H = {H}, "
              f"D = {D}, agenda, batch 64, {a.threads} BLAS thread(s), "
              f"median of {a.repeat} (min..max)\n")
        print("| model | layout | instances/s | batches | kernels | "
              "bytes copied in cells | max |Δ logits| vs built-in |")
        print("|---|---|---|---|---|---|---|")
        for name, layout in configs:
            r = rate[name, layout]
            d = max(abs(x - y) for oa, ob in zip(outs[name, layout], ref)
                    for na, nb in zip(oa["nodes"], ob["nodes"])
                    for x, y in zip(na["logits"], nb["logits"]))
            s = summ[name, layout]
            print(f"| {name} | {layout} | {statistics.median(r):,.0f} "
                  f"({min(r):,.0f}..{max(r):,.0f}) | {s['batches']} | "
                  f"{s['kernels']} | {s['cell_bytes_copied']} | {d:.2g} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
