"""dgl-treelstm: DGL examples/pytorch/tree_lstm (TreeLSTM with the N-ary,
binary TreeLSTMCell) -> Canopy treelstm.

DGL: leaves iou = W_iou x + b_iou; internal nodes h_cat = [h1; h2],
iou = U_iou h_cat + b_iou, f = sigmoid(U_f h_cat) viewed [2, H];
i, o, u = chunks; c = sigmoid(i) tanh(u) + f1 c1 + f2 c2 (leaves: c = 0
before), h = sigmoid(o) tanh(c); logits = linear(h).
Canopy: internal g = internal.U [h1; h2] + internal.b split (i, f1, f2, o, u).
"""
import torch

from .common import Dim, KeyCheck, blocks, check_rows, dim_of, f32, \
    read_labels, sample_trees, Lookup
from . import verify as V

NAME = "dgl-treelstm"
FAMILY = "treelstm"
KEYS = """\
embedding.weight [V,D]      -> embed
cell.W_iou.weight [3H,D]    -> leaf.W          (chunks i, o, u)
cell.b_iou [1,3H]           -> leaf.b, and internal.b rows i, o, u
cell.U_iou.weight [3H,2H]   -> internal.U rows i, o, u
cell.U_f.weight [2H,2H]     -> internal.U rows f1, f2
cell.U_f.bias [2H]          -> internal.b rows f1, f2
linear.weight [C,H]         -> out.W
linear.bias [C]             -> out.b
Binary trees; a unary node's missing child is zero (as in Canopy).
"""


def convert(sd, args, vocab):
    from . import Conversion
    V_ = dim_of(sd, "embedding.weight", 0, NAME, "the embedding", ndim=2)
    D = dim_of(sd, "embedding.weight", 1, NAME, "the embedding", ndim=2)
    H = dim_of(sd, "cell.U_f.bias", 0, NAME, "U_f's bias: 2H", ndim=1,
               divisor=2)
    C = dim_of(sd, "linear.weight", 0, NAME, "the output layer", ndim=2)
    kc = KeyCheck(sd, NAME)
    kc.expect("embedding.weight", Dim("V", V_), Dim("D", D))
    kc.expect("cell.W_iou.weight", Dim("3H", 3 * H), Dim("D", D))
    kc.expect("cell.U_iou.weight", Dim("3H", 3 * H), Dim("2H", 2 * H))
    if "cell.b_iou" in sd and sd["cell.b_iou"].dim() == 1:
        kc.expect("cell.b_iou", Dim("3H", 3 * H))
    else:
        kc.expect("cell.b_iou", 1, Dim("3H", 3 * H))
    kc.expect("cell.U_f.weight", Dim("2H", 2 * H), Dim("2H", 2 * H))
    kc.expect("cell.U_f.bias", Dim("2H", 2 * H))
    kc.expect("linear.weight", Dim("C", C), Dim("H", H))
    kc.expect("linear.bias", Dim("C", C))
    kc.check()
    check_rows(sd, "embedding.weight", vocab, "--vocab")
    labels = read_labels(args.labels, C) if args.labels else None

    b_iou = sd["cell.b_iou"].reshape(-1)
    Ui, Uo, Uu = blocks(sd["cell.U_iou.weight"], 3)
    bi, bo, bu = blocks(b_iou, 3)
    tensors = {
        "embed": f32(sd["embedding.weight"]),
        "leaf.W": f32(sd["cell.W_iou.weight"]),
        "leaf.b": f32(b_iou),
        "internal.U": f32(torch.cat([Ui, sd["cell.U_f.weight"], Uo, Uu])),
        "internal.b": f32(torch.cat([bi, sd["cell.U_f.bias"], bo, bu])),
        "out.W": f32(sd["linear.weight"]),
        "out.b": f32(sd["linear.bias"]),
    }
    summary = [
        "embedding.weight -> embed",
        "cell.W_iou.weight -> leaf.W; cell.b_iou -> leaf.b (i, o, u)",
        "cell.U_iou.weight (i | o | u) + cell.U_f.weight (f1 | f2) -> "
        "internal.U rows (i, f1, f2, o, u)",
        "cell.b_iou (i | o | u) + cell.U_f.bias (f1 | f2) -> "
        "internal.b rows (i, f1, f2, o, u)",
        "linear.weight/bias -> out.W/out.b",
    ]
    meta = dict(hidden=H, embed=D, classes=C, vocab=vocab, labels=labels,
                lowercase=True if args.lowercase else None)
    return Conversion(FAMILY, tensors, meta, summary, sd=sd, vocab=vocab,
                      H=H)


