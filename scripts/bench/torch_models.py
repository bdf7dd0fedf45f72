#!/usr/bin/python3
"""PyTorch baselines for the Canopy benchmark (docs/benchmarks.md).

Loads a Canopy model directory (model.json + weights.safetensors, parsed
directly) and runs treelstm, treegru, childsum-treelstm, bilstm-tagger or
latticelstm (docs/models.md) in one of two modes:

  per-instance   one instance at a time, one vertex at a time: the way a
                 PyTorch model of a dynamic network is usually written.
  level-batched  the TensorFlow Fold approach: the instances of a batch are
                 merged, vertices of one type at one depth are computed by one
                 matrix product, their inputs gathered with index_select and
                 their results written back with index_copy / index_add.

Instances are parsed up front (prepare()); run() does the per-batch
scheduling (grouping by depth, index tensors) and the arithmetic, which is
what the benchmark times.  Uses /usr/bin/python3 with Debian's python3-torch.

CLI (for checking by hand):
  torch_models.py --model DIR --input FILE.jsonl --mode per-instance|level-batched
                  [--batch N] [--threads 2] [--limit N] [--device cuda]
prints one JSON line {"logits": ...} per instance.
"""
import argparse
import json
import os
import struct
import sys

import torch

TREE_FAMILIES = ("treelstm", "treegru", "childsum-treelstm")
FAMILIES = TREE_FAMILIES + ("bilstm-tagger", "latticelstm")
MODES = ("per-instance", "level-batched")

_LOWER = {c: c + 32 for c in range(65, 91)}


# --------------------------------------------------------------------------
# model directory
# --------------------------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = bytearray(data[8 + hlen:])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: tensor %s is %s, only F32 is supported"
                             % (path, name, info["dtype"]))
        b, e = info["data_offsets"]
        t = torch.frombuffer(body[b:e], dtype=torch.float32) if e > b \
            else torch.zeros(0)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def read_vocab(path):
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    idx = {}
    for i, t in enumerate(lines):
        t = t[:-1] if t.endswith("\r") else t
        idx.setdefault(t, i)
    return idx


