"""torch-tagger: nn.Embedding + nn.LSTM(bidirectional=True, num_layers=1) +
nn.Linear, optionally the CRF of PyTorch's BiLSTM-CRF tutorial
(`transitions [T, T]`, transitions[to, from]; tags include START and STOP;
Viterbi from START, ending with transitions[STOP]) -> Canopy bilstm-tagger.

nn.LSTM's gate order (i, f, g, o) is Canopy's; `_reverse` is the backward
direction. CRF: Canopy's crf.trans[i, j] = score of tag j after tag i =
transitions[j, i]; crf.start[j] = transitions[j, START]; crf.end[i] =
transitions[STOP, i]; START/STOP rows leave out.W/out.b and the CRF.
"""
import re

import torch

from .common import Dim, ImportFailure, KeyCheck, check_recurrent, \
    check_rows, dim_of, f32, read_lines, sample_sentences, tokens_of, Lookup
from . import verify as V

NAME = "torch-tagger"
FAMILY = "bilstm-tagger"
KEYS = """\
word_embeds.weight [V,D]                     -> embed
lstm.weight_ih_l0 / weight_hh_l0 [4H,D|H]    -> fwd.W_ih / fwd.W_hh (i,f,g,o)
lstm.bias_ih_l0 / bias_hh_l0 [4H]            -> fwd.b_ih / fwd.b_hh
lstm.*_l0_reverse                            -> bwd.*
hidden2tag.weight [T,2H], .bias [T]          -> out.W [C,2H], out.b [C]
transitions [T,T] (optional CRF, tutorial    -> crf.trans [C,C] (= transposed),
  convention transitions[to, from])             crf.start [C], crf.end [C];
                                                START/STOP rows dropped, C = T-2
Module names: --embedding, --lstm, --linear, --crf (default the tutorial's,
else detected when unambiguous). START/STOP: named <START>/<STOP> (or START/
STOP, <start>/<stop>) in --labels, or --start-tag/--stop-tag, else the last
two tags (START = T-2, STOP = T-1). One layer, bidirectional; initial states
zero (the tutorial's random init_hidden is not part of the model).
"""

START_NAMES = ("<START>", "START", "<start>", "START_TAG", "<s>")
STOP_NAMES = ("<STOP>", "STOP", "<stop>", "STOP_TAG", "</s>")


def _prefixes(sd, suffix):
    return sorted(k[:-len(suffix)] for k in sd if k.endswith(suffix))


def _one(cands, what, opt):
    if len(cands) == 1:
        return cands[0]
    if not cands:
        raise ImportFailure(f"{NAME}: found no {what}; name it with {opt}")
    raise ImportFailure(f"{NAME}: more than one {what} ("
                        + ", ".join(cands) + f"); name one with {opt}")


