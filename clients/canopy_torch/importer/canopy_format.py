"""canopy: the state_dict of a canopy_torch family module (keys are already
Canopy's tensor names) -> that family's model directory.

The family is --family or inferred from the key set. Verification runs the
canopy_torch module itself (canopy_torch.from_state_dict + its forward, via
canopy_torch.data.instance_to_input) against canopy run.
"""
import random

import torch

from .common import ImportFailure, KeyCheck, check_rows, f32, \
    read_labels, read_lines, read_vocab, sample_sentences, sample_trees
from . import verify as V

NAME = "canopy"
FAMILY = "(any: --family or inferred)"
KEYS = """\
Canopy's own tensor names (docs/models.md), e.g. treelstm: embed, leaf.W,
leaf.b, internal.U, internal.b, out.W, out.b -- as a canopy_torch module's
state_dict(). The family is inferred from the keys (cell.W: childsum-treelstm,
internal_a.U: treelstm-2type, internal.Ug: treegru, leaf.M: mvrnn,
internal.U: treelstm, fwd.W_ih: bilstm-tagger (crf.* -> "crf": true),
enc.W_ih: lstm-nmt, char.W: latticelstm, gru.W_ih: latticegru) or --family.
lstm-nmt needs --tgt-vocab; latticelstm --word-vocab (--lexicon optional);
treelstm-2type takes --type-b-labels L1,L2.
"""

# a key that only this family has -> family (checked in this order)
_SIGNATURE = (("cell.W", "childsum-treelstm"),
              ("internal_a.U", "treelstm-2type"),
              ("internal.Ug", "treegru"), ("leaf.M", "mvrnn"),
              ("internal.U", "treelstm"), ("fwd.W_ih", "bilstm-tagger"),
              ("enc.W_ih", "lstm-nmt"), ("char.W", "latticelstm"),
              ("gru.W_ih", "latticegru"))
# family -> (tensor, axis, multiple of H)
_H_FROM = {"treelstm": ("leaf.b", 3), "treelstm-2type": ("leaf.b", 3),
           "treegru": ("leaf.b", 1), "childsum-treelstm": ("cell.b", 4),
           "mvrnn": ("internal.b", 1), "bilstm-tagger": ("fwd.b_ih", 4),
           "lstm-nmt": ("enc.b_ih", 4), "latticelstm": ("link.b", 1),
           "latticegru": ("gru.b_ih", 3)}
TREES = ("treelstm", "treelstm-2type", "treegru", "childsum-treelstm",
         "mvrnn")


def _ct():
    try:
        import canopy_torch
        from canopy_torch import data
        canopy_torch.from_state_dict, canopy_torch.MODULES
        data.instance_to_input
    except (ImportError, AttributeError) as e:
        raise ImportFailure("format canopy needs the canopy_torch modules "
                            f"(from_state_dict, data.instance_to_input): {e}",
                            status=1)
    return canopy_torch, data


def infer_family(sd, fam):
    if fam:
        if fam not in _H_FROM:
            raise ImportFailure(f"--family {fam!r}: not a Canopy family; one "
                                "of " + ", ".join(_H_FROM))
        return fam, "--family"
    for key, f in _SIGNATURE:
        if key in sd:
            return f, f"inferred from key {key!r}"
    raise ImportFailure(
        "canopy: cannot infer the family: none of the keys "
        + ", ".join(k for k, _ in _SIGNATURE) + " is in the checkpoint "
        "(keys: " + ", ".join(sorted(sd)[:12]) + "); name it with --family")


def _size(sd, key, axis, fam):
    if key not in sd:
        raise ImportFailure(f"canopy/{fam}: missing key {key!r}")
    if axis >= sd[key].dim():
        raise ImportFailure(f"canopy/{fam}: key {key!r} has shape "
                            f"{list(sd[key].shape)}: too few axes")
    return int(sd[key].shape[axis])


