"""Helpers shared by the formats: errors, checkpoints, key/shape checking,
vocabularies, gate-block surgery, inputs (trees, sequences) and samples.

Only the standard library and torch.
"""
import difflib
import json
import os
import random

import torch

# exit statuses
EXIT_USAGE = 2      # usage, vocabulary, key or shape errors: nothing written
EXIT_MISMATCH = 1   # verification failed (or canopy could not run the model)


class ImportFailure(Exception):
    """An error the user can act on; ``status`` is the exit status."""

    def __init__(self, message, status=EXIT_USAGE):
        Exception.__init__(self, message)
        self.status = status


# ---------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------

DEFAULT_KEYS = ("state_dict", "model", "model_state_dict")


def _is_state_dict(obj):
    return (isinstance(obj, dict) and len(obj) > 0
            and all(isinstance(k, str) for k in obj)
            and all(torch.is_tensor(v) for v in obj.values()))


def load_checkpoint(path, key=None):
    """The state_dict in ``path``: the saved object itself, or the dict under
    ``key`` (default: the first of state_dict, model, model_state_dict), or a
    saved nn.Module's state_dict(). Returns (dict name -> float tensor, note)."""
    if not os.path.isfile(path):
        raise ImportFailure(f"checkpoint {path}: no such file")
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # pickle errors, truncated files, ...
        raise ImportFailure(f"checkpoint {path}: torch.load failed: {e}")
    where = "the saved object"
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            have = sorted(k for k in obj) if isinstance(obj, dict) else []
            raise ImportFailure(
                f"checkpoint {path}: no key {key!r} (--key); top-level keys: "
                + (", ".join(map(str, have[:20])) or "none (not a dict)"))
        obj, where = obj[key], f"key {key!r}"
    elif isinstance(obj, dict) and not _is_state_dict(obj):
        for k in DEFAULT_KEYS:
            if k in obj:
                obj, where = obj[k], f"key {k!r}"
                break
    if isinstance(obj, torch.nn.Module):
        obj, where = obj.state_dict(), where + " (an nn.Module: its state_dict())"
    if not _is_state_dict(obj):
        have = sorted(map(str, obj))[:20] if isinstance(obj, dict) else []
        raise ImportFailure(
            f"checkpoint {path}: {where} is not a state_dict (a dict of "
            "tensor names to tensors); name the key that holds one with --key"
            + (f" (top-level keys: {', '.join(have)})" if have else ""))
    sd = {}
    for k, v in obj.items():
        if not v.is_floating_point():
            raise ImportFailure(f"key {k!r}: dtype {v.dtype}, expected a "
                                "floating-point tensor")
        sd[k] = v.detach().to("cpu", torch.float64)
    note = f"state_dict from {where}, {len(sd)} tensors"
    prefixes = {k.split(".", 1)[0] for k in sd}
    if prefixes == {"module"}:   # saved from nn.DataParallel
        sd = {k[len("module."):]: v for k, v in sd.items()}
        note += " (the DataParallel prefix 'module.' removed)"
    return sd, note


# ---------------------------------------------------------------------------
# keys and shapes
# ---------------------------------------------------------------------------

def shape_str(shape):
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


class Dim(object):
    """A named size, e.g. Dim("3H", 24)."""

    def __init__(self, name, value):
        self.name, self.value = name, int(value)

    def __repr__(self):
        return f"{self.name}={self.value}"


def expect_str(dims):
    return "[" + ", ".join(repr(d) if isinstance(d, Dim) else str(d)
                           for d in dims) + "]"


