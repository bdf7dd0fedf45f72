"""A plain interpreter of model.json cells (docs/cells.md), one vertex at a
time, in float64: what a cells model computes, written from the format
alone and independent of the C engine and of the tracer.

    run_cells(model_dir, [instance, ...]) -> [response object, ...]

The responses carry what ``canopy run --outputs all --return-hidden``
does: tree — ``logits``/``label`` of the root, ``nodes`` (pre-order, each
with ``logits``), ``h``; sequence/bisequence — per-token ``logits``,
``tags``, ``h``; dag — ``logits``/``label`` of the last node.
"""
import json
import os

import torch

from .data import (Vocab, _tokens, dag_of, load_vocab,
                   parse_tree_instance)
from .safetensors import load_file

__all__ = ["load_cells", "run_cells", "eval_type"]


def load_cells(model_dir):
    """(meta, tensors as float64 torch tensors, Vocab)."""
    with open(os.path.join(model_dir, "model.json"), encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("family") != "cells":
        raise ValueError(f"{model_dir}: not a cells model")
    raw, _ = load_file(os.path.join(model_dir, "weights.safetensors"))
    tens = {}
    for k, (shape, buf) in raw.items():
        t = torch.tensor(list(buf), dtype=torch.float64)
        tens[k] = t.reshape(shape)
    vocab = Vocab(load_vocab(os.path.join(model_dir, meta["vocab"])),
                  lowercase=bool(meta.get("lowercase", False)))
    return meta, tens, vocab


def _ref(ops, vals, r):
    if isinstance(r, int):
        return vals[r]
    for k, op in enumerate(ops):
        if op.get("name") == r:
            return vals[k]
    raise KeyError(r)


def eval_type(t, tens, state, token_id, edges):
    """One vertex of type ``t``: ``edges`` is the list of its input edges'
    states (1-D tensors; None for an absent one). Returns the new state.
    A per-edge value (input_each and the ops over it) is a [k, width]
    tensor, a row per present edge; edge_sum sums its rows."""
    ops, vals = t["ops"], []
    for op in ops:
        kind = op["op"]
        cols = op.get("cols")

        def cut(v):
            return v if cols is None else v[cols[0]:cols[1]]
        if kind == "input":
            c = cols or [0, state]
            e = op["edge"]
            v = edges[e] if e < len(edges) and edges[e] is not None else None
            w = c[1] - c[0]
            if v is not None:
                v = v[c[0]:c[1]]
            elif op.get("absent") == "identity":  # a square matrix
                side = int(round(w ** 0.5))
                v = torch.eye(side, dtype=torch.float64).reshape(-1)
            else:
                v = torch.zeros(w, dtype=torch.float64)
        elif kind in ("input_sum", "input_mean"):
            c = cols or [0, state]
            present = [e[c[0]:c[1]] for e in edges if e is not None]
            v = torch.zeros(c[1] - c[0], dtype=torch.float64)
            for e in present:
                v = v + e
            if kind == "input_mean" and present:
                v = v / len(present)
        elif kind == "input_each":
            c = cols or [0, state]
            present = [e[c[0]:c[1]] for e in edges if e is not None]
            v = (torch.stack(present) if present else
                 torch.zeros(0, c[1] - c[0], dtype=torch.float64))
        elif kind == "edge_sum":
            v = _ref(ops, vals, op["a"]).sum(0)
        elif kind == "embed":
            v = tens[op["tensor"]][token_id]
        elif kind == "table":  # rows past the table's read row 0
            tab = tens[op["tensor"]]
            v = tab[token_id if token_id < tab.shape[0] else 0].reshape(-1)
        elif kind == "matmul":  # per vertex: L·R, row-major
            if "a" in op:
                L = _ref(ops, vals, op["a"]).reshape(op["m"], -1)
            else:
                r, c2 = op.get("rows"), op.get("cols")
                W = tens[op["weight"]]
                L = W[r[0]:r[1], c2[0]:c2[1]]
            if "b" in op:
                R = _ref(ops, vals, op["b"]).reshape(L.shape[1], -1)
            else:
                r, c2 = op.get("rows"), op.get("cols")
                R = tens[op["weight"]][r[0]:r[1], c2[0]:c2[1]]
            v = (L @ R).reshape(-1)
        elif kind == "step":
            v = (_ref(ops, vals, op["a"]) > 0).double()
        elif kind == "param":
            v = cut(tens[op["tensor"]])
        elif kind == "linear":
            xs = op["x"] if isinstance(op["x"], list) else [op["x"]]
            x = torch.cat([_ref(ops, vals, r) for r in xs], -1)
            W = tens[op["weight"]]
            rows = op.get("rows", [0, W.shape[0]])
            v = x @ W[rows[0]:rows[1]].t()
            if "bias" in op:
                v = v + tens[op["bias"]][rows[0]:rows[1]]
        elif kind in ("add", "sub", "mul", "div"):
            a, b = _ref(ops, vals, op["a"]), _ref(ops, vals, op["b"])
            v = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[kind]
        elif kind in ("sigmoid", "tanh", "exp", "relu"):
            v = getattr(torch, kind)(_ref(ops, vals, op["a"]))
        elif kind == "scale":
            v = op["k"] * _ref(ops, vals, op["a"])
        elif kind == "rsub":
            v = op["k"] - _ref(ops, vals, op["a"])
        elif kind == "shift":
            v = _ref(ops, vals, op["a"]) + op["k"]
        elif kind == "slice":
            v = _ref(ops, vals, op["a"])[..., cols[0]:cols[1]]
        elif kind == "concat":
            v = torch.cat([_ref(ops, vals, r) for r in op["x"]], -1)
        else:
            raise ValueError(f"unknown op {kind!r}")
        if "width" in op and v.shape[-1] != op["width"]:
            raise ValueError(f"op {op.get('name')}: width {v.shape[-1]}, "
                             f"declared {op['width']}")
        vals.append(v)
    s = torch.cat([_ref(ops, vals, r) for r in t["state"]])
    if s.shape[0] != state:
        raise ValueError(f"type {t['name']}: state width {s.shape[0]}")
    return s


def _by_when(cells, when):
    for t in cells["types"]:
        if t["when"] == when:
            return t
    return None


def _logits(out, tens, s):
    a, b = out["from"]
    z = tens[out["weight"]] @ s[a:b]
    return z + tens[out["bias"]] if "bias" in out else z


def _tree(meta, tens, vocab, inst):
    cells = meta["cells"]
    S, arity = cells["state"], cells.get("arity", 2)
    tree = parse_tree_instance(inst)
    nodes = tree.nodes
    st = [None] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):
        n = nodes[k]
        if n.is_leaf():
            t = _by_when(cells, "leaf")
            st[k] = eval_type(t, tens, S, vocab.id(n.word), [])
            continue
        if arity and len(n.children) > arity:
            raise ValueError(f"node {k} has {len(n.children)} children")
        t = None
        for c in cells["types"]:
            if isinstance(c["when"], dict) and n.label in c["when"]["labels"]:
                t = c
                break
        t = t or _by_when(cells, "internal")
        st[k] = eval_type(t, tens, S, 0, [st[c] for c in n.children])
    out = cells["output"]
    logits = [_logits(out, tens, s) for s in st]
    h = cells.get("hidden", [0, S])
    return {"logits": logits[0].tolist(), "label": int(logits[0].argmax()),
            "nodes": [{"logits": z.tolist()} for z in logits],
            "h": st[0][h[0]:h[1]].tolist()}


