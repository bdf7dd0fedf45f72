"""Input handling that matches the Canopy engine (docs/api.md).

- ``load_vocab(path)`` / ``Vocab(tokens, lowercase=False)``: id = line
  index, first occurrence wins, an unknown token is id 0 (``<unk>``);
  ``lowercase`` lowercases ASCII A-Z only, before every look-up.
- ``parse_tree(s)`` (bracketed Penn/SST string) and ``tree_from_json(node)``
  give a ``Tree`` whose ``.nodes`` are in pre-order; each ``Node`` has
  ``.label``, ``.word`` (leaves only), ``.children`` (pre-order indices)
  and ``.type`` ("a"/"b" from JSON input, None from brackets).
- ``find_spans(chars, lexicon, lowercase)``: the lexicon spans of a lattice.
- ``instance_to_input(family, instance, model)``: an API instance object ->
  what ``model.forward`` takes (see each module's docstring).

Every invalid input is a ``ValueError`` saying what and where.
"""
import torch

__all__ = ["load_vocab", "Vocab", "ascii_lower", "Node", "Tree", "parse_tree",
           "tree_from_json", "parse_tree_instance", "find_spans",
           "instance_to_input"]

_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def ascii_lower(s):
    """Lowercases ASCII A-Z only (what model.json ``lowercase`` does)."""
    return s.translate(_LOWER)


