"""Model directories <-> modules: ``save``, ``load``, ``from_state_dict``,
and the tensor names and shapes every family must have (docs/models.md)."""
import json
import os

import torch

from .data import load_vocab
from .modeldir import write_model_dir
from .safetensors import load_file
from .sequences import LSTMNMT, BiLSTMTagger, LatticeGRU, LatticeLSTM
from .trees import MVRNN, ChildSumTreeLSTM, TreeGRU, TreeLSTM, TreeLSTM2Type

__all__ = ["MODULES", "expected_shapes", "check_state_dict", "from_state_dict",
           "load", "save"]

MODULES = {cls.family: cls for cls in (
    TreeLSTM, TreeLSTM2Type, TreeGRU, ChildSumTreeLSTM, MVRNN,
    BiLSTMTagger, LSTMNMT, LatticeLSTM, LatticeGRU)}

# family -> (tensor whose first dim is a multiple of H, that multiple)
_H_FROM = {"treelstm": ("leaf.b", 3), "treelstm-2type": ("leaf.b", 3),
           "treegru": ("leaf.b", 1), "childsum-treelstm": ("cell.b", 4),
           "mvrnn": ("internal.b", 1), "bilstm-tagger": ("fwd.b_ih", 4),
           "lstm-nmt": ("enc.b_ih", 4), "latticelstm": ("link.b", 1),
           "latticegru": ("gru.b_ih", 3)}


def _lstm(prefix, H, D):
    return {prefix + ".W_ih": (4 * H, D), prefix + ".W_hh": (4 * H, H),
            prefix + ".b_ih": (4 * H,), prefix + ".b_hh": (4 * H,)}


def expected_shapes(family, hidden, embed, classes=None, *, vocab_size,
                    tgt_vocab_size=None, word_vocab_size=None, word_embed=None,
                    matrices=None, crf=False):
    """Tensor name -> shape (tuple) that ``family`` needs (docs/models.md)."""
    H, D, C, V = int(hidden), int(embed), classes, vocab_size
    if family in ("treelstm", "treelstm-2type"):
        s = {"embed": (V, D), "leaf.W": (3 * H, D), "leaf.b": (3 * H,)}
        for cell in (["internal"] if family == "treelstm"
                     else ["internal_a", "internal_b"]):
            s.update({cell + ".U": (5 * H, 2 * H), cell + ".b": (5 * H,)})
    elif family == "treegru":
        s = {"embed": (V, D), "leaf.W": (H, D), "leaf.b": (H,),
             "internal.Ug": (3 * H, 2 * H), "internal.bg": (3 * H,),
             "internal.Un": (H, 2 * H), "internal.bn": (H,)}
    elif family == "childsum-treelstm":
        s = {"embed": (V, D), "cell.W": (4 * H, D), "cell.U": (4 * H, H),
             "cell.b": (4 * H,)}
    elif family == "mvrnn":
        s = {"embed": (V, H), "leaf.M": (matrices, H, H), "internal.W": (H, 2 * H),
             "internal.b": (H,), "internal.WM": (H, 2 * H)}
    elif family == "bilstm-tagger":
        s = {"embed": (V, D), **_lstm("fwd", H, D), **_lstm("bwd", H, D)}
        if crf:
            s.update({"crf.start": (C,), "crf.end": (C,), "crf.trans": (C, C)})
    elif family == "lstm-nmt":
        Vt = tgt_vocab_size
        return {"src_embed": (V, D), "tgt_embed": (Vt, D), **_lstm("enc", H, D),
                **_lstm("dec", H, D), "proj.W": (Vt, H), "proj.b": (Vt,)}
    elif family == "latticelstm":
        Dw = word_embed
        s = {"embed": (V, D), "word_embed": (word_vocab_size, Dw),
             "char.W": (4 * H, D + H), "char.b": (4 * H,),
             "word.W": (3 * H, Dw + H), "word.b": (3 * H,),
             "link.W": (H, D + H), "link.b": (H,)}
    elif family == "latticegru":
        s = {"embed": (V, D), "gru.W_ih": (3 * H, D), "gru.W_hh": (3 * H, H),
             "gru.b_ih": (3 * H,), "gru.b_hh": (3 * H,)}
    else:
        raise ValueError(f"unknown family {family!r}; one of " + ", ".join(MODULES))
    s["out.W"] = (C, 2 * H if family == "bilstm-tagger" else H)
    s["out.b"] = (C,)
    return s