class Model(object):
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "model.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.family = cfg["family"]
        if self.family not in FAMILIES:
            raise ValueError("family %r has no PyTorch baseline" % self.family)
        self.H = int(cfg["hidden"])
        self.D = int(cfg["embed"])
        self.C = int(cfg["classes"])
        self.lowercase = bool(cfg.get("lowercase", False))
        self.vocab = read_vocab(os.path.join(model_dir, cfg["vocab"]))
        self.word_vocab = None
        if self.family == "latticelstm":
            self.word_vocab = read_vocab(os.path.join(model_dir, cfg["word_vocab"]))
        p = read_safetensors(os.path.join(model_dir,
                                          cfg.get("weights", "weights.safetensors")))
        self.p = p
        H = self.H
        # transposed copies for x @ W^T as addmm(b, x, Wt)
        self.t = {k: v.t().contiguous() for k, v in p.items() if v.dim() == 2}
        self.zero = torch.zeros(H)
        if self.family == "childsum-treelstm":
            W, U, b = p["cell.W"], p["cell.U"], p["cell.b"]
            iou = torch.cat([torch.arange(0, H), torch.arange(2 * H, 4 * H)])
            f = torch.arange(H, 2 * H)
            self.W_iou, self.U_iou, self.b_iou = W[iou].contiguous(), U[iou].contiguous(), b[iou].contiguous()
            self.U_f, self.b_f = U[f].contiguous(), b[f].contiguous()
            self.W_iou_t, self.U_iou_t = self.W_iou.t().contiguous(), self.U_iou.t().contiguous()
            self.U_f_t = self.U_f.t().contiguous()
        if self.family == "latticelstm":
            self.Dw = p["word_embed"].shape[1]

    def to(self, device):
        """Moves every weight to device; with torch.set_default_device(device)
        the per-batch tensors are made there too (scripts/bench/gpu.py)."""
        for name, v in list(vars(self).items()):
            if torch.is_tensor(v):
                setattr(self, name, v.to(device))
            elif isinstance(v, dict) and v and all(torch.is_tensor(x) for x in v.values()):
                setattr(self, name, {k: x.to(device) for k, x in v.items()})
        return self

    def norm(self, tok):
        return tok.translate(_LOWER) if self.lowercase else tok

    def wid(self, tok, vocab=None):
        return (vocab or self.vocab).get(self.norm(tok), 0)

    # -- parsing (outside the timed region) ---------------------------------
    def prepare(self, inst):
        if self.family in TREE_FAMILIES:
            return self.prepare_tree(inst)
        if self.family == "bilstm-tagger":
            toks = inst["tokens"] if "tokens" in inst else inst["text"].split()
            return torch.tensor([self.wid(t) for t in toks], dtype=torch.long)
        return self.prepare_lattice(inst)

    def prepare_tree(self, inst):
        """Post-order arrays: word[k] (-1 internal), kids[k], height[k]; root last."""
        root = parse_tree(inst["tree"])
        word, kids, height = [], [], []
        stack = [(root, False)]
        ids = {}
        while stack:
            node, done = stack.pop()
            if not done and node[1]:
                stack.append((node, True))
                for ch in reversed(node[1]):
                    stack.append((ch, False))
                continue
            k = len(word)
            ids[id(node)] = k
            if node[1]:
                ks = [ids[id(ch)] for ch in node[1]]
                if self.family != "childsum-treelstm" and len(ks) > 2:
                    raise ValueError("node with %d children in a binary family" % len(ks))
                word.append(-1)
                kids.append(ks)
                height.append(1 + max(height[j] for j in ks))
            else:
                word.append(self.wid(node[0]))
                kids.append([])
                height.append(0)
        return {"word": word, "kids": kids, "height": height,
                "word_t": torch.tensor([w if w >= 0 else 0 for w in word], dtype=torch.long)}

    def prepare_lattice(self, inst):
        chars = inst["chars"] if "chars" in inst else list(inst["text"])
        n = len(chars)
        ending = [[] for _ in range(n)]   # char j -> [(start, word id)]
        for w in inst.get("words", []):
            b, e = w["start"], w["end"]
            tok = w.get("token")
            if tok is None:
                tok = "".join(chars[b:e])
            ending[e - 1].append((b, self.wid(tok, self.word_vocab)))
        return {"chars": torch.tensor([self.wid(c) for c in chars], dtype=torch.long),
                "ending": ending, "n": n,
                "ending_t": [(torch.tensor([b for b, _ in E], dtype=torch.long),
                              torch.tensor([w for _, w in E], dtype=torch.long)) if E else None
                             for E in ending]}

    # -- floating-point work (matrix products only, 2*M*N*K each) ----------
    def flops(self, prep):
        H, D, C = self.H, self.D, self.C
        f = self.family
        if f in ("treelstm", "treegru"):
            leaves = sum(1 for w in prep["word"] if w >= 0)
            internal = len(prep["word"]) - leaves
            if f == "treelstm":
                return 2 * 3 * H * D * leaves + 2 * 5 * H * 2 * H * internal + 2 * C * H
            return 2 * H * D * leaves + (2 * 3 * H * 2 * H + 2 * H * 2 * H) * internal + 2 * C * H
        if f == "childsum-treelstm":
            leaves = sum(1 for w in prep["word"] if w >= 0)
            internal = len(prep["word"]) - leaves
            edges = sum(len(k) for k in prep["kids"])
            return 2 * 3 * H * D * leaves + 2 * 3 * H * H * internal + 2 * H * H * edges + 2 * C * H
        if f == "bilstm-tagger":
            n = int(prep.shape[0])
            return n * (2 * (2 * 4 * H * D + 2 * 4 * H * H) + 2 * C * 2 * H)
        n = prep["n"]
        words = sum(len(E) for E in prep["ending"])
        return (n * (2 * 4 * H * (D + H) + 2 * C * H)
                + words * (2 * 3 * H * (self.Dw + H) + 2 * H * (D + H)))

    # -- running -------------------------------------------------------------
    def run(self, preps, mode, batch):
        """List of logits tensors ([C] for trees' roots, [n, C] for sequences)."""
        out = []
        if mode == "per-instance":
            fn = getattr(self, "one_" + self.family.replace("-", "_"))
            for p in preps:
                out.append(fn(p))
            return out
        fn = getattr(self, "batch_" + self.family.replace("-", "_"))
        for s in range(0, len(preps), batch):
            out.extend(fn(preps[s:s + batch]))
        return out

    # ===== per instance ======================================================
    def one_treelstm(self, t):
        p, H = self.p, self.H
        E, W, bl, U, bi = p["embed"], p["leaf.W"], p["leaf.b"], p["internal.U"], p["internal.b"]
        hs, cs = [], []
        z = self.zero
        for w, ks, wt in zip(t["word"], t["kids"], t["word_t"]):
            if w >= 0:
                i, o, u = torch.addmv(bl, W, E[wt]).chunk(3)
                c = torch.sigmoid(i) * torch.tanh(u)
            else:
                h1, c1 = hs[ks[0]], cs[ks[0]]
                h2, c2 = (hs[ks[1]], cs[ks[1]]) if len(ks) > 1 else (z, z)
                i, f1, f2, o, u = torch.addmv(bi, U, torch.cat([h1, h2])).chunk(5)
                c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f1) * c1 + torch.sigmoid(f2) * c2
            hs.append(torch.sigmoid(o) * torch.tanh(c))
            cs.append(c)
        return torch.addmv(p["out.b"], p["out.W"], hs[-1])

    def one_treegru(self, t):
        p = self.p
        E, W, bl = p["embed"], p["leaf.W"], p["leaf.b"]
        Ug, bg, Un, bn = p["internal.Ug"], p["internal.bg"], p["internal.Un"], p["internal.bn"]
        hs = []
        z0 = self.zero
        for w, ks, wt in zip(t["word"], t["kids"], t["word_t"]):
            if w >= 0:
                hs.append(torch.tanh(torch.addmv(bl, W, E[wt])))
                continue
            h1 = hs[ks[0]]
            h2 = hs[ks[1]] if len(ks) > 1 else z0
            r1, r2, z = torch.sigmoid(torch.addmv(bg, Ug, torch.cat([h1, h2]))).chunk(3)
            n = torch.tanh(torch.addmv(bn, Un, torch.cat([r1 * h1, r2 * h2])))
            hs.append(z * ((h1 + h2) / 2) + (1 - z) * n)
        return torch.addmv(p["out.b"], p["out.W"], hs[-1])

    def one_childsum_treelstm(self, t):
        p = self.p
        E = p["embed"]
        hs, cs = [], []
        for w, ks, wt in zip(t["word"], t["kids"], t["word_t"]):
            if w >= 0:
                i, o, u = torch.addmv(self.b_iou, self.W_iou, E[wt]).chunk(3)
                c = torch.sigmoid(i) * torch.tanh(u)
            else:
                hk = torch.stack([hs[k] for k in ks])
                ck = torch.stack([cs[k] for k in ks])
                i, o, u = torch.addmv(self.b_iou, self.U_iou, hk.sum(0)).chunk(3)
                f = torch.sigmoid(torch.addmm(self.b_f, hk, self.U_f_t))
                c = torch.sigmoid(i) * torch.tanh(u) + (f * ck).sum(0)
            hs.append(torch.sigmoid(o) * torch.tanh(c))
            cs.append(c)
        return torch.addmv(p["out.b"], p["out.W"], hs[-1])

    def one_bilstm_tagger(self, ids):
        p = self.p
        X = p["embed"].index_select(0, ids)
        n = X.shape[0]
        res = []
        for d in ("fwd", "bwd"):
            Wih, Whh, bih, bhh = p[d + ".W_ih"], p[d + ".W_hh"], p[d + ".b_ih"], p[d + ".b_hh"]
            h = torch.zeros(1, self.H)
            c = torch.zeros(1, self.H)
            hs = [None] * n
            order = range(n) if d == "fwd" else range(n - 1, -1, -1)
            for t in order:
                h, c = torch.lstm_cell(X[t:t + 1], (h, c), Wih, Whh, bih, bhh)
                hs[t] = h
            res.append(torch.cat(hs))
        return torch.addmm(p["out.b"], torch.cat(res, 1), self.t["out.W"])

    def one_latticelstm(self, L):
        p, H = self.p, self.H
        X = p["embed"].index_select(0, L["chars"])
        WE = p["word_embed"]
        cW, cb = p["char.W"], p["char.b"]
        wWt, wb = self.t["word.W"], p["word.b"]
        lWt, lb = self.t["link.W"], p["link.b"]
        h, c = self.zero, self.zero
        hs, cs = [], []
        for j in range(L["n"]):
            x = X[j]
            i, f, o, u = torch.addmv(cb, cW, torch.cat([x, h])).chunk(4)
            Ej = L["ending_t"][j]
            if Ej is None:
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
            else:
                starts, wids = Ej
                hb = torch.stack([hs[b] for b in starts.tolist()])
                cb_ = torch.stack([cs[b] for b in starts.tolist()])
                wi, wf, wu = torch.addmm(wb, torch.cat([WE.index_select(0, wids), hb], 1), wWt).chunk(3, 1)
                cw = torch.sigmoid(wf) * cb_ + torch.sigmoid(wi) * torch.tanh(wu)
                l = torch.sigmoid(torch.addmm(lb, torch.cat([x.expand(cw.shape[0], -1), cw], 1), lWt))
                ai = torch.exp(torch.sigmoid(i))
                ae = torch.exp(l)
                den = ai + ae.sum(0)
                c = (ai / den) * torch.tanh(u) + ((ae / den) * cw).sum(0)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
            cs.append(c)
        return torch.addmm(p["out.b"], torch.stack(hs), self.t["out.W"])

    # ===== level-batched (TensorFlow Fold) ===================================
    def _tree_levels(self, trees):
        """Global numbering (offset per tree); leaves; per height>0 the
        internal nodes' ids and children.  Row N of the state is zero."""
        off = 0
        leaf_idx, leaf_w = [], []
        levels = {}
        roots = []
        for t in trees:
            word, kids, height = t["word"], t["kids"], t["height"]
            for k, w in enumerate(word):
                if w >= 0:
                    leaf_idx.append(off + k)
                    leaf_w.append(w)
                else:
                    levels.setdefault(height[k], []).append((off + k, [off + j for j in kids[k]]))
            off += len(word)
            roots.append(off - 1)
        return off, leaf_idx, leaf_w, levels, roots

    def batch_treelstm(self, trees):
        p, H, t = self.p, self.H, self.t
        N, leaf_idx, leaf_w, levels, roots = self._tree_levels(trees)
        h = torch.zeros(N + 1, H)
        c = torch.zeros(N + 1, H)
        li = torch.tensor(leaf_idx)
        x = p["embed"].index_select(0, torch.tensor(leaf_w))
        i, o, u = torch.addmm(p["leaf.b"], x, t["leaf.W"]).chunk(3, 1)
        cl = torch.sigmoid(i) * torch.tanh(u)
        c.index_copy_(0, li, cl)
        h.index_copy_(0, li, torch.sigmoid(o) * torch.tanh(cl))
        for lv in sorted(levels):
            nodes = levels[lv]
            idx = torch.tensor([n for n, _ in nodes])
            k1 = torch.tensor([ks[0] for _, ks in nodes])
            k2 = torch.tensor([ks[1] if len(ks) > 1 else N for _, ks in nodes])
            hh = torch.cat([h.index_select(0, k1), h.index_select(0, k2)], 1)
            i, f1, f2, o, u = torch.addmm(p["internal.b"], hh, t["internal.U"]).chunk(5, 1)
            cn = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f1) * c.index_select(0, k1)
                  + torch.sigmoid(f2) * c.index_select(0, k2))
            c.index_copy_(0, idx, cn)
            h.index_copy_(0, idx, torch.sigmoid(o) * torch.tanh(cn))
        return list(torch.addmm(p["out.b"], h.index_select(0, torch.tensor(roots)), t["out.W"]))

    def batch_treegru(self, trees):
        p, H, t = self.p, self.H, self.t
        N, leaf_idx, leaf_w, levels, roots = self._tree_levels(trees)
        h = torch.zeros(N + 1, H)
        x = p["embed"].index_select(0, torch.tensor(leaf_w))
        h.index_copy_(0, torch.tensor(leaf_idx), torch.tanh(torch.addmm(p["leaf.b"], x, t["leaf.W"])))
        for lv in sorted(levels):
            nodes = levels[lv]
            idx = torch.tensor([n for n, _ in nodes])
            h1 = h.index_select(0, torch.tensor([ks[0] for _, ks in nodes]))
            h2 = h.index_select(0, torch.tensor([ks[1] if len(ks) > 1 else N for _, ks in nodes]))
            r1, r2, z = torch.sigmoid(torch.addmm(p["internal.bg"], torch.cat([h1, h2], 1),
                                                  t["internal.Ug"])).chunk(3, 1)
            n = torch.tanh(torch.addmm(p["internal.bn"], torch.cat([r1 * h1, r2 * h2], 1), t["internal.Un"]))
            h.index_copy_(0, idx, z * ((h1 + h2) / 2) + (1 - z) * n)
        return list(torch.addmm(p["out.b"], h.index_select(0, torch.tensor(roots)), t["out.W"]))

    def batch_childsum_treelstm(self, trees):
        p, H = self.p, self.H
        N, leaf_idx, leaf_w, levels, roots = self._tree_levels(trees)
        h = torch.zeros(N, H)
        c = torch.zeros(N, H)
        li = torch.tensor(leaf_idx)
        x = p["embed"].index_select(0, torch.tensor(leaf_w))
        i, o, u = torch.addmm(self.b_iou, x, self.W_iou_t).chunk(3, 1)
        cl = torch.sigmoid(i) * torch.tanh(u)
        c.index_copy_(0, li, cl)
        h.index_copy_(0, li, torch.sigmoid(o) * torch.tanh(cl))
        for lv in sorted(levels):
            nodes = levels[lv]
            idx = torch.tensor([n for n, _ in nodes])
            kid = torch.tensor([k for _, ks in nodes for k in ks])
            par = torch.tensor([r for r, (_, ks) in enumerate(nodes) for _ in ks])
            hk = h.index_select(0, kid)
            hs = torch.zeros(len(nodes), H).index_add_(0, par, hk)
            i, o, u = torch.addmm(self.b_iou, hs, self.U_iou_t).chunk(3, 1)
            f = torch.sigmoid(torch.addmm(self.b_f, hk, self.U_f_t))
            fc = torch.zeros(len(nodes), H).index_add_(0, par, f * c.index_select(0, kid))
            cn = torch.sigmoid(i) * torch.tanh(u) + fc
            c.index_copy_(0, idx, cn)
            h.index_copy_(0, idx, torch.sigmoid(o) * torch.tanh(cn))
        return list(torch.addmm(p["out.b"], h.index_select(0, torch.tensor(roots)), self.t["out.W"]))

    def batch_bilstm_tagger(self, seqs):
        p, H = self.p, self.H
        lens = [int(s.shape[0]) for s in seqs]
        offs = [0]
        for n in lens:
            offs.append(offs[-1] + n)
        T = offs[-1]
        X = p["embed"].index_select(0, torch.cat(seqs))
        # sequences longest first: the ones still running at step t are a prefix
        order = sorted(range(len(seqs)), key=lambda k: -lens[k])
        B = len(seqs)
        outs = []
        for d in ("fwd", "bwd"):
            Wih, Whh, bih, bhh = p[d + ".W_ih"], p[d + ".W_hh"], p[d + ".b_ih"], p[d + ".b_hh"]
            h = torch.zeros(B, H)
            c = torch.zeros(B, H)
            Hs = torch.empty(T, H)
            for step in range(lens[order[0]]):
                act = [k for k in order if lens[k] > step]
                m = len(act)
                pos = torch.tensor([offs[k] + (step if d == "fwd" else lens[k] - 1 - step) for k in act])
                hn, cn = torch.lstm_cell(X.index_select(0, pos), (h[:m], c[:m]), Wih, Whh, bih, bhh)
                h = torch.cat([hn, h[m:]]) if m < B else hn
                c = torch.cat([cn, c[m:]]) if m < B else cn
                Hs.index_copy_(0, pos, hn)
            outs.append(Hs)
        lg = torch.addmm(p["out.b"], torch.cat(outs, 1), self.t["out.W"])
        return [lg[offs[k]:offs[k + 1]] for k in range(B)]

    def batch_latticelstm(self, lats):
        p, H = self.p, self.H
        lens = [L["n"] for L in lats]
        offs = [0]
        for n in lens:
            offs.append(offs[-1] + n)
        T = offs[-1]
        X = p["embed"].index_select(0, torch.cat([L["chars"] for L in lats]))
        Hs = torch.empty(T, H)
        Cs = torch.empty(T, H)
        order = sorted(range(len(lats)), key=lambda k: -lens[k])
        B = len(lats)
        h = torch.zeros(B, H)
        c = torch.zeros(B, H)
        cWt, cb = self.t["char.W"], p["char.b"]
        wWt, wb = self.t["word.W"], p["word.b"]
        lWt, lb = self.t["link.W"], p["link.b"]
        WE = p["word_embed"]
        for j in range(lens[order[0]]):
            act = [k for k in order if lens[k] > j]
            m = len(act)
            pos = torch.tensor([offs[k] + j for k in act])
            x = X.index_select(0, pos)
            i, f, o, u = torch.addmm(cb, torch.cat([x, h[:m]], 1), cWt).chunk(4, 1)
            si, tu = torch.sigmoid(i), torch.tanh(u)
            cn = torch.sigmoid(f) * c[:m] + si * tu
            # words whose last character is j, over every running lattice
            rows, starts, wids = [], [], []
            for r, k in enumerate(act):
                E = lats[k]["ending"][j]
                for b, w in E:
                    rows.append(r)
                    starts.append(offs[k] + b)
                    wids.append(w)
            if rows:
                rows_t = torch.tensor(rows)
                st = torch.tensor(starts)
                wi, wf, wu = torch.addmm(wb, torch.cat([WE.index_select(0, torch.tensor(wids)),
                                                        Hs.index_select(0, st)], 1), wWt).chunk(3, 1)
                cw = torch.sigmoid(wf) * Cs.index_select(0, st) + torch.sigmoid(wi) * torch.tanh(wu)
                l = torch.sigmoid(torch.addmm(lb, torch.cat([x.index_select(0, rows_t), cw], 1), lWt))
                ae = torch.exp(l)
                ai = torch.exp(si)
                den = ai.index_add(0, rows_t, ae)
                num = (ai * tu).index_add_(0, rows_t, ae * cw)
                has = torch.zeros(m, dtype=torch.bool)
                has[rows_t] = True
                cn = torch.where(has[:, None], num / den, cn)
            hn = torch.sigmoid(o) * torch.tanh(cn)
            Hs.index_copy_(0, pos, hn)
            Cs.index_copy_(0, pos, cn)
            h = torch.cat([hn, h[m:]]) if m < B else hn
            c = torch.cat([cn, c[m:]]) if m < B else cn
        lg = torch.addmm(p["out.b"], Hs, self.t["out.W"])
        return [lg[offs[k]:offs[k + 1]] for k in range(B)]


