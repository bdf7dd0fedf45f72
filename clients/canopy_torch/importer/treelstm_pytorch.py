"""treelstm-pytorch: dasguptar/treelstm.pytorch treelstm/model.py, the
ChildSumTreeLSTM inside SimilarityTreeLSTM -> Canopy childsum-treelstm.

dasguptar's node_forward(inputs, child_c, child_h):
  iou = ioux(x) + iouh(sum_k h_k); i, o, u = split; i, o = sigmoid, u = tanh
  f = sigmoid(fh(child_h) + fx(x).repeat(K, 1)); c = i u + sum_k f_k c_k
  h = o tanh(c); a leaf has one zero child.
It feeds a word at every node of a dependency tree; Canopy's childsum feeds x
at leaves only (x = 0 at internal nodes: only the biases of ioux/fx remain),
and the verification here follows Canopy's input semantics.
"""
import torch

from .common import Dim, ImportFailure, KeyCheck, blocks, check_rows, \
    dim_of, f32, read_labels, sample_trees, Lookup
from . import verify as V

NAME = "treelstm-pytorch"
FAMILY = "childsum-treelstm"
P = "childsumtreelstm."
KEYS = """\
emb.weight [V,D]                        -> embed
childsumtreelstm.ioux.weight [3H,D]     -> cell.W rows i, o, u
childsumtreelstm.iouh.weight [3H,H]     -> cell.U rows i, o, u
childsumtreelstm.fx.weight [H,D]        -> cell.W rows f
childsumtreelstm.fh.weight [H,H]        -> cell.U rows f
childsumtreelstm.{ioux,iouh}.bias [3H]  -> summed: cell.b rows i, o, u
childsumtreelstm.{fx,fh}.bias [H]       -> summed: cell.b rows f
similarity.{wh,wp}.{weight,bias}        ignored (the similarity head)
--head PREFIX: PREFIX.weight [C,H], PREFIX.bias [C] -> out.W, out.b
  (without it out.W/out.b are zero, C = 1: read h with return_hidden)
Input semantics: Canopy feeds word vectors at leaves only (x = 0 at internal
nodes); dasguptar feeds a word at every node of a dependency tree.
"""


def convert(sd, args, vocab):
    from . import Conversion
    V_ = dim_of(sd, "emb.weight", 0, NAME, "the embedding", ndim=2)
    D = dim_of(sd, "emb.weight", 1, NAME, "the embedding", ndim=2)
    H = dim_of(sd, P + "fh.weight", 0, NAME, "fh: [H, H]", ndim=2)
    kc = KeyCheck(sd, NAME)
    kc.expect("emb.weight", Dim("V", V_), Dim("D", D))
    kc.expect(P + "ioux.weight", Dim("3H", 3 * H), Dim("D", D))
    kc.expect(P + "ioux.bias", Dim("3H", 3 * H))
    kc.expect(P + "iouh.weight", Dim("3H", 3 * H), Dim("H", H))
    kc.expect(P + "iouh.bias", Dim("3H", 3 * H))
    kc.expect(P + "fx.weight", Dim("H", H), Dim("D", D))
    kc.expect(P + "fx.bias", Dim("H", H))
    kc.expect(P + "fh.weight", Dim("H", H), Dim("H", H))
    kc.expect(P + "fh.bias", Dim("H", H))
    notes = []
    ignored = [k for k in sd if k.startswith("similarity.")
               and (not args.head or not k.startswith(args.head + "."))]
    for k in ignored:
        kc.ignore(k, "similarity head")
    if ignored:
        notes.append("ignored the similarity head (" + ", ".join(
            sorted(ignored)) + "): Canopy serves the tree encoder")
    if args.head:
        C = dim_of(sd, args.head + ".weight", 0, NAME,
                   "the --head output layer", ndim=2)
        kc.expect(args.head + ".weight", Dim("C", C), Dim("H", H))
        kc.expect(args.head + ".bias", Dim("C", C))
    else:
        C = 1
    probs = kc.problems()
    if probs:
        heads = sorted(k[:-len(".weight")] for k in sd if k.endswith(".weight")
                       and k[:-len(".weight")] + ".bias" in sd
                       and sd[k].dim() == 2 and sd[k].shape[1] == H
                       and not k.startswith((P, "similarity.")))
        if heads and not args.head:
            probs.append(f"(an output layer [C, H={H}]? take it with --head "
                         + " or --head ".join(heads) + ")")
        raise ImportFailure(f"{NAME}: the checkpoint does not fit the format:"
                            "\n  " + "\n  ".join(probs))
    kc.check()
    check_rows(sd, "emb.weight", vocab, "--vocab")
    labels = read_labels(args.labels, C) if args.labels else None

    g = lambda k: sd[P + k]
    Wi, Wo, Wu = blocks(g("ioux.weight"), 3)
    Ui, Uo, Uu = blocks(g("iouh.weight"), 3)
    bi, bo, bu = blocks(g("ioux.bias") + g("iouh.bias"), 3)
    tensors = {
        "embed": f32(sd["emb.weight"]),
        "cell.W": f32(torch.cat([Wi, g("fx.weight"), Wo, Wu])),
        "cell.U": f32(torch.cat([Ui, g("fh.weight"), Uo, Uu])),
        "cell.b": f32(torch.cat([bi, g("fx.bias") + g("fh.bias"), bo, bu])),
    }
    if args.head:
        tensors["out.W"] = f32(sd[args.head + ".weight"])
        tensors["out.b"] = f32(sd[args.head + ".bias"])
        head = f"{args.head}.weight/bias -> out.W/out.b"
    else:
        tensors["out.W"] = torch.zeros(1, H)
        tensors["out.b"] = torch.zeros(1)
        head = "no output layer (--head): out.W/out.b zero, 1 class"
        notes.append("no --head: the output layer is zero (1 class); the "
                     "encoding is h (request return_hidden)")
    notes.append("Canopy's childsum-treelstm feeds word vectors at leaves "
                 "only (x = 0 at internal nodes), unlike dasguptar's "
                 "dependency trees with a word at every node; verified "
                 "with Canopy's input semantics")
    summary = [
        "emb.weight -> embed",
        "ioux.weight (i | o | u) + fx.weight -> cell.W rows (i, f, o, u)",
        "iouh.weight (i | o | u) + fh.weight -> cell.U rows (i, f, o, u)",
        "ioux.bias + iouh.bias (i | o | u), fx.bias + fh.bias -> cell.b "
        "rows (i, f, o, u)",
        head,
    ]
    meta = dict(hidden=H, embed=D, classes=C, vocab=vocab, labels=labels,
                lowercase=True if args.lowercase else None)
    return Conversion(FAMILY, tensors, meta, summary, notes, sd=sd,
                      vocab=vocab, H=H, D=D, head=args.head)