def _shape(t):
    return tuple(int(x) for x in t.shape)


def _free_dims(family, sd):
    """The sizes a state_dict fixes by itself (vocabulary rows etc.)."""
    def dim(name, k):
        return _shape(sd[name])[k] if name in sd and len(sd[name].shape) > k else None
    emb = "src_embed" if family == "lstm-nmt" else "embed"
    return dict(vocab_size=dim(emb, 0), tgt_vocab_size=dim("tgt_embed", 0),
                word_vocab_size=dim("word_embed", 0), word_embed=dim("word_embed", 1),
                matrices=dim("leaf.M", 0),
                crf=family == "bilstm-tagger" and any(k.startswith("crf.") for k in sd))


def check_state_dict(family, sd, hidden, embed, classes=None, crf=None, **sizes):
    """Raises ValueError naming the first tensor that is missing, unexpected
    or of the wrong shape for ``family`` with these sizes. ``sizes``
    (vocab_size, ...) default to what the state_dict's tables say."""
    free = _free_dims(family, sd)
    if crf is not None:
        free["crf"] = bool(crf)
    free.update({k: v for k, v in sizes.items() if v is not None})
    want = expected_shapes(family, hidden, embed, classes, **free)
    for name in sorted(want):
        if name not in sd:
            raise ValueError(f"{family}: tensor '{name}' is missing "
                             f"(expected shape {list(want[name])})")
        if _shape(sd[name]) != tuple(want[name]):
            raise ValueError(f"{family}: tensor '{name}' has shape "
                             f"{list(_shape(sd[name]))}, expected {list(want[name])}")
    for name in sorted(sd):
        if name not in want:
            raise ValueError(f"{family}: unexpected tensor '{name}'; the family's "
                             "tensors are " + ", ".join(sorted(want)))
    return want


def _tokens(v):
    if isinstance(v, str):
        return load_vocab(v)
    return v


def from_state_dict(family, state_dict, **options):
    """A module of ``family`` with these weights. Sizes come from the tensor
    shapes (``hidden``, ``embed``, ``classes`` given in ``options`` are
    checked against them); other options are model.json's: ``vocab``,
    ``labels``, ``lowercase``, ``type_b_labels``, ``crf``,
    ``max_decode_len``, ``tgt_vocab``, ``word_vocab``, ``lexicon``
    (vocabularies as token lists or file paths; a vocabulary not given
    becomes placeholder tokens ``#k``, enough for id input)."""
    if family not in MODULES:
        raise ValueError(f"unknown family {family!r}; one of " + ", ".join(MODULES))
    sd = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)).float()
          for k, v in state_dict.items()}
    hname, mult = _H_FROM[family]
    if hname not in sd:
        raise ValueError(f"{family}: tensor '{hname}' is missing")
    H = _shape(sd[hname])[0] // mult
    emb = "src_embed" if family == "lstm-nmt" else "embed"
    if emb not in sd or len(sd[emb].shape) != 2:
        raise ValueError(f"{family}: tensor '{emb}' is missing or not 2-D")
    V, D = _shape(sd[emb])
    C = None
    if family != "lstm-nmt":
        if "out.b" not in sd:
            raise ValueError(f"{family}: tensor 'out.b' is missing")
        C = _shape(sd["out.b"])[0]
    for key, got in (("hidden", H), ("embed", D), ("classes", C)):
        if options.get(key) is not None and int(options[key]) != got:
            raise ValueError(f"{family}: {key} is {options[key]} but the tensors "
                             f"say {got}")
    free = _free_dims(family, sd)
    if options.get("crf") is not None and family == "bilstm-tagger":
        free["crf"] = bool(options["crf"])
    check_state_dict(family, sd, H, D, C, **free)
    vocab = _tokens(options.get("vocab")) or V
    if not isinstance(vocab, int) and len(vocab) != V:
        raise ValueError(f"{family}: vocabulary has {len(vocab)} tokens but "
                         f"tensor '{emb}' has {V} rows")
    kw = dict(hidden=H, embed=D, lowercase=bool(options.get("lowercase", False)))
    if family != "lstm-nmt":
        kw.update(classes=C, labels=options.get("labels"))
    if family == "treelstm-2type":
        kw["type_b_labels"] = options.get("type_b_labels") or ()
    elif family == "mvrnn":
        kw["matrices"] = free["matrices"]
    elif family == "bilstm-tagger":
        kw["crf"] = free["crf"]
    elif family == "lstm-nmt":
        kw["max_decode_len"] = options.get("max_decode_len")
        kw["tgt_vocab"] = _tokens(options.get("tgt_vocab")) or free["tgt_vocab_size"]
    elif family == "latticelstm":
        kw["word_vocab"] = _tokens(options.get("word_vocab")) or free["word_vocab_size"]
        kw["word_embed"] = free["word_embed"]
        lex = options.get("lexicon")
        kw["lexicon"] = _tokens(lex) if lex is not None else None
    m = MODULES[family](vocab, **kw)
    for name, n in (("tgt_embed", "tgt_vocab"), ("word_embed", "word_vocab")):
        if name in sd and len(getattr(m, n)) != _shape(sd[name])[0]:
            raise ValueError(f"{family}: {n} has {len(getattr(m, n))} tokens but "
                             f"tensor '{name}' has {_shape(sd[name])[0]} rows")
    m.load_state_dict(sd, strict=True)
    return m


