#!/usr/bin/python3
"""Writes the cells descriptions (docs/cells.md "model.json: cells") that
tests/test_cells_json.c serves: the built-in families that the IR can
express, described as cells over the built-ins' own tensor names, and
three cells that are not built in (a peephole Tree-LSTM, a ReLU tree GRU
with a label type, an Elman RNN tagger) plus one cell that uses every op.

    /usr/bin/python3 tests/cells/gen_cells.py [--hidden 16 --embed 12] [DIR]

The files are committed; run this again only to change them. The widths
are the tests' (H = 16, D = 12); --hidden 128 --embed 128 gives the
treelstm example of docs/cells.md (models/treelstm's sizes)."""
import argparse
import json
import os


class Cell:
    """One vertex type's op list, built in order."""

    def __init__(self):
        self.ops = []

    def op(self, name, op, **kw):
        self.ops.append(dict(name=name, op=op, **kw))
        return name

    def slices(self, src, width, names):
        return [self.op(n, "slice", a=src, cols=[k * width, (k + 1) * width])
                for k, n in enumerate(names)]


def model(structure, state, types, out, **extra):
    cells = {"structure": structure}
    cells.update(extra)
    cells.update({"state": state, "types": types, "output": out})
    return {"family": "cells", "classes": 5, "vocab": "vocab.txt",
            "cells": cells}


def vtype(name, when, cell, state):
    return {"name": name, "when": when, "ops": cell.ops, "state": state}


def treelstm_leaf(H):
    c = Cell()
    c.op("x", "embed", tensor="embed")
    c.op("g", "linear", x="x", weight="leaf.W", bias="leaf.b", width=3 * H)
    gi, go, gu = c.slices("g", H, ["gi", "go", "gu"])
    c.op("c", "mul", a=c.op("si", "sigmoid", a=gi),
         b=c.op("tu", "tanh", a=gu))
    c.op("h", "mul", a=c.op("so", "sigmoid", a=go),
         b=c.op("tc", "tanh", a="c"))
    return c


def treelstm_internal(H, U, b):
    c = Cell()
    c.op("h1", "input", edge=0, cols=[0, H])
    c.op("c1", "input", edge=0, cols=[H, 2 * H])
    c.op("h2", "input", edge=1, cols=[0, H])
    c.op("c2", "input", edge=1, cols=[H, 2 * H])
    c.op("g", "linear", x=["h1", "h2"], weight=U, bias=b, width=5 * H)
    c.op("sg", "sigmoid", a="g")
    i, f1, f2, o = c.slices("sg", H, ["i", "f1", "f2", "o"])
    c.op("gu", "slice", a="g", cols=[4 * H, 5 * H])
    c.op("u", "tanh", a="gu")
    c.op("iu", "mul", a=i, b="u")
    c.op("fc1", "mul", a=f1, b="c1")
    c.op("fc2", "mul", a=f2, b="c2")
    c.op("c12", "add", a="iu", b="fc1")
    c.op("c", "add", a="c12", b="fc2")
    c.op("tc", "tanh", a="c")
    c.op("h", "mul", a=o, b="tc")
    return c


def out_layer(H):
    return {"from": [0, H], "weight": "out.W", "bias": "out.b"}


def treelstm(H, D):
    return model("tree", 2 * H, [
        vtype("leaf", "leaf", treelstm_leaf(H), ["h", "c"]),
        vtype("internal", "internal",
              treelstm_internal(H, "internal.U", "internal.b"), ["h", "c"]),
    ], out_layer(H), arity=2, hidden=[0, H])


def treelstm_2type(H, D):
    return model("tree", 2 * H, [
        vtype("leaf", "leaf", treelstm_leaf(H), ["h", "c"]),
        vtype("internal_a", "internal",
              treelstm_internal(H, "internal_a.U", "internal_a.b"),
              ["h", "c"]),
        vtype("internal_b", {"labels": ["NP", "PP"]},
              treelstm_internal(H, "internal_b.U", "internal_b.b"),
              ["h", "c"]),
    ], out_layer(H), arity=2, hidden=[0, H])


