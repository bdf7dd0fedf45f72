"""Tree families of docs/models.md: treelstm, treelstm-2type, treegru,
childsum-treelstm, mvrnn.

Every tree module takes the vocabulary (a list of tokens, id 0 = ``<unk>``)
in its constructor and maps leaf words itself, so ``forward`` takes a
``Tree`` (``canopy_torch.parse_tree("(3 (2 It) (4 (2 's) (2 fine)))")``,
``tree_from_json(...)``, or ``instance_to_input(family, {"tree": ...}, m)``)
and returns ``{"logits": [n_nodes, C] in pre-order, "h": the root's hidden
vector (mvrnn: the root's p), "label": argmax of the root's logits}``.
Nodes of equal height are computed together (one batched cell per level),
which is the same math as the engine's one node at a time.
"""
import torch

from .common import CanopyModule, Params, split

__all__ = ["TreeLSTM", "TreeLSTM2Type", "TreeGRU", "ChildSumTreeLSTM", "MVRNN"]

_TRAIN = """
    Training (per-node labels from an SST-style bracketed tree)::

        m = {cls}(vocab, hidden=150, embed=300, classes=5)
        opt = torch.optim.Adagrad(m.parameters(), lr=0.05)
        for s in trees:                    # "(3 (2 It) (4 (2 's) (2 fine)))"
            t = canopy_torch.parse_tree(s); y = torch.tensor([int(l) for l in t.labels()])
            loss = F.cross_entropy(m(t)["logits"], y); opt.zero_grad(); loss.backward(); opt.step()
        canopy_torch.save(m, "models/sst")
"""


class _TreeModule(CanopyModule):
    binary = True        # more than two children is an error (not childsum)

    def __init__(self, vocab, hidden, embed, classes, lowercase, labels):
        super().__init__()
        self._setup(vocab, hidden, embed, classes, lowercase, labels)

    def forward(self, tree):
        nodes = tree.nodes
        n = len(nodes)
        if n == 0:
            raise ValueError("bad_tree: empty tree")
        height = [0] * n
        for k in range(n - 1, -1, -1):
            kids = nodes[k].children
            if self.binary and len(kids) > 2:
                raise ValueError(f"too_many_children: node {k} (pre-order) has "
                                 f"{len(kids)} children; {self.family} allows at "
                                 "most 2 (use childsum-treelstm)")
            if kids:
                height[k] = 1 + max(height[c] for c in kids)
            elif not nodes[k].is_leaf():
                raise ValueError(f"bad_tree: node {k} has neither a word nor children")
        leaves = [k for k in range(n) if nodes[k].is_leaf()]
        levels = {}
        for k in range(n):
            if not nodes[k].is_leaf():
                levels.setdefault(height[k], []).append(k)
        st = [None] * n
        ids = self._ids([self.vocab.id(nodes[k].word) for k in leaves])
        for k, s in zip(leaves, _rows(self._leaves(ids))):
            st[k] = s
        for hgt in sorted(levels):
            group = levels[hgt]
            for k, s in zip(group, self._internal(tree, group, st)):
                st[k] = s
        hs = torch.stack([s[0] for s in st])
        logits = hs @ self.out.W.t() + self.out.b
        return {"logits": logits, "h": st[0][0], "label": int(logits[0].argmax())}

    def _kid(self, tree, group, st, j, zero):
        """Child j of every node of ``group``, stacked per state component
        (``zero`` stands in for an absent child)."""
        cols = []
        for k in group:
            kids = tree.nodes[k].children
            cols.append(st[kids[j]] if j < len(kids) else zero)
        return [torch.stack(c) for c in zip(*cols)]

    def _internal(self, tree, group, st):
        return _rows(self._cell(self.internal, tree, group, st))


def _rows(states):
    """Tuple of [g, ...] tensors -> list of g tuples of rows."""
    return list(zip(*[s.unbind(0) for s in states]))