def find_modules(sd, args):
    lstm = args.lstm or ("lstm" if "lstm.weight_ih_l0" in sd else _one(
        [p for p in _prefixes(sd, ".weight_ih_l0")], "nn.LSTM (a key "
        "'NAME.weight_ih_l0')", "--lstm"))
    check_recurrent(sd, lstm, NAME)
    for k in sd:
        m = re.match(re.escape(lstm) + r"\.(weight|bias)_\w\w_l(\d+)", k)
        if m and m.group(2) != "0":
            raise ImportFailure(
                f"{NAME}: key {k!r}: the LSTM has more than one layer; "
                "Canopy's bilstm-tagger has one bidirectional layer "
                "(num_layers=1)")
    if (lstm + ".weight_ih_l0") in sd and \
            (lstm + ".weight_ih_l0_reverse") not in sd:
        raise ImportFailure(
            f"{NAME}: missing key {lstm + '.weight_ih_l0_reverse'!r}: the "
            "LSTM is unidirectional; Canopy's bilstm-tagger needs "
            "bidirectional=True")
    if (lstm + ".weight_hr_l0") in sd:
        raise ImportFailure(f"{NAME}: key {lstm + '.weight_hr_l0'!r}: an "
                            "LSTM with proj_size is not supported")
    D = dim_of(sd, lstm + ".weight_ih_l0", 1, NAME, "the LSTM", ndim=2)
    H = dim_of(sd, lstm + ".weight_hh_l0", 0, NAME, "the LSTM: 4H rows",
               ndim=2, divisor=4)
    emb = args.embedding or ("word_embeds" if "word_embeds.weight" in sd
                             else _one([p for p in _prefixes(sd, ".weight")
                                        if sd[p + ".weight"].dim() == 2
                                        and sd[p + ".weight"].shape[1] == D
                                        and p + ".bias" not in sd],
                                       f"nn.Embedding ([V, {D}] without "
                                       "bias)", "--embedding"))
    lin = args.linear or ("hidden2tag" if "hidden2tag.weight" in sd
                          else _one([p for p in _prefixes(sd, ".weight")
                                     if sd[p + ".weight"].dim() == 2
                                     and sd[p + ".weight"].shape[1] == 2 * H
                                     and p + ".bias" in sd],
                                    f"nn.Linear ([T, {2 * H}] with bias)",
                                    "--linear"))
    T = dim_of(sd, lin + ".weight", 0, NAME, "the output layer", ndim=2)
    if args.crf == "none":
        crf = None
    elif args.crf:
        crf = args.crf
    elif "transitions" in sd:
        crf = "transitions"
    else:
        square = [k for k in sd if list(sd[k].shape) == [T, T]
                  and not k.startswith((lstm + ".", lin + ".", emb + "."))]
        crf = _one(square, "CRF", "--crf") if len(square) > 1 else \
            (square[0] if square else None)
    return emb, lstm, lin, crf, D, H, T


def _find_start_stop(args, T, labels):
    if args.start_tag is not None or args.stop_tag is not None:
        if args.start_tag is None or args.stop_tag is None:
            raise ImportFailure("--start-tag and --stop-tag go together")
        s, e = args.start_tag, args.stop_tag
        how = "--start-tag/--stop-tag"
    elif labels is not None and len(labels) == T:
        s = [i for i, l in enumerate(labels) if l in START_NAMES]
        e = [i for i, l in enumerate(labels) if l in STOP_NAMES]
        if len(s) != 1 or len(e) != 1:
            raise ImportFailure(
                f"--labels has {T} names (with START/STOP) but not exactly "
                "one START (" + "/".join(START_NAMES) + ") and one STOP ("
                + "/".join(STOP_NAMES) + "); use --start-tag/--stop-tag")
        s, e = s[0], e[0]
        how = f"by name in --labels ({labels[s]!r}, {labels[e]!r})"
    else:
        s, e = T - 2, T - 1
        how = "assumed: the last two tags (no names in --labels, no " \
              "--start-tag/--stop-tag)"
    for x, n in ((s, "START"), (e, "STOP")):
        if not 0 <= x < T:
            raise ImportFailure(f"{n} tag {x} is not one of the {T} tags")
    if s == e:
        raise ImportFailure("START and STOP are the same tag")
    return s, e, how