def convert(sd, args, vocab):
    from . import Conversion
    ct, _ = _ct()
    from canopy_torch.export import expected_shapes
    fam, how = infer_family(sd, args.family)
    hkey, mult = _H_FROM[fam]
    H = _size(sd, hkey, 0, fam) // mult
    emb = "src_embed" if fam == "lstm-nmt" else "embed"
    V_ = _size(sd, emb, 0, fam)
    D = _size(sd, emb, 1, fam)
    C = _size(sd, "out.b", 0, fam) if fam != "lstm-nmt" else None
    crf = fam == "bilstm-tagger" and any(k.startswith("crf.") for k in sd)
    sizes = dict(vocab_size=V_, crf=crf)
    extra = {}
    if fam == "lstm-nmt":
        if not args.tgt_vocab:
            raise ImportFailure("canopy/lstm-nmt needs --tgt-vocab")
        extra["tgt_vocab"] = read_vocab(args.tgt_vocab, "--tgt-vocab",
                                        target=True)
        sizes["tgt_vocab_size"] = _size(sd, "tgt_embed", 0, fam)
        if args.max_decode_len:
            extra["max_decode_len"] = args.max_decode_len
    if fam == "latticelstm":
        if not args.word_vocab:
            raise ImportFailure("canopy/latticelstm needs --word-vocab")
        extra["word_vocab"] = read_vocab(args.word_vocab, "--word-vocab")
        sizes["word_vocab_size"] = _size(sd, "word_embed", 0, fam)
        sizes["word_embed"] = _size(sd, "word_embed", 1, fam)
        if args.lexicon:
            extra["lexicon"] = [w for w in read_lines(args.lexicon,
                                                      "--lexicon") if w]
    if fam == "mvrnn":
        sizes["matrices"] = _size(sd, "leaf.M", 0, fam)
    if fam == "treelstm-2type":
        extra["type_b_labels"] = [x for x in (args.type_b_labels or
                                              "").split(",") if x]
    want = expected_shapes(fam, H, D, C, **sizes)
    kc = KeyCheck(sd, f"canopy/{fam}")
    for k, shape in want.items():
        kc.expect(k, *shape)
    kc.check()
    check_rows(sd, emb, vocab, "--vocab")
    if fam == "lstm-nmt":
        check_rows(sd, "tgt_embed", extra["tgt_vocab"], "--tgt-vocab")
    if fam == "latticelstm":
        check_rows(sd, "word_embed", extra["word_vocab"], "--word-vocab")
    labels = read_labels(args.labels, C) if args.labels and C else None
    tensors = {k: f32(v) for k, v in sd.items()}
    summary = [f"family {fam} ({how}); every tensor kept by name: "
               + ", ".join(sorted(sd))]
    meta = dict(hidden=H, embed=D, classes=C, vocab=vocab, labels=labels,
                lowercase=True if args.lowercase else None,
                crf=True if crf else None, **extra)
    return Conversion(fam, tensors, meta, summary, sd=sd, vocab=vocab, H=H)


def sample(conv):
    fam, vocab = conv.family, conv.vocab
    if fam in TREES:
        insts = sample_trees(vocab, arity=4 if fam == "childsum-treelstm"
                             else 2)
        if fam == "treelstm-2type":
            rng = random.Random(1)

            def mark(n):
                if "children" in n:
                    n["type"] = rng.choice("ab")
                    for c in n["children"]:
                        mark(c)
            for i in insts:
                mark(i["tree"])
        return insts
    if fam in ("bilstm-tagger", "lstm-nmt"):
        return sample_sentences(vocab)
    rng = random.Random(0)
    out = []
    for _ in range(16):
        n = rng.randint(2, 14)
        toks = [vocab[rng.randrange(len(vocab))] for _ in range(n)]
        if fam == "latticelstm":
            wv = conv.meta["word_vocab"]
            words, seen = [], set()
            for _ in range(rng.randint(0, n)):
                b = rng.randrange(n - 1)
                e = rng.randint(b + 2, min(n, b + 5))
                if (b, e) in seen:      # a span may be given only once
                    continue
                seen.add((b, e))
                w = {"start": b, "end": e}
                if rng.random() < 0.7:
                    w["token"] = wv[rng.randrange(len(wv))]
                words.append(w)
            out.append({"chars": toks, "words": words})
        else:      # latticegru: a DAG, node j - 1 always precedes node j
            nodes = []
            for j in range(n):
                prev = sorted(set(([j - 1] if j else []) + [
                    rng.randrange(j) for _ in range(rng.randint(0, 2)) if j]))
                nodes.append({"token": toks[j], "prev": prev})
            out.append({"nodes": nodes})
    return out