class TreeLSTM(_TreeModule):
    __doc__ = """Family ``treelstm``: binary constituency Tree-LSTM (Tai et al. 2015).

    Parameters (state_dict keys): ``embed [V,D]``, ``leaf.W [3H,D]``,
    ``leaf.b [3H]``, ``internal.U [5H,2H]``, ``internal.b [5H]``,
    ``out.W [C,H]``, ``out.b [C]``. Leaf gates (i, o, u); internal gates
    (i, f1, f2, o, u); a unary node's second child is zero.
    """ + _TRAIN.format(cls="TreeLSTM")

    family = "treelstm"

    def __init__(self, vocab, *, hidden=150, embed=300, classes=5,
                 lowercase=False, labels=None):
        super().__init__(vocab, hidden, embed, classes, lowercase, labels)
        H, D, C = self.hidden, self.embed_dim, self.classes
        self.embed = torch.nn.Parameter(torch.empty(len(self.vocab), D))
        self.leaf = Params(W=(3 * H, D), b=(3 * H,))
        self._make_internal()
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def _make_internal(self):
        H = self.hidden
        self.internal = Params(U=(5 * H, 2 * H), b=(5 * H,))

    def _leaves(self, ids):
        i, o, u = split(self.embed[ids] @ self.leaf.W.t() + self.leaf.b, 3)
        c = torch.sigmoid(i) * torch.tanh(u)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _cell(self, p, tree, group, st):
        z = self._zeros(self.hidden)
        h1, c1 = self._kid(tree, group, st, 0, (z, z))
        h2, c2 = self._kid(tree, group, st, 1, (z, z))
        i, f1, f2, o, u = split(torch.cat([h1, h2], -1) @ p.U.t() + p.b, 5)
        c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f1) * c1
             + torch.sigmoid(f2) * c2)
        return torch.sigmoid(o) * torch.tanh(c), c


class TreeLSTM2Type(TreeLSTM):
    __doc__ = """Family ``treelstm-2type``: a TreeLSTM with two internal cells.

    Parameters: as ``TreeLSTM`` with ``internal_a.U [5H,2H]``,
    ``internal_a.b [5H]``, ``internal_b.U``, ``internal_b.b`` instead of
    ``internal.*``. A node uses ``internal_b`` when its ``type`` is "b"
    (JSON input), or, for bracketed input (type None), when its label is in
    ``type_b_labels``; else ``internal_a``.
    """ + _TRAIN.format(cls="TreeLSTM2Type").replace(
        "classes=5)", "classes=5, type_b_labels=[\"NP\"])")

    family = "treelstm-2type"

    def __init__(self, vocab, *, hidden=150, embed=300, classes=5,
                 type_b_labels=(), lowercase=False, labels=None):
        super().__init__(vocab, hidden=hidden, embed=embed, classes=classes,
                         lowercase=lowercase, labels=labels)
        self.type_b_labels = [str(x) for x in (type_b_labels or ())]

    def _make_internal(self):
        H = self.hidden
        self.internal_a = Params(U=(5 * H, 2 * H), b=(5 * H,))
        self.internal_b = Params(U=(5 * H, 2 * H), b=(5 * H,))

    def node_type(self, node):
        if node.type is not None:
            return node.type
        return "b" if node.label is not None and node.label in self.type_b_labels else "a"

    def _internal(self, tree, group, st):
        out = {}
        for typ, p in (("a", self.internal_a), ("b", self.internal_b)):
            sub = [k for k in group if self.node_type(tree.nodes[k]) == typ]
            if sub:
                out.update(zip(sub, _rows(self._cell(p, tree, sub, st))))
        return [out[k] for k in group]

    def model_options(self):
        return dict(super().model_options(), type_b_labels=list(self.type_b_labels))


class TreeGRU(_TreeModule):
    __doc__ = """Family ``treegru``: binary Tree-GRU.

    Parameters: ``embed [V,D]``, ``leaf.W [H,D]``, ``leaf.b [H]``,
    ``internal.Ug [3H,2H]``, ``internal.bg [3H]`` (gates r1, r2, z),
    ``internal.Un [H,2H]``, ``internal.bn [H]``, ``out.W [C,H]``, ``out.b [C]``.
    h = z * (h1 + h2) / 2 + (1 - z) * n; a unary node's second child is zero.
    """ + _TRAIN.format(cls="TreeGRU")

    family = "treegru"

    def __init__(self, vocab, *, hidden=150, embed=300, classes=5,
                 lowercase=False, labels=None):
        super().__init__(vocab, hidden, embed, classes, lowercase, labels)
        H, D, C = self.hidden, self.embed_dim, self.classes
        self.embed = torch.nn.Parameter(torch.empty(len(self.vocab), D))
        self.leaf = Params(W=(H, D), b=(H,))
        self.internal = Params(Ug=(3 * H, 2 * H), bg=(3 * H,),
                               Un=(H, 2 * H), bn=(H,))
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def _leaves(self, ids):
        return (torch.tanh(self.embed[ids] @ self.leaf.W.t() + self.leaf.b),)

    def _cell(self, p, tree, group, st):
        z0 = self._zeros(self.hidden)
        (h1,) = self._kid(tree, group, st, 0, (z0,))
        (h2,) = self._kid(tree, group, st, 1, (z0,))
        r1, r2, z = split(torch.sigmoid(torch.cat([h1, h2], -1) @ p.Ug.t() + p.bg), 3)
        n = torch.tanh(torch.cat([r1 * h1, r2 * h2], -1) @ p.Un.t() + p.bn)
        return (z * ((h1 + h2) / 2) + (1 - z) * n,)