# --------------------------------------------------------------------------
# bracketed trees: (LABEL word) is a leaf, (LABEL child...) an internal node,
# a bare atom among children is a leaf; nodes are (word, children)
# --------------------------------------------------------------------------

_OPEN, _CLOSE = object(), object()


def parse_tree(s):
    if isinstance(s, dict):
        return _json_tree(s)
    toks = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            toks.append(_OPEN if ch == "(" else _CLOSE)
            i += 1
        else:
            j = i
            while j < n and not s[j].isspace() and s[j] not in "()":
                j += 1
            toks.append(s[i:j])
            i = j
    stack, root = [], None
    for tk in toks:
        if tk is _OPEN:
            stack.append([])
        elif tk is _CLOSE:
            items = stack.pop()
            if isinstance(items[0], str):        # labelled bracket
                if len(items) == 2 and isinstance(items[1], str):
                    node = (items[1], [])
                else:
                    node = (None, [(it, []) if isinstance(it, str) else it for it in items[1:]])
            else:
                node = (None, [(it, []) if isinstance(it, str) else it for it in items])
            if stack:
                stack[-1].append(node)
            else:
                root = node
        else:
            stack[-1].append(tk)
    return root


def _json_tree(o):
    if "word" in o:
        return (o["word"], [])
    return (None, [_json_tree(c) for c in o["children"]])


def load_instances(path, limit=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
                if limit and len(out) >= limit:
                    break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--mode", choices=MODES, default="level-batched")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = Model(a.model).to(a.device)
    if a.device != "cpu":
        torch.set_default_device(a.device)  # torch >= 2.0
    preps = [m.prepare(i) for i in load_instances(a.input, a.limit)]
    with torch.inference_mode():
        outs = m.run(preps, a.mode, a.batch)
    for o in outs:
        sys.stdout.write(json.dumps({"logits": o.tolist()}) + "\n")


if __name__ == "__main__":
    main()
