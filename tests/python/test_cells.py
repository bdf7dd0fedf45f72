"""Bring your own cell (docs/cells.md): three cells that are not built in,
written here as plain PyTorch modules, traced by canopy_torch.save_cells
and computed by the C engine.

- a peephole Tree-LSTM (binary trees, peephole weights on the cells),
- a ReLU tree GRU (binary trees, ReLU candidate, mean of the children),
- an Elman RNN tagger (sequence, tanh(W x + h U + b)).

Each is traced and saved; its model.json is run by `canopy run` on real
trees and sentences from data/ under every policy and both IR
layouts (naive, pq), batched (--batch 64) and one instance a run, and must
equal the module's own forward to 1e-4; the tagger is also served by
`canopy serve` on a free port and asked over HTTP, requests in parallel.
The tracer is also checked without the engine: the saved JSON,
interpreted op by op (canopy_torch.cells_ref), equals the module; and it
refuses an unsupported op or a data-dependent branch naming the line.

Env: CANOPY_BIN (default build/canopy), CANOPY_DATA.
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from daemon_util import Served, post_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import canopy_torch as ct  # noqa: E402
from canopy_torch.cells_ref import run_cells  # noqa: E402

BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")
TOL = 1e-4
POLICIES = ("none", "depth", "agenda", "sufficient", "lookahead",
            "lookahead2", "plan", "fsm")
LAYOUTS = ("naive", "pq")
MAXDIFF = {}

torch.set_num_threads(1)


# -- the three cells, as a user writes them -------------------------------------

class PeepholeLeaf(nn.Module):
    """forward(x) -> [h, c]: an LSTM leaf with a peephole on the output gate."""

    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D, 3 * H)
        self.p_o = nn.Parameter(torch.zeros(H))

    def forward(self, x):
        i, o, u = self.W(x).chunk(3, dim=-1)
        c = torch.sigmoid(i) * torch.tanh(u)
        h = torch.sigmoid(o + self.p_o * c) * torch.tanh(c)
        return torch.cat([h, c], dim=-1)


class PeepholeInternal(nn.Module):
    """forward(s1, s2) -> [h, c]: gates see the children's cells."""

    def __init__(self, H):
        super().__init__()
        self.H = H
        self.U = nn.Linear(2 * H, 5 * H)
        self.p_i = nn.Parameter(torch.zeros(2 * H))
        self.p_f1 = nn.Parameter(torch.zeros(H))
        self.p_f2 = nn.Parameter(torch.zeros(H))
        self.p_o = nn.Parameter(torch.zeros(H))

    def forward(self, s1, s2):
        H = self.H
        h1, c1 = s1[:, :H], s1[:, H:]
        h2, c2 = torch.split(s2, H, dim=1)
        g = self.U(torch.cat([h1, h2], -1))
        i, f1, f2, o, u = g.chunk(5, -1)
        i = torch.sigmoid(i + self.p_i[:H] * c1 + self.p_i[H:] * c2)
        f1 = torch.sigmoid(f1 + self.p_f1 * c1)
        f2 = (f2 + self.p_f2 * c2).sigmoid()
        c = i * torch.tanh(u) + f1 * c1 + f2 * c2
        h = torch.sigmoid(o + self.p_o * c) * c.tanh()
        return torch.cat([h, c], -1)


class ReLUGRULeaf(nn.Module):
    """forward(x) -> h = relu(W x + b)."""

    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(D, H))     # used as x @ W
        self.b = nn.Parameter(torch.zeros(H))

    def forward(self, x):
        return torch.relu(x @ self.W + self.b)


class ReLUGRUInternal(nn.Module):
    """forward(s1, s2) -> h: a tree GRU with a ReLU candidate."""

    def __init__(self, H):
        super().__init__()
        self.gates = nn.Linear(2 * H, 3 * H)
        self.cand = nn.Linear(2 * H, H, bias=False)
        self.cand_b = nn.Parameter(torch.zeros(H))
        self.act = nn.ReLU()

    def forward(self, s1, s2):
        z, r1, r2 = torch.sigmoid(self.gates(torch.cat([s1, s2], 1))).chunk(3, 1)
        n = self.act(self.cand(torch.cat([r1 * s1, r2 * s2], 1)) + self.cand_b)
        return z * (s1 + s2) / 2 + (1 - z) * n


class ElmanStep(nn.Module):
    """forward(x, h_prev) -> h = tanh(W x + h_prev U^T + b)."""

    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D, H)
        self.U = nn.Parameter(torch.zeros(H, H))

    def forward(self, x, h_prev):
        return torch.tanh(self.W(x) + h_prev @ self.U.t())


# -- whole models, PyTorch's own forward ----------------------------------------