def treegru(H, D):
    leaf = Cell()
    leaf.op("x", "embed", tensor="embed")
    leaf.op("h", "tanh", a=leaf.op("a", "linear", x="x", weight="leaf.W",
                                   bias="leaf.b"))
    c = Cell()
    c.op("h1", "input", edge=0)
    c.op("h2", "input", edge=1)
    c.op("hh", "concat", x=["h1", "h2"])
    c.op("g", "linear", x="hh", weight="internal.Ug", bias="internal.bg")
    c.op("sg", "sigmoid", a="g")
    r1, r2, z = c.slices("sg", H, ["r1", "r2", "z"])
    c.op("rh1", "mul", a=r1, b="h1")
    c.op("rh2", "mul", a=r2, b="h2")
    c.op("n", "tanh", a=c.op("na", "linear", x=["rh1", "rh2"],
                             weight="internal.Un", bias="internal.bn"))
    c.op("avg", "scale", a=c.op("sum", "add", a="h1", b="h2"), k=0.5)
    c.op("zavg", "mul", a=z, b="avg")
    c.op("zn", "mul", a=c.op("1-z", "rsub", a=z, k=1.0), b="n")
    c.op("h", "add", a="zavg", b="zn")
    return model("tree", H, [vtype("leaf", "leaf", leaf, ["h"]),
                             vtype("internal", "internal", c, ["h"])],
                 out_layer(H), arity=2)


def lstm_step(H, d):
    """nn.LSTMCell, previous [h | c] = input edge 0 (bilstm-tagger)."""
    c = Cell()
    c.op("x", "embed", tensor="embed")
    c.op("h", "input", edge=0, cols=[0, H])
    c.op("cp", "input", edge=0, cols=[H, 2 * H])
    c.op("gx", "linear", x="x", weight=d + ".W_ih", bias=d + ".b_ih")
    c.op("gh", "linear", x="h", weight=d + ".W_hh", bias=d + ".b_hh")
    c.op("g", "add", a="gx", b="gh")
    gi, gf, gg, go = c.slices("g", H, ["gi", "gf", "gg", "go"])
    c.op("c1", "mul", a=c.op("f", "sigmoid", a=gf), b="cp")
    c.op("c2", "mul", a=c.op("i", "sigmoid", a=gi),
         b=c.op("u", "tanh", a=gg))
    c.op("c", "add", a="c1", b="c2")
    c.op("h2", "mul", a=c.op("o", "sigmoid", a=go),
         b=c.op("tc", "tanh", a="c"))
    return c


def bilstm_tagger(H, D):
    return model("bisequence", 2 * H, [
        vtype("fwd", "forward", lstm_step(H, "fwd"), ["h2", "c"]),
        vtype("bwd", "backward", lstm_step(H, "bwd"), ["h2", "c"]),
    ], out_layer(H), hidden=[0, H])


def gru(c, H, x, hp, pre):
    """nn.GRUCell over ops x and hp; rows (r, z, n)."""
    c.op("gi", "linear", x=x, weight=pre + "W_ih", bias=pre + "b_ih")
    c.op("gh", "linear", x=hp, weight=pre + "W_hh", bias=pre + "b_hh")
    c.op("rz", "sigmoid", a=c.op("rza", "add",
                                 a=c.op("gi_rz", "slice", a="gi",
                                        cols=[0, 2 * H]),
                                 b=c.op("gh_rz", "slice", a="gh",
                                        cols=[0, 2 * H])))
    r, z = c.slices("rz", H, ["r", "z"])
    c.op("gi_n", "slice", a="gi", cols=[2 * H, 3 * H])
    c.op("gh_n", "slice", a="gh", cols=[2 * H, 3 * H])
    c.op("n", "tanh", a=c.op("na", "add", a="gi_n",
                             b=c.op("rgh", "mul", a=r, b="gh_n")))
    c.op("h", "add", a=c.op("zn", "mul", a=c.op("1-z", "rsub", a=z, k=1.0),
                            b="n"),
         b=c.op("zh", "mul", a=z, b=hp))
    return "h"


