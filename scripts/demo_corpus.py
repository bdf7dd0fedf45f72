"""Builds the demo corpus: real English sentences parsed with link-grammar.

The recipe follows data/README.md (how the evaluation set was
made), so the demo models see the same kind of trees they will be served:

* text: the fortune files of the Debian `fortunes`/`fortunes-min` packages
  that the evaluation set was drawn from (/usr/share/games/fortunes) and the Jargon File of `jargon-text`
  (jargon.txt.gz; jargon.html holds only its index page, stripped of HTML
  too), split into sentences; ASCII sentences of 4-50 tokens are kept;
* parse: `link-parser -constituents=3` (link-grammar 5.12) with null links
  and panic mode off and a per-sentence time limit, so a sentence that
  cannot be fully linked or that times out gets no tree and is dropped;
* leaves: (TAG word), TAG from the link-grammar subscript of the word
  (.n N, .v V, .a A, .e ADV, .j CONJ), PU for punctuation, else W; the word
  keeps its case from the text;
* internal nodes: the link-grammar phrase labels; unary chains of internal
  nodes collapsed (upper label kept); right-binarized with the extra nodes
  keeping the parent label.

Sentences equal (ignoring case and spacing) to one of the evaluation set
are dropped.  Parser output is cached under build/demo-corpus/ (gitignored)
keyed by the hash of the input chunk, so reruns do not parse again.
"""
import gzip
import hashlib
import html
import json
import os
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

FORTUNES = "/usr/share/games/fortunes"
JARGON_TXT = "/usr/share/doc/jargon-text/jargon.txt.gz"
JARGON_HTML = "/usr/share/doc/jargon-text/jargon.html"
EVAL_SEQUENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sequences.jsonl")
# the fortune files the evaluation set was drawn from (its README)
FORTUNE_FILES = ("fortunes literature riddles art computers cookie education "
                 "food goedel humorists kids law love magic medicine "
                 "miscellaneous news people pets platitudes politics science "
                 "sports tao wisdom work").split()
LINK_PARSER = ["link-parser", "-constituents=3", "-graphics=0", "-null=0",
               "-panic=0", "-echo=1", "-verbosity=1", "-morphology=0"]
SUBSCRIPT_TAGS = {"n": "N", "v": "V", "a": "A", "e": "ADV", "j": "CONJ"}
OK_CHARS = re.compile(r"^[A-Za-z0-9 .,;:!?'\"-]+$")
SENT_SPLIT = re.compile(r'(?<=[.!?])\s+(?=["A-Z])|(?<=[.!?]")\s+(?=["A-Z])')


def fortune_texts():
    """Yield each fortune (text between % lines) with its lines joined,
    attribution lines ("-- Author") left out, from the FORTUNE_FILES."""
    for name in FORTUNE_FILES:
        path = os.path.join(FORTUNES, name)
        with open(path, encoding="utf-8", errors="replace") as f:
            for block in f.read().split("\n%\n"):
                lines = [l for l in block.splitlines()
                         if not l.strip().startswith("--")]
                yield " ".join(lines)