class TreeModel(nn.Module):
    """Embedding, a leaf and an internal cell, an output layer; forward runs
    one node at a time, bottom up (a missing child is zeros)."""

    def __init__(self, vocab, leaf, internal, state, hidden, classes):
        super().__init__()
        self.vocab = ct.Vocab(vocab)
        self.embed = nn.Embedding(len(vocab), leaf_in(leaf))
        self.leaf, self.internal = leaf, internal
        self.state, self.hidden = state, hidden
        self.out = nn.Linear(hidden, classes)

    def forward(self, tree):
        st = [None] * len(tree.nodes)
        for k in range(len(tree.nodes) - 1, -1, -1):
            n = tree.nodes[k]
            if n.is_leaf():
                x = self.embed(torch.tensor([self.vocab.id(n.word)]))
                st[k] = self.leaf(x)
            else:
                kids = [st[c] for c in n.children]
                kids += [torch.zeros(1, self.state)] * (2 - len(kids))
                st[k] = self.internal(*kids)
        s = torch.cat(st, 0)
        return {"logits": self.out(s[:, :self.hidden]),
                "h": s[0, :self.hidden]}

    def save(self, d):
        return ct.save_cells(d, "tree", {"leaf": self.leaf,
                                         "internal": self.internal},
                             state=self.state, hidden=(0, self.hidden),
                             output=self.out, embed=self.embed,
                             vocab=self.vocab.tokens, model=self)


def leaf_in(leaf):
    w = leaf.W.weight if isinstance(leaf.W, nn.Linear) else leaf.W.t()
    return w.shape[1]


class ElmanTagger(nn.Module):
    def __init__(self, vocab, D, H, classes):
        super().__init__()
        self.vocab = ct.Vocab(vocab)
        self.embed = nn.Embedding(len(vocab), D)
        self.rnn = ElmanStep(D, H)
        self.out = nn.Linear(H, classes)
        self.H = H

    def forward(self, tokens):
        h = torch.zeros(1, self.H)
        hs = []
        for t in tokens:
            h = self.rnn(self.embed(torch.tensor([self.vocab.id(t)])), h)
            hs.append(h)
        hs = torch.cat(hs, 0)
        return {"logits": self.out(hs), "h": hs}

    def save(self, d, labels=None):
        return ct.save_cells(d, "sequence", {"step": self.rnn}, state=self.H,
                             output=self.out, embed=self.embed,
                             vocab=self.vocab.tokens, labels=labels,
                             model=self)


# -- data -------------------------------------------------------------------------

def lines(name, n, start=0):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [json.loads(l) for l in f.read().splitlines()[start:start + n]]


def vocab_of(tokens):
    """<unk>, then distinct tokens in order, every sixth one dropped (those
    stay unknown words)."""
    seen = []
    for t in tokens:
        if t not in seen:
            seen.append(t)
    return ["<unk>"] + [t for k, t in enumerate(seen) if k % 6 != 3]


def randomize(module, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * scale)
    return module


def trees(n, start=0):
    insts = lines("trees-binary.jsonl", n, start)
    # some as JSON NODE objects, as the API allows
    for k in range(2, len(insts), 5):
        insts[k] = {"tree": to_json(ct.parse_tree(insts[k]["tree"]))}
    return insts


def to_json(tree, k=0):
    n = tree.nodes[k]
    if n.is_leaf():
        return {"word": n.word}
    return {"label": n.label, "children": [to_json(tree, c) for c in n.children]}


def peephole_model(seed=1, n=12):
    insts = trees(n)
    words = [w for i in insts for w in ct.parse_tree_instance(i).leaves()]
    H, D = 6, 5
    m = TreeModel(vocab_of(words), PeepholeLeaf(D, H), PeepholeInternal(H),
                  2 * H, H, 4)
    return randomize(m, seed), insts


def relugru_model(seed=2, n=12):
    insts = trees(n, 40)
    words = [w for i in insts for w in ct.parse_tree_instance(i).leaves()]
    H, D = 7, 4
    m = TreeModel(vocab_of(words), ReLUGRULeaf(D, H), ReLUGRUInternal(H),
                  H, H, 3)
    return randomize(m, seed), insts


def elman_model(seed=3, n=16):
    insts = lines("sequences.jsonl", n, 10)
    for k in range(1, len(insts), 4):          # some as "text"
        insts[k] = {"text": " ".join(insts[k]["tokens"])}
    words = [t for i in insts for t in ct.data._tokens(i)]
    m = ElmanTagger(vocab_of(words), 5, 6, 5)
    return randomize(m, seed), insts


def torch_out(m, inst):
    with torch.no_grad():
        if isinstance(m, ElmanTagger):
            return m(ct.data._tokens(inst))
        return m(ct.parse_tree_instance(inst))


def canopy_run(model_dir, instances, extra=()):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False,
                                     encoding="utf-8") as f:
        for inst in instances:
            f.write(json.dumps(inst) + "\n")
        path = f.name
    try:
        cmd = [BIN, "run", "--model", model_dir, "--input", path, "--outputs",
               "all", "--return-hidden"] + list(extra)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}): "
                             f"{p.stderr[-2000:]}")
    out = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    assert len(out) == len(instances), (len(out), len(instances))
    return out


