"""Source models for tests/python/test_import.py.

Small nn.Modules that mimic the public architectures' parameter layouts
(state_dict key names and shapes) and compute their forward passes the
way the public code does. Written for the tests, independently of
clients/canopy_torch/importer: a test saves one of these, runs the real
canopy-import executable, and compares `canopy run` with the forward here.

Trees are parsed by tests/reference/canopy_ref.py (the independent numpy
reference of the engine's input handling).
"""
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import canopy_ref  # noqa: E402

DTYPE = torch.float64


def parse_tree(inst):
    return canopy_ref.parse_tree_instance(inst)


def preorder(root):
    return canopy_ref.preorder(root)


def make_vocab(path, limit=150, lines=None):
    """<unk> + the most frequent input tokens of the first `lines` lines."""
    import json
    counts = {}
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f):
            if lines is not None and k >= lines:
                break
            inst = json.loads(line)
            if "tree" in inst:
                toks = [n.word for n in preorder(parse_tree(inst))
                        if n.is_leaf()]
            else:
                toks = inst["tokens"]
            for t in toks:
                counts[t] = counts.get(t, 0) + 1
    order = sorted(counts, key=lambda t: (-counts[t], t))[:limit]
    return ["<unk>"] + [t for t in order if t != "<unk>"]


def randomize(module, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1)
                    * scale)
    return module


# ---------------------------------------------------------------------------
# DGL examples/pytorch/tree_lstm/tree_lstm.py
# ---------------------------------------------------------------------------

class DGLTreeLSTMCell(nn.Module):
    """N-ary (binary) cell: W_iou, U_iou, b_iou, U_f."""

    def __init__(self, x_size, h_size):
        super().__init__()
        self.W_iou = nn.Linear(x_size, 3 * h_size, bias=False)
        self.U_iou = nn.Linear(2 * h_size, 3 * h_size, bias=False)
        self.b_iou = nn.Parameter(torch.zeros(1, 3 * h_size))
        self.U_f = nn.Linear(2 * h_size, 2 * h_size)


class DGLChildSumTreeLSTMCell(nn.Module):
    def __init__(self, x_size, h_size):
        super().__init__()
        self.W_iou = nn.Linear(x_size, 3 * h_size, bias=False)
        self.U_iou = nn.Linear(h_size, 3 * h_size, bias=False)
        self.b_iou = nn.Parameter(torch.zeros(1, 3 * h_size))
        self.U_f = nn.Linear(h_size, h_size)


class DGLTreeLSTM(nn.Module):
    """DGL's TreeLSTM(num_vocabs, x_size, h_size, num_classes, dropout,
    cell_type='nary'|'childsum'); forward per tree, recursively, with the
    message/reduce/apply steps of the DGL example."""

    def __init__(self, V, D, H, C, cell_type="nary"):
        super().__init__()
        self.H, self.cell_type = H, cell_type
        self.embedding = nn.Embedding(V, D)
        cell = DGLTreeLSTMCell if cell_type == "nary" else \
            DGLChildSumTreeLSTMCell
        self.cell = cell(D, H)
        self.linear = nn.Linear(H, C)

    def _apply_node(self, iou, c):           # apply_node_func
        iou = iou + self.cell.b_iou
        i, o, u = torch.chunk(iou, 3, 1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)
        c = i * u + c
        return o * torch.tanh(c), c

    def _reduce(self, hs, cs):         # reduce_func over the mailbox
        H = self.H
        if self.cell_type == "nary":
            while hs.shape[1] < 2:         # unary: a zero second child
                hs = torch.cat([hs, torch.zeros(1, 1, H, dtype=hs.dtype)], 1)
                cs = torch.cat([cs, torch.zeros(1, 1, H, dtype=cs.dtype)], 1)
            h_cat = hs.view(1, -1)
            f = torch.sigmoid(self.cell.U_f(h_cat)).view(*hs.size())
            c = torch.sum(f * cs, 1)
            return self.cell.U_iou(h_cat), c
        h_tild = torch.sum(hs, 1)
        f = torch.sigmoid(self.cell.U_f(hs))
        c = torch.sum(f * cs, 1)
        return self.cell.U_iou(h_tild), c

    def node(self, n, ids, acc):
        if n.is_leaf():
            x = self.embedding(torch.tensor([ids(n.word)]))
            h, c = self._apply_node(self.cell.W_iou(x),
                               torch.zeros(1, self.H, dtype=x.dtype))
        else:
            kids = [self.node(k, ids, acc) for k in n.children]
            hs = torch.stack([k[0] for k in kids], 1)     # [1, K, H]
            cs = torch.stack([k[1] for k in kids], 1)
            iou, c = self._reduce(hs, cs)
            h, c = self._apply_node(iou, c)
        acc.append((n, h[0]))
        return h, c

    @torch.no_grad()
    def forward(self, root, ids):
        """-> (logits [n_nodes, C] in pre-order, root h)."""
        acc = []
        self.node(root, ids, acc)
        hmap = {id(n): h for n, h in acc}
        pre = preorder(root)
        hs = torch.stack([hmap[id(n)] for n in pre])
        return self.linear(hs), hmap[id(root)]


