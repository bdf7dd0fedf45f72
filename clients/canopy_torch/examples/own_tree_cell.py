#!/usr/bin/python3
"""A cell of one's own, from docs/cells.md alone: a tree "minimal gated
unit" (one gate per node, used both to reset the children and to mix them
with the candidate), trained briefly in PyTorch to predict each node's
phrase label, traced with canopy_torch.save_cells, served by `canopy
serve`, and asked over HTTP by several clients at once on held-out trees.
Prints the largest difference between the daemon's logits and PyTorch's.

    /usr/bin/python3 clients/canopy_torch/examples/own_tree_cell.py \\
        --canopy build/canopy --data data

Exit status 0 when every node's logits agree to 1e-4.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import canopy_torch as ct  # noqa: E402

H, D = 24, 16


class Leaf(nn.Module):
    """forward(x) -> s: a word's state, a scaled projection."""

    def __init__(self):
        super().__init__()
        self.E = nn.Parameter(torch.randn(D, H) * 0.3)     # used as x @ E
        self.gain = nn.Parameter(torch.ones(H))

    def forward(self, x):
        return torch.tanh(x @ self.E) * self.gain


class MGUNode(nn.Module):
    """forward(s1, s2) -> s: one gate f, read as a reset and as the mix."""

    def __init__(self):
        super().__init__()
        self.Wf = nn.Linear(2 * H, H)
        self.Wn = nn.Linear(2 * H, H)

    def forward(self, s1, s2):
        f = torch.sigmoid(self.Wf(torch.cat([s1, s2], dim=-1)))
        n = torch.tanh(self.Wn(torch.cat([f * s1, f * s2], dim=-1)))
        return (1 - f) * (s1 + s2) * 0.5 + f * n


class TreeMGU(nn.Module):
    def __init__(self, vocab, labels):
        super().__init__()
        self.vocab, self.labels = ct.Vocab(vocab), labels
        self.embed = nn.Embedding(len(vocab), D)
        self.leaf, self.node = Leaf(), MGUNode()
        self.out = nn.Linear(H, len(labels))

    def forward(self, tree):
        """Logits of every node, pre-order, one node at a time."""
        s = [None] * len(tree.nodes)
        for k in reversed(range(len(tree.nodes))):
            n = tree.nodes[k]
            if n.is_leaf():
                s[k] = self.leaf(self.embed(torch.tensor([self.vocab.id(n.word)])))
            else:
                kids = [s[c] for c in n.children] + [torch.zeros(1, H)]
                s[k] = self.node(kids[0], kids[1])
        return self.out(torch.cat(s))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--canopy", default="build/canopy")
    ap.add_argument("--data", default=os.environ.get("CANOPY_DATA",
                                                      "data"))
    ap.add_argument("--train", type=int, default=150)
    ap.add_argument("--test", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with open(os.path.join(a.data, "trees-binary.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(l) for l in f]
    train = rows[:a.train]
    held_out = rows[len(rows) - a.test:]             # never seen in training
    trees = [ct.parse_tree(r["tree"]) for r in train]
    words = sorted({w for t in trees for w in t.leaves()})
    labels = sorted({l for t in trees for l in t.labels()})
    m = TreeMGU(["<unk>"] + words, labels)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for epoch in range(2):
        total = 0.0
        for t in trees:
            y = torch.tensor([labels.index(l) for l in t.labels()])
            loss = F.cross_entropy(m(t), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
        print(f"epoch {epoch}: mean loss {total / len(trees):.3f}")

    tmp = tempfile.mkdtemp(prefix="canopy-own-cell-")
    try:
        ct.save_cells(os.path.join(tmp, "models", "mgu"), "tree",
                      {"leaf": m.leaf, "internal": m.node}, state=H,
                      output=m.out, embed=m.embed, vocab=m.vocab.tokens,
                      labels=labels, model=m)
        port = free_port()
        log = open(os.path.join(tmp, "serve.log"), "w")
        daemon = subprocess.Popen([a.canopy, "serve", "--models-dir",
                                   os.path.join(tmp, "models"), "--port",
                                   str(port)], stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(500):
                try:
                    urllib.request.urlopen(url + "/readyz", timeout=1)
                    break
                except OSError:
                    time.sleep(0.02)
            answers = [None] * len(held_out)

            def client(c):
                for i in range(c, len(held_out), a.clients):
                    body = json.dumps({"instances": [held_out[i]],
                                       "outputs": "all"}).encode()
                    req = urllib.request.Request(url + "/v1/models/mgu/infer",
                                                 data=body)
                    with urllib.request.urlopen(req, timeout=60) as r:
                        answers[i] = json.loads(r.read())
            threads = [threading.Thread(target=client, args=(c,))
                       for c in range(a.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            daemon.terminate()
            daemon.wait(timeout=20)
            log.close()
        worst, nodes, runs = 0.0, 0, set()
        with torch.no_grad():
            for inst, ans in zip(held_out, answers):
                want = m(ct.parse_tree(inst["tree"]))
                got = torch.tensor([nd["logits"] for nd in ans["outputs"][0]["nodes"]])
                worst = max(worst, float((got - want).abs().max()))
                nodes += len(want)
                st = ans["stats"]       # describes the run it joined
                runs.add((st["batches"], st["lower_bound"], st["compute_ms"]))
        print(f"{len(held_out)} held-out trees ({nodes} nodes) over HTTP from "
              f"{a.clients} clients, computed in {len(runs)} runs: "
              f"max |daemon - PyTorch| = {worst:.3g}")
        return 0 if worst <= 1e-4 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