class KeyCheck(object):
    """Checks a state_dict against a format's expected keys and shapes.

    ``expect(key, dims)`` records an expected tensor (dims: Dim or int per
    axis); ``ignore(key, why)`` a known key that is not used; ``check()``
    raises one ImportFailure listing every missing key, every shape that does
    not fit and every unknown key (each with the shape expected)."""

    def __init__(self, sd, fmt):
        self.sd, self.fmt = sd, fmt
        self.expected = {}      # key -> dims
        self.optional = set()
        self.ignored = {}       # key -> why

    def expect(self, key, *dims, optional=False):
        self.expected[key] = dims
        if optional:
            self.optional.add(key)

    def ignore(self, key, why):
        self.ignored[key] = why

    def problems(self):
        out = []
        for key, dims in self.expected.items():
            if key not in self.sd:
                if key not in self.optional:
                    out.append(f"missing key {key!r}: expected shape "
                               f"{expect_str(dims)}")
                continue
            got = list(self.sd[key].shape)
            want = [d.value if isinstance(d, Dim) else int(d) for d in dims]
            if got != want:
                out.append(f"key {key!r} has shape {shape_str(got)}, expected "
                           f"{expect_str(dims)}")
        for key in sorted(self.sd):
            if key not in self.expected and key not in self.ignored:
                out.append(f"unknown key {key!r} (shape "
                           f"{shape_str(self.sd[key].shape)}): not part of "
                           f"format {self.fmt}")
        return out

    def check(self):
        probs = self.problems()
        if probs:
            raise ImportFailure(
                f"{self.fmt}: the checkpoint does not fit the format:\n  "
                + "\n  ".join(probs)
                + f"\n(canopy-import --help lists the keys {self.fmt} expects)")


def need(sd, key, fmt, what):
    """A tensor the format reads its sizes from: missing is an error that
    names the checkpoint's keys closest to it (a renamed key)."""
    if key not in sd:
        base = key.rsplit(".", 1)[0] + "."
        near = [k for k in sorted(sd) if k.startswith(base)]
        near += [k for k in difflib.get_close_matches(key, list(sd), n=3,
                                                      cutoff=0.6)
                 if k not in near]
        raise ImportFailure(
            f"{fmt}: missing key {key!r} ({what})"
            + ("; the checkpoint has instead: " + ", ".join(
                f"{k!r} (shape {shape_str(sd[k].shape)})" for k in near)
               if near else "")
            + f"\n(canopy-import --help lists the keys {fmt} expects)")
    return sd[key]


def dim_of(sd, key, axis, fmt, what, ndim=None, divisor=1):
    t = need(sd, key, fmt, what)
    if ndim is not None and t.dim() != ndim:
        raise ImportFailure(f"{fmt}: key {key!r} has shape "
                            f"{shape_str(t.shape)}, expected {ndim} axes "
                            f"({what})")
    if axis >= t.dim():
        raise ImportFailure(f"{fmt}: key {key!r} has shape "
                            f"{shape_str(t.shape)}: too few axes ({what})")
    n = int(t.shape[axis])
    if n % divisor:
        raise ImportFailure(f"{fmt}: key {key!r} has shape "
                            f"{shape_str(t.shape)}: axis {axis} ({n}) is not "
                            f"a multiple of {divisor} ({what})")
    return n // divisor


# torch's recurrent layers by their gate count: weight_hh_l0 is [G*H, H]
RECURRENT = {4: "nn.LSTM", 3: "nn.GRU", 1: "nn.RNN"}


