"""Sequence and lattice families of docs/models.md: bilstm-tagger (optionally
with a CRF), lstm-nmt, latticelstm, latticegru.

These modules take ids (LongTensors) rather than strings; the vocabularies
they carry turn tokens into ids: ``m.vocab.ids(tokens)``, or
``canopy_torch.instance_to_input(m.family, api_instance, m)``, which returns
the tuple of ``forward``'s arguments.
"""
import torch
from torch import nn

from .common import CanopyModule, Params, gru_cell, lstm_cell, split
from .data import Vocab, ascii_lower

__all__ = ["BiLSTMTagger", "LSTMNMT", "LatticeLSTM", "LatticeGRU"]

BOS, EOS, DEFAULT_MAX_DECODE_LEN = 1, 2, 50


def _lstm_params(H, D):
    return Params(W_ih=(4 * H, D), W_hh=(4 * H, H), b_ih=(4 * H,), b_hh=(4 * H,))


class BiLSTMTagger(CanopyModule):
    """Family ``bilstm-tagger``: BiLSTM sequence tagger, optionally with a CRF.

    Parameters: ``embed [V,D]``; ``fwd.W_ih [4H,D]``, ``fwd.W_hh [4H,H]``,
    ``fwd.b_ih [4H]``, ``fwd.b_hh [4H]`` (nn.LSTMCell, rows i, f, g, o) and
    the same four for ``bwd``; ``out.W [C,2H]``, ``out.b [C]``. With
    ``crf=True`` also ``crf.start [C]``, ``crf.end [C]``, ``crf.trans [C,C]``
    (trans[i, j] scores tag j following tag i).

    ``forward(ids)`` -> ``{"logits": [n,C] emission scores, "h": [n,2H] =
    [hf_t; hb_t], "tags", "path_score"}`` (tags and score as ``decode``); ``decode(ids)`` -> (tags,
    path_score): Viterbi of start[y1] + sum e_t[y_t] + sum trans[y_{t-1}, y_t]
    + end[y_n] with ties to the lowest id (without a CRF: the argmax tags and
    the sum of their logits); ``nll(ids, tags)``: the CRF's negative
    log-likelihood (forward algorithm); without a CRF, the summed cross-entropy.

    Training::

        m = BiLSTMTagger(vocab, hidden=100, embed=100, classes=len(tags), crf=True)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        for toks, gold in data:            # gold: list of tag ids
            loss = m.nll(m.vocab.ids(toks), gold); opt.zero_grad(); loss.backward(); opt.step()
        canopy_torch.save(m, "models/tagger", labels=tag_names)
    """

    family = "bilstm-tagger"

    def __init__(self, vocab, *, hidden=100, embed=100, classes=10, crf=False,
                 lowercase=False, labels=None):
        super().__init__()
        self._setup(vocab, hidden, embed, classes, lowercase, labels)
        H, D, C = self.hidden, self.embed_dim, self.classes
        self.embed = nn.Parameter(torch.empty(len(self.vocab), D))
        self.fwd = _lstm_params(H, D)
        self.bwd = _lstm_params(H, D)
        self.out = Params(W=(C, 2 * H), b=(C,))
        self.crf = Params(start=(C,), end=(C,), trans=(C, C)) if crf else None
        self.reset_parameters()

    @property
    def has_crf(self):
        return self.crf is not None

    def model_options(self):
        opts = super().model_options()
        if self.has_crf:
            opts["crf"] = True
        return opts

    def emissions(self, ids):
        """(logits [n,C], h [n,2H])."""
        x = self.embed[self._ids(ids)]
        n, H = x.shape[0], self.hidden
        hf, hb = [None] * n, [None] * n
        for p, order, out in ((self.fwd, range(n), hf),
                              (self.bwd, range(n - 1, -1, -1), hb)):
            h = c = self._zeros(H)
            for t in order:
                h, c = lstm_cell(p, x[t], h, c)
                out[t] = h
        if n == 0:
            hs = self._zeros(0, 2 * H)
        else:
            hs = torch.cat([torch.stack(hf), torch.stack(hb)], -1)
        return hs @ self.out.W.t() + self.out.b, hs

    def forward(self, ids):
        logits, hs = self.emissions(ids)
        tags, score = self._decode(logits)
        return {"logits": logits, "h": hs, "tags": tags, "path_score": score}

    def decode(self, ids):
        """(tags: list[int], path_score: float) of the best tag path."""
        with torch.no_grad():
            return self._decode(self.emissions(ids)[0])

    def _decode(self, e):
        e = e.detach()
        if not self.has_crf:
            tags = [int(t) for t in e.argmax(-1)] if len(e) else []
            return tags, float(sum(float(e[t, y]) for t, y in enumerate(tags)))
        if len(e) == 0:
            return [], 0.0
        trans = self.crf.trans.detach()
        score = self.crf.start.detach() + e[0]
        back = []
        for t in range(1, len(e)):
            cand = score.unsqueeze(1) + trans          # [prev i, next j]
            best = cand.argmax(0)                      # lowest i on a tie
            score = cand.gather(0, best.unsqueeze(0)).squeeze(0) + e[t]
            back.append(best)
        score = score + self.crf.end.detach()
        y = int(score.argmax())
        path_score = float(score[y])
        tags = [y]
        for best in reversed(back):
            y = int(best[y])
            tags.append(y)
        return tags[::-1], path_score

    def path_score(self, ids_or_logits, tags):
        """Score of one tag path (a Tensor; ``ids`` or emission logits)."""
        e = ids_or_logits
        if e.dtype == torch.long:
            e = self.emissions(e)[0]
        y = self._ids(tags)
        s = e.gather(1, y.unsqueeze(1)).sum()
        if self.has_crf and len(y):
            s = s + self.crf.start[y[0]] + self.crf.end[y[-1]] \
                + self.crf.trans[y[:-1], y[1:]].sum()
        return s

    def nll(self, ids, tags):
        """Negative log-likelihood of ``tags`` (a scalar Tensor to minimise)."""
        e = self.emissions(ids)[0]
        y = self._ids(tags)
        if len(y) != len(e):
            raise ValueError(f"{len(y)} tags for {len(e)} tokens")
        if not self.has_crf:
            return nn.functional.cross_entropy(e, y, reduction="sum")
        if len(e) == 0:
            return e.sum()
        alpha = self.crf.start + e[0]
        for t in range(1, len(e)):
            alpha = torch.logsumexp(alpha.unsqueeze(1) + self.crf.trans, 0) + e[t]
        return torch.logsumexp(alpha + self.crf.end, 0) - self.path_score(e, y)