def convert(sd, args, vocab):
    from . import Conversion
    emb, lstm, lin, crf, D, H, T = find_modules(sd, args)
    V_ = dim_of(sd, emb + ".weight", 0, NAME, "the embedding", ndim=2)
    kc = KeyCheck(sd, NAME)
    kc.expect(emb + ".weight", Dim("V", V_), Dim("D", D))
    for sfx in ("_l0", "_l0_reverse"):
        kc.expect(f"{lstm}.weight_ih{sfx}", Dim("4H", 4 * H), Dim("D", D))
        kc.expect(f"{lstm}.weight_hh{sfx}", Dim("4H", 4 * H), Dim("H", H))
        kc.expect(f"{lstm}.bias_ih{sfx}", Dim("4H", 4 * H))
        kc.expect(f"{lstm}.bias_hh{sfx}", Dim("4H", 4 * H))
    kc.expect(lin + ".weight", Dim("T", T), Dim("2H", 2 * H))
    kc.expect(lin + ".bias", Dim("T", T))
    if crf:
        kc.expect(crf, Dim("T", T), Dim("T", T))
    kc.check()
    check_rows(sd, emb + ".weight", vocab, "--vocab")
    labels = read_lines(args.labels, "--labels") if args.labels else None
    notes = []
    tensors = {"embed": f32(sd[emb + ".weight"])}
    for d, sfx in (("fwd", "_l0"), ("bwd", "_l0_reverse")):
        tensors[d + ".W_ih"] = f32(sd[f"{lstm}.weight_ih{sfx}"])
        tensors[d + ".W_hh"] = f32(sd[f"{lstm}.weight_hh{sfx}"])
        tensors[d + ".b_ih"] = f32(sd[f"{lstm}.bias_ih{sfx}"])
        tensors[d + ".b_hh"] = f32(sd[f"{lstm}.bias_hh{sfx}"])
    summary = [f"{emb}.weight -> embed",
               f"{lstm}.{{weight,bias}}_{{ih,hh}}_l0 -> fwd.{{W,b}}_{{ih,hh}}"
               " (gate order i, f, g, o kept)",
               f"{lstm}.*_l0_reverse -> bwd.*"]
    options = {}
    if crf:
        start, stop, how = _find_start_stop(args, T, labels)
        real = [t for t in range(T) if t not in (start, stop)]
        tr = sd[crf]
        idx = torch.tensor(real)
        tensors["crf.trans"] = f32(tr[idx][:, idx].t())
        tensors["crf.start"] = f32(tr[idx, start])
        tensors["crf.end"] = f32(tr[stop, idx])
        tensors["out.W"] = f32(sd[lin + ".weight"][idx])
        tensors["out.b"] = f32(sd[lin + ".bias"][idx])
        if labels is not None and len(labels) == T:
            labels = [labels[t] for t in real]
        options["crf"] = True
        C = T - 2
        summary += [f"{lin}.weight/bias without rows START={start}, "
                    f"STOP={stop} -> out.W/out.b [{C}, {2 * H}]",
                    f"{crf}[j, i] -> crf.trans[i, j]; {crf}[j, START] -> "
                    f"crf.start[j]; {crf}[STOP, i] -> crf.end[i]"]
        notes.append(f"CRF START = tag {start}, STOP = tag {stop}: {how}")
        into_start = max(float(tr[start, t]) for t in range(T))
        from_stop = max(float(tr[t, stop]) for t in range(T))
        if into_start > -1000 or from_stop > -1000:
            notes.append(f"{crf}[START, :] or {crf}[:, STOP] is above -1000 "
                         f"(max {max(into_start, from_stop):g}): paths "
                         "through START/STOP are not ruled out, and "
                         "Canopy's CRF over the real tags may differ "
                         "(the verification will tell)")
    else:
        C = T
        tensors["out.W"] = f32(sd[lin + ".weight"])
        tensors["out.b"] = f32(sd[lin + ".bias"])
        summary.append(f"{lin}.weight/bias -> out.W/out.b")
    if labels is not None and len(labels) != C:
        raise ImportFailure(f"--labels {args.labels}: {len(labels)} labels, "
                            f"but the tagger has {C} tags"
                            + (f" ({T} with START/STOP)" if crf else ""))
    meta = dict(hidden=H, embed=D, classes=C, vocab=vocab, labels=labels,
                lowercase=True if args.lowercase else None, **options)
    return Conversion(FAMILY, tensors, meta, summary, notes, sd=sd,
                      vocab=vocab, H=H, D=D, T=T, names=(emb, lstm, lin, crf),
                      start_stop=(start, stop, real) if crf else None)