class Case(unittest.TestCase):
    def close(self, key, got, want, what):
        got = torch.as_tensor(got, dtype=torch.float64).reshape(-1)
        want = torch.as_tensor(want, dtype=torch.float64).reshape(-1)
        self.assertEqual(got.shape, want.shape, f"{what}: shape")
        d = float((got - want).abs().max()) if got.numel() else 0.0
        MAXDIFF[key] = max(MAXDIFF.get(key, 0.0), d)
        self.assertLessEqual(d, TOL, f"{what}: max |diff| {d:.3g}")

    def compare(self, key, m, inst, co, what):
        """A canopy response (or cells_ref's) against the module's forward."""
        self.assertNotIn("error", co, what)
        mo = torch_out(m, inst)
        z = mo["logits"]
        if isinstance(m, ElmanTagger):
            self.close(key, co["logits"], z, what + " logits")
            self.assertEqual(co["tags"], [int(r.argmax()) for r in z], what)
            self.close(key, co["h"], mo["h"], what + " h")
            return
        self.close(key, co["logits"], z[0], what + " root logits")
        self.assertEqual(co["label"], int(z[0].argmax()), what + " label")
        self.assertEqual(len(co["nodes"]), len(z), what + " nodes")
        for k, nd in enumerate(co["nodes"]):
            self.close(key, nd["logits"], z[k], f"{what} node {k}")
        self.close(key, co["h"], mo["h"], what + " h")


MODELS = {"peephole-treelstm": peephole_model, "relu-treegru": relugru_model,
          "elman-tagger": elman_model}


# -- the tracer alone ---------------------------------------------------------------