def check_recurrent(sd, prefix, fmt, want="nn.LSTM"):
    """The recurrent layer at prefix (keys PREFIX.weight_hh_l0 ...) must be
    a `want`: nn.LSTM, nn.GRU and nn.RNN share their key names and differ
    only in the gate blocks of weight_hh_l0 ([4H, H], [3H, H], [H, H]). A
    GRU handed to an LSTM format would otherwise fail later and far away
    ("found no nn.Linear [T, 2H]" with a wrong H), so the layer found is
    named here."""
    t = sd.get(prefix + ".weight_hh_l0")
    if t is None or t.dim() != 2 or int(t.shape[1]) == 0:
        return
    rows, H = int(t.shape[0]), int(t.shape[1])
    found = RECURRENT.get(rows // H) if rows % H == 0 else None
    if found == want:
        return
    shape = shape_str(t.shape)
    what = (f"an {found}" if found else
            f"a recurrent layer of {rows / H:g} gate blocks")
    raise ImportFailure(
        f"{fmt}: '{prefix}' is {what} ({prefix}.weight_hh_l0 {shape} = "
        f"[{rows // H if rows % H == 0 else rows}*H, H], H={H}); "
        f"the {fmt} format takes an {want} (weight_hh_l0 "
        f"[{next(g for g, n in RECURRENT.items() if n == want)}*H, H]); "
        "another cell can be served as a model described by its cells "
        "(docs/cells.md, canopy_torch.save_cells)")


def blocks(t, n):
    """Split rows (axis 0) into n equal consecutive blocks."""
    return list(torch.chunk(t, n, dim=0))


def f32(t):
    return t.detach().to(torch.float32).contiguous()


# ---------------------------------------------------------------------------
# vocabularies and labels
# ---------------------------------------------------------------------------

def read_lines(path, what):
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            text = f.read()
    except OSError as e:
        raise ImportFailure(f"{what} {path}: {e.strerror}")
    except UnicodeDecodeError as e:
        raise ImportFailure(f"{what} {path}: not UTF-8 ({e})")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [l[:-1] if l.endswith("\r") else l for l in lines]


def read_vocab(path, what="--vocab", target=False):
    toks = read_lines(path, what)
    need_ = ["<unk>", "<s>", "</s>"] if target else ["<unk>"]
    for i, want in enumerate(need_):
        got = toks[i] if i < len(toks) else None
        if got != want:
            where = [j for j, t in enumerate(toks) if t == want]
            raise ImportFailure(
                f"{what} {path}: line {i + 1} (id {i}) is "
                + (repr(got) if got is not None else "missing")
                + f"; Canopy requires id {i} = {want!r}"
                + (" (ids 0, 1, 2 = '<unk>', '<s>', '</s>': unknown word, "
                   "start and end of the output)" if target else
                   " (the id every unknown token maps to)")
                + (f"; {want!r} is on line {where[0] + 1}" if where else
                   f"; the file has no {want!r}")
                + ". The importer does not permute embedding rows: "
                "re-index the vocabulary and the checkpoint's embedding "
                "together (or retrain) so that the ids fit.")
    for i, t in enumerate(toks):
        if not t or any(c.isspace() for c in t):
            raise ImportFailure(f"{what} {path}: line {i + 1} ({t!r}) is "
                                "empty or holds whitespace; Canopy reads one "
                                "token a line")
    return toks


def check_rows(sd, key, vocab, vocab_opt):
    rows = int(sd[key].shape[0])
    if rows != len(vocab):
        raise ImportFailure(
            f"key {key!r} has {rows} rows but {vocab_opt} has {len(vocab)} "
            f"tokens; Canopy needs one embedding row per vocabulary line "
            f"(line k = id k = row k)")


def read_labels(path, classes, what="--labels"):
    labels = read_lines(path, what)
    if len(labels) != classes:
        raise ImportFailure(f"{what} {path}: {len(labels)} labels, but the "
                            f"output layer has {classes} classes")
    return labels


# ---------------------------------------------------------------------------
# inputs: trees and sequences (docs/api.md)
# ---------------------------------------------------------------------------

class Tree(object):
    __slots__ = ("label", "word", "children")

    def __init__(self, label=None, word=None, children=None):
        self.label, self.word = label, word
        self.children = children if children is not None else []

    def is_leaf(self):
        return self.word is not None

    def preorder(self):
        out, stack = [], [self]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children))
        return out


