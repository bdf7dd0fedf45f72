"""Writes a complete Canopy model directory (docs/models.md).

    write_model_dir(out_dir, family, tensors, hidden=H, embed=D, classes=C,
                    vocab=[...], labels=[...], **options)

``family`` may also be ``"cells"`` (docs/cells.md; ``canopy_torch.save_cells``
writes those): then ``hidden`` and ``embed`` are not written and the
``cells`` option holds model.json's ``"cells"`` object.

``tensors`` maps Canopy tensor names (docs/models.md) to tensors (torch,
numpy or (shape, floats)). Vocabularies are lists of tokens, id = index;
id 0 must be ``<unk>`` (and a target vocabulary's ids 1, 2 ``<s>``,
``</s>``). Family options go into model.json as given: ``lowercase``,
``type_b_labels``, ``crf``, ``max_decode_len``, ``version``; the
vocabularies ``word_vocab`` and ``tgt_vocab`` and the ``lexicon`` (a list
of words) are written as files next to model.json.

Nothing is written half: the directory is assembled under a temporary
name beside ``out_dir`` and renamed into place at the end (an existing
``out_dir`` is replaced only then).

The directory is 0755 and its files 0644 whatever the umask, as ``cp -r``
of a model would make them: a daemon running as another user (systemd's
DynamicUser, a container's) must read them, and ``tempfile.mkdtemp``
alone gave 0700, which such a daemon cannot enter.
"""
import json
import os
import shutil
import tempfile

from .safetensors import save_file

__all__ = ["write_model_dir", "FAMILIES", "DIR_MODE", "FILE_MODE"]

DIR_MODE, FILE_MODE = 0o755, 0o644

FAMILIES = ("treelstm", "treelstm-2type", "treegru", "childsum-treelstm",
            "mvrnn", "bilstm-tagger", "lstm-nmt", "latticelstm", "latticegru")

# Vocabulary-like options: model.json key -> file name written.
_FILES = {"vocab": "vocab.txt", "word_vocab": "words.txt",
          "tgt_vocab": "tgt_vocab.txt", "lexicon": "lexicon.txt"}


def _check_vocab(key, toks):
    toks = [str(t) for t in toks]
    if not toks or toks[0] != "<unk>":
        raise ValueError(f"{key}: id 0 must be '<unk>' (got "
                         f"{toks[0] if toks else 'an empty list'!r})")
    if key == "tgt_vocab" and toks[1:3] != ["<s>", "</s>"]:
        raise ValueError("tgt_vocab: ids 1 and 2 must be '<s>' and '</s>'")
    for i, t in enumerate(toks):
        if not t or any(c.isspace() for c in t):
            raise ValueError(f"{key}: token {i} ({t!r}) is empty or holds "
                             "whitespace; one token a line cannot hold it")
    return toks


def _flat_json(v):
    """A value short enough for one line: a cells op, a list of scalars."""
    if isinstance(v, dict):
        return "op" in v
    if isinstance(v, list):
        return all(not isinstance(x, (dict, list)) for x in v)
    return True


def _pretty(v, ind=""):
    """JSON indented by 2, with every op of a cells model and every list of
    scalars on one line (model.json stays readable by eye)."""
    if _flat_json(v):
        return json.dumps(v)
    inner = ind + "  "
    if isinstance(v, list):
        return ("[\n" + ",\n".join(inner + _pretty(x, inner) for x in v)
                + "\n" + ind + "]")
    return ("{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {_pretty(x, inner)}"
                               for k, x in v.items()) + "\n" + ind + "}")


def write_model_dir(out_dir, family, tensors, *, vocab, hidden=None,
                    embed=None, classes=None, labels=None, **options):
    if family not in FAMILIES and family != "cells":
        raise ValueError(f"unknown family {family!r}; one of "
                         + ", ".join(FAMILIES) + " (or cells)")
    meta = {"family": family}
    if family != "cells":  # a cells model takes its widths from its cells
        if hidden is None or embed is None:
            raise ValueError(f"{family}: hidden and embed are required")
        meta.update(hidden=int(hidden), embed=int(embed))
    if classes is not None:
        meta["classes"] = int(classes)
    files = {"vocab": _check_vocab("vocab", vocab)}
    for key in ("word_vocab", "tgt_vocab"):
        if options.get(key) is not None:
            files[key] = _check_vocab(key, options.pop(key))
        else:
            options.pop(key, None)
    lexicon = options.pop("lexicon", None)
    if labels is not None:
        labels = [str(x) for x in labels]
        if classes is not None and len(labels) != int(classes):
            raise ValueError(f"{len(labels)} labels for {classes} classes")
        meta["labels"] = labels
    for k, v in options.items():
        if v is not None:
            meta[k] = v
    out_dir = os.path.abspath(str(out_dir))
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(out_dir) + ".",
                           dir=parent)
    try:
        for key, toks in files.items():
            meta[key] = _FILES[key]
            with open(os.path.join(tmp, _FILES[key]), "w",
                      encoding="utf-8") as f:
                f.write("\n".join(toks) + "\n")
        if lexicon is not None:
            meta["lexicon"] = _FILES["lexicon"]
            with open(os.path.join(tmp, _FILES["lexicon"]), "w",
                      encoding="utf-8") as f:
                f.write("\n".join(str(w) for w in lexicon) + "\n")
        save_file(tensors, os.path.join(tmp, "weights.safetensors"),
                  metadata={"format": "pt", "family": family})
        with open(os.path.join(tmp, "model.json"), "w",
                  encoding="utf-8") as f:
            f.write(_pretty(meta) + "\n")
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), FILE_MODE)
        os.chmod(tmp, DIR_MODE)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
