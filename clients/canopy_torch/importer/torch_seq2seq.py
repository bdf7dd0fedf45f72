"""torch-seq2seq: LSTM encoder-decoder without attention (encoder
nn.Embedding + nn.LSTM; decoder nn.Embedding + nn.LSTM + nn.Linear `out`,
the layout of PyTorch's seq2seq tutorial with LSTM cells) -> lstm-nmt.

The decoder starts from the encoder's final (h, c), feeds <s> first and
decodes greedily until </s> or max_decode_len.
"""
import re

import torch

from .common import Dim, ImportFailure, KeyCheck, check_recurrent, \
    check_rows, dim_of, f32, \
    read_vocab, sample_sentences, tokens_of, Lookup
from . import verify as V

NAME = "torch-seq2seq"
FAMILY = "lstm-nmt"
KEYS = """\
encoder.embedding.weight [Vs,D]               -> src_embed
encoder.lstm.{weight_ih,weight_hh}_l0 [4H,D|H] -> enc.W_ih, enc.W_hh
encoder.lstm.{bias_ih,bias_hh}_l0 [4H]        -> enc.b_ih, enc.b_hh
decoder.embedding.weight [Vt,D]               -> tgt_embed
decoder.lstm.*_l0                             -> dec.*
decoder.out.weight [Vt,H], .bias [Vt]         -> proj.W, proj.b
Needs --tgt-vocab (ids 0, 1, 2 = <unk>, <s>, </s>); --max-decode-len N.
One unidirectional layer each; encoder and decoder share H and D.
"""


def _lstm_checks(sd, p):
    check_recurrent(sd, p, NAME)
    for k in sd:
        m = re.match(re.escape(p) + r"\.(weight|bias)_\w\w_l(\d+)(_reverse)?$",
                     k)
        if m and m.group(2) != "0":
            raise ImportFailure(f"{NAME}: key {k!r}: more than one LSTM "
                                "layer; lstm-nmt has one layer each")
        if m and m.group(3):
            raise ImportFailure(f"{NAME}: key {k!r}: a bidirectional LSTM; "
                                "lstm-nmt's LSTMs are unidirectional")


def convert(sd, args, vocab):
    from . import Conversion
    if not args.tgt_vocab:
        raise ImportFailure(f"{NAME} needs --tgt-vocab FILE (the target "
                            "vocabulary: ids 0, 1, 2 = <unk>, <s>, </s>)")
    tgt = read_vocab(args.tgt_vocab, "--tgt-vocab", target=True)
    _lstm_checks(sd, "encoder.lstm")
    _lstm_checks(sd, "decoder.lstm")
    Vs = dim_of(sd, "encoder.embedding.weight", 0, NAME, "the source "
                "embedding", ndim=2)
    D = dim_of(sd, "encoder.embedding.weight", 1, NAME, "the source "
               "embedding", ndim=2)
    Vt = dim_of(sd, "decoder.embedding.weight", 0, NAME, "the target "
                "embedding", ndim=2)
    Dt = dim_of(sd, "decoder.embedding.weight", 1, NAME, "the target "
                "embedding", ndim=2)
    H = dim_of(sd, "encoder.lstm.weight_hh_l0", 1, NAME, "the encoder LSTM",
               ndim=2)
    Hd = dim_of(sd, "decoder.lstm.weight_hh_l0", 1, NAME, "the decoder LSTM",
                ndim=2)
    if Hd != H:
        raise ImportFailure(
            f"{NAME}: the encoder's hidden size ('encoder.lstm.weight_hh_l0': "
            f"H={H}) differs from the decoder's ('decoder.lstm.weight_hh_l0'"
            f": H={Hd}); lstm-nmt passes the encoder's final (h, c) to the "
            "decoder, so they must match")
    if Dt != D:
        raise ImportFailure(
            f"{NAME}: the source embedding size ('encoder.embedding.weight': "
            f"D={D}) differs from the target's ('decoder.embedding.weight': "
            f"D={Dt}); Canopy's lstm-nmt has one embedding size D")
    kc = KeyCheck(sd, NAME)
    kc.expect("encoder.embedding.weight", Dim("Vs", Vs), Dim("D", D))
    kc.expect("decoder.embedding.weight", Dim("Vt", Vt), Dim("D", D))
    for p in ("encoder.lstm", "decoder.lstm"):
        kc.expect(p + ".weight_ih_l0", Dim("4H", 4 * H), Dim("D", D))
        kc.expect(p + ".weight_hh_l0", Dim("4H", 4 * H), Dim("H", H))
        kc.expect(p + ".bias_ih_l0", Dim("4H", 4 * H))
        kc.expect(p + ".bias_hh_l0", Dim("4H", 4 * H))
    kc.expect("decoder.out.weight", Dim("Vt", Vt), Dim("H", H))
    kc.expect("decoder.out.bias", Dim("Vt", Vt))
    kc.check()
    check_rows(sd, "encoder.embedding.weight", vocab, "--vocab")
    check_rows(sd, "decoder.embedding.weight", tgt, "--tgt-vocab")
    tensors = {"src_embed": f32(sd["encoder.embedding.weight"]),
               "tgt_embed": f32(sd["decoder.embedding.weight"]),
               "proj.W": f32(sd["decoder.out.weight"]),
               "proj.b": f32(sd["decoder.out.bias"])}
    for c, p in (("enc", "encoder.lstm"), ("dec", "decoder.lstm")):
        tensors[c + ".W_ih"] = f32(sd[p + ".weight_ih_l0"])
        tensors[c + ".W_hh"] = f32(sd[p + ".weight_hh_l0"])
        tensors[c + ".b_ih"] = f32(sd[p + ".bias_ih_l0"])
        tensors[c + ".b_hh"] = f32(sd[p + ".bias_hh_l0"])
    summary = ["encoder.embedding.weight -> src_embed; "
               "decoder.embedding.weight -> tgt_embed",
               "encoder.lstm.*_l0 -> enc.* (gate order i, f, g, o kept)",
               "decoder.lstm.*_l0 -> dec.*",
               "decoder.out.weight/bias -> proj.W/proj.b"]
    if args.max_decode_len is not None and args.max_decode_len < 1:
        raise ImportFailure("--max-decode-len must be at least 1")
    meta = dict(hidden=H, embed=D, vocab=vocab, tgt_vocab=tgt,
                lowercase=True if args.lowercase else None,
                max_decode_len=args.max_decode_len)
    return Conversion(FAMILY, tensors, meta, summary, sd=sd, vocab=vocab,
                      tgt=tgt, H=H, D=D)