class ChildSumTreeLSTM(torch.nn.Module):
    """dasguptar's ChildSumTreeLSTM, with the checkpoint's tensors."""

    def __init__(self, sd, D, H):
        super().__init__()
        self.in_dim, self.mem_dim = D, H
        self.ioux = torch.nn.Linear(D, 3 * H).double()
        self.iouh = torch.nn.Linear(H, 3 * H).double()
        self.fx = torch.nn.Linear(D, H).double()
        self.fh = torch.nn.Linear(H, H).double()
        self.load_state_dict({k[len(P):]: v for k, v in sd.items()
                              if k.startswith(P)})

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

    def forward(self, tree, inputs, out):
        """inputs(node) -> [1, D] (Canopy: the word at leaves, else 0)."""
        for ch in tree.children:
            self.forward(ch, inputs, out)
        if not tree.children:
            child_c = torch.zeros(1, self.mem_dim, dtype=torch.float64)
            child_h = torch.zeros(1, self.mem_dim, dtype=torch.float64)
        else:
            child_c = torch.cat([out[id(c)][0] for c in tree.children], 0)
            child_h = torch.cat([out[id(c)][1] for c in tree.children], 0)
        out[id(tree)] = self.node_forward(inputs(tree), child_c, child_h)
        return out[id(tree)]


NAMES = {
    "embed": "embed <- emb.weight",
    "leaf": "cell.W / cell.b rows i, o, u <- ioux.weight / ioux.bias + "
            "iouh.bias",
    "internal": "cell.U <- iouh.weight (i, o, u), fh.weight (f); cell.b rows "
                "f <- fx.bias + fh.bias",
    "out": "out.W / out.b <- --head",
}


def sample(conv):
    return sample_trees(conv.vocab, arity=4)


def verify(conv, args, canopy, model_dir, insts):
    sd = conv.sd
    m = ChildSumTreeLSTM(sd, conv.D, conv.H)
    emb = sd["emb.weight"]
    look = Lookup(conv.vocab, args.lowercase)
    zero = torch.zeros(1, conv.D, dtype=torch.float64)

    def inputs(t):
        return emb[look(t.word)].view(1, -1) if t.is_leaf() else zero

    def states(t):
        out = {}
        m.forward(t, inputs, out)
        return {k: v[1][0] for k, v in out.items()}

    names = dict(NAMES)
    if conv.head:
        W, b = sd[conv.head + ".weight"], sd[conv.head + ".bias"]
    else:
        # without a head the logits are zero: only the root's h tells
        names["internal"] = names["leaf"] = (
            "cell.W / cell.U / cell.b <- ioux, iouh, fx, fh (without --head "
            "only the root's h is compared)")
        W, b = torch.zeros(1, conv.H, dtype=torch.float64), \
            torch.zeros(1, dtype=torch.float64)
    with torch.no_grad():
        return V.verify_trees(conv, canopy, model_dir, insts, args.tolerance,
                              states, lambda h: W @ h + b, names)