class TestTracer(Case):
    def test_json_interpreted_equals_pytorch(self):
        """The saved model.json, interpreted op by op, is the module."""
        for key, make in MODELS.items():
            m, insts = make()
            with tempfile.TemporaryDirectory() as tmp:
                d = m.save(os.path.join(tmp, key))
                outs = run_cells(d, insts)
            for i, (inst, co) in enumerate(zip(insts, outs)):
                self.compare(key + " (ref)", m, inst, co, f"{key} instance {i}")

    def test_weights_named_after_parameters(self):
        m, _ = peephole_model()
        with tempfile.TemporaryDirectory() as tmp:
            d = m.save(os.path.join(tmp, "m"))
            tens, _ = ct.load_file(os.path.join(d, "weights.safetensors"))
            with open(os.path.join(d, "model.json")) as f:
                meta = json.load(f)
        self.assertEqual(set(tens), set(dict(m.named_parameters())))
        self.assertEqual(meta["family"], "cells")
        self.assertEqual(meta["cells"]["state"], 12)
        self.assertEqual(meta["cells"]["output"],
                         {"from": [0, 6], "weight": "out.weight",
                          "bias": "out.bias"})
        # x @ W is stored as W^T under W's name, [N, K] as linear wants
        g, _ = relugru_model()
        with tempfile.TemporaryDirectory() as tmp:
            tens, _ = ct.load_file(os.path.join(g.save(os.path.join(tmp, "g")),
                                                "weights.safetensors"))
        self.assertEqual(tens["leaf.W"][0], [7, 4])
        self.assertEqual(len(tens), len(dict(g.named_parameters())))

    def test_names_without_a_model(self):
        """No model given: '<cell name>.<parameter>', 'output.*', 'embed'."""
        step, out = ElmanStep(3, 4), nn.Linear(4, 2)
        emb = nn.Parameter(torch.zeros(3, 3))
        with tempfile.TemporaryDirectory() as tmp:
            d = ct.save_cells(os.path.join(tmp, "m"), "sequence",
                              {"step": step}, state=4, output=out, embed=emb,
                              vocab=["<unk>", "a", "b"])
            tens, _ = ct.load_file(os.path.join(d, "weights.safetensors"))
        self.assertEqual(sorted(tens), ["embed", "output.bias",
                                        "output.weight", "step.U", "step.W.bias",
                                        "step.W.weight"])

    def test_load_says_cells(self):
        m, _ = elman_model()
        with tempfile.TemporaryDirectory() as tmp:
            d = m.save(os.path.join(tmp, "e"))
            with self.assertRaises(ValueError) as e:
                ct.load(d)
            self.assertIn("is a cells model", str(e.exception))
            # the weights load back into the module that was traced
            raw, _ = ct.load_file(os.path.join(d, "weights.safetensors"))
            sd = {k: torch.tensor(list(buf)).reshape(shape)
                  for k, (shape, buf) in raw.items()}
            m2, _ = elman_model(seed=99)
            m2.load_state_dict(sd)
            for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
                self.assertTrue(torch.equal(a, b))

    def test_ops_are_what_the_cell_does(self):
        m, _ = peephole_model()
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(m.save(os.path.join(tmp, "m")),
                                   "model.json")) as f:
                cells = json.load(f)["cells"]
        leaf, internal = cells["types"]
        self.assertEqual((leaf["when"], internal["when"]), ("leaf", "internal"))
        kinds = [op["op"] for op in internal["ops"]]
        self.assertEqual(kinds.count("linear"), 1)     # self.U, bias folded in
        self.assertEqual(kinds.count("input"), 4)      # h1 c1 h2 c2, by columns
        self.assertEqual(kinds.count("param"), 5)      # p_i in two halves
        self.assertEqual(sorted({op["op"] for op in internal["ops"]}),
                         ["add", "concat", "input", "linear", "mul", "param",
                          "sigmoid", "slice", "tanh"])
        cols = sorted((op["edge"], tuple(op["cols"]))
                      for op in internal["ops"] if op["op"] == "input")
        self.assertEqual(cols, [(0, (0, 6)), (0, (6, 12)), (1, (0, 6)),
                                (1, (6, 12))])
        self.assertEqual(len(internal["state"]), 2)    # [h, c]
        g, _ = relugru_model()
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(g.save(os.path.join(tmp, "g")),
                                   "model.json")) as f:
                ops = json.load(f)["cells"]["types"][1]["ops"]
        kinds = [op["op"] for op in ops]
        for k in ("relu", "rsub", "scale"):            # (1 - z), / 2
            self.assertIn(k, kinds)

    def test_children_ops(self):
        m = NaryModel(["<unk>", "a"], 3, 4, 2)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(m.save(os.path.join(tmp, "n")),
                                   "model.json")) as f:
                cells = json.load(f)["cells"]
        self.assertEqual(cells["arity"], 0)
        kinds = [op["op"] for op in cells["types"][1]["ops"]]
        for k in ("input_sum", "input_mean", "input", "exp", "div", "shift",
                  "scale", "relu"):
            self.assertIn(k, kinds)

    def refusal(self, cell, needle, **kw):
        """save_cells refuses ``cell``, naming this file and ``needle``'s line."""
        src, first = inspect.getsourcelines(type(cell).forward)
        line = first + next(i for i, l in enumerate(src) if needle in l)
        args = dict(state=4, output=nn.Linear(4, 2),
                    embed=nn.Embedding(3, 4), vocab=["<unk>", "a", "b"])
        args.update(kw)
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(ct.CellTraceError) as e:
                ct.save_cells(os.path.join(tmp, "m"), "sequence",
                              {"step": cell}, **args)
            self.assertFalse(os.path.exists(os.path.join(tmp, "m")))
        msg = str(e.exception)
        self.assertIn(f"test_cells.py, line {line}", msg)
        self.assertIn(needle, msg)
        return msg

    def test_refuses_what_it_cannot_trace(self):
        # (the cell, the line of its forward the refusal names, what it says)
        refused = [
            (SortCell, "torch.sort(", "sort is not supported"),
            (BranchCell, "if x.sum() > 0", "data-dependent"),
            (ModuleCell, "self.gru(x, h)", "GRUCell is not supported"),
            (RowsCell, "h[:1]", "rows are the vertices"),
            (WidthCell, "x[:, :2]", "widths 4 and 2"),
            # F.softmax goes through torch's dispatch: still the user's line
            (SoftmaxCell, "F.softmax(", "softmax is not supported"),
            (LoopCell, "for g in x.chunk(2, -1):",
             "unpack a split/chunk into names"),
            (ConstCell, "h * self.c", "not a parameter or buffer"),
            (TwoWayCell, "h @ self.W.t()", "both as x @ W and as x @ W.t()"),
        ]
        for cell, needle, says in refused:
            with self.subTest(cell.__name__):
                self.assertIn(says, self.refusal(cell(), needle))

    def test_refuses_x_in_an_internal_cell(self):
        leaf, internal = PeepholeLeaf(3, 2), XInternal()
        with self.assertRaises(ct.CellTraceError) as e:
            ct.save_cells(tempfile.mkdtemp(), "tree",
                          {"leaf": leaf, "internal": internal}, state=4,
                          output=nn.Linear(2, 2), embed=nn.Embedding(3, 3),
                          vocab=["<unk>", "a", "b"])
        self.assertIn("takes 2: forward(s1, s2) (internal nodes have no "
                      "token, so no x)", str(e.exception))

    def test_refuses_per_child_mixed_with_per_node(self):
        with self.assertRaises(ct.CellTraceError) as e:
            ct.save_cells(tempfile.mkdtemp(), "tree",
                          {"leaf": ChildSumLeaf(3, 2),
                           "internal": MixedChildren(2)}, state=4, arity=0,
                          output=nn.Linear(4, 2), embed=nn.Embedding(3, 3),
                          vocab=["<unk>", "a", "b"])
        self.assertIn("mixes a per-child value", str(e.exception))
        self.assertIn("test_cells.py, line", str(e.exception))
        with self.assertRaises(ct.CellTraceError) as e:
            ct.save_cells(tempfile.mkdtemp(), "tree",
                          {"leaf": ChildSumLeaf(3, 2),
                           "internal": PerChildState()}, state=4, arity=0,
                          output=nn.Linear(4, 2), embed=nn.Embedding(3, 3),
                          vocab=["<unk>", "a", "b"])
        self.assertIn("per-child value as (part of) the state",
                      str(e.exception))

    def test_refuses_wrong_state_width(self):
        with self.assertRaises(ct.CellTraceError) as e:
            ct.save_cells(tempfile.mkdtemp(), "sequence",
                          {"step": XCell()}, state=8,
                          output=nn.Linear(4, 2), embed=nn.Embedding(3, 4),
                          vocab=["<unk>", "a", "b"])
        self.assertIn("width 4; the model's state is 8", str(e.exception))


class MixedChildren(nn.Module):
    """A per-child value times a per-node one: no broadcast yet."""

    def __init__(self, H):
        super().__init__()
        self.U = nn.Linear(2 * H, 2 * H)

    def forward(self, children):
        return (self.U(children) * children.sum(0)).sum(0)