def jargon_texts():
    """Yield the prose paragraphs of the Jargon File (headword lines and
    etymology brackets dropped, {cross-refs} and curly quotes flattened)."""
    with open(JARGON_HTML, encoding="iso-8859-1") as f:
        page = re.sub(r"<[^>]+>", " ", f.read())
    yield html.unescape(page)
    with gzip.open(JARGON_TXT, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para or para.startswith(":"):
            continue
        para = re.sub(r"^\d+\.\s+", "", para)
        para = re.sub(r"\[[^\]]*\]", " ", para)
        para = re.sub(r"[{}]", "", para)
        for a, b in (("\u201c", '"'), ("\u201d", '"'), ("\u2018", "'"),
                     ("\u2019", "'")):
            para = para.replace(a, b)
        yield para


def norm(s):
    """Key for comparing sentences across tokenizations: lower case, no
    whitespace."""
    return re.sub(r"\s+", "", s).lower()


def candidate_sentences():
    """All distinct acceptable sentences with their source, in text order,
    excluding those of the evaluation set; and how many those were."""
    banned = set()
    if os.path.exists(EVAL_SEQUENCES):
        with open(EVAL_SEQUENCES) as f:
            banned = {norm("".join(json.loads(l)["tokens"])) for l in f}
    seen, out, n_banned = set(), [], 0
    for source, texts in (("fortunes", fortune_texts()),
                          ("jargon", jargon_texts())):
        for text in texts:
            text = " ".join(text.split())
            for s in SENT_SPLIT.split(text):
                s = s.strip()
                n = len(s.split())
                if not (4 <= n <= 40 and len(s) <= 240 and OK_CHARS.match(s)):
                    continue
                if not re.match(r'^"?[A-Z]', s) or not re.search(r'[.!?]"?$', s):
                    continue
                if s.count('"') % 2 or "--" in s[:2]:
                    continue
                k = norm(s)
                if k in banned and k not in seen:
                    n_banned += 1
                if k in seen or k in banned:
                    continue
                seen.add(k)
                out.append((source, s))
    return out, n_banned


def run_parser(sentences, cache_dir, timeout):
    """Parse a chunk of sentences with one link-parser process; the raw
    output is cached by the hash of the input and options."""
    text = "".join(s + "\n" for s in sentences)
    key = hashlib.sha1((text + str(timeout)).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, key + ".out")
    if not os.path.exists(path):
        r = subprocess.run(LINK_PARSER + ["-timeout=%d" % timeout],
                           input=text, capture_output=True, text=True,
                           errors="replace")
        with open(path + ".tmp", "w") as f:
            f.write(r.stdout)
        os.replace(path + ".tmp", path)
    with open(path) as f:
        return f.read()


def split_output(out, sentences):
    """Map each input sentence to its first constituent line, or None when
    link-parser found no complete linkage, timed out, or used null links."""
    lines = out.splitlines()
    result, i = [], 0
    for k, s in enumerate(sentences):
        while i < len(lines) and lines[i] != s:
            i += 1
        j = i + 1
        nxt = sentences[k + 1] if k + 1 < len(sentences) else None
        block = []
        while j < len(lines) and lines[j] != nxt:
            block.append(lines[j])
            j += 1
        i = j
        tree = None
        ok = any(l.startswith("Found ") for l in block) and \
            not any("expired" in l or "null" in l.lower() for l in block)
        for n, l in enumerate(block):
            if "Linkage 1," in l and "UNUSED=0" in l and ok:
                if n + 1 < len(block) and block[n + 1].startswith("("):
                    tree = block[n + 1]
                break
        result.append(tree)
    return result


def read_constituents(s):
    """Parse a link-parser constituent string into nested [label, children]
    lists with raw word strings as leaves."""
    toks = re.findall(r"\(|\)|[^\s()]+", s)
    pos = 0

    def node():
        nonlocal pos
        assert toks[pos] == "("
        label, pos = toks[pos + 1], pos + 2
        kids = []
        while toks[pos] != ")":
            if toks[pos] == "(":
                kids.append(node())
            else:
                kids.append(toks[pos])
                pos += 1
        pos += 1
        return [label, kids]
    root = node()
    assert pos == len(toks)
    return root


def leaf_tag(word, sub):
    """TAG of a leaf from its link-grammar subscript (None: no subscript)."""
    if not any(c.isalnum() for c in word):
        return "PU"
    if sub:
        return SUBSCRIPT_TAGS.get(sub.split("-")[0], "W")
    return "W"


def to_tree(constituents, sentence):
    """Turn a constituent string into a tree of (label, children) / (TAG,
    word) tuples with words aligned to the sentence text (original case).
    Returns None when the leaves do not spell out the whole sentence."""
    pos = 0

    def align(raw):
        nonlocal pos
        while pos < len(sentence) and sentence[pos] == " ":
            pos += 1
        w = re.sub(r"\[[^\]]*\]|\{[^}]*\}", "", raw)
        m = re.match(r"^(.+)\.([a-z#][a-z0-9#-]*)$", w)
        for word, sub in ((m.group(1), m.group(2)) if m else (w, None), (w, None)):
            if sentence[pos:pos + len(word)].lower() == word.lower():
                text = sentence[pos:pos + len(word)]
                pos += len(word)
                return (leaf_tag(text, sub), text)
        raise ValueError(raw)

    def build(n):
        if isinstance(n, str):
            return align(n)
        label, kids = n
        while len(kids) == 1 and not isinstance(kids[0], str):
            kids = kids[0][1]          # collapse unary chain, keep upper label
        return (label, [build(k) for k in kids])
    try:
        tree = build(read_constituents(constituents))
    except (ValueError, AssertionError, IndexError):
        return None
    return tree if sentence[pos:].strip() == "" else None


def binarize(t):
    """Right-binarize: (L a b c) -> (L a (L b c))."""
    label, kids = t
    if isinstance(kids, str):
        return t
    kids = [binarize(k) for k in kids]
    while len(kids) > 2:
        kids = kids[:-2] + [(label, kids[-2:])]
    return (label, kids)


def tree_str(t):
    """Bracketed string of a tree, leaves as (TAG word)."""
    label, kids = t
    if isinstance(kids, str):
        return "(%s %s)" % (label, kids)
    return "(%s %s)" % (label, " ".join(tree_str(k) for k in kids))


def leaves(t):
    """(TAG, word) leaves of a tree, left to right."""
    if isinstance(t[1], str):
        return [t]
    return [l for k in t[1] for l in leaves(k)]


def build_corpus(n_sentences, seed, cache_dir="build/demo-corpus",
                 timeout=3, jobs=2, chunk=200, log=print):
    """Return up to n_sentences parsed examples, each a dict with source,
    text, tokens, tags, tree (binary bracketed string).  Candidates are
    shuffled with `seed` and parsed in chunks (`jobs` processes) until
    enough parse; results are cached, so reruns only read the cache."""
    os.makedirs(cache_dir, exist_ok=True)
    cands, n_banned = candidate_sentences()
    random.Random(seed).shuffle(cands)
    log("corpus: %d candidate sentences (fortunes %d, jargon %d; %d equal to "
        "an evaluation-set sentence left out)" % (
            len(cands), sum(c[0] == "fortunes" for c in cands),
            sum(c[0] == "jargon" for c in cands), n_banned))
    examples, tried, start = [], 0, 0
    with ThreadPoolExecutor(jobs) as pool:
        while len(examples) < n_sentences and start < len(cands):
            chunks = [cands[i:i + chunk] for i in
                      range(start, min(len(cands), start + jobs * chunk), chunk)]
            start += jobs * chunk
            outs = pool.map(lambda c: run_parser([s for _, s in c], cache_dir,
                                                 timeout), chunks)
            for c, out in zip(chunks, outs):
                for (src, s), cons in zip(c, split_output(out, [s for _, s in c])):
                    tried += 1
                    t = to_tree(cons, s) if cons else None
                    if t is None or len(examples) >= n_sentences:
                        continue
                    lv = leaves(t)
                    if not 4 <= len(lv) <= 50:
                        continue
                    examples.append({"source": src, "text": s,
                                     "tokens": [w for _, w in lv],
                                     "tags": [g for g, _ in lv],
                                     "tree": tree_str(binarize(t))})
            log("corpus: parsed %d sentences, kept %d" % (tried, len(examples)))
    return examples
