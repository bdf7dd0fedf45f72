#!/usr/bin/python3
"""Independent float32 reference implementation of the Canopy model families.

Written only from docs/models.md and docs/api.md.  Plain, slow and
obviously correct: one node at a time, numpy float32 arithmetic, matrices
stored [out, in] and applied as y = W @ x + b.

CLI:
  canopy_ref.py --model DIR --input FILE.jsonl [--outputs root|all]
                [--return-hidden] [--max-decode-len N] [--margins]
      prints one JSON object per input line (the per-instance output object
      of docs/api.md, or {"error": {...}} for an instance the API rejects).

  canopy_ref.py --make-model DIR --family F [--hidden H] [--embed D]
                [--classes C] [--seed S] [--vocab-from FILE.jsonl]
                [--lexicon FILE] [--labels] [--lowercase] [--crf] ...
      writes a random tiny model directory (for tests and comparisons).

Only the Python standard library and numpy are used.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

F32 = np.float32

FAMILIES = (
    "treelstm", "treelstm-2type", "treegru", "childsum-treelstm", "mvrnn",
    "bilstm-tagger", "lstm-nmt", "latticelstm", "latticegru",
)
TREE_FAMILIES = ("treelstm", "treelstm-2type", "treegru", "childsum-treelstm", "mvrnn")
BINARY_TREE_FAMILIES = ("treelstm", "treelstm-2type", "treegru", "mvrnn")

DEFAULT_MAX_DECODE_LEN = 50
BOS_ID = 1
EOS_ID = 2


class RefError(Exception):
    """An input the API rejects: carries the API error code."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code
        self.message = message


class LoadError(Exception):
    """A model directory that cannot be loaded."""


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