class PerChildState(nn.Module):
    def forward(self, children):
        return torch.tanh(children)


class SoftmaxCell(nn.Module):
    def forward(self, x, h):
        return F.softmax(x + h, dim=-1)


class LoopCell(nn.Module):
    def forward(self, x, h):
        for g in x.chunk(2, -1):
            h = h * 2
        return h


class ConstCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.ones(4)          # not registered: would not be saved

    def forward(self, x, h):
        return x + h * self.c


class XCell(nn.Module):
    def forward(self, x, h):
        return x


class TwoWayCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(4, 4))

    def forward(self, x, h):
        return torch.tanh(x @ self.W + h @ self.W.t())


class XInternal(nn.Module):
    def forward(self, x, s1, s2):
        return s1 + s2


class SortCell(nn.Module):
    def forward(self, x, h):
        return torch.sort(x + h, dim=-1)[0]


class BranchCell(nn.Module):
    def forward(self, x, h):
        if x.sum() > 0:
            return x
        return h


class ModuleCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRUCell(4, 4)

    def forward(self, x, h):
        return self.gru(x, h)


class RowsCell(nn.Module):
    def forward(self, x, h):
        return x + h[:1]


class WidthCell(nn.Module):
    def forward(self, x, h):
        return torch.tanh(x * x[:, :2]) + h


# -- the engine -----------------------------------------------------------------------

def _engine_has_cells():
    """None when this build loads cells models, else why not."""
    m = ElmanTagger(["<unk>", "a"], 2, 2, 2)
    with tempfile.TemporaryDirectory() as tmp:
        d = m.save(os.path.join(tmp, "m"))
        p = subprocess.run([BIN, "run", "--model", d, "--input", "-"],
                           input='{"tokens": ["a"]}\n', capture_output=True,
                           text=True, timeout=60)
    if p.returncode == 1 and "family" in p.stderr and "cells" in p.stderr \
            and os.environ.get("CANOPY_REQUIRE_CELLS") != "1":
        return p.stderr.strip()[-300:]
    return None


class TestEngine(Case):
    @classmethod
    def setUpClass(cls):
        cls.missing = _engine_has_cells()

    def setUp(self):
        if self.missing:
            self.skipTest("this build of canopy has no cells family yet: "
                          + self.missing)

    def run_model(self, key):
        m, insts = MODELS[key]()
        pol_dir = tempfile.mkdtemp(prefix="canopy-cells-pol-")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                d = m.save(os.path.join(tmp, key))
                one = canopy_run(d, insts, ["--batch", "1", "--layout", "pq"])
                for i, (inst, co) in enumerate(zip(insts, one)):
                    self.compare(key, m, inst, co, f"{key} batch 1 instance {i}")
                for layout in LAYOUTS:
                    for pol in POLICIES:
                        extra = ["--policy", pol, "--layout", layout]
                        if pol == "fsm":
                            extra += ["--policy-cache", pol_dir]
                        outs = canopy_run(d, insts, extra)
                        for i, (inst, co, co1) in enumerate(zip(insts, outs, one)):
                            what = f"{key} {pol}/{layout} instance {i}"
                            self.compare(key, m, inst, co, what)
                            # batched equals unbatched
                            self.close(key + " batched-vs-1", co["logits"],
                                       co1["logits"], what + " vs batch 1")
        finally:
            shutil.rmtree(pol_dir, ignore_errors=True)

    def test_peephole_treelstm(self):
        self.run_model("peephole-treelstm")

    def test_relu_treegru(self):
        self.run_model("relu-treegru")

    def test_elman_tagger(self):
        self.run_model("elman-tagger")


# -- the other structures: any-arity trees, bisequences, dags -------------------------

class SumLeaf(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D, H)

    def forward(self, x):
        return torch.tanh(self.W(x))


class SumInternal(nn.Module):
    """forward(children) -> h: gates on the sum and the mean, a softplus-like
    divide (exp, neg, number + tensor, tensor / tensor)."""

    def __init__(self, H):
        super().__init__()
        self.U = nn.Linear(2 * H, 2 * H)

    def forward(self, children):
        g, u = self.U(torch.cat([children.sum(0), children.mean(0)], -1)).chunk(2, -1)
        return (torch.sigmoid(g) * torch.relu(u) / (1 + torch.exp(-u))
                + children[0] * 0.25)


class NaryModel(nn.Module):
    """Any-arity trees: SumLeaf and SumInternal, or the cells given (whose
    state may be wider than H: h is its first H columns)."""

    def __init__(self, vocab, D, H, C, leaf=None, internal=None, state=None):
        super().__init__()
        self.vocab, self.H, self.state = ct.Vocab(vocab), H, state or H
        self.embed = nn.Embedding(len(vocab), D)
        self.leaf = leaf or SumLeaf(D, H)
        self.internal = internal or SumInternal(H)
        self.out = nn.Linear(H, C)

    def forward(self, inst):
        tree = ct.parse_tree_instance(inst)
        st = [None] * len(tree.nodes)
        for k in range(len(tree.nodes) - 1, -1, -1):
            n = tree.nodes[k]
            if n.is_leaf():
                st[k] = self.leaf(self.embed(torch.tensor([self.vocab.id(n.word)])))
            else:
                st[k] = self.internal(torch.stack([st[c] for c in n.children]))
        h = torch.cat(st, 0)[:, :self.H]
        return {"logits": self.out(h), "h": h[0]}

    def save(self, d):
        wide = {"hidden": (0, self.H)} if self.state != self.H else {}
        return ct.save_cells(d, "tree", {"leaf": self.leaf, "internal": self.internal},
                             arity=0, state=self.state, output=self.out,
                             embed=self.embed, vocab=self.vocab.tokens, model=self,
                             **wide)