class DGLNaryTreeLSTM(object):
    """DGL's TreeLSTM + TreeLSTMCell (N-ary, N = 2), computed recursively
    with the checkpoint's own tensors (float64)."""

    def __init__(self, sd, H):
        self.H = H
        self.embedding = torch.nn.Embedding.from_pretrained(
            sd["embedding.weight"])
        self.W_iou = torch.nn.Linear(1, 1, bias=False).double()
        self.W_iou.weight = torch.nn.Parameter(sd["cell.W_iou.weight"])
        self.U_iou = torch.nn.Linear(1, 1, bias=False).double()
        self.U_iou.weight = torch.nn.Parameter(sd["cell.U_iou.weight"])
        self.b_iou = sd["cell.b_iou"].reshape(1, -1)
        self.U_f = torch.nn.Linear(1, 1).double()
        self.U_f.weight = torch.nn.Parameter(sd["cell.U_f.weight"])
        self.U_f.bias = torch.nn.Parameter(sd["cell.U_f.bias"])
        self.linear = torch.nn.Linear(1, 1).double()
        self.linear.weight = torch.nn.Parameter(sd["linear.weight"])
        self.linear.bias = torch.nn.Parameter(sd["linear.bias"])

    def apply_node(self, iou, c):
        iou = iou + self.b_iou
        i, o, u = torch.chunk(iou, 3, 1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)
        c = i * u + c
        return o * torch.tanh(c), c

    def node(self, t, lookup, out):
        H = self.H
        if t.is_leaf():
            x = self.embedding(torch.tensor([lookup(t.word)]))
            h, c = self.apply_node(self.W_iou(x), torch.zeros(1, H,
                                                              dtype=x.dtype))
        else:
            if len(t.children) > 2:
                raise ValueError(f"a node has {len(t.children)} children; "
                                 "the N-ary (binary) Tree-LSTM takes at most "
                                 "2 (dgl-childsum / childsum-treelstm take "
                                 "any number)")
            kids = [self.node(k, lookup, out) for k in t.children]
            while len(kids) < 2:         # unary node: a zero second child
                z = torch.zeros(1, H, dtype=torch.float64)
                kids.append((z, z))
            h_cat = torch.cat([k[0] for k in kids], 1)           # [1, 2H]
            f = torch.sigmoid(self.U_f(h_cat)).view(1, 2, H)
            c = torch.sum(f * torch.stack([k[1] for k in kids], 1), 1)
            h, c = self.apply_node(self.U_iou(h_cat), c)
        out[id(t)] = h
        return h, c

    @torch.no_grad()
    def states(self, t, lookup):
        out = {}
        self.node(t, lookup, out)
        return {k: v[0] for k, v in out.items()}

    @torch.no_grad()
    def logits(self, h):
        return self.linear(h)


NAMES = {
    "embed": "embed <- embedding.weight",
    "leaf": "leaf.W / leaf.b <- cell.W_iou.weight / cell.b_iou (i, o, u)",
    "internal": "internal.U / internal.b <- cell.U_iou.weight, "
                "cell.U_f.weight / cell.b_iou, cell.U_f.bias "
                "(rows i, f1, f2, o, u)",
    "out": "out.W / out.b <- linear.weight / linear.bias",
}


def sample(conv):
    return sample_trees(conv.vocab, arity=2)


def verify(conv, args, canopy, model_dir, insts):
    m = DGLNaryTreeLSTM(conv.sd, conv.H)
    look = Lookup(conv.vocab, args.lowercase)
    with torch.no_grad():
        return V.verify_trees(conv, canopy, model_dir, insts, args.tolerance,
                              lambda t: m.states(t, look), m.logits, NAMES)