def _parse_bracketed(s):
    toks, i, n = [], 0, len(s)
    while i < n:
        ch = s[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            toks.append(ch)
            i += 1
        else:
            j = i
            while j < n and not s[j].isspace() and s[j] not in "()":
                j += 1
            toks.append(s[i:j])
            i = j
    if not toks or toks[0] != "(":
        raise ValueError("a bracketed tree must start with '('")
    stack, root = [], None
    for t in toks:
        if root is not None:
            raise ValueError("text after the top-level tree")
        if t == "(":
            stack.append([])
        elif t == ")":
            if not stack:
                raise ValueError("unbalanced ')'")
            items = stack.pop()
            if not items:
                raise ValueError("empty bracket '()'")
            first = items[0]
            if isinstance(first, str):
                if len(items) == 1:
                    raise ValueError(f"bracket with a single atom ({first})")
                if len(items) == 2 and isinstance(items[1], str):
                    node = Tree(label=first, word=items[1])
                else:
                    node = Tree(label=first, children=[
                        Tree(word=x) if isinstance(x, str) else x
                        for x in items[1:]])
            else:
                node = Tree(children=[Tree(word=x) if isinstance(x, str)
                                      else x for x in items])
            if stack:
                stack[-1].append(node)
            else:
                root = node
        else:
            if not stack:
                raise ValueError("text outside brackets")
            stack[-1].append(t)
    if stack:
        raise ValueError("unclosed '('")
    return root


def _parse_json_tree(o):
    if not isinstance(o, dict):
        raise ValueError("a tree node must be an object")
    if "word" in o:
        return Tree(label=o.get("label"), word=o["word"])
    ch = o.get("children")
    if not isinstance(ch, list) or not ch:
        raise ValueError("a node needs a word or a non-empty children list")
    return Tree(label=o.get("label"),
                children=[_parse_json_tree(c) for c in ch])


def tree_of(inst):
    t = inst.get("tree") if isinstance(inst, dict) else None
    if isinstance(t, str):
        return _parse_bracketed(t)
    if isinstance(t, dict):
        return _parse_json_tree(t)
    raise ValueError('a tree instance needs "tree": a string or an object')


def tokens_of(inst):
    if isinstance(inst, dict) and isinstance(inst.get("tokens"), list):
        toks = [str(t) for t in inst["tokens"]]
    elif isinstance(inst, dict) and isinstance(inst.get("text"), str):
        toks = inst["text"].split()
    else:
        raise ValueError('a sequence instance needs "tokens" or "text"')
    if not toks:
        raise ValueError("the input is empty: send at least one token")
    return toks


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


class Lookup(object):
    """Token -> id as Canopy does it (first occurrence wins, unknown -> 0,
    optional ASCII lowercasing)."""

    def __init__(self, vocab, lowercase=False):
        self.index = {}
        for i, t in enumerate(vocab):
            self.index.setdefault(t, i)
        self.lowercase = lowercase

    def __call__(self, tok):
        if self.lowercase:
            tok = tok.translate(_LOWER)
        return self.index.get(tok, 0)


def read_jsonl(path):
    out = []
    for k, line in enumerate(read_lines(path, "--check")):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as e:
            raise ImportFailure(f"--check {path}: line {k + 1}: not JSON ({e})")
    if not out:
        raise ImportFailure(f"--check {path}: no instances")
    return out


# ---------------------------------------------------------------------------
# built-in samples (deterministic, over the vocabulary's own tokens)
# ---------------------------------------------------------------------------

def _sample_tokens(rng, vocab, n):
    # every id is drawn, <unk> included, so every embedding row can show up
    return [vocab[rng.randrange(len(vocab))] for _ in range(n)]


def sample_trees(vocab, n=24, arity=2, seed=0):
    """Random JSON trees over vocabulary tokens: binary (arity=2, with some
    unary nodes) or any arity up to ``arity``."""
    rng = random.Random(seed)

    def build(words):
        if len(words) == 1:
            leaf = {"word": words[0]}
            return {"children": [leaf]} if rng.random() < 0.2 else leaf
        k = rng.randint(2, min(arity, len(words)))
        cuts = sorted(rng.sample(range(1, len(words)), k - 1))
        parts = [words[a:b] for a, b in zip([0] + cuts, cuts + [len(words)])]
        node = {"children": [build(p) for p in parts]}
        if rng.random() < 0.1:
            node = {"children": [node]}
        return node

    out = []
    for i in range(n):
        words = _sample_tokens(rng, vocab, rng.randint(2, 12))
        root = build(words)
        if "word" in root:
            root = {"children": [root]}
        out.append({"tree": root})
    # every vocabulary row at least once (up to a limit) in extra trees
    ids = list(range(len(vocab)))[:400]
    for a in range(0, len(ids), 10):
        words = [vocab[j] for j in ids[a:a + 10]]
        if len(words) >= 2:
            out.append({"tree": build(words)})
    return out


def sample_sentences(vocab, n=24, seed=0, maxlen=14):
    rng = random.Random(seed)
    out = [{"tokens": _sample_tokens(rng, vocab, rng.randint(1, maxlen))}
           for _ in range(n)]
    ids = list(range(len(vocab)))[:400]
    for a in range(0, len(ids), 12):
        out.append({"tokens": [vocab[j] for j in ids[a:a + 12]]})
    return out