class ChildSumLeaf(nn.Module):
    """forward(x) -> [h, c]."""

    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D, 3 * H)

    def forward(self, x):
        i, o, u = self.W(x).chunk(3, -1)
        c = torch.sigmoid(i) * torch.tanh(u)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], -1)


class ChildSumInternal(nn.Module):
    """forward(children) -> [h, c]: Child-Sum Tree-LSTM, a forget gate per
    child (per-child work on the stack, then .sum(0): segment ops)."""

    def __init__(self, H):
        super().__init__()
        self.H = H
        self.U = nn.Linear(H, 3 * H)
        self.U_f = nn.Linear(H, H)

    def forward(self, children):
        H = self.H
        h_k, c_k = children[:, :, :H], children[:, :, H:]
        i, o, u = self.U(h_k.sum(0)).chunk(3, -1)
        f_k = torch.sigmoid(self.U_f(h_k))
        c = torch.sigmoid(i) * torch.tanh(u) + (f_k * c_k).sum(0)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], -1)


def childsum_model(vocab, D, H, C):
    return NaryModel(vocab, D, H, C, ChildSumLeaf(D, H), ChildSumInternal(H),
                     2 * H)


class BiOut(nn.Module):
    def __init__(self, H, C):
        super().__init__()
        self.H = H
        self.lin = nn.Linear(2 * H, C)

    def forward(self, s_fwd, s_bwd):
        return self.lin(torch.cat([s_fwd[:, :self.H], s_bwd[:, :self.H]], -1))


class BiElman(nn.Module):
    """A bisequence: Elman cells both ways, the state [h, x-part] of 2H."""

    def __init__(self, vocab, D, H, C):
        super().__init__()
        self.vocab, self.H = ct.Vocab(vocab), H
        self.embed = nn.Embedding(len(vocab), D)
        self.fwd, self.bwd = ElmanStep(D, H), ElmanStep(D, H)
        self.out = BiOut(H, C)

    def forward(self, inst):
        xs = [self.embed(torch.tensor([self.vocab.id(t)]))
              for t in ct.data._tokens(inst)]
        h, fw = torch.zeros(1, self.H), []
        for x in xs:
            h = self.fwd(x, h)
            fw.append(h)
        h, bw = torch.zeros(1, self.H), [None] * len(xs)
        for j in range(len(xs) - 1, -1, -1):
            h = self.bwd(xs[j], h)
            bw[j] = h
        f, b = torch.cat(fw, 0), torch.cat(bw, 0)
        return {"logits": self.out(f, b), "h": torch.cat([f, b], -1)}

    def save(self, d):
        return ct.save_cells(d, "bisequence", {"forward": self.fwd,
                                               "backward": self.bwd},
                             state=self.H, output=self.out, embed=self.embed,
                             vocab=self.vocab.tokens, model=self)