def _module(conv, args):
    ct, data = _ct()
    m = conv.meta
    opts = dict(vocab=conv.vocab, labels=m.get("labels"),
                lowercase=bool(args.lowercase))
    for k in ("tgt_vocab", "word_vocab", "lexicon", "type_b_labels",
              "max_decode_len", "crf"):
        if m.get(k) is not None:
            opts[k] = m[k]
    try:
        mod = ct.from_state_dict(conv.family, conv.sd, **opts)
    except ValueError as e:
        raise ImportFailure(f"canopy_torch.from_state_dict: {e}")
    return mod.double(), data


def verify(conv, args, canopy, model_dir, insts):
    fam = conv.family
    mod, data = _module(conv, args)
    rep = V.Report(args.tolerance)
    cap = min(20, args.max_decode_len or 20)

    def run(inst, k, **kw):
        try:
            with torch.no_grad():
                return mod(*data.instance_to_input(fam, inst, mod), **kw)
        except ValueError as e:
            raise ImportFailure(f"check instance {k + 1}: {e}")

    if fam in TREES:
        refs = []
        for k, inst in V.each(insts):
            out = run(inst, k)
            tree = data.instance_to_input(fam, inst, mod)[0]
            refs.append({"logits": out["logits"].tolist(),
                         "leaf": [n.is_leaf() for n in tree.nodes],
                         "h": out["h"].tolist()})
        V.compare_trees(rep, refs, V.run_canopy(canopy, model_dir, insts))
        names = {"embed": "embed", "out": "out.W / out.b",
                 "leaf": "leaf.* (cell.W / cell.b for childsum)",
                 "internal": "internal*.U / .b (cell.U for childsum)"}
        return rep, V.tree_suspects(rep, names)
    if fam == "bilstm-tagger":
        refs = []
        for k, inst in V.each(insts):
            out = run(inst, k)
            refs.append({"logits": out["logits"].tolist(),
                         "h": out["h"].tolist(), "H": conv.H,
                         "tags": out["tags"],
                         "path_score": out["path_score"]})
        crf = bool(conv.meta.get("crf"))
        V.compare_tagger(rep, refs, V.run_canopy(canopy, model_dir, insts),
                         crf=crf)
        names = {"embed": "embed", "fwd": "fwd.*", "bwd": "bwd.*",
                 "out": "out.W / out.b", "crf": "crf.*"}
        return rep, V.tagger_suspects(rep, names, crf=crf)
    if fam == "lstm-nmt":
        def ref(inst, k, n):
            out = run(inst, k, max_len=n)
            lg = out["logits"]
            margins = [V.margin(r) for r in lg.tolist()]
            return {"ids": list(out["output_ids"]), "h": out["h"].tolist(),
                    "margins": margins or [float("inf")]}
        refs1 = [ref(i, k, 1) for k, i in enumerate(insts)]
        refs = [ref(i, k, cap) for k, i in enumerate(insts)]
        outs1 = V.run_canopy(canopy, model_dir, insts,
                             ["--max-decode-len", "1"])
        outs = V.run_canopy(canopy, model_dir, insts,
                            ["--max-decode-len", str(cap)])
        V.compare_nmt(rep, refs1, outs1, refs, outs)
        names = {k: k + ".*" for k in ("enc", "dec", "src_embed",
                                       "tgt_embed", "proj")}
        return rep, V.nmt_suspects(rep, names)
    # lattices
    outs = V.run_canopy(canopy, model_dir, insts)
    for k, (inst, got) in enumerate(zip(insts, outs)):
        out = run(inst, k)
        rep.diff("logits", out["logits"].tolist(), got.get("logits", []))
        rep.diff("h", out["h"].tolist(), got.get("h", []))
    sus = [] if rep.passed() else [
        "h differs: " + ("char.*, word.*, link.*, embed, word_embed"
                         if fam == "latticelstm" else "gru.*, embed")
        if not rep.ok("h") else "out.W / out.b (h matches)"]
    return rep, sus