def load_vocab(path):
    """A vocabulary file (one token a line; line k is id k) as a list."""
    with open(path, "r", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [l[:-1] if l.endswith("\r") else l for l in lines]


class Vocab:
    """Token <-> id. ``id(tok)`` is 0 (``<unk>``) for an unknown token."""

    def __init__(self, tokens, lowercase=False):
        if isinstance(tokens, Vocab):
            tokens = tokens.tokens
        self.tokens = [str(t) for t in tokens]
        self.lowercase = bool(lowercase)
        self.index = {}
        for i, t in enumerate(self.tokens):
            self.index.setdefault(t, i)

    def norm(self, tok):
        return ascii_lower(tok) if self.lowercase else tok

    def id(self, tok):
        return self.index.get(self.norm(tok), 0)

    def ids(self, toks):
        """LongTensor of the ids of ``toks``."""
        return torch.tensor([self.id(t) for t in toks], dtype=torch.long)

    def token(self, i):
        return self.tokens[i] if 0 <= i < len(self.tokens) else "<unk>"

    def __len__(self):
        return len(self.tokens)

    def __repr__(self):
        return f"Vocab({len(self.tokens)} tokens, lowercase={self.lowercase})"


# -- trees -------------------------------------------------------------------

class Node:
    __slots__ = ("label", "word", "children", "type")

    def __init__(self, label=None, word=None, children=None, type=None):
        self.label, self.word, self.type = label, word, type
        self.children = children if children is not None else []

    def is_leaf(self):
        return self.word is not None

    def __repr__(self):
        return (f"Node(label={self.label!r}, word={self.word!r}, "
                f"children={self.children}, type={self.type!r})")


class Tree:
    """A tree as a list of ``Node``s in pre-order (``nodes[0]`` is the root);
    ``children`` hold pre-order indices, so a child's index is always larger
    than its parent's and ``reversed(range(len(nodes)))`` is a valid
    bottom-up order."""

    def __init__(self, nodes):
        self.nodes = nodes

    def __len__(self):
        return len(self.nodes)

    def leaves(self):
        return [n.word for n in self.nodes if n.is_leaf()]

    def labels(self):
        return [n.label for n in self.nodes]

    def __repr__(self):
        def show(k):
            n = self.nodes[k]
            if n.is_leaf():
                return n.word if n.label is None else f"({n.label} {n.word})"
            inner = " ".join(show(c) for c in n.children)
            return f"({n.label} {inner})" if n.label is not None else f"({inner})"
        return f"Tree({show(0)!r})" if self.nodes else "Tree()"


def _flatten(root):
    """Nested (label, word, type, [kids]) -> Tree in pre-order, iteratively."""
    nodes = []
    stack = [(root, None)]
    while stack:
        (label, word, typ, kids), parent = stack.pop()
        k = len(nodes)
        nodes.append(Node(label=label, word=word, type=typ))
        if parent is not None:
            nodes[parent].children.append(k)
        for kid in reversed(kids):
            stack.append((kid, k))
    return Tree(nodes)


def parse_tree(s):
    """Parses one bracketed tree (docs/api.md): ``(X w)`` is a leaf labelled X
    with word w, ``(X child ...)`` an internal node labelled X, a bracket whose
    first item is a bracket is unlabelled, a bare word among children is an
    unlabelled leaf. ``(w)``, ``()``, text outside the one top-level tree or
    a string not starting with ``(`` are ValueErrors (with the offset)."""
    if not isinstance(s, str):
        raise ValueError("bad_tree: a tree must be a string or an object")
    stack, root, i, n = [], None, 0, len(s)
    while i < n and s[i].isspace():
        i += 1
    if i >= n or s[i] != "(":
        raise ValueError("bad_tree: the tree string must start with '(' "
                         f"(offset {i})")
    while i < n:
        ch = s[i]
        if ch.isspace():
            i += 1
            continue
        if root is not None:
            raise ValueError(f"bad_tree: text after the top-level tree at offset {i}")
        if ch == "(":
            stack.append((i, []))
            i += 1
        elif ch == ")":
            if not stack:
                raise ValueError(f"bad_tree: unbalanced ')' at offset {i}")
            off, items = stack.pop()
            node = _bracket(items, off)
            if stack:
                stack[-1][1].append(node)
            else:
                root = node
            i += 1
        else:
            j = i
            while j < n and not s[j].isspace() and s[j] not in "()":
                j += 1
            stack[-1][1].append(s[i:j])
            i = j
    if stack:
        raise ValueError(f"bad_tree: unclosed '(' at offset {stack[-1][0]}")
    return _flatten(root)


def _bracket(items, off):
    if not items:
        raise ValueError(f"bad_tree: empty bracket '()' at offset {off}")
    first = items[0]
    if isinstance(first, str):
        if len(items) == 1:
            raise ValueError(f"bad_tree: bracket with a single atom '({first})' "
                             f"at offset {off}")
        if len(items) == 2 and isinstance(items[1], str):
            return (first, items[1], None, [])
        label, rest = first, items[1:]
    else:
        label, rest = None, items
    return (label, None, None,
            [(None, it, None, []) if isinstance(it, str) else it for it in rest])


def tree_from_json(obj):
    """``{"word": w}`` or ``{"label": .., "type": "a"|"b", "children": [..]}``
    -> Tree. As in the engine, an internal JSON node's cell is chosen by its
    ``type`` alone (default "a"); its label is kept for training targets."""
    def make(o, path):
        if not isinstance(o, dict):
            raise ValueError(f"bad_tree: node {path} must be an object")
        label = o.get("label")
        if label is not None and not isinstance(label, (str, int)):
            raise ValueError(f"bad_tree: node {path}: label must be a string")
        label = None if label is None else str(label)
        typ = o.get("type")
        if typ is not None and typ not in ("a", "b"):
            raise ValueError(f'bad_tree: node {path}: type must be "a" or "b"')
        kids = o.get("children")
        if "word" in o:
            if not isinstance(o["word"], str):
                raise ValueError(f"bad_tree: node {path}: word must be a string")
            if kids:
                raise ValueError(f"bad_tree: node {path} has both a word and children")
            return [label, o["word"], typ, []]
        if not isinstance(kids, list) or not kids:
            raise ValueError(f"bad_tree: node {path} needs a word or a "
                             "non-empty children list")
        return [label, None, typ or "a", kids]

    root = make(obj, "root")
    work = [(root, "root")]
    while work:
        node, path = work.pop()
        kids = node[3]
        node[3] = [make(k, f"{path}.{i}") for i, k in enumerate(kids)]
        work.extend((k, f"{path}.{i}") for i, k in enumerate(node[3]))
    return _flatten(root)


def parse_tree_instance(inst):
    """``{"tree": "(...)"}`` or ``{"tree": NODE}`` -> Tree."""
    if not isinstance(inst, dict) or "tree" not in inst:
        raise ValueError('bad_instance: a tree instance needs a "tree" field')
    t = inst["tree"]
    if isinstance(t, str):
        return parse_tree(t)
    if isinstance(t, dict):
        return tree_from_json(t)
    raise ValueError('bad_instance: "tree" must be a string or an object')


# -- sequences, lattices, dags -------------------------------------------------

def _tokens(inst):
    if not isinstance(inst, dict):
        raise ValueError("bad_instance: an instance must be an object")
    if "tokens" in inst:
        toks = inst["tokens"]
        if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
            raise ValueError('bad_instance: "tokens" must be a list of strings')
        return list(toks)
    if "text" in inst:
        if not isinstance(inst["text"], str):
            raise ValueError('bad_instance: "text" must be a string')
        return inst["text"].split()
    raise ValueError('bad_instance: a sequence instance needs "tokens" or "text"')


def find_spans(chars, lexicon, lowercase=False):
    """Every span (b, e), e - b >= 2, whose joined characters (ASCII-lowercased
    when ``lowercase``) are in ``lexicon`` (a set), sorted by (start, end)."""
    lex = lexicon if isinstance(lexicon, (set, frozenset)) else set(lexicon or ())
    maxlen = max((len(w) for w in lex), default=0)
    norm = ascii_lower if lowercase else (lambda s: s)
    n = len(chars)
    return [(b, e) for b in range(n) for e in range(b + 2, min(n, b + maxlen) + 1)
            if norm("".join(chars[b:e])) in lex]


def lattice_of(inst, lexicon=None, lowercase=False):
    """A lattice instance -> (chars, [(start, end, word_token), ...])."""
    if not isinstance(inst, dict):
        raise ValueError("bad_instance: an instance must be an object")
    if "chars" in inst:
        chars = inst["chars"]
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise ValueError('bad_lattice: "chars" must be a list of strings')
        chars = list(chars)
    elif "text" in inst:
        if not isinstance(inst["text"], str):
            raise ValueError('bad_instance: "text" must be a string')
        chars = list(inst["text"])
    else:
        raise ValueError('bad_instance: a lattice instance needs "chars" or "text"')
    n = len(chars)
    if "words" not in inst:
        return chars, [(b, e, "".join(chars[b:e]))
                       for b, e in find_spans(chars, lexicon, lowercase)]
    if not isinstance(inst["words"], list):
        raise ValueError('bad_lattice: "words" must be a list')
    words = []
    for k, w in enumerate(inst["words"]):
        b, e = (w.get("start"), w.get("end")) if isinstance(w, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (b, e)):
            raise ValueError(f"bad_lattice: word {k} needs integer start and end")
        if b < 0 or e > n or e - b < 2:
            raise ValueError(f"bad_lattice: word {k} span [{b}, {e}) is invalid for "
                             f"{n} characters (need 0 <= start, end <= n, end - start >= 2)")
        tok = w.get("token")
        if tok is not None and not isinstance(tok, str):
            raise ValueError(f"bad_lattice: word {k} token must be a string")
        words.append((b, e, tok if tok is not None else "".join(chars[b:e])))
    return chars, words


def dag_of(inst):
    """A dag instance -> (tokens, prevs) after the API's checks."""
    if not isinstance(inst, dict) or not isinstance(inst.get("nodes"), list):
        raise ValueError('bad_instance: a dag instance needs a "nodes" list')
    nodes = inst["nodes"]
    if not nodes:
        raise ValueError("bad_lattice: a dag needs at least one node")
    toks, prevs, has_succ = [], [], [False] * len(nodes)
    for j, nd in enumerate(nodes):
        if not isinstance(nd, dict) or not isinstance(nd.get("token"), str):
            raise ValueError(f'bad_lattice: node {j} needs a string "token"')
        prev = nd.get("prev", [])
        if not isinstance(prev, list):
            raise ValueError(f'bad_lattice: node {j}: "prev" must be a list')
        for q in prev:
            if not isinstance(q, int) or isinstance(q, bool) or not 0 <= q < j:
                raise ValueError(f"bad_lattice: node {j}: prev {q!r} must be an "
                                 "index smaller than the node's own")
            has_succ[q] = True
        toks.append(nd["token"])
        prevs.append(list(prev))
    for j in range(len(nodes) - 1):
        if not has_succ[j]:
            raise ValueError(f"bad_lattice: node {j} is a sink; only the last "
                             "node may be one")
    return toks, prevs


def instance_to_input(family, instance, model):
    """An API instance object -> the positional arguments (a tuple) of
    ``model.forward`` for ``family``, using the model's vocabularies,
    lexicon and ``lowercase``:

    - tree families: ``(Tree,)``
    - bilstm-tagger, lstm-nmt: ``(ids,)`` LongTensor of source ids
    - latticelstm: ``(char_ids, words)`` with words = [(start, end, word_id)]
    - latticegru: ``(ids, prevs)``

    so ``model(*instance_to_input(model.family, inst, model))`` runs it."""
    fam = family
    if fam in ("treelstm", "treelstm-2type", "treegru", "childsum-treelstm", "mvrnn"):
        tree = parse_tree_instance(instance)
        if fam != "childsum-treelstm":
            for k, n in enumerate(tree.nodes):
                if len(n.children) > 2:
                    raise ValueError(
                        f"too_many_children: node {k} (pre-order) has "
                        f"{len(n.children)} children; {fam} allows at most 2 "
                        "(use childsum-treelstm)")
        return (tree,)
    if fam in ("bilstm-tagger", "lstm-nmt"):
        return (model.vocab.ids(_tokens(instance)),)
    if fam == "latticelstm":
        chars, words = lattice_of(instance, model.lexicon, model.lowercase)
        return (model.vocab.ids(chars),
                [(b, e, model.word_vocab.id(t)) for b, e, t in words])
    if fam == "latticegru":
        toks, prevs = dag_of(instance)
        return (model.vocab.ids(toks), prevs)
    raise ValueError(f"unknown family {family!r}")