class DagCell(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.W = nn.Linear(D + H, H)

    def forward(self, x, preds):
        return torch.tanh(self.W(torch.cat([x, preds.mean(0)], -1)))


class DagModel(nn.Module):
    def __init__(self, vocab, D, H, C):
        super().__init__()
        self.vocab, self.H = ct.Vocab(vocab), H
        self.embed = nn.Embedding(len(vocab), D)
        self.node = DagCell(D, H)
        self.out = nn.Linear(H, C)

    def forward(self, inst):
        toks, prevs = ct.data.dag_of(inst)
        st = []
        for t, pv in zip(toks, prevs):
            kids = torch.stack([st[q] for q in pv]) if pv else torch.zeros(1, 1, self.H)
            st.append(self.node(self.embed(torch.tensor([self.vocab.id(t)])), kids))
        return {"logits": self.out(st[-1])[0]}

    def save(self, d):
        return ct.save_cells(d, "dag", {"node": self.node}, state=self.H,
                             output=self.out, embed=self.embed,
                             vocab=self.vocab.tokens, model=self)


class LabelTreeModel(TreeModel):
    """Two internal cells: nodes labelled NP or PP use their own."""

    def __init__(self, vocab, H, D, C):
        super().__init__(vocab, PeepholeLeaf(D, H), PeepholeInternal(H),
                         2 * H, H, C)
        self.phrase = PeepholeInternal(H)

    def forward(self, inst):
        tree = ct.parse_tree_instance(inst)
        st = [None] * len(tree.nodes)
        for k in range(len(tree.nodes) - 1, -1, -1):
            n = tree.nodes[k]
            if n.is_leaf():
                st[k] = self.leaf(self.embed(torch.tensor([self.vocab.id(n.word)])))
                continue
            kids = [st[c] for c in n.children]
            kids += [torch.zeros(1, self.state)] * (2 - len(kids))
            cell = self.phrase if n.label in ("NP", "PP") else self.internal
            st[k] = cell(*kids)
        s = torch.cat(st, 0)
        return {"logits": self.out(s[:, :self.hidden]), "h": s[0, :self.hidden]}

    def save(self, d):
        return ct.save_cells(d, "tree", [
            ("leaf", "leaf", self.leaf),
            ("phrase", {"labels": ["NP", "PP"]}, self.phrase),
            ("internal", "internal", self.internal)],
            state=self.state, hidden=(0, self.hidden), output=self.out,
            embed=self.embed, vocab=self.vocab.tokens, model=self)


class PiecesStep(nn.Module):
    """A state of 20 one-column parts (more than the loader's 16 a list).
    Few sources: 20 column slices of x or h_prev would be 20 sources,
    over the compiler's 16."""

    def forward(self, x, h_prev):
        v = torch.tanh(x[:, :2] * 0.5 + h_prev[:, 18:])
        return torch.cat([v[:, i % 2:i % 2 + 1] * (i + 1) for i in range(20)],
                         -1)


class _Fwd:
    """A tagger whose forward takes the instance (for check())."""

    def __init__(self, m):
        self.m = m

    def __call__(self, inst):
        return self.m(ct.data._tokens(inst))

    def save(self, d):
        return self.m.save(d)


class TestStructures(Case):
    """An any-arity tree (children.sum/mean), a bisequence and a dag: the
    engine (pq and naive, batched and one a run) and the JSON interpreted
    equal PyTorch."""

    def check(self, key, m, insts, compare):
        with tempfile.TemporaryDirectory() as tmp:
            d = m.save(os.path.join(tmp, key))
            runs = [("ref", run_cells(d, insts))]
            if not _engine_has_cells():
                for extra in (["--layout", "pq"], ["--layout", "naive"],
                              ["--batch", "1"]):
                    runs.append((" ".join(extra), canopy_run(d, insts, extra)))
        with torch.no_grad():
            mine = [m(i) for i in insts]
        for how, outs in runs:
            for i, (mo, co) in enumerate(zip(mine, outs)):
                self.assertNotIn("error", co, f"{key} {how} {i}")
                compare(key, mo, co, f"{key} {how} instance {i}")

    def test_long_concats(self):
        """More than 16 pieces (the loader's list limit): nested concats."""
        insts = lines("sequences.jsonl", 6, 50)
        m = randomize(ElmanTagger(vocab_of([t for i in insts for t in i["tokens"]]),
                                  20, 20, 3), 9)
        m.rnn = PiecesStep()

        def cmp(key, mo, co, what):
            self.close(key, co["logits"], mo["logits"], what)
            self.close(key, co["h"], mo["h"], what + " h")
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(m.save(os.path.join(tmp, "p")),
                                   "model.json")) as f:
                st = json.load(f)["cells"]["types"][0]
        self.assertLessEqual(len(st["state"]), 16)
        self.assertTrue(all(len(op["x"]) <= 16 for op in st["ops"]
                            if op["op"] == "concat"))
        self.assertEqual(sum(op["op"] == "concat" for op in st["ops"]), 2)
        self.check("long-concats", _Fwd(m), insts, cmp)

    def test_any_arity_tree(self):
        insts = lines("trees-nary.jsonl", 12)
        ts = [ct.parse_tree_instance(i) for i in insts]
        m = randomize(NaryModel(vocab_of([w for t in ts for w in t.leaves()]),
                                4, 5, 3), 5)

        def cmp(key, mo, co, what):
            self.close(key, co["logits"], mo["logits"][0], what)
            for k, nd in enumerate(co["nodes"]):
                self.close(key, nd["logits"], mo["logits"][k], f"{what} {k}")
            self.close(key, co["h"], mo["h"], what + " h")
        self.assertTrue(any(len(n.children) > 2 for t in ts for n in t.nodes))
        self.check("nary-tree", m, insts, cmp)

    def test_per_child_gates(self):
        """Child-Sum Tree-LSTM written in PyTorch: per-child work on the
        children stack becomes input_each ... edge_sum (segment ops)."""
        insts = lines("trees-nary.jsonl", 12)
        ts = [ct.parse_tree_instance(i) for i in insts]
        m = randomize(childsum_model(vocab_of([w for t in ts for w in t.leaves()]),
                                     4, 5, 3), 6)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(m.save(os.path.join(tmp, "cs")),
                                   "model.json")) as f:
                kinds = [op["op"] for op in
                         json.load(f)["cells"]["types"][1]["ops"]]
        self.assertEqual(kinds.count("edge_sum"), 1)
        self.assertIn("input_each", kinds)
        self.assertIn("input_sum", kinds)

        def cmp(key, mo, co, what):
            self.close(key, co["logits"], mo["logits"][0], what)
            for k, nd in enumerate(co["nodes"]):
                self.close(key, nd["logits"], mo["logits"][k], f"{what} {k}")
            self.close(key, co["h"], mo["h"], what + " h")
        self.check("childsum", m, insts, cmp)

    def test_label_types(self):
        insts = trees(10, 80)
        m = randomize(LabelTreeModel(
            vocab_of([w for i in insts for w in ct.parse_tree_instance(i).leaves()]),
            4, 3, 3), 8)

        def cmp(key, mo, co, what):
            for k, nd in enumerate(co["nodes"]):
                self.close(key, nd["logits"], mo["logits"][k], f"{what} {k}")
            self.close(key, co["h"], mo["h"], what + " h")
        self.check("label-types", m, insts, cmp)

    def test_bisequence(self):
        insts = lines("sequences.jsonl", 12, 30)
        m = randomize(BiElman(vocab_of([t for i in insts for t in i["tokens"]]),
                              4, 5, 3), 6)

        def cmp(key, mo, co, what):
            self.close(key, co["logits"], mo["logits"], what)
            self.close(key, co["h"], mo["h"], what + " h")
        self.check("bisequence", m, insts, cmp)

    def test_dag(self):
        insts = lines("dags.jsonl", 8)
        m = randomize(DagModel(vocab_of([n["token"] for i in insts
                                         for n in i["nodes"]]), 4, 5, 3), 7)

        def cmp(key, mo, co, what):
            self.close(key, co["logits"], mo["logits"], what)
            self.assertEqual(co["label"], int(mo["logits"].argmax()), what)
        self.check("dag", m, insts, cmp)