class LSTMNMT(CanopyModule):
    """Family ``lstm-nmt``: LSTM encoder-decoder with greedy decoding.

    Parameters: ``src_embed [Vs,D]``, ``tgt_embed [Vt,D]``, ``enc.W_ih [4H,D]``,
    ``enc.W_hh [4H,H]``, ``enc.b_ih [4H]``, ``enc.b_hh [4H]``, the same four
    for ``dec``, ``proj.W [Vt,H]``, ``proj.b [Vt]``. ``vocab`` is the source
    vocabulary, ``tgt_vocab`` the target one (ids 0, 1, 2 = <unk>, <s>, </s>).

    ``forward(src_ids, max_len=None)`` decodes greedily (lowest id on a tie)
    until </s> or min(max_len, max_decode_len, 50) steps: ``{"output_ids":
    [...] without </s>, "logits": [T,Vt] of every step, "h": the decoder's
    last h}``. ``teacher_forced(src_ids, tgt_ids)`` -> logits
    [len(tgt_ids)+1, Vt] predicting tgt_ids then </s>.

    Training::

        m = LSTMNMT(src_vocab, tgt_vocab, hidden=128, embed=64)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        for src, tgt in pairs:             # token lists
            y = torch.cat([m.tgt_vocab.ids(tgt), torch.tensor([2])])
            loss = F.cross_entropy(m.teacher_forced(m.vocab.ids(src), y[:-1]), y); opt.zero_grad(); loss.backward(); opt.step()
        canopy_torch.save(m, "models/nmt", max_decode_len=40)
    """

    family = "lstm-nmt"

    def __init__(self, vocab, tgt_vocab, *, hidden=128, embed=64,
                 max_decode_len=None, lowercase=False):
        super().__init__()
        self._setup(vocab, hidden, embed, None, lowercase, None)
        if isinstance(tgt_vocab, int):
            tgt_vocab = ["<unk>", "<s>", "</s>"] + [f"#{i}" for i in range(3, tgt_vocab)]
        self.tgt_vocab = Vocab(tgt_vocab)   # output side: never lowercased
        if self.tgt_vocab.tokens[:3] != ["<unk>", "<s>", "</s>"]:
            raise ValueError("tgt_vocab: ids 0, 1, 2 must be <unk>, <s>, </s>")
        self.max_decode_len = None if max_decode_len is None else int(max_decode_len)
        H, D, Vt = self.hidden, self.embed_dim, len(self.tgt_vocab)
        self.src_embed = nn.Parameter(torch.empty(len(self.vocab), D))
        self.tgt_embed = nn.Parameter(torch.empty(Vt, D))
        self.enc = _lstm_params(H, D)
        self.dec = _lstm_params(H, D)
        self.proj = Params(W=(Vt, H), b=(Vt,))
        self.reset_parameters()

    def model_options(self):
        opts = super().model_options()
        opts["tgt_vocab"] = list(self.tgt_vocab.tokens)
        if self.max_decode_len is not None:
            opts["max_decode_len"] = self.max_decode_len
        return opts

    def encode(self, src_ids):
        h = c = self._zeros(self.hidden)
        for x in self.src_embed[self._ids(src_ids)]:
            h, c = lstm_cell(self.enc, x, h, c)
        return h, c

    def decode_cap(self, max_len=None):
        caps = [DEFAULT_MAX_DECODE_LEN if max_len is None else int(max_len),
                DEFAULT_MAX_DECODE_LEN if self.max_decode_len is None
                else self.max_decode_len]
        return max(0, min(caps))

    def forward(self, src_ids, max_len=None):
        h, c = self.encode(src_ids)
        y, ids, logits = BOS, [], []
        for _ in range(self.decode_cap(max_len)):
            h, c = lstm_cell(self.dec, self.tgt_embed[y], h, c)
            lg = h @ self.proj.W.t() + self.proj.b
            logits.append(lg)
            y = int(lg.argmax())
            if y == EOS:
                break
            ids.append(y)
        lg = torch.stack(logits) if logits else self._zeros(0, len(self.tgt_vocab))
        return {"output_ids": ids, "logits": lg, "h": h}

    def teacher_forced(self, src_ids, tgt_ids):
        h, c = self.encode(src_ids)
        ins = self._ids([BOS] + [int(t) for t in tgt_ids])
        hs = []
        for x in self.tgt_embed[ins]:
            h, c = lstm_cell(self.dec, x, h, c)
            hs.append(h)
        return torch.stack(hs) @ self.proj.W.t() + self.proj.b