class Tagger(torch.nn.Module):
    """The source model: nn.Embedding + nn.LSTM + nn.Linear (+ the
    tutorial's Viterbi), loaded with the checkpoint's tensors."""

    def __init__(self, conv):
        super().__init__()
        sd, (emb, lstm, lin, crf) = conv.sd, conv.names
        self.H = conv.H
        self.word_embeds = torch.nn.Embedding.from_pretrained(
            sd[emb + ".weight"])
        self.lstm = torch.nn.LSTM(conv.D, conv.H, num_layers=1,
                                  bidirectional=True).double()
        self.lstm.load_state_dict({k[len(lstm) + 1:]: v for k, v in
                                   sd.items() if k.startswith(lstm + ".")})
        self.hidden2tag = torch.nn.Linear(2 * conv.H, conv.T).double()
        self.hidden2tag.load_state_dict({"weight": sd[lin + ".weight"],
                                         "bias": sd[lin + ".bias"]})
        self.transitions = sd[crf] if crf else None

    @torch.no_grad()
    def features(self, ids):
        x = self.word_embeds(torch.tensor(ids)).view(len(ids), 1, -1)
        z = torch.zeros(2, 1, self.H, dtype=torch.float64)
        out, _ = self.lstm(x, (z, z))
        out = out.view(len(ids), 2 * self.H)
        return out, self.hidden2tag(out)

    @torch.no_grad()
    def viterbi(self, feats, START, STOP):
        tr = self.transitions
        T = tr.shape[0]
        backpointers = []
        forward_var = torch.full((1, T), -10000., dtype=torch.float64)
        forward_var[0][START] = 0
        for feat in feats:
            bptrs, vvars = [], []
            for next_tag in range(T):
                next_tag_var = forward_var + tr[next_tag]
                best = int(torch.argmax(next_tag_var))
                bptrs.append(best)
                vvars.append(next_tag_var[0][best].view(1))
            forward_var = (torch.cat(vvars) + feat).view(1, -1)
            backpointers.append(bptrs)
        terminal = forward_var + tr[STOP]
        best = int(torch.argmax(terminal))
        score = float(terminal[0][best])
        path = [best]
        for bptrs in reversed(backpointers):
            best = bptrs[best]
            path.append(best)
        path.pop()          # START
        path.reverse()
        return score, path


NAMES = {
    "embed": "embed <- {0}.weight",
    "fwd": "fwd.* <- {1}.*_l0",
    "bwd": "bwd.* <- {1}.*_l0_reverse",
    "out": "out.W / out.b <- {2}.weight / .bias",
    "crf": "crf.trans / crf.start / crf.end <- {3} (transposed; START/STOP)",
}


def sample(conv):
    return sample_sentences(conv.vocab)


def verify(conv, args, canopy, model_dir, insts):
    m = Tagger(conv)
    look = Lookup(conv.vocab, args.lowercase)
    refs = []
    for k, inst in V.each(insts):
        try:
            toks = tokens_of(inst)
        except ValueError as e:
            raise ImportFailure(f"check instance {k + 1}: {e}")
        hs, feats = m.features([look(t) for t in toks])
        ref = {"h": hs.tolist(), "H": conv.H}
        if conv.start_stop:
            start, stop, real = conv.start_stop
            score, path = m.viterbi(feats, start, stop)
            pos = {t: i for i, t in enumerate(real)}
            ref["tags"] = [pos.get(t, -1) for t in path]
            ref["path_score"] = score
            ref["logits"] = feats[:, real].tolist()
        else:
            ref["logits"] = feats.tolist()
        refs.append(ref)
    outs = V.run_canopy(canopy, model_dir, insts)
    rep = V.Report(args.tolerance)
    crf = bool(conv.start_stop)
    V.compare_tagger(rep, refs, outs, crf=crf)
    names = {k: v.format(*conv.names) for k, v in NAMES.items()}
    return rep, V.tagger_suspects(rep, names, crf=crf)