class TestDaemon(Case):
    """The Elman tagger served by `canopy serve`, asked over HTTP by eight
    clients at once (their instances batched together)."""

    @classmethod
    def setUpClass(cls):
        cls.missing = _engine_has_cells()
        if cls.missing:
            return
        cls.tmp = tempfile.mkdtemp(prefix="canopy-cells-")
        cls.m, cls.insts = elman_model(seed=4, n=24)
        cls.m.save(os.path.join(cls.tmp, "models", "elman"),
                   labels=["A", "B", "C", "D", "E"])
        cls.served = Served(BIN, os.path.join(cls.tmp, "models"), cls.tmp)
        cls.url = cls.served.url

    @classmethod
    def tearDownClass(cls):
        if cls.missing:
            return
        cls.served.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if self.missing:
            self.skipTest("this build of canopy has no cells family yet: "
                          + self.missing)

    def post(self, body):
        st, answer = post_json(self.url + "/v1/models/elman/infer", body,
                               timeout=30)
        self.assertEqual(st, 200, answer)
        return answer

    def test_http_equals_pytorch(self):
        results = [None] * len(self.insts)
        errors = []

        def client(k):
            try:
                for i in range(k, len(self.insts), 8):
                    results[i] = self.post({"instances": [self.insts[i]],
                                            "return_hidden": True})
            except Exception as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for i, (inst, r) in enumerate(zip(self.insts, results)):
            co = r["outputs"][0]
            self.compare("elman-tagger (http)", self.m, inst, co,
                         f"http instance {i}")
            self.assertEqual(co["tag_names"], ["ABCDE"[t] for t in co["tags"]])
        # one request holding them all
        r = self.post({"instances": self.insts, "return_hidden": True})
        for i, (inst, co) in enumerate(zip(self.insts, r["outputs"])):
            self.compare("elman-tagger (http)", self.m, inst, co,
                         f"http batch instance {i}")


def tearDownModule():
    if MAXDIFF:
        print("\nmax |difference| against PyTorch:", file=sys.stderr)
        for k in sorted(MAXDIFF):
            print(f"  {k}: {MAXDIFF[k]:.3g}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()


class TestBuiltinAsCells(Case):
    """tests/cells/mvrnn.json (per-vertex matmul, a table row per word, a
    missing child read as the identity), interpreted op by op by
    cells_ref over a built-in mvrnn's weights, equals the built-in engine:
    the format's new ops mean what the engine computes."""

    def test_mvrnn_interpreted_equals_engine(self):
        insts = lines("trees-binary.jsonl", 10)
        with tempfile.TemporaryDirectory() as tmp:
            b, c = os.path.join(tmp, "b"), os.path.join(tmp, "c")
            subprocess.run([BIN, "model", "init", "mvrnn", b, "--hidden", "16",
                            "--embed", "16", "--vocab-from",
                            os.path.join(DATA, "trees-binary.jsonl")],
                           check=True, capture_output=True, timeout=120)
            with open(os.path.join(b, "model.json")) as f:
                meta = json.load(f)
            with open(os.path.join(os.path.dirname(__file__), "..", "cells",
                                   "mvrnn.json")) as f:
                cells = json.load(f)  # written at H = 16
            cells["vocab"] = meta["vocab"]
            cells["classes"] = meta.get("classes", 5)
            os.makedirs(c)
            for name in os.listdir(b):
                if name != "model.json":
                    os.symlink(os.path.join(b, name), os.path.join(c, name))
            with open(os.path.join(c, "model.json"), "w") as f:
                json.dump(cells, f)
            ref = run_cells(c, insts)
            eng = canopy_run(b, insts, [])
        self.assertEqual(len(ref), len(eng))
        for i, (r, e) in enumerate(zip(ref, eng)):
            self.close("mvrnn", e["logits"], r["logits"], f"instance {i}")
