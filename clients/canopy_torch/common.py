"""Pieces shared by the family modules: named parameter containers, the
LSTMCell / GRUCell math of docs/models.md, and the base class that carries a
module's vocabularies and model.json options."""
import math

import torch
from torch import nn

from .data import Vocab

__all__ = ["Params", "CanopyModule", "lstm_cell", "gru_cell", "split"]


class Params(nn.Module):
    """A container of plain parameters, so that ``self.leaf = Params(W=(3H, D),
    b=(3H,))`` gives the state_dict keys ``leaf.W`` and ``leaf.b``."""

    def __init__(self, **shapes):
        super().__init__()
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(torch.empty(*shape)))


def split(v, n):
    """docs/models.md "split (a, b, ...)": n equal consecutive parts of the
    last dim."""
    return v.chunk(n, dim=-1)


def lstm_cell(p, x, h, c):
    """nn.LSTMCell with ``p.W_ih, p.W_hh, p.b_ih, p.b_hh``; rows (i, f, g, o).
    x, h, c: [..., D] / [..., H]."""
    g = x @ p.W_ih.t() + p.b_ih + h @ p.W_hh.t() + p.b_hh
    i, f, u, o = split(g, 4)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
    return torch.sigmoid(o) * torch.tanh(c2), c2


def gru_cell(p, x, h):
    """nn.GRUCell with ``p.W_ih, p.W_hh, p.b_ih, p.b_hh``; rows (r, z, n)."""
    xr, xz, xn = split(x @ p.W_ih.t() + p.b_ih, 3)
    hr, hz, hn = split(h @ p.W_hh.t() + p.b_hh, 3)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


class CanopyModule(nn.Module):
    """Base of every family module: ``vocab`` (a ``Vocab``), ``lowercase``,
    ``labels``, sizes ``hidden``, ``embed_dim``, ``classes``, and
    ``model_options()`` (the model.json options ``save`` writes)."""

    family = None

    def _setup(self, vocab, hidden, embed, classes, lowercase, labels):
        if vocab is None:
            raise ValueError(f"{self.family}: a vocabulary (list of tokens, "
                             "id 0 = '<unk>') is required")
        if isinstance(vocab, int):
            vocab = ["<unk>"] + [f"#{i}" for i in range(1, vocab)]
        self.lowercase = bool(lowercase)
        self.vocab = Vocab(vocab, self.lowercase)
        self.hidden, self.embed_dim = int(hidden), int(embed)
        self.classes = None if classes is None else int(classes)
        self.labels = None if labels is None else [str(x) for x in labels]
        if self.labels is not None and self.classes is not None \
                and len(self.labels) != self.classes:
            raise ValueError(f"{len(self.labels)} labels for {self.classes} classes")

    def _zeros(self, *shape):
        """Zeros on the module's device and dtype."""
        return next(self.parameters()).new_zeros(shape)

    def _ids(self, ids):
        """ids (list or LongTensor) as a LongTensor on the module's device."""
        return torch.as_tensor(ids, dtype=torch.long,
                               device=next(self.parameters()).device)

    def model_options(self):
        """Family options for model.json (vocab files other than ``vocab``
        included as token lists)."""
        return {"lowercase": True} if self.lowercase else {}

    def reset_parameters(self):
        """Embedding tables N(0, 1); matrices U(+-1/sqrt(fan_in)) as nn.Linear;
        biases U(+-1/sqrt(H)); mvrnn's leaf.M identity + N(0, 0.01);
        CRF scores zero."""
        bound_b = 1 / math.sqrt(self.hidden)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("embed"):
                    p.normal_(0, 1)
                elif name == "leaf.M":
                    p.normal_(0, 0.01)
                    p += torch.eye(p.shape[1])
                elif name.startswith("crf."):
                    p.zero_()
                elif p.dim() == 1:
                    p.uniform_(-bound_b, bound_b)
                else:
                    b = 1 / math.sqrt(p.shape[-1])
                    p.uniform_(-b, b)

    def extra_repr(self):
        return (f"family={self.family!r}, vocab={len(self.vocab)}, "
                f"hidden={self.hidden}, embed={self.embed_dim}, "
                f"classes={self.classes}")