class ChildSumTreeLSTM(_TreeModule):
    __doc__ = """Family ``childsum-treelstm``: Child-Sum Tree-LSTM, any arity.

    Parameters: ``embed [V,D]``, ``cell.W [4H,D]``, ``cell.U [4H,H]``,
    ``cell.b [4H]`` (rows i, f, o, u), ``out.W [C,H]``, ``out.b [C]``.
    x = embed[w] at a leaf, zero at an internal node; one forget gate per child.
    """ + _TRAIN.format(cls="ChildSumTreeLSTM")

    family = "childsum-treelstm"
    binary = False

    def __init__(self, vocab, *, hidden=150, embed=300, classes=5,
                 lowercase=False, labels=None):
        super().__init__(vocab, hidden, embed, classes, lowercase, labels)
        H, D, C = self.hidden, self.embed_dim, self.classes
        self.embed = torch.nn.Parameter(torch.empty(len(self.vocab), D))
        self.cell = Params(W=(4 * H, D), U=(4 * H, H), b=(4 * H,))
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def _leaves(self, ids):
        i, _, o, u = split(self.embed[ids] @ self.cell.W.t() + self.cell.b, 4)
        c = torch.sigmoid(i) * torch.tanh(u)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _internal(self, tree, group, st):
        return _rows(self._cell(self.cell, tree, group, st))

    def _cell(self, p, tree, group, st):
        # internal nodes: x = 0, so the W x terms vanish
        par, hk, ck = [], [], []
        for j, k in enumerate(group):
            for c in tree.nodes[k].children:
                par.append(j)
                hk.append(st[c][0])
                ck.append(st[c][1])
        par = self._ids(par)
        hk, ck = torch.stack(hk), torch.stack(ck)
        H = self.hidden
        hs = self._zeros(len(group), H).index_add(0, par, hk)
        Ui, Uf, Uo, Uu = split(p.U.t(), 4)
        bi, bf, bo, bu = split(p.b, 4)
        f = torch.sigmoid(hk @ Uf + bf)
        i = torch.sigmoid(hs @ Ui + bi)
        o = torch.sigmoid(hs @ Uo + bo)
        u = torch.tanh(hs @ Uu + bu)
        c = i * u + self._zeros(len(group), H).index_add(0, par, f * ck)
        return o * torch.tanh(c), c


class MVRNN(_TreeModule):
    __doc__ = """Family ``mvrnn``: Matrix-Vector RNN (Socher et al. 2012); D = H.

    Parameters: ``embed [V,H]``, ``leaf.M [K,H,H]`` (word w < K uses
    leaf.M[w], else leaf.M[0]; K defaults to V), ``internal.W [H,2H]``,
    ``internal.b [H]``, ``internal.WM [H,2H]``, ``out.W [C,H]``, ``out.b [C]``.
    p = tanh(W [B a; A b] + b), P = WM [A; B]; a unary node has b = 0, B = I.
    ``h`` is the root's p.
    """ + _TRAIN.format(cls="MVRNN").replace("hidden=150, embed=300", "hidden=50")

    family = "mvrnn"

    def __init__(self, vocab, *, hidden=50, embed=None, classes=5, matrices=None,
                 lowercase=False, labels=None):
        if embed is not None and int(embed) != int(hidden):
            raise ValueError(f"mvrnn needs embed ({embed}) == hidden ({hidden})")
        super().__init__(vocab, hidden, hidden, classes, lowercase, labels)
        H, C = self.hidden, self.classes
        K = len(self.vocab) if matrices is None else int(matrices)
        self.embed = torch.nn.Parameter(torch.empty(len(self.vocab), H))
        self.leaf = Params(M=(K, H, H))
        self.internal = Params(W=(H, 2 * H), b=(H,), WM=(H, 2 * H))
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def _leaves(self, ids):
        K = self.leaf.M.shape[0]
        return self.embed[ids], self.leaf.M[torch.where(ids < K, ids, torch.zeros_like(ids))]

    def _cell(self, p, tree, group, st):
        H = self.hidden
        a, A = self._kid(tree, group, st, 0, None)
        b, B = self._kid(tree, group, st, 1, (self._zeros(H), torch.eye(H, out=self._zeros(H, H))))
        Ba = (B @ a.unsqueeze(-1)).squeeze(-1)
        Ab = (A @ b.unsqueeze(-1)).squeeze(-1)
        pv = torch.tanh(torch.cat([Ba, Ab], -1) @ p.W.t() + p.b)
        return pv, p.WM @ torch.cat([A, B], 1)