def _seq(meta, tens, vocab, inst):
    cells = meta["cells"]
    S = cells["state"]
    ids = [vocab.id(t) for t in _tokens(inst)]
    out, h = cells["output"], cells.get("hidden", [0, S])
    fw = []
    t = _by_when(cells, "step" if cells["structure"] == "sequence" else "forward")
    for i in ids:
        fw.append(eval_type(t, tens, S, i, [fw[-1] if fw else None]))
    if cells["structure"] == "sequence":
        z = [_logits(out, tens, s) for s in fw]
        hs = [s[h[0]:h[1]] for s in fw]
    else:
        tb = _by_when(cells, "backward")
        bw = [None] * len(ids)
        for j in range(len(ids) - 1, -1, -1):
            bw[j] = eval_type(tb, tens, S, ids[j],
                              [bw[j + 1] if j + 1 < len(ids) else None])
        a, b = out["from"]
        z = []
        for f, g in zip(fw, bw):
            v = tens[out["weight"]] @ torch.cat([f[a:b], g[a:b]])
            z.append(v + tens[out["bias"]] if "bias" in out else v)
        hs = [torch.cat([f[h[0]:h[1]], g[h[0]:h[1]]]) for f, g in zip(fw, bw)]
    return {"logits": [v.tolist() for v in z],
            "tags": [int(v.argmax()) for v in z],
            "h": [v.tolist() for v in hs]}


def _dag(meta, tens, vocab, inst):
    cells = meta["cells"]
    S = cells["state"]
    toks, prevs = dag_of(inst)
    t = _by_when(cells, "node")
    st = []
    for tok, pv in zip(toks, prevs):
        st.append(eval_type(t, tens, S, vocab.id(tok), [st[q] for q in pv]))
    z = _logits(cells["output"], tens, st[-1])
    return {"logits": z.tolist(), "label": int(z.argmax())}


def run_cells(model_dir, instances):
    """Each instance's response, computed from model.json alone."""
    meta, tens, vocab = load_cells(model_dir)
    fn = {"tree": _tree, "sequence": _seq, "bisequence": _seq,
          "dag": _dag}[meta["cells"]["structure"]]
    return [fn(meta, tens, vocab, inst) for inst in instances]