def read_safetensors(path):
    """Return {name: float32 ndarray}. Only F32 is supported."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise LoadError("%s: file shorter than the 8-byte header length" % path)
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise LoadError("%s: header length %d runs past the end of the file" % (path, hlen))
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise LoadError("%s: bad JSON header: %s" % (path, e))
    body = data[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info.get("dtype") != "F32":
            raise LoadError("%s: tensor %s has dtype %r, only F32 is supported"
                            % (path, name, info.get("dtype")))
        shape = tuple(int(s) for s in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        count = 1
        for s in shape:
            count *= s
        if end - begin != 4 * count or begin < 0:
            raise LoadError("%s: tensor %s: data_offsets %r do not match shape %r"
                            % (path, name, info["data_offsets"], shape))
        if end > len(body):
            raise LoadError("%s: tensor %s: file is cut short" % (path, name))
        arr = np.frombuffer(body, dtype="<f4", count=count, offset=begin)
        out[name] = arr.astype(F32).reshape(shape)
    return out


def write_safetensors(path, tensors):
    """Write {name: array} as F32 safetensors (names sorted, 8-byte aligned header)."""
    names = sorted(tensors)
    header = {}
    blobs = []
    offset = 0
    for name in names:
        arr = np.ascontiguousarray(np.asarray(tensors[name], dtype="<f4"))
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for raw in blobs:
            f.write(raw)


# ---------------------------------------------------------------------------
# vocabularies, lowercasing
# ---------------------------------------------------------------------------

_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def ascii_lower(s):
    """Lowercase ASCII A-Z only (nothing else changes)."""
    return s.translate(_ASCII_LOWER)


class Vocab(object):
    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.index = {}
        for i, t in enumerate(self.tokens):
            if t not in self.index:          # first occurrence wins
                self.index[t] = i

    @classmethod
    def load(cls, path):
        with open(path, "r", encoding="utf-8", newline="") as f:
            text = f.read()
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        lines = [l[:-1] if l.endswith("\r") else l for l in lines]
        return cls(lines)

    def lookup(self, token):
        return self.index.get(token, 0)

    def token(self, i):
        return self.tokens[i] if 0 <= i < len(self.tokens) else "<unk>"

    def __len__(self):
        return len(self.tokens)


# ---------------------------------------------------------------------------
# math helpers (all float32)
# ---------------------------------------------------------------------------

def sigmoid(x):
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore"):
        return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


def tanh(x):
    return np.tanh(np.asarray(x, dtype=F32)).astype(F32)


def exp(x):
    return np.exp(np.asarray(x, dtype=F32)).astype(F32)


def linear(W, x, b=None):
    y = (W @ np.asarray(x, dtype=F32)).astype(F32)
    if b is not None:
        y = (y + b).astype(F32)
    return y


def split(v, n):
    k = v.shape[0] // n
    return [v[i * k:(i + 1) * k] for i in range(n)]


def cat(*vs):
    return np.concatenate([np.asarray(v, dtype=F32) for v in vs]).astype(F32)


def argmax(v):
    """Lowest index among the maxima (np.argmax already returns the first)."""
    return int(np.argmax(v))


def lstm_cell(p, prefix, x, h, c):
    """PyTorch nn.LSTMCell: rows (i, f, g, o)."""
    g = (linear(p[prefix + ".W_ih"], x, p[prefix + ".b_ih"])
         + linear(p[prefix + ".W_hh"], h, p[prefix + ".b_hh"])).astype(F32)
    gi, gf, gg, go = split(g, 4)
    c2 = (sigmoid(gf) * c + sigmoid(gi) * tanh(gg)).astype(F32)
    h2 = (sigmoid(go) * tanh(c2)).astype(F32)
    return h2, c2


def gru_cell(p, prefix, x, h):
    """PyTorch nn.GRUCell: rows (r, z, n)."""
    gx = linear(p[prefix + ".W_ih"], x, p[prefix + ".b_ih"])
    gh = linear(p[prefix + ".W_hh"], h, p[prefix + ".b_hh"])
    xr, xz, xn = split(gx, 3)
    hr, hz, hn = split(gh, 3)
    r = sigmoid(xr + hr)
    z = sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    return ((F32(1) - z) * n + z * h).astype(F32)


# ---------------------------------------------------------------------------
# trees
# ---------------------------------------------------------------------------

class Node(object):
    __slots__ = ("label", "word", "children", "type")

    def __init__(self, label=None, word=None, children=None, type_=None):
        self.label = label
        self.word = word
        self.children = children if children is not None else []
        self.type = type_

    def is_leaf(self):
        return self.word is not None

    def __repr__(self):
        if self.is_leaf():
            return "(%s %s)" % (self.label, self.word) if self.label is not None else self.word
        return "(%s %s)" % (self.label if self.label is not None else "",
                            " ".join(repr(c) for c in self.children))


def _tokenize_bracketed(s):
    """Yield (kind, text, offset) with kind in '(', ')', 'atom'."""
    toks = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch.isspace():
            i += 1
        elif ch == "(" or ch == ")":
            toks.append((ch, ch, i))
            i += 1
        else:
            j = i
            while j < n and not s[j].isspace() and s[j] not in "()":
                j += 1
            toks.append(("atom", s[i:j], i))
            i = j
    return toks


def parse_bracketed(s):
    """Parse one bracketed tree (docs/api.md contract).
    Raises RefError('bad_tree')."""
    if not isinstance(s, str):
        raise RefError("bad_tree", "tree must be a string or an object")
    toks = _tokenize_bracketed(s)
    if not toks or toks[0][0] != "(":
        raise RefError("bad_tree", "tree string must start with '(' (offset 0)")
    # explicit stack of open brackets; each holds its list of items
    stack = []
    root = None
    pos = 0
    while pos < len(toks):
        kind, text, off = toks[pos]
        pos += 1
        if root is not None:
            raise RefError("bad_tree", "text after the top-level tree at offset %d" % off)
        if kind == "(":
            stack.append((off, []))
        elif kind == "atom":
            if not stack:
                raise RefError("bad_tree", "text outside brackets at offset %d" % off)
            stack[-1][1].append(text)
        else:  # ')'
            if not stack:
                raise RefError("bad_tree", "unbalanced ')' at offset %d" % off)
            open_off, items = stack.pop()
            node = _bracket_node(items, open_off)
            if stack:
                stack[-1][1].append(node)
            else:
                root = node
    if stack:
        raise RefError("bad_tree", "unclosed '(' at offset %d" % stack[-1][0])
    return root


def _bracket_node(items, off):
    if not items:
        raise RefError("bad_tree", "empty bracket '()' at offset %d" % off)
    first = items[0]
    if isinstance(first, str):
        if len(items) == 1:
            raise RefError("bad_tree", "bracket with a single atom '(%s)' at offset %d"
                           % (first, off))
        if len(items) == 2 and isinstance(items[1], str):
            return Node(label=first, word=items[1])
        label, rest = first, items[1:]
    else:
        label, rest = None, items
    children = [Node(word=it) if isinstance(it, str) else it for it in rest]
    return Node(label=label, children=children)


def parse_json_tree(obj):
    """{"word": w} or {"label": .., "type": "a"|"b", "children": [...]}; iterative."""
    def make(o):
        if not isinstance(o, dict):
            raise RefError("bad_tree", "tree node must be an object")
        label = o.get("label")
        if label is not None and not isinstance(label, (str, int)):
            raise RefError("bad_tree", "node label must be a string")
        if label is not None:
            label = str(label)
        typ = o.get("type")
        if typ is not None and typ not in ("a", "b"):
            raise RefError("bad_tree", "node type must be \"a\" or \"b\"")
        ch = o.get("children")
        if "word" in o:
            if not isinstance(o["word"], str):
                raise RefError("bad_tree", "node word must be a string")
            if ch:
                raise RefError("bad_tree", "a node has both a word and children")
            return Node(label=label, word=o["word"], type_=typ), []
        if not isinstance(ch, list) or not ch:
            raise RefError("bad_tree", "a node needs a word or a non-empty children list")
        # JSON input: the "type" field alone picks the internal cell (default "a")
        return Node(label=label, type_=typ or "a"), ch

    root, kids = make(obj)
    work = [(root, kids)]
    while work:
        node, kids = work.pop()
        for k in kids:
            child, grandkids = make(k)
            node.children.append(child)
            work.append((child, grandkids))
    return root


def parse_tree_instance(inst):
    if not isinstance(inst, dict) or "tree" not in inst:
        raise RefError("bad_instance", "a tree instance needs a \"tree\" field")
    t = inst["tree"]
    if isinstance(t, str):
        return parse_bracketed(t)
    if isinstance(t, dict):
        return parse_json_tree(t)
    raise RefError("bad_instance", "\"tree\" must be a string or an object")


def preorder(root):
    out = []
    stack = [root]
    while stack:
        n = stack.pop()
        out.append(n)
        for c in reversed(n.children):
            stack.append(c)
    return out


def postorder(root):
    """Children before parents (explicit stack, no recursion)."""
    pre = preorder(root)
    # reverse of a (node, right-to-left children) pre-order is a valid post-order;
    # simplest: every node appears after all its descendants in reversed pre-order.
    return list(reversed(pre))


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------

def expected_shapes(family, cfg, t):
    """Tensor name -> shape (None entries are free dims checked for consistency)."""
    H = cfg["hidden"]
    D = cfg["embed"]
    C = cfg.get("classes")
    V = t["embed"].shape[0] if "embed" in t else None
    s = {}
    if family in ("treelstm", "treelstm-2type"):
        s["embed"] = (V, D)
        s["leaf.W"] = (3 * H, D)
        s["leaf.b"] = (3 * H,)
        cells = ["internal"] if family == "treelstm" else ["internal_a", "internal_b"]
        for cell in cells:
            s[cell + ".U"] = (5 * H, 2 * H)
            s[cell + ".b"] = (5 * H,)
    elif family == "treegru":
        s["embed"] = (V, D)
        s["leaf.W"] = (H, D)
        s["leaf.b"] = (H,)
        s["internal.Ug"] = (3 * H, 2 * H)
        s["internal.bg"] = (3 * H,)
        s["internal.Un"] = (H, 2 * H)
        s["internal.bn"] = (H,)
    elif family == "childsum-treelstm":
        s["embed"] = (V, D)
        s["cell.W"] = (4 * H, D)
        s["cell.U"] = (4 * H, H)
        s["cell.b"] = (4 * H,)
    elif family == "mvrnn":
        if D != H:
            raise LoadError("mvrnn needs embed (D=%d) == hidden (H=%d)" % (D, H))
        K = t["leaf.M"].shape[0] if "leaf.M" in t else None
        s["embed"] = (V, H)
        s["leaf.M"] = (K, H, H)
        s["internal.W"] = (H, 2 * H)
        s["internal.b"] = (H,)
        s["internal.WM"] = (H, 2 * H)
    elif family == "bilstm-tagger":
        s["embed"] = (V, D)
        for d in ("fwd", "bwd"):
            s[d + ".W_ih"] = (4 * H, D)
            s[d + ".W_hh"] = (4 * H, H)
            s[d + ".b_ih"] = (4 * H,)
            s[d + ".b_hh"] = (4 * H,)
        s["out.W"] = (C, 2 * H)
        s["out.b"] = (C,)
    elif family == "lstm-nmt":
        Vs = t["src_embed"].shape[0] if "src_embed" in t else None
        Vt = t["tgt_embed"].shape[0] if "tgt_embed" in t else None
        s["src_embed"] = (Vs, D)
        s["tgt_embed"] = (Vt, D)
        for d in ("enc", "dec"):
            s[d + ".W_ih"] = (4 * H, D)
            s[d + ".W_hh"] = (4 * H, H)
            s[d + ".b_ih"] = (4 * H,)
            s[d + ".b_hh"] = (4 * H,)
        s["proj.W"] = (Vt, H)
        s["proj.b"] = (Vt,)
    elif family == "latticelstm":
        Vw = t["word_embed"].shape[0] if "word_embed" in t else None
        Dw = t["word_embed"].shape[1] if "word_embed" in t and t["word_embed"].ndim == 2 else None
        s["embed"] = (V, D)
        s["word_embed"] = (Vw, Dw)
        s["char.W"] = (4 * H, D + H)
        s["char.b"] = (4 * H,)
        s["word.W"] = (3 * H, (Dw or 0) + H)
        s["word.b"] = (3 * H,)
        s["link.W"] = (H, D + H)
        s["link.b"] = (H,)
    elif family == "latticegru":
        s["embed"] = (V, D)
        s["gru.W_ih"] = (3 * H, D)
        s["gru.W_hh"] = (3 * H, H)
        s["gru.b_ih"] = (3 * H,)
        s["gru.b_hh"] = (3 * H,)
    else:
        raise LoadError("unknown family %r" % family)
    if family not in ("lstm-nmt",):
        s["out.W"] = (C, (2 * H) if family == "bilstm-tagger" else H)
        s["out.b"] = (C,)
    if cfg.get("crf") is True:
        s["crf.start"] = (C,)
        s["crf.end"] = (C,)
        s["crf.trans"] = (C, C)
    return s


# ---------------------------------------------------------------------------
# linear-chain CRF (docs/models.md bilstm-tagger "crf")
# ---------------------------------------------------------------------------

def crf_path_score(p, emissions, tags):
    """start[y1] + sum_t e_t[y_t] + sum_t trans[y_{t-1}, y_t] + end[yn],
    summed in float64, returned as the nearest float32."""
    s = float(p["crf.start"][tags[0]]) + float(p["crf.end"][tags[-1]])
    for t, y in enumerate(tags):
        s += float(emissions[t][y])
        if t > 0:
            s += float(p["crf.trans"][tags[t - 1], y])
    return F32(s)


def crf_viterbi(p, emissions):
    """Best tag path for one sentence (list of float32 logit vectors), one
    position at a time in float32.  Ties: the lowest previous tag at each
    backpointer, the lowest final tag (np.argmax returns the first maximum).
    Returns (tags, path_score)."""
    start, end, trans = p["crf.start"], p["crf.end"], p["crf.trans"]
    C = start.shape[0]
    score = (start + emissions[0]).astype(F32)
    back = []
    for e in emissions[1:]:
        prev = np.empty(C, dtype=np.int64)
        new = np.empty(C, dtype=F32)
        for j in range(C):
            cand = (score + trans[:, j]).astype(F32)   # from every tag k into j
            prev[j] = int(np.argmax(cand))
            new[j] = F32(cand[prev[j]] + e[j])
        back.append(prev)
        score = new
    last = int(np.argmax((score + end).astype(F32)))
    tags = [last]
    for prev in reversed(back):
        tags.append(int(prev[tags[-1]]))
    tags.reverse()
    return tags, crf_path_score(p, emissions, tags)


class Model(object):
    def __init__(self, model_dir):
        self.dir = model_dir
        with open(os.path.join(model_dir, "model.json"), "r", encoding="utf-8") as f:
            cfg = json.load(f)
        self.cfg = cfg
        for k in ("family", "hidden", "embed", "vocab"):
            if k not in cfg:
                raise LoadError("model.json lacks %r" % k)
        self.family = cfg["family"]
        if self.family not in FAMILIES:
            raise LoadError("unknown family %r" % self.family)
        if self.family != "lstm-nmt" and "classes" not in cfg:
            raise LoadError("model.json lacks 'classes'")
        self.H = int(cfg["hidden"])
        self.D = int(cfg["embed"])
        self.C = int(cfg["classes"]) if "classes" in cfg else None
        self.labels = cfg.get("labels")
        if self.labels is not None and self.C is not None and len(self.labels) != self.C:
            raise LoadError("model.json has %d labels for %d classes" % (len(self.labels), self.C))
        self.lowercase = bool(cfg.get("lowercase", False))
        if "crf" in cfg and (not isinstance(cfg["crf"], bool) or self.family != "bilstm-tagger"):
            raise LoadError("model.json key 'crf' must be true or false, and only for bilstm-tagger")
        self.crf = cfg.get("crf") is True
        self.vocab = Vocab.load(os.path.join(model_dir, cfg["vocab"]))
        self.tgt_vocab = None
        self.word_vocab = None
        self.lexicon = None
        if self.family == "lstm-nmt":
            if "tgt_vocab" not in cfg:
                raise LoadError("lstm-nmt model.json lacks 'tgt_vocab'")
            self.tgt_vocab = Vocab.load(os.path.join(model_dir, cfg["tgt_vocab"]))
        if self.family == "latticelstm":
            if "word_vocab" not in cfg:
                raise LoadError("latticelstm model.json lacks 'word_vocab'")
            self.word_vocab = Vocab.load(os.path.join(model_dir, cfg["word_vocab"]))
            if cfg.get("lexicon"):
                self.lexicon = load_lexicon(os.path.join(model_dir, cfg["lexicon"]))
        self.type_b_labels = set(str(x) for x in cfg.get("type_b_labels", []))
        self.max_decode_len = cfg.get("max_decode_len")
        self.p = read_safetensors(os.path.join(model_dir, cfg.get("weights", "weights.safetensors")))
        shapes = expected_shapes(self.family, cfg, self.p)
        for name in sorted(shapes):
            if name not in self.p:
                raise LoadError("tensor %s is missing" % name)
            want = shapes[name]
            got = self.p[name].shape
            if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
                raise LoadError("tensor %s has shape %r, expected %r" % (name, list(got), list(want)))

    # -- look-ups --------------------------------------------------------
    def norm(self, tok):
        return ascii_lower(tok) if self.lowercase else tok

    def emb(self, name, vocab, tok):
        i = vocab.lookup(self.norm(tok))
        E = self.p[name]
        if i >= E.shape[0]:
            raise LoadError("token %r has id %d but %s has %d rows" % (tok, i, name, E.shape[0]))
        return E[i], i

    def label_name(self, k):
        return self.labels[k] if self.labels is not None else None

    def output(self, h):
        return linear(self.p["out.W"], h, self.p["out.b"])

    # -- dispatch --------------------------------------------------------
    def run(self, inst, outputs="root", return_hidden=False, max_decode_len=None):
        """Per-instance output object (dict). Raises RefError on a bad instance.

        For lstm-nmt the dict also carries "_margins" (top-2 logit margin of
        every decoder step, in order) and "_stopped_eos"; the CLI strips
        these unless asked.
        """
        fam = self.family
        if fam in TREE_FAMILIES:
            return self.run_tree(inst, outputs, return_hidden)
        if fam == "bilstm-tagger":
            return self.run_bilstm(inst, return_hidden)
        if fam == "lstm-nmt":
            return self.run_nmt(inst, return_hidden, max_decode_len)
        if fam == "latticelstm":
            return self.run_latticelstm(inst, return_hidden)
        if fam == "latticegru":
            return self.run_latticegru(inst, return_hidden)
        raise LoadError("unknown family %r" % fam)

    # -- trees ------------------------------------------------------------
    def run_tree(self, inst, outputs, return_hidden):
        root = parse_tree_instance(inst)
        fam = self.family
        pre = preorder(root)
        index = {id(n): k for k, n in enumerate(pre)}
        if fam in BINARY_TREE_FAMILIES:
            for k, n in enumerate(pre):
                if len(n.children) > 2:
                    raise RefError("too_many_children",
                                   "node %d (pre-order) has %d children; %s allows at most 2 "
                                   "(use childsum-treelstm)" % (k, len(n.children), fam))
        state = {}  # pre-order index -> tuple of node state
        for n in postorder(root):
            k = index[id(n)]
            kids = [state[index[id(c)]] for c in n.children]
            if fam == "treelstm" or fam == "treelstm-2type":
                state[k] = self.treelstm_node(n, kids)
            elif fam == "treegru":
                state[k] = self.treegru_node(n, kids)
            elif fam == "childsum-treelstm":
                state[k] = self.childsum_node(n, kids)
            else:
                state[k] = self.mvrnn_node(n, kids)
        res = {}
        h_root = state[0][0]
        logits = self.output(h_root)
        self._put_class(res, logits)
        if outputs == "all":
            nodes = []
            for k in range(len(pre)):
                lg = self.output(state[k][0])
                d = {}
                self._put_class(d, lg)
                nodes.append(d)
            res["nodes"] = nodes
        if return_hidden:
            res["h"] = h_root
        return res

    def _put_class(self, d, logits):
        d["logits"] = logits
        lab = argmax(logits)
        d["label"] = lab
        if self.labels is not None:
            d["label_name"] = self.labels[lab]

    def treelstm_node(self, n, kids):
        """Returns (h, c)."""
        p, H = self.p, self.H
        if n.is_leaf():
            x, _ = self.emb("embed", self.vocab, n.word)
            g = linear(p["leaf.W"], x, p["leaf.b"])
            i, o, u = split(g, 3)
            c = (sigmoid(i) * tanh(u)).astype(F32)
            h = (sigmoid(o) * tanh(c)).astype(F32)
            return h, c
        zero = np.zeros(H, dtype=F32)
        h1, c1 = kids[0]
        h2, c2 = kids[1] if len(kids) > 1 else (zero, zero)
        if self.family == "treelstm":
            cell = "internal"
        elif n.type is not None:          # JSON input: "type" decides
            cell = "internal_b" if n.type == "b" else "internal_a"
        else:
            cell = "internal_b" if (n.label is not None and n.label in self.type_b_labels) \
                else "internal_a"
        g = linear(p[cell + ".U"], cat(h1, h2), p[cell + ".b"])
        i, f1, f2, o, u = split(g, 5)
        c = (sigmoid(i) * tanh(u) + sigmoid(f1) * c1 + sigmoid(f2) * c2).astype(F32)
        h = (sigmoid(o) * tanh(c)).astype(F32)
        return h, c

    def treegru_node(self, n, kids):
        """Returns (h,)."""
        p, H = self.p, self.H
        if n.is_leaf():
            x, _ = self.emb("embed", self.vocab, n.word)
            return (tanh(linear(p["leaf.W"], x, p["leaf.b"])),)
        zero = np.zeros(H, dtype=F32)
        h1 = kids[0][0]
        h2 = kids[1][0] if len(kids) > 1 else zero
        gates = sigmoid(linear(p["internal.Ug"], cat(h1, h2), p["internal.bg"]))
        r1, r2, z = split(gates, 3)
        nn_ = tanh(linear(p["internal.Un"], cat(r1 * h1, r2 * h2), p["internal.bn"]))
        h = (z * ((h1 + h2) / F32(2)) + (F32(1) - z) * nn_).astype(F32)
        return (h,)

    def childsum_node(self, n, kids):
        """Returns (h, c)."""
        p, H = self.p, self.H
        if n.is_leaf():
            x, _ = self.emb("embed", self.vocab, n.word)
        else:
            x = np.zeros(self.D, dtype=F32)
        W, U, b = p["cell.W"], p["cell.U"], p["cell.b"]
        Wi, Wf, Wo, Wu = split(W, 4)
        Ui, Uf, Uo, Uu = split(U, 4)
        bi, bf, bo, bu = split(b, 4)
        hs = np.zeros(H, dtype=F32)
        for hk, _ in kids:
            hs = (hs + hk).astype(F32)
        i = sigmoid(linear(Wi, x) + linear(Ui, hs) + bi)
        o = sigmoid(linear(Wo, x) + linear(Uo, hs) + bo)
        u = tanh(linear(Wu, x) + linear(Uu, hs) + bu)
        c = (i * u).astype(F32)
        for hk, ck in kids:
            fk = sigmoid(linear(Wf, x) + linear(Uf, hk) + bf)
            c = (c + fk * ck).astype(F32)
        h = (o * tanh(c)).astype(F32)
        return h, c

    def mvrnn_node(self, n, kids):
        """Returns (vector, matrix)."""
        p, H = self.p, self.H
        if n.is_leaf():
            a, w = self.emb("embed", self.vocab, n.word)
            M = p["leaf.M"]
            A = M[w] if w < M.shape[0] else M[0]
            return a.astype(F32), A.astype(F32)
        a, A = kids[0]
        if len(kids) > 1:
            b, B = kids[1]
        else:
            b, B = np.zeros(H, dtype=F32), np.eye(H, dtype=F32)
        pv = tanh(linear(p["internal.W"], cat(B @ a, A @ b), p["internal.b"]))
        P = (p["internal.WM"] @ np.concatenate([A, B], axis=0)).astype(F32)
        return pv, P

    # -- sequences -----------------------------------------------------------
    def tokens_of(self, inst):
        if not isinstance(inst, dict):
            raise RefError("bad_instance", "instance must be an object")
        if "tokens" in inst:
            toks = inst["tokens"]
            if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
                raise RefError("bad_instance", "\"tokens\" must be a list of strings")
            return list(toks)
        if "text" in inst:
            if not isinstance(inst["text"], str):
                raise RefError("bad_instance", "\"text\" must be a string")
            return inst["text"].split()
        raise RefError("bad_instance", "a sequence instance needs \"tokens\" or \"text\"")

    def run_bilstm(self, inst, return_hidden):
        toks = self.tokens_of(inst)
        p, H = self.p, self.H
        xs = [self.emb("embed", self.vocab, t)[0] for t in toks]
        n = len(xs)
        hf = [None] * n
        hb = [None] * n
        h = np.zeros(H, dtype=F32)
        c = np.zeros(H, dtype=F32)
        for t in range(n):
            h, c = lstm_cell(p, "fwd", xs[t], h, c)
            hf[t] = h
        h = np.zeros(H, dtype=F32)
        c = np.zeros(H, dtype=F32)
        for t in range(n - 1, -1, -1):
            h, c = lstm_cell(p, "bwd", xs[t], h, c)
            hb[t] = h
        res = {"logits": [], "tags": []}
        hs = []
        for t in range(n):
            ht = cat(hf[t], hb[t])
            hs.append(ht)
            lg = self.output(ht)
            res["logits"].append(lg)
            res["tags"].append(argmax(lg))
        if self.crf:
            res["tags"], res["path_score"] = crf_viterbi(p, res["logits"])
        if self.labels is not None:
            res["tag_names"] = [self.labels[k] for k in res["tags"]]
        if return_hidden:
            res["h"] = hs
        return res

    def decode_cap(self, request_cap):
        caps = [DEFAULT_MAX_DECODE_LEN if request_cap is None else int(request_cap),
                DEFAULT_MAX_DECODE_LEN if self.max_decode_len is None else int(self.max_decode_len)]
        return max(0, min(caps))

    def run_nmt(self, inst, return_hidden, max_decode_len):
        toks = self.tokens_of(inst)
        p, H = self.p, self.H
        h = np.zeros(H, dtype=F32)
        c = np.zeros(H, dtype=F32)
        for t in toks:
            x, _ = self.emb("src_embed", self.vocab, t)
            h, c = lstm_cell(p, "enc", x, h, c)
        cap = self.decode_cap(max_decode_len)
        y = BOS_ID
        ids = []
        margins = []
        stopped = False
        for step in range(cap):
            x = p["tgt_embed"][y]
            h, c = lstm_cell(p, "dec", x, h, c)
            lg = linear(p["proj.W"], h, p["proj.b"])
            y = argmax(lg)
            srt = np.sort(lg)
            margins.append(float(srt[-1]) - float(srt[-2]) if lg.shape[0] > 1 else float("inf"))
            if y == EOS_ID:
                stopped = True
                break
            ids.append(y)
        res = {"output_tokens": [self.tgt_vocab.token(i) for i in ids], "output_ids": ids}
        if return_hidden:
            res["h"] = h
        res["_margins"] = margins
        res["_stopped_eos"] = stopped
        return res

    # -- lattices --------------------------------------------------------------
    def lattice_of(self, inst):
        if not isinstance(inst, dict):
            raise RefError("bad_instance", "instance must be an object")
        if "chars" in inst:
            chars = inst["chars"]
            if not isinstance(chars, list) or not all(isinstance(ch, str) for ch in chars):
                raise RefError("bad_lattice", "\"chars\" must be a list of strings")
            chars = list(chars)
        elif "text" in inst:
            if not isinstance(inst["text"], str):
                raise RefError("bad_instance", "\"text\" must be a string")
            chars = list(inst["text"])
        else:
            raise RefError("bad_instance", "a lattice instance needs \"chars\" or \"text\"")
        n = len(chars)
        if "words" in inst:
            ws = inst["words"]
            if not isinstance(ws, list):
                raise RefError("bad_lattice", "\"words\" must be a list")
            words = []
            for k, w in enumerate(ws):
                if not isinstance(w, dict) or not isinstance(w.get("start"), int) \
                        or not isinstance(w.get("end"), int) \
                        or isinstance(w.get("start"), bool) or isinstance(w.get("end"), bool):
                    raise RefError("bad_lattice", "word %d needs integer start and end" % k)
                b, e = w["start"], w["end"]
                if b < 0 or e > n or e - b < 2:
                    raise RefError("bad_lattice", "word %d span [%d, %d) is invalid for %d characters "
                                   "(need 0 <= start, end <= n, end - start >= 2)" % (k, b, e, n))
                tok = w.get("token")
                if tok is not None and not isinstance(tok, str):
                    raise RefError("bad_lattice", "word %d token must be a string" % k)
                words.append((b, e, tok if tok is not None else "".join(chars[b:e])))
        else:
            words = [(b, e, "".join(chars[b:e]))
                     for (b, e) in find_spans(chars, self.lexicon or LEXICON_EMPTY, self.norm)]
        return chars, words

    def run_latticelstm(self, inst, return_hidden):
        chars, words = self.lattice_of(inst)
        p, H = self.p, self.H
        n = len(chars)
        xs = [self.emb("embed", self.vocab, ch)[0] for ch in chars]
        ending = [[] for _ in range(n)]  # char j -> words whose end == j + 1
        for (b, e, tok) in words:
            ending[e - 1].append((b, e, tok))
        hs = [None] * n
        cs = [None] * n
        h_prev = np.zeros(H, dtype=F32)
        c_prev = np.zeros(H, dtype=F32)
        for j in range(n):
            g = linear(p["char.W"], cat(xs[j], h_prev), p["char.b"])
            gi, gf, go, gu = split(g, 4)
            E = ending[j]
            if not E:
                c = (sigmoid(gf) * c_prev + sigmoid(gi) * tanh(gu)).astype(F32)
            else:
                cws = []
                ls = []
                for (b, e, tok) in E:
                    xw, _ = self.emb("word_embed", self.word_vocab, tok)
                    wg = linear(p["word.W"], cat(xw, hs[b]), p["word.b"])
                    wi, wf, wu = split(wg, 3)
                    cw = (sigmoid(wf) * cs[b] + sigmoid(wi) * tanh(wu)).astype(F32)
                    l = sigmoid(linear(p["link.W"], cat(xs[e - 1], cw), p["link.b"]))
                    cws.append(cw)
                    ls.append(l)
                ai = exp(sigmoid(gi))
                aes = [exp(l) for l in ls]
                den = ai
                for a in aes:
                    den = (den + a).astype(F32)
                c = ((ai / den) * tanh(gu)).astype(F32)
                for a, cw in zip(aes, cws):
                    c = (c + (a / den) * cw).astype(F32)
            h = (sigmoid(go) * tanh(c)).astype(F32)
            hs[j] = h
            cs[j] = c
            h_prev, c_prev = h, c
        res = {"logits": [], "tags": []}
        for j in range(n):
            lg = self.output(hs[j])
            res["logits"].append(lg)
            res["tags"].append(argmax(lg))
        if self.labels is not None:
            res["tag_names"] = [self.labels[k] for k in res["tags"]]
        if return_hidden:
            res["h"] = list(hs)
        return res

    def dag_of(self, inst):
        if not isinstance(inst, dict) or not isinstance(inst.get("nodes"), list):
            raise RefError("bad_instance", "a dag instance needs a \"nodes\" list")
        nodes = inst["nodes"]
        if not nodes:
            raise RefError("bad_lattice", "a dag needs at least one node")
        out = []
        has_succ = [False] * len(nodes)
        for j, nd in enumerate(nodes):
            if not isinstance(nd, dict) or not isinstance(nd.get("token"), str):
                raise RefError("bad_lattice", "node %d needs a string \"token\"" % j)
            prev = nd.get("prev", [])
            if not isinstance(prev, list):
                raise RefError("bad_lattice", "node %d: \"prev\" must be a list" % j)
            for q in prev:
                if not isinstance(q, int) or isinstance(q, bool) or q < 0 or q >= j:
                    raise RefError("bad_lattice", "node %d: prev %r must be an index smaller "
                                   "than the node's own" % (j, q))
                has_succ[q] = True
            out.append((nd["token"], list(prev)))
        for j in range(len(nodes) - 1):
            if not has_succ[j]:
                raise RefError("bad_lattice", "node %d is a sink; only the last node may be one" % j)
        return out

    def run_latticegru(self, inst, return_hidden):
        nodes = self.dag_of(inst)
        p, H = self.p, self.H
        hs = []
        for tok, prev in nodes:
            x, _ = self.emb("embed", self.vocab, tok)
            hp = np.zeros(H, dtype=F32)
            for q in prev:
                hp = (hp + hs[q]).astype(F32)
            if prev:
                hp = (hp / F32(len(prev))).astype(F32)
            hs.append(gru_cell(p, "gru", x, hp))
        res = {}
        self._put_class(res, self.output(hs[-1]))
        if return_hidden:
            res["h"] = hs[-1]
        return res


# ---------------------------------------------------------------------------
# lexicon
# ---------------------------------------------------------------------------

class Lexicon(object):
    def __init__(self, words):
        self.words = set(words)
        self.maxlen = max((len(w) for w in self.words), default=0)

    def __contains__(self, w):
        return w in self.words


LEXICON_EMPTY = Lexicon([])


def load_lexicon(path):
    with open(path, "r", encoding="utf-8") as f:
        return Lexicon(l.rstrip("\r\n") for l in f if l.rstrip("\r\n") != "")


def find_spans(chars, lexicon, norm=lambda s: s):
    """Every span [b, e), e - b >= 2, whose joined (normalised) chars are in the lexicon,
    sorted by (start, end)."""
    n = len(chars)
    spans = []
    for b in range(n):
        for e in range(b + 2, min(n, b + lexicon.maxlen) + 1):
            if norm("".join(chars[b:e])) in lexicon:
                spans.append((b, e))
    return spans


# ---------------------------------------------------------------------------
# JSON output
# ---------------------------------------------------------------------------

def _fmt(v):
    if isinstance(v, np.ndarray):
        return "[" + ",".join(_fmt_float(x) for x in v.tolist()) + "]"
    if isinstance(v, (np.floating,)):
        return _fmt_float(float(v))
    if isinstance(v, float):
        return _fmt_float(v)
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + _fmt(x) for k, x in v.items()) + "}"
    raise TypeError("cannot format %r" % type(v))


def _fmt_float(x):
    x = float(F32(x))  # exact float32 value, printed with repr (round-trips)
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x)


def to_json(obj):
    return _fmt(obj)


def to_plain(obj):
    """ndarrays -> lists of Python floats (float32 values), recursively."""
    if isinstance(obj, np.ndarray):
        return [float(x) for x in obj.tolist()]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def run_line(model, line, idx, outputs="root", return_hidden=False, max_decode_len=None):
    """One input line -> output dict (with private "_" keys for lstm-nmt) or error dict."""
    try:
        inst = json.loads(line)
    except ValueError as e:
        return {"error": {"code": "bad_json", "message": "line %d: %s" % (idx + 1, e), "instance": idx}}
    try:
        return model.run(inst, outputs, return_hidden, max_decode_len)
    except RefError as e:
        return {"error": {"code": e.code, "message": e.message, "instance": idx}}


def read_lines(path):
    with open(path, "r", encoding="utf-8") as f:
        return [l for l in f.read().split("\n") if l.strip() != ""]


# ---------------------------------------------------------------------------
# random model directories (for self-tests and comparisons)
# ---------------------------------------------------------------------------

def _tensor_shapes_for(family, H, D, C, V, Vt=None, Vw=None, Dw=None, K=None, crf=False):
    cfg = {"hidden": H, "embed": D, "classes": C, "crf": crf}
    fake = {"embed": np.zeros((V, D), F32)}
    if family == "mvrnn":
        fake["leaf.M"] = np.zeros((K if K is not None else V, H, H), F32)
    if family == "lstm-nmt":
        fake = {"src_embed": np.zeros((V, D), F32), "tgt_embed": np.zeros((Vt, D), F32)}
    if family == "latticelstm":
        fake["word_embed"] = np.zeros((Vw, Dw), F32)
    return expected_shapes(family, cfg, fake)


def write_vocab(path, tokens):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for t in tokens:
            f.write(t + "\n")


def write_model(model_dir, family, H=4, D=None, C=3, vocab=None, seed=0, scale=0.5,
                labels=None, lowercase=False, tgt_vocab=None, word_vocab=None, Dw=None,
                lexicon=None, K=None, type_b_labels=None, max_decode_len=None,
                eos_bias=0.0, tensors=None, crf=False):
    """Write a random tiny model directory for `family`.

    vocab / tgt_vocab / word_vocab: token lists *without* the reserved
    entries (<unk>; lstm-nmt targets also <s>, </s>), which are prepended.
    labels: list of C names, or True for generated names.  lexicon: a list
    of words (written to lexicon.txt) or None.  K: rows of mvrnn leaf.M
    (default V).  eos_bias: added to lstm-nmt proj.b[2] (</s>) so that
    decodes end at varied lengths.  tensors: dict overriding any generated tensor.
    crf: bilstm-tagger with the CRF layer ("crf": true, crf.* tensors).
    Returns the dict of tensors written.
    """
    if family not in FAMILIES:
        raise ValueError("unknown family %r" % family)
    if D is None:
        D = H
    if family == "mvrnn" and D != H:
        raise ValueError("mvrnn needs D == H")
    os.makedirs(model_dir, exist_ok=True)
    vocab = list(vocab) if vocab is not None else ["w%d" % i for i in range(1, 10)]
    vtoks = ["<unk>"] + [t for t in vocab if t != "<unk>"]
    cfg = {"family": family, "hidden": H, "embed": D, "vocab": "vocab.txt"}
    write_vocab(os.path.join(model_dir, "vocab.txt"), vtoks)
    V = len(vtoks)
    Vt = Vw = None
    if family != "lstm-nmt":
        cfg["classes"] = C
        if labels is True:
            labels = ["L%d" % k for k in range(C)]
        if labels:
            cfg["labels"] = list(labels)
    if lowercase:
        cfg["lowercase"] = True
    if crf:
        cfg["crf"] = True
    if family == "lstm-nmt":
        tv = list(tgt_vocab) if tgt_vocab is not None else ["t%d" % i for i in range(1, 10)]
        ttoks = ["<unk>", "<s>", "</s>"] + [t for t in tv if t not in ("<unk>", "<s>", "</s>")]
        write_vocab(os.path.join(model_dir, "tgt_vocab.txt"), ttoks)
        cfg["tgt_vocab"] = "tgt_vocab.txt"
        Vt = len(ttoks)
        if max_decode_len is not None:
            cfg["max_decode_len"] = max_decode_len
    if family == "latticelstm":
        wv = list(word_vocab) if word_vocab is not None else (list(lexicon) if lexicon else [])
        wtoks = ["<unk>"] + [t for t in wv if t != "<unk>"]
        write_vocab(os.path.join(model_dir, "words.txt"), wtoks)
        cfg["word_vocab"] = "words.txt"
        Vw = len(wtoks)
        Dw = Dw if Dw is not None else D
        if lexicon is not None:
            write_vocab(os.path.join(model_dir, "lexicon.txt"), list(lexicon))
            cfg["lexicon"] = "lexicon.txt"
    if family == "treelstm-2type":
        cfg["type_b_labels"] = list(type_b_labels) if type_b_labels is not None else []
    shapes = _tensor_shapes_for(family, H, D, C, V, Vt=Vt, Vw=Vw, Dw=Dw, K=K, crf=crf)
    rng = np.random.RandomState(seed)
    out = {}
    for name in sorted(shapes):
        shp = tuple(shapes[name])
        out[name] = rng.uniform(-scale, scale, size=shp).astype(F32)
    if family == "lstm-nmt" and eos_bias:
        out["proj.b"][EOS_ID] += F32(eos_bias)
    if tensors:
        for k, v in tensors.items():
            out[k] = np.asarray(v, dtype=F32)
    write_safetensors(os.path.join(model_dir, "weights.safetensors"), out)
    with open(os.path.join(model_dir, "model.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    return out


def vocab_from_data(path, family, limit=None):
    """Collect input-side tokens of a data file, most frequent first."""
    counts = {}
    spans = {}

    def add(d, t):
        d[t] = d.get(t, 0) + 1

    for line in read_lines(path):
        inst = json.loads(line)
        if "tree" in inst:
            try:
                root = parse_tree_instance(inst)
            except RefError:
                continue
            for n in preorder(root):
                if n.is_leaf():
                    add(counts, n.word)
        elif "tokens" in inst or ("text" in inst and family in ("bilstm-tagger", "lstm-nmt")):
            toks = inst["tokens"] if "tokens" in inst else inst["text"].split()
            for t in toks:
                add(counts, t)
        elif "chars" in inst or "text" in inst:
            chars = inst["chars"] if "chars" in inst else list(inst["text"])
            for ch in chars:
                add(counts, ch)
            for w in inst.get("words", []):
                add(spans, w.get("token") or "".join(chars[w["start"]:w["end"]]))
        elif "nodes" in inst:
            for nd in inst["nodes"]:
                add(counts, nd["token"])
    order = sorted(counts, key=lambda t: (-counts[t], t))
    worder = sorted(spans, key=lambda t: (-spans[t], t))
    if limit:
        order = order[:limit]
        worder = worder[:limit]
    return order, worder


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="Canopy float32 reference implementation")
    ap.add_argument("--model", help="model directory")
    ap.add_argument("--input", help="JSONL file, one instance per line")
    ap.add_argument("--outputs", choices=("root", "all"), default="root")
    ap.add_argument("--return-hidden", action="store_true")
    ap.add_argument("--max-decode-len", type=int, default=None)
    ap.add_argument("--margins", action="store_true",
                    help="lstm-nmt: also print \"_margins\" (top-2 logit margin per step)")
    g = ap.add_argument_group("--make-model: write a random tiny model directory")
    g.add_argument("--make-model", metavar="DIR")
    g.add_argument("--family", choices=FAMILIES)
    g.add_argument("--hidden", type=int, default=8)
    g.add_argument("--embed", type=int, default=None)
    g.add_argument("--classes", type=int, default=5)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scale", type=float, default=0.5)
    g.add_argument("--vocab-from", metavar="FILE.jsonl",
                   help="take the vocabulary (and word vocabulary) from a data file")
    g.add_argument("--vocab-limit", type=int, default=None)
    g.add_argument("--lexicon", metavar="FILE", help="latticelstm: lexicon word list to copy in")
    g.add_argument("--labels", action="store_true", help="write label names")
    g.add_argument("--lowercase", action="store_true")
    g.add_argument("--crf", action="store_true", help="bilstm-tagger: add the CRF layer")
    g.add_argument("--type-b-labels", default="", help="treelstm-2type: comma-separated labels")
    g.add_argument("--model-max-decode-len", type=int, default=None)
    g.add_argument("--eos-bias", type=float, default=0.0,
                   help="lstm-nmt: add to the </s> output bias (varied output lengths)")
    a = ap.parse_args(argv)

    if a.make_model:
        if not a.family:
            ap.error("--make-model needs --family")
        vocab = wvocab = None
        if a.vocab_from:
            vocab, wvocab = vocab_from_data(a.vocab_from, a.family, a.vocab_limit)
        lex = None
        if a.lexicon:
            lex = sorted(load_lexicon(a.lexicon).words)
            if not wvocab:
                wvocab = lex
        write_model(a.make_model, a.family, H=a.hidden, D=a.embed, C=a.classes, vocab=vocab,
                    seed=a.seed, scale=a.scale, labels=True if a.labels else None,
                    lowercase=a.lowercase, tgt_vocab=vocab if a.family == "lstm-nmt" else None,
                    word_vocab=wvocab, lexicon=lex,
                    type_b_labels=[x for x in a.type_b_labels.split(",") if x],
                    max_decode_len=a.model_max_decode_len, eos_bias=a.eos_bias,
                    crf=a.crf)
        return 0

    if not a.model or not a.input:
        ap.error("--model and --input are required")
    try:
        model = Model(a.model)
    except (LoadError, OSError, ValueError, KeyError) as e:
        sys.stderr.write("canopy_ref: cannot load model %s: %s\n" % (a.model, e))
        return 2
    out = sys.stdout
    for idx, line in enumerate(read_lines(a.input)):
        res = run_line(model, line, idx, a.outputs, a.return_hidden, a.max_decode_len)
        if not a.margins:
            res = {k: v for k, v in res.items() if not k.startswith("_")}
        else:
            res.pop("_stopped_eos", None)
        out.write(to_json(res) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