class LatticeLSTM(CanopyModule):
    """Family ``latticelstm``: character lattice LSTM tagger (Zhang & Yang 2018).

    Parameters: ``embed [V,D]`` (characters), ``word_embed [Vw,Dw]``,
    ``char.W [4H,D+H]``, ``char.b [4H]`` (rows i, f, o, u), ``word.W
    [3H,Dw+H]``, ``word.b [3H]`` (rows i, f, u), ``link.W [H,D+H]``,
    ``link.b [H]``, ``out.W [C,H]``, ``out.b [C]``. ``vocab`` holds the
    characters, ``word_vocab`` the words; ``lexicon`` (optional word list)
    finds spans for instances sent without ``words``.

    ``forward(char_ids, words)`` with words = [(start, end, word_id), ...]
    (end exclusive, end - start >= 2) -> ``{"logits": [n,C], "h": [n,H],
    "tags": argmax per char}``.

    Training::

        m = LatticeLSTM(chars, words, hidden=100, embed=50, classes=4, lexicon=words[1:])
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        for inst, gold in data:            # inst: {"chars": [...], "words": [...]} or {"text": ...}
            loss = F.cross_entropy(m(*canopy_torch.instance_to_input(m.family, inst, m))["logits"], gold)
            opt.zero_grad(); loss.backward(); opt.step()
        canopy_torch.save(m, "models/seg")
    """

    family = "latticelstm"

    def __init__(self, vocab, word_vocab, *, hidden=100, embed=50, classes=4,
                 word_embed=None, lexicon=None, lowercase=False, labels=None):
        super().__init__()
        self._setup(vocab, hidden, embed, classes, lowercase, labels)
        if isinstance(word_vocab, int):
            word_vocab = ["<unk>"] + [f"#{i}" for i in range(1, word_vocab)]
        self.word_vocab = Vocab(word_vocab, self.lowercase)
        self.lexicon_words = None if lexicon is None else [str(w) for w in lexicon]
        self.lexicon = None if lexicon is None else {
            ascii_lower(w) if self.lowercase else w for w in self.lexicon_words}
        H, D, C = self.hidden, self.embed_dim, self.classes
        Dw = D if word_embed is None else int(word_embed)
        self.word_embed_dim = Dw
        self.embed = nn.Parameter(torch.empty(len(self.vocab), D))
        self.word_embed = nn.Parameter(torch.empty(len(self.word_vocab), Dw))
        self.char = Params(W=(4 * H, D + H), b=(4 * H,))
        self.word = Params(W=(3 * H, Dw + H), b=(3 * H,))
        self.link = Params(W=(H, D + H), b=(H,))
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def model_options(self):
        opts = super().model_options()
        opts["word_vocab"] = list(self.word_vocab.tokens)
        if self.lexicon_words is not None:
            opts["lexicon"] = list(self.lexicon_words)
        return opts

    def forward(self, char_ids, words):
        n, H = len(char_ids), self.hidden
        xs = self.embed[self._ids(char_ids)]
        ending = [[] for _ in range(n)]
        for b, e, w in words:
            if not (0 <= b and e <= n and e - b >= 2):
                raise ValueError(f"bad_lattice: word span [{b}, {e}) is invalid "
                                 f"for {n} characters")
            ending[e - 1].append((b, int(w)))
        hs, cs = [], []
        h = c = self._zeros(H)
        for j in range(n):
            i, f, o, u = split(torch.cat([xs[j], h]) @ self.char.W.t() + self.char.b, 4)
            if not ending[j]:
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
            else:
                bs = [b for b, _ in ending[j]]
                xw = self.word_embed[self._ids([w for _, w in ending[j]])]
                hb = torch.stack([hs[b] for b in bs])
                cb = torch.stack([cs[b] for b in bs])
                wi, wf, wu = split(torch.cat([xw, hb], -1) @ self.word.W.t() + self.word.b, 3)
                cw = torch.sigmoid(wf) * cb + torch.sigmoid(wi) * torch.tanh(wu)
                xj = xs[j].expand(len(bs), -1)
                links = torch.sigmoid(torch.cat([xj, cw], -1) @ self.link.W.t() + self.link.b)
                alpha = torch.softmax(torch.cat([torch.sigmoid(i).unsqueeze(0), links]), 0)
                c = alpha[0] * torch.tanh(u) + (alpha[1:] * cw).sum(0)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
            cs.append(c)
        hs = torch.stack(hs) if hs else self._zeros(0, H)
        logits = hs @ self.out.W.t() + self.out.b
        return {"logits": logits, "h": hs, "tags": [int(t) for t in logits.argmax(-1)]}