class Seq2Seq(torch.nn.Module):
    """The source model: encoder/decoder nn.Embedding + nn.LSTM, decoder.out
    nn.Linear, greedy decoding; the checkpoint's own tensors."""

    def __init__(self, conv):
        super().__init__()
        sd = conv.sd
        self.src = torch.nn.Embedding.from_pretrained(
            sd["encoder.embedding.weight"])
        self.tgt = torch.nn.Embedding.from_pretrained(
            sd["decoder.embedding.weight"])
        self.enc = torch.nn.LSTM(conv.D, conv.H).double()
        self.dec = torch.nn.LSTM(conv.D, conv.H).double()
        for m, p in ((self.enc, "encoder.lstm."), (self.dec, "decoder.lstm.")):
            m.load_state_dict({k[len(p):]: v for k, v in sd.items()
                               if k.startswith(p)})
        self.out = torch.nn.Linear(conv.H, sd["decoder.out.weight"].shape[0])
        self.out = self.out.double()
        self.out.load_state_dict({"weight": sd["decoder.out.weight"],
                                  "bias": sd["decoder.out.bias"]})

    @torch.no_grad()
    def greedy(self, ids, cap, bos=1, eos=2):
        x = self.src(torch.tensor(ids)).view(len(ids), 1, -1)
        _, (h, c) = self.enc(x)
        y, out, margins = bos, [], []
        for _ in range(cap):
            e = self.tgt(torch.tensor([y])).view(1, 1, -1)
            o, (h, c) = self.dec(e, (h, c))
            lg = self.out(o[0, 0])
            top = torch.topk(lg, min(2, lg.shape[0])).values
            margins.append(float(top[0] - top[1]) if lg.shape[0] > 1
                           else float("inf"))
            y = int(torch.argmax(lg))
            if y == eos:
                break
            out.append(y)
        return {"ids": out, "h": h[0, 0].tolist(), "margins": margins}


NAMES = {
    "src_embed": "src_embed <- encoder.embedding.weight",
    "tgt_embed": "tgt_embed <- decoder.embedding.weight",
    "enc": "enc.* <- encoder.lstm.*_l0",
    "dec": "dec.* <- decoder.lstm.*_l0",
    "proj": "proj.W / proj.b <- decoder.out.weight / .bias",
}

CHECK_CAP = 20


def sample(conv):
    return sample_sentences(conv.vocab)


def verify(conv, args, canopy, model_dir, insts):
    m = Seq2Seq(conv)
    look = Lookup(conv.vocab, args.lowercase)
    cap = min(CHECK_CAP, args.max_decode_len or CHECK_CAP)
    ids = []
    for k, inst in V.each(insts):
        try:
            ids.append([look(t) for t in tokens_of(inst)])
        except ValueError as e:
            raise ImportFailure(f"check instance {k + 1}: {e}")
    refs1 = [m.greedy(x, 1) for x in ids]
    refs = [m.greedy(x, cap) for x in ids]
    outs1 = V.run_canopy(canopy, model_dir, insts, ["--max-decode-len", "1"])
    outs = V.run_canopy(canopy, model_dir, insts,
                        ["--max-decode-len", str(cap)])
    rep = V.Report(args.tolerance)
    V.compare_nmt(rep, refs1, outs1, refs, outs)
    return rep, V.nmt_suspects(rep, NAMES)