def _torch_tensor(shape, buf):
    if len(buf) == 0:
        return torch.zeros(shape)
    return torch.frombuffer(bytearray(buf.tobytes()), dtype=torch.float32).reshape(shape)


def load(model_dir):
    """Reads a Canopy model directory (model.json, weights, vocab files)
    into the family's module."""
    with open(os.path.join(model_dir, "model.json"), encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("family") == "cells":
        raise ValueError(f"{model_dir} is a cells model (docs/cells.md): it "
                         "has no module here; load its weights into your own "
                         "with load_file, or evaluate it with "
                         "canopy_torch.cells_ref.run_cells")
    for k in ("family", "hidden", "embed", "vocab"):
        if k not in meta:
            raise ValueError(f"{model_dir}/model.json lacks '{k}'")
    opts = dict(meta)
    for key in ("vocab", "word_vocab", "tgt_vocab", "lexicon"):
        if meta.get(key):
            opts[key] = load_vocab(os.path.join(model_dir, meta[key]))
    if opts.get("lexicon") is not None:
        opts["lexicon"] = [w for w in opts["lexicon"] if w != ""]
    raw, _ = load_file(os.path.join(model_dir, meta.get("weights", "weights.safetensors")))
    sd = {k: _torch_tensor(shape, buf) for k, (shape, buf) in raw.items()}
    family = opts.pop("family")
    return from_state_dict(family, sd, **opts)


def save(module, out_dir, vocab=None, labels=None, **options):
    """Writes ``module`` as a complete Canopy model directory: model.json
    (family, sizes, labels and the module's options: lowercase,
    type_b_labels, crf, max_decode_len, tgt_vocab, word_vocab, lexicon;
    ``options`` override them), weights.safetensors (its state_dict) and the
    vocabulary files. ``vocab``/``labels`` default to the module's own.
    A state_dict whose names or shapes are not the family's is refused with
    a ValueError naming the tensor. Returns the directory's path."""
    family = getattr(module, "family", None)
    if family not in MODULES:
        raise ValueError(f"save: {type(module).__name__} is not a Canopy family "
                         "module (no known .family)")
    sd = {k: v.detach().float().cpu() for k, v in module.state_dict().items()}
    opts = module.model_options()
    opts.update(options)
    vocab = list(vocab) if vocab is not None else list(module.vocab.tokens)
    sizes = {"vocab_size": len(vocab)}
    if family == "lstm-nmt":
        sizes["tgt_vocab_size"] = len(opts["tgt_vocab"])
    if family == "latticelstm":
        sizes["word_vocab_size"] = len(opts["word_vocab"])
        sizes["word_embed"] = module.word_embed_dim
    check_state_dict(family, sd, module.hidden, module.embed_dim, module.classes,
                     crf=getattr(module, "has_crf", None), **sizes)
    if labels is None:
        labels = module.labels
    if family == "lstm-nmt":
        return write_model_dir(out_dir, family, sd, hidden=module.hidden,
                               embed=module.embed_dim, vocab=vocab, **opts)
    return write_model_dir(out_dir, family, sd, hidden=module.hidden,
                           embed=module.embed_dim, classes=module.classes,
                           vocab=vocab, labels=labels, **opts)