def latticegru(H, D):
    c = Cell()
    c.op("x", "embed", tensor="embed")
    c.op("hp", "input_mean", cols=[0, H])
    gru(c, H, "x", "hp", "gru.")
    return model("dag", H, [vtype("node", "node", c, ["h"])], out_layer(H))


# ---- cells that are not built in ---------------------------------------------
def childsum_treelstm(H, D):
    """Any arity: one forget gate per child (segment ops: input_each,
    edge_sum)."""
    def gates(c, x, W):
        gi, go, gu = [c.op(n, "linear", x=x, weight=W, bias="cell.b",
                           rows=[k * H, (k + 1) * H])
                      for n, k in (("gi", 0), ("go", 2), ("gu", 3))]
        return (c.op("i", "sigmoid", a=gi), c.op("o", "sigmoid", a=go),
                c.op("u", "tanh", a=gu))

    leaf = Cell()
    leaf.op("x", "embed", tensor="embed")
    i, o, u = gates(leaf, "x", "cell.W")
    leaf.op("c", "mul", a=i, b=u)
    leaf.op("h", "mul", a=o, b=leaf.op("tc", "tanh", a="c"))
    c = Cell()
    c.op("hs", "input_sum", cols=[0, H])
    i, o, u = gates(c, "hs", "cell.U")
    c.op("h_k", "input_each", cols=[0, H])
    c.op("c_k", "input_each", cols=[H, 2 * H])
    c.op("f_k", "sigmoid", a=c.op("gf", "linear", x="h_k", weight="cell.U",
                                  bias="cell.b", rows=[H, 2 * H]))
    c.op("fc", "edge_sum", a=c.op("fc_k", "mul", a="f_k", b="c_k"))
    c.op("c", "add", a=c.op("iu", "mul", a=i, b=u), b="fc")
    c.op("h", "mul", a=o, b=c.op("tc", "tanh", a="c"))
    return model("tree", 2 * H, [
        vtype("leaf", "leaf", leaf, ["h", "c"]),
        vtype("internal", "internal", c, ["h", "c"]),
    ], out_layer(H), arity=0, hidden=[0, H])


def mvrnn(H, D):
    """Per-vertex matrices: matmul between per-vertex values and with
    weight blocks, a table row per word, a missing child's B = I."""
    HH = H * H
    leaf = Cell()
    leaf.op("a", "embed", tensor="embed")
    leaf.op("A", "table", tensor="leaf.M")
    c = Cell()
    c.op("a", "input", edge=0, cols=[0, H])
    c.op("A", "input", edge=0, cols=[H, H + HH])
    c.op("b", "input", edge=1, cols=[0, H])
    c.op("B", "input", edge=1, cols=[H, H + HH], absent="identity")
    c.op("x1", "matmul", a="B", b="a", m=H)
    c.op("x2", "matmul", a="A", b="b", m=H)
    c.op("p", "tanh", a=c.op("g", "linear", x=["x1", "x2"],
                             weight="internal.W", bias="internal.b"))
    c.op("P", "add",
         a=c.op("P1", "matmul", weight="internal.WM", rows=[0, H],
                cols=[0, H], b="A"),
         b=c.op("P2", "matmul", weight="internal.WM", rows=[0, H],
                cols=[H, 2 * H], b="B"))
    return model("tree", H + HH, [
        vtype("leaf", "leaf", leaf, ["a", "A"]),
        vtype("internal", "internal", c, ["p", "P"]),
    ], out_layer(H), arity=2, hidden=[0, H])