class LatticeGRU(CanopyModule):
    """Family ``latticegru``: word-lattice GRU encoder with pooled predecessors.

    Parameters: ``embed [V,D]``, ``gru.W_ih [3H,D]``, ``gru.W_hh [3H,H]``,
    ``gru.b_ih [3H]``, ``gru.b_hh [3H]`` (nn.GRUCell, rows r, z, n),
    ``out.W [C,H]``, ``out.b [C]``.

    ``forward(ids, prevs)``: nodes in topological order, prevs[j] the
    predecessors of node j (indices < j), the last node the only sink;
    h_j = GRUCell(embed[ids[j]], mean of the predecessors' h) -> ``{"logits":
    [C] of the sink, "h": the sink's h, "label": argmax}``.

    Training::

        m = LatticeGRU(vocab, hidden=100, embed=100, classes=2)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        for inst, y in data:               # inst: {"nodes": [{"token": .., "prev": [..]}, ...]}
            lg = m(*canopy_torch.instance_to_input(m.family, inst, m))["logits"]
            loss = F.cross_entropy(lg[None], torch.tensor([y])); opt.zero_grad(); loss.backward(); opt.step()
        canopy_torch.save(m, "models/lattice")
    """

    family = "latticegru"

    def __init__(self, vocab, *, hidden=100, embed=100, classes=2,
                 lowercase=False, labels=None):
        super().__init__()
        self._setup(vocab, hidden, embed, classes, lowercase, labels)
        H, D, C = self.hidden, self.embed_dim, self.classes
        self.embed = nn.Parameter(torch.empty(len(self.vocab), D))
        self.gru = Params(W_ih=(3 * H, D), W_hh=(3 * H, H), b_ih=(3 * H,), b_hh=(3 * H,))
        self.out = Params(W=(C, H), b=(C,))
        self.reset_parameters()

    def forward(self, ids, prevs):
        if len(ids) == 0 or len(prevs) != len(ids):
            raise ValueError("bad_lattice: need one prev list per node, at least one node")
        xs = self.embed[self._ids(ids)]
        hs = []
        for j, prev in enumerate(prevs):
            if any(not 0 <= q < j for q in prev):
                raise ValueError(f"bad_lattice: node {j}: prev must be < {j}")
            if prev:
                hp = torch.stack([hs[q] for q in prev]).sum(0) / len(prev)
            else:
                hp = self._zeros(self.hidden)
            hs.append(gru_cell(self.gru, xs[j], hp))
        logits = hs[-1] @ self.out.W.t() + self.out.b
        return {"logits": logits, "h": hs[-1], "label": int(logits.argmax())}