# ---------------------------------------------------------------------------
# dasguptar/treelstm.pytorch treelstm/model.py
# ---------------------------------------------------------------------------

class ChildSumTreeLSTM(nn.Module):
    def __init__(self, in_dim, mem_dim):
        super().__init__()
        self.in_dim, self.mem_dim = in_dim, mem_dim
        self.ioux = nn.Linear(in_dim, 3 * mem_dim)
        self.iouh = nn.Linear(mem_dim, 3 * mem_dim)
        self.fx = nn.Linear(in_dim, mem_dim)
        self.fh = nn.Linear(mem_dim, mem_dim)

    def node_forward(self, inputs, child_c, child_h):
        child_h_sum = torch.sum(child_h, dim=0, keepdim=True)
        iou = self.ioux(inputs) + self.iouh(child_h_sum)
        i, o, u = torch.split(iou, iou.size(1) // 3, dim=1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)
        f = torch.sigmoid(self.fh(child_h) +
                          self.fx(inputs).repeat(len(child_h), 1))
        fc = torch.mul(f, child_c)
        c = torch.mul(i, u) + torch.sum(fc, dim=0, keepdim=True)
        h = torch.mul(o, torch.tanh(c))
        return c, h

    def forward(self, tree, inputs, acc):
        for ch in tree.children:
            self.forward(ch, inputs, acc)
        if not tree.children:
            child_c = torch.zeros(1, self.mem_dim, dtype=DTYPE)
            child_h = torch.zeros(1, self.mem_dim, dtype=DTYPE)
        else:
            child_c = torch.cat([acc[id(c)][0] for c in tree.children])
            child_h = torch.cat([acc[id(c)][1] for c in tree.children])
        acc[id(tree)] = self.node_forward(inputs(tree), child_c, child_h)
        return acc[id(tree)]


class Similarity(nn.Module):
    def __init__(self, mem_dim, hidden_dim, num_classes):
        super().__init__()
        self.wh = nn.Linear(2 * mem_dim, hidden_dim)
        self.wp = nn.Linear(hidden_dim, num_classes)


class SimilarityTreeLSTM(nn.Module):
    """Parameter layout of dasguptar's SimilarityTreeLSTM, plus a `head`
    Linear [C, H] (a classifier a user added; imported with --head)."""

    def __init__(self, V, D, H, C, with_head=True):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.childsumtreelstm = ChildSumTreeLSTM(D, H)
        self.similarity = Similarity(H, 5, 5)
        if with_head:
            self.head = nn.Linear(H, C)

    @torch.no_grad()
    def forward(self, root, ids):
        """Canopy's input semantics: the word at leaves, zero elsewhere."""
        D = self.emb.weight.shape[1]

        def inputs(n):
            if n.is_leaf():
                return self.emb(torch.tensor([ids(n.word)]))
            return torch.zeros(1, D, dtype=DTYPE)
        acc = {}
        self.childsumtreelstm(root, inputs, acc)
        hs = torch.stack([acc[id(n)][1][0] for n in preorder(root)])
        lg = self.head(hs) if hasattr(self, "head") else \
            torch.zeros(hs.shape[0], 1, dtype=DTYPE)
        return lg, acc[id(root)][1][0]


# ---------------------------------------------------------------------------
# PyTorch's BiLSTM-CRF tutorial (Advanced: Making Dynamic Decisions)
# ---------------------------------------------------------------------------

class BiLSTMTagger(nn.Module):
    def __init__(self, V, D, H, T, crf=False, names=None):
        super().__init__()
        n = dict(embedding="word_embeds", lstm="lstm", linear="hidden2tag",
                 crf="transitions")
        n.update(names or {})
        self.n = n
        self.H = H
        setattr(self, n["embedding"], nn.Embedding(V, D))
        setattr(self, n["lstm"], nn.LSTM(D, H, num_layers=1,
                                         bidirectional=True))
        setattr(self, n["linear"], nn.Linear(2 * H, T))
        self.crf = crf
        if crf:
            setattr(self, n["crf"], nn.Parameter(torch.randn(T, T)))

    def trans(self):
        return getattr(self, self.n["crf"])

    @torch.no_grad()
    def features(self, toks, ids):
        x = getattr(self, self.n["embedding"])(
            torch.tensor([ids(t) for t in toks])).view(len(toks), 1, -1)
        z = torch.zeros(2, 1, self.H, dtype=x.dtype)
        out, _ = getattr(self, self.n["lstm"])(x, (z, z))
        out = out.view(len(toks), 2 * self.H)
        return out, getattr(self, self.n["linear"])(out)

    @torch.no_grad()
    def viterbi(self, feats, START, STOP):
        """The tutorial's _viterbi_decode: (path score, best path)."""
        tr = self.trans()
        T = tr.shape[0]
        backpointers = []
        forward_var = torch.full((1, T), -10000., dtype=feats.dtype)
        forward_var[0][START] = 0
        for feat in feats:
            bptrs, vvars = [], []
            for next_tag in range(T):
                next_tag_var = forward_var + tr[next_tag]
                best = int(torch.argmax(next_tag_var, 1))
                bptrs.append(best)
                vvars.append(next_tag_var[0][best].view(1))
            forward_var = (torch.cat(vvars) + feat).view(1, -1)
            backpointers.append(bptrs)
        terminal = forward_var + tr[STOP]
        best = int(torch.argmax(terminal, 1))
        score = float(terminal[0][best])
        path = [best]
        for bptrs in reversed(backpointers):
            best = bptrs[best]
            path.append(best)
        assert path.pop() == START
        path.reverse()
        return score, path


# ---------------------------------------------------------------------------
# LSTM encoder-decoder (the PyTorch seq2seq tutorial's layout, LSTM cells,
# no attention)
# ---------------------------------------------------------------------------

class Encoder(nn.Module):
    def __init__(self, V, D, H):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        self.lstm = nn.LSTM(D, H)


class Decoder(nn.Module):
    def __init__(self, V, D, H):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        self.lstm = nn.LSTM(D, H)
        self.out = nn.Linear(H, V)


class Seq2Seq(nn.Module):
    def __init__(self, Vs, Vt, D, H):
        super().__init__()
        self.encoder = Encoder(Vs, D, H)
        self.decoder = Decoder(Vt, D, H)

    @torch.no_grad()
    def greedy(self, toks, ids, cap, bos=1, eos=2):
        """-> (output ids without </s>, the decoder's last h, top-2 margins
        per step)."""
        x = self.encoder.embedding(torch.tensor([ids(t) for t in toks]))
        _, (h, c) = self.encoder.lstm(x.view(len(toks), 1, -1))
        y, out, margins = bos, [], []
        for _ in range(cap):
            e = self.decoder.embedding(torch.tensor([y])).view(1, 1, -1)
            o, (h, c) = self.decoder.lstm(e, (h, c))
            lg = self.decoder.out(o[0, 0])
            top = torch.topk(lg, 2).values
            margins.append(float(top[0] - top[1]))
            y = int(torch.argmax(lg))
            if y == eos:
                break
            out.append(y)
        return out, h[0, 0], margins