def peephole_treelstm(H, D):
    """Binary Tree-LSTM with peephole connections (Gers & Schmidhuber 2000
    style): the input and forget gates see the children's cells, the output
    gate the new cell. peep = [p_i | p_f | p_o], one vector."""
    leaf = Cell()
    leaf.op("x", "embed", tensor="embed")
    leaf.op("g", "linear", x="x", weight="leaf.W", bias="leaf.b")
    gi, go, gu = leaf.slices("g", H, ["gi", "go", "gu"])
    leaf.op("c", "mul", a=leaf.op("i", "sigmoid", a=gi),
            b=leaf.op("u", "tanh", a=gu))
    leaf.op("po", "param", tensor="peep", cols=[2 * H, 3 * H])
    leaf.op("o", "sigmoid", a=leaf.op("oa", "add", a=go,
                                      b=leaf.op("poc", "mul", a="po",
                                                b="c")))
    leaf.op("h", "mul", a="o", b=leaf.op("tc", "tanh", a="c"))
    c = Cell()
    c.op("s1", "input", edge=0)
    c.op("s2", "input", edge=1)
    h1, c1 = c.slices("s1", H, ["h1", "c1"])
    h2, c2 = c.slices("s2", H, ["h2", "c2"])
    c.op("g", "linear", x=["h1", "h2"], weight="internal.U",
         bias="internal.b")
    gi, gf1, gf2, go, gu = c.slices("g", H, ["gi", "gf1", "gf2", "go", "gu"])
    c.op("pi", "param", tensor="peep", cols=[0, H])
    c.op("pf", "param", tensor="peep", cols=[H, 2 * H])
    c.op("po", "param", tensor="peep", cols=[2 * H, 3 * H])
    c.op("i", "sigmoid", a=c.op("ia", "add", a=gi, b=c.op(
        "pic", "mul", a="pi", b=c.op("c12", "add", a=c1, b=c2))))
    c.op("f1", "sigmoid", a=c.op("f1a", "add", a=gf1,
                                 b=c.op("pf1", "mul", a="pf", b=c1)))
    c.op("f2", "sigmoid", a=c.op("f2a", "add", a=gf2,
                                 b=c.op("pf2", "mul", a="pf", b=c2)))
    c.op("c", "add", a=c.op("iu", "mul", a="i", b=c.op("u", "tanh", a=gu)),
         b=c.op("fc", "add", a=c.op("fc1", "mul", a="f1", b=c1),
                b=c.op("fc2", "mul", a="f2", b=c2)))
    c.op("o", "sigmoid", a=c.op("oa", "add", a=go,
                                b=c.op("poc", "mul", a="po", b="c")))
    c.op("h", "mul", a="o", b=c.op("tc", "tanh", a="c"))
    return model("tree", 2 * H, [
        vtype("leaf", "leaf", leaf, ["h", "c"]),
        vtype("internal", "internal", c, ["h", "c"]),
    ], out_layer(H), arity=2, hidden=[0, H])


def relu_treegru(H, D):
    """A child-sum GRU over trees of any arity with ReLU candidates:
    leaf h = relu(W x + b); internal, over the children's sum s and mean m:
    [z; r] = σ(Wzr s + bzr), n = relu(Wn (r ⊙ m) + bn),
    h = (1 - z) ⊙ n + z ⊙ m. Nodes labelled NP use their own Wn (nb.W)."""
    leaf = Cell()
    leaf.op("x", "embed", tensor="embed")
    leaf.op("h", "relu", a=leaf.op("a", "linear", x="x", weight="leaf.W",
                                   bias="leaf.b"))

    def internal(wn):
        c = Cell()
        c.op("s", "input_sum")
        c.op("m", "input_mean")
        c.op("zr", "sigmoid", a=c.op("zra", "linear", x="s", weight="zr.W",
                                     bias="zr.b"))
        z, r = c.slices("zr", H, ["z", "r"])
        c.op("n", "relu", a=c.op("na", "linear",
                                 x=c.op("rm", "mul", a=r, b="m"),
                                 weight=wn + ".W", bias="n.b"))
        c.op("h", "add", a=c.op("zn", "mul", a=c.op("1-z", "rsub", a=z,
                                                    k=1.0), b="n"),
             b=c.op("zm", "mul", a=z, b="m"))
        return c

    return model("tree", H, [
        vtype("leaf", "leaf", leaf, ["h"]),
        vtype("internal", "internal", internal("n"), ["h"]),
        vtype("np", {"labels": ["NP"]}, internal("nb"), ["h"]),
    ], out_layer(H), arity=0)


