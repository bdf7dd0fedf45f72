"""dgl-childsum: DGL examples/pytorch/tree_lstm ChildSumTreeLSTMCell
(TreeLSTM(..., cell_type='childsum')) -> Canopy childsum-treelstm.

DGL: leaves iou = W_iou x + b_iou; internal nodes iou = U_iou (sum_k h_k)
+ b_iou (no x: DGL masks internal nodes' input), f_k = sigmoid(U_f h_k +
b_f), c = sigmoid(i) tanh(u) + sum_k f_k c_k, h = sigmoid(o) tanh(c).
Canopy: cell.W/U/b rows (i, f, o, u); W_f = 0 (DGL's forget gate has no x).
"""
import torch

from .common import Dim, KeyCheck, blocks, check_rows, dim_of, f32, \
    read_labels, sample_trees, Lookup
from . import verify as V

NAME = "dgl-childsum"
FAMILY = "childsum-treelstm"
KEYS = """\
embedding.weight [V,D]      -> embed
cell.W_iou.weight [3H,D]    -> cell.W rows i, o, u (rows f = 0)
cell.U_iou.weight [3H,H]    -> cell.U rows i, o, u
cell.b_iou [1,3H]           -> cell.b rows i, o, u
cell.U_f.weight [H,H]       -> cell.U rows f
cell.U_f.bias [H]           -> cell.b rows f
linear.weight [C,H]         -> out.W
linear.bias [C]             -> out.b
"""


def convert(sd, args, vocab):
    from . import Conversion
    V_ = dim_of(sd, "embedding.weight", 0, NAME, "the embedding", ndim=2)
    D = dim_of(sd, "embedding.weight", 1, NAME, "the embedding", ndim=2)
    H = dim_of(sd, "cell.U_f.bias", 0, NAME, "U_f's bias: H", ndim=1)
    C = dim_of(sd, "linear.weight", 0, NAME, "the output layer", ndim=2)
    kc = KeyCheck(sd, NAME)
    kc.expect("embedding.weight", Dim("V", V_), Dim("D", D))
    kc.expect("cell.W_iou.weight", Dim("3H", 3 * H), Dim("D", D))
    kc.expect("cell.U_iou.weight", Dim("3H", 3 * H), Dim("H", H))
    if "cell.b_iou" in sd and sd["cell.b_iou"].dim() == 1:
        kc.expect("cell.b_iou", Dim("3H", 3 * H))
    else:
        kc.expect("cell.b_iou", 1, Dim("3H", 3 * H))
    kc.expect("cell.U_f.weight", Dim("H", H), Dim("H", H))
    kc.expect("cell.U_f.bias", Dim("H", H))
    kc.expect("linear.weight", Dim("C", C), Dim("H", H))
    kc.expect("linear.bias", Dim("C", C))
    kc.check()
    check_rows(sd, "embedding.weight", vocab, "--vocab")
    labels = read_labels(args.labels, C) if args.labels else None

    Wi, Wo, Wu = blocks(sd["cell.W_iou.weight"], 3)
    Ui, Uo, Uu = blocks(sd["cell.U_iou.weight"], 3)
    bi, bo, bu = blocks(sd["cell.b_iou"].reshape(-1), 3)
    tensors = {
        "embed": f32(sd["embedding.weight"]),
        "cell.W": f32(torch.cat([Wi, torch.zeros_like(Wi), Wo, Wu])),
        "cell.U": f32(torch.cat([Ui, sd["cell.U_f.weight"], Uo, Uu])),
        "cell.b": f32(torch.cat([bi, sd["cell.U_f.bias"], bo, bu])),
        "out.W": f32(sd["linear.weight"]),
        "out.b": f32(sd["linear.bias"]),
    }
    summary = [
        "embedding.weight -> embed",
        "cell.W_iou.weight (i | o | u) + zeros (f) -> cell.W rows "
        "(i, f, o, u)",
        "cell.U_iou.weight (i | o | u) + cell.U_f.weight -> cell.U rows "
        "(i, f, o, u)",
        "cell.b_iou (i | o | u) + cell.U_f.bias -> cell.b rows (i, f, o, u)",
        "linear.weight/bias -> out.W/out.b",
    ]
    meta = dict(hidden=H, embed=D, classes=C, vocab=vocab, labels=labels,
                lowercase=True if args.lowercase else None)
    return Conversion(FAMILY, tensors, meta, summary, sd=sd, vocab=vocab,
                      H=H)


class DGLChildSumTreeLSTM(object):
    """DGL's TreeLSTM with ChildSumTreeLSTMCell, recursively (float64)."""

    def __init__(self, sd, H):
        self.H = H
        self.embedding = torch.nn.Embedding.from_pretrained(
            sd["embedding.weight"])
        self.W_iou = lambda x: x @ sd["cell.W_iou.weight"].t()
        self.U_iou = lambda x: x @ sd["cell.U_iou.weight"].t()
        self.b_iou = sd["cell.b_iou"].reshape(1, -1)
        self.U_f = lambda x: x @ sd["cell.U_f.weight"].t() + sd["cell.U_f.bias"]
        self.W_out, self.b_out = sd["linear.weight"], sd["linear.bias"]

    def apply_node(self, iou, c):
        i, o, u = torch.chunk(iou + self.b_iou, 3, 1)
        c = torch.sigmoid(i) * torch.tanh(u) + c
        return torch.sigmoid(o) * torch.tanh(c), c

    def node(self, t, lookup, out):
        if t.is_leaf():
            x = self.embedding(torch.tensor([lookup(t.word)]))
            h, c = self.apply_node(self.W_iou(x),
                                   torch.zeros(1, self.H, dtype=x.dtype))
        else:
            kids = [self.node(k, lookup, out) for k in t.children]
            hk = torch.cat([k[0] for k in kids], 0)          # [K, H]
            ck = torch.cat([k[1] for k in kids], 0)
            f = torch.sigmoid(self.U_f(hk))
            c = torch.sum(f * ck, 0, keepdim=True)
            h_tild = torch.sum(hk, 0, keepdim=True)
            h, c = self.apply_node(self.U_iou(h_tild), c)
        out[id(t)] = h[0]
        return h, c

    @torch.no_grad()
    def states(self, t, lookup):
        out = {}
        self.node(t, lookup, out)
        return out

    def logits(self, h):
        return self.W_out @ h + self.b_out


NAMES = {
    "embed": "embed <- embedding.weight",
    "leaf": "cell.W / cell.b rows i, o, u <- cell.W_iou.weight / cell.b_iou",
    "internal": "cell.U <- cell.U_iou.weight (i, o, u), cell.U_f.weight (f); "
                "cell.b rows f <- cell.U_f.bias",
    "out": "out.W / out.b <- linear.weight / linear.bias",
}


def sample(conv):
    return sample_trees(conv.vocab, arity=4)


def verify(conv, args, canopy, model_dir, insts):
    m = DGLChildSumTreeLSTM(conv.sd, conv.H)
    look = Lookup(conv.vocab, args.lowercase)
    with torch.no_grad():
        return V.verify_trees(conv, canopy, model_dir, insts, args.tolerance,
                              lambda t: m.states(t, look), m.logits, NAMES)