def elman_tagger(H, D):
    """Elman RNN tagger: h_t = tanh(W [x_t; h_{t-1}] + b), tags from h_t."""
    c = Cell()
    c.op("x", "embed", tensor="embed")
    c.op("hp", "input", edge=0)
    c.op("h", "tanh", a=c.op("a", "linear", x=["x", "hp"], weight="rnn.W",
                             bias="rnn.b"))
    return model("sequence", H, [vtype("step", "step", c, ["h"])],
                 out_layer(H))


def allops(H, D):
    """A sequence cell that uses every op once (its reference is in
    tests/test_cells_json.c): state [u | v | w], H each.
      a = A x + ab (2H rows, of which rows [H, 2H) are taken), p = prev u
      u = a / (exp(relu(a)) + 1)
      v = (1 - σ(p)) ⊙ (0.5 · tanh(a)) - p
      w = Σ-of-inputs v ⊙ mean-of-inputs w + bias_w"""
    c = Cell()
    c.op("x", "embed", tensor="embed")
    c.op("a", "linear", x="x", weight="A", bias="ab", rows=[H, 2 * H])
    c.op("prev", "input", edge=0, cols=[0, 2 * H])
    c.op("p", "slice", a="prev", cols=[0, H])
    c.op("u", "div", a="a", b=c.op("e1", "shift", k=1.0, a=c.op(
        "e", "exp", a=c.op("ra", "relu", a="a"))))
    c.op("v0", "mul", a=c.op("1-s", "rsub", k=1.0, a=c.op("sp", "sigmoid",
                                                            a="p")),
         b=c.op("ht", "scale", k=0.5, a=c.op("ta", "tanh", a="a")))
    c.op("v", "sub", a="v0", b="p")
    c.op("vs", "input_sum", cols=[H, 2 * H])
    c.op("wm", "input_mean", cols=[2 * H, 3 * H])
    c.op("bw", "param", tensor="bw")
    c.op("w", "add", a=c.op("vw", "mul", a="vs", b="wm"), b="bw")
    c.op("uvw", "concat", x=["u", "v", "w"])
    return model("sequence", 3 * H, [vtype("step", "step", c, ["uvw"])],
                 {"from": [H, 3 * H], "weight": "out.W"})


ALL = {"treelstm": treelstm, "treelstm-2type": treelstm_2type,
       "treegru": treegru, "childsum-treelstm": childsum_treelstm,
       "mvrnn": mvrnn,
       "bilstm-tagger": bilstm_tagger,
       "latticegru": latticegru, "peephole-treelstm": peephole_treelstm,
       "relu-treegru": relu_treegru, "elman-tagger": elman_tagger,
       "allops": allops}


def dump(m):
    """Indented JSON with one op a line."""
    ops = {}
    for k, t in enumerate(m["cells"]["types"]):
        ops["@ops%d@" % k] = t["ops"]
        t["ops"] = "@ops%d@" % k
    text = json.dumps(m, indent=2)
    for key, lst in ops.items():
        lines = ",\n".join("          " + json.dumps(o) for o in lst)
        text = text.replace('"%s"' % key, "[\n" + lines + "\n        ]")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--embed", type=int, default=12)
    ap.add_argument("--only")
    ap.add_argument("dir", nargs="?", default=os.path.dirname(
        os.path.abspath(__file__)))
    a = ap.parse_args()
    for name, f in ALL.items():
        if a.only and name != a.only:
            continue
        with open(os.path.join(a.dir, name + ".json"), "w") as fp:
            fp.write(dump(f(a.hidden, a.embed)) + "\n")


if __name__ == "__main__":
    main()
