#!/usr/bin/python3
"""Rebuild lattices.jsonl and dags.jsonl from sequences.jsonl and lexicon.txt.

The recipe is data/README.md's: the sentence (its tokens, in order) lower-
cased, letters a-z only, capped at 120 characters, is a lattice's
characters; its words are the spans of 2-10 characters found in the
lexicon, in (start, end) order. A DAG has one node per such span and one
per single character, sorted by (start, end); a node's `prev` are the
indices of the nodes that end where it starts; a final `</s>` node's prev
are the nodes that end at the last character. The JSON is written compact
(no spaces), keys in the order above, one object per line.

usage: derive.py [--data DIR] [--out DIR] [--check]

  --data DIR   where sequences.jsonl and lexicon.txt are read (default: the
               directory of this script)
  --out DIR    where lattices.jsonl and dags.jsonl are written (default:
               --data)
  --check      write nothing: compare what would be written with the files
               in --data, print each line that differs, exit 1 if any does
"""
import argparse
import json
import os
import sys

MAX_CHARS = 120
MIN_WORD, MAX_WORD = 2, 10


def dumps(obj):
    """The files' JSON: compact, ASCII, keys in insertion order."""
    return json.dumps(obj, separators=(",", ":"))


def characters(tokens):
    """The lattice's characters of one sentence."""
    text = " ".join(tokens).lower()
    return "".join(c for c in text if "a" <= c <= "z")[:MAX_CHARS]


def lexicon_spans(chars, lexicon):
    """(start, end) of every span of 2-10 characters that is a lexicon word,
    sorted by (start, end)."""
    n = len(chars)
    return [(a, b) for a in range(n)
            for b in range(a + MIN_WORD, min(a + MAX_WORD, n) + 1)
            if chars[a:b] in lexicon]


def lattice(chars, words):
    return {"chars": list(chars),
            "words": [{"start": a, "end": b} for a, b in words]}


def dag(chars, words):
    """Nodes of the words and of the single characters, sorted by
    (start, end), each pointing back at the nodes that end where it
    starts; `</s>` closes it."""
    spans = sorted(words + [(a, a + 1) for a in range(len(chars))])
    ending = {}
    for i, (_, b) in enumerate(spans):
        ending.setdefault(b, []).append(i)
    nodes = [{"token": chars[a:b], "prev": ending.get(a, [])}
             for a, b in spans]
    nodes.append({"token": "</s>", "prev": ending.get(len(chars), [])})
    return {"nodes": nodes}


def derive(data):
    """The lines of lattices.jsonl and dags.jsonl, as lists of strings."""
    with open(os.path.join(data, "lexicon.txt"), encoding="utf-8") as f:
        lexicon = {w.strip() for w in f if w.strip()}
    lattices, dags = [], []
    with open(os.path.join(data, "sequences.jsonl"), encoding="utf-8") as f:
        for line in f:
            chars = characters(json.loads(line)["tokens"])
            words = lexicon_spans(chars, lexicon)
            lattices.append(dumps(lattice(chars, words)))
            dags.append(dumps(dag(chars, words)))
    return {"lattices.jsonl": lattices, "dags.jsonl": dags}


def check(data, derived):
    """Print every line of data's files that differs from the derived one;
    the number of differing lines (a missing or extra line counts)."""
    bad = 0
    for name, lines in derived.items():
        before = bad
        path = os.path.join(data, name)
        with open(path, encoding="utf-8") as f:
            have = f.read().split("\n")
        if have and have[-1] == "":
            have.pop()
        else:
            print(f"{path}: no newline at the end")
            bad += 1
        for i in range(max(len(have), len(lines))):
            a = have[i] if i < len(have) else None
            b = lines[i] if i < len(lines) else None
            if a != b:
                bad += 1
                col = 0
                if a is not None and b is not None:
                    while col < min(len(a), len(b)) and a[col] == b[col]:
                        col += 1
                what = ("missing" if a is None else "extra" if b is None
                        else f"differs from byte {col + 1}")
                lo = max(0, col - 40)
                print(f"{path}:{i + 1}: {what}"
                      + (f"\n  file:    {a[lo:lo + 120]}" if a is not None
                         else "")
                      + (f"\n  derived: {b[lo:lo + 120]}" if b is not None
                         else ""))
        print(f"{path}: {len(lines)} lines derived, "
              f"{'identical' if bad == before else 'see above'}")
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=here)
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    derived = derive(args.data)
    if args.check:
        bad = check(args.data, derived)
        if bad:
            print(f"{bad} line(s) differ from the recipe")
        return 1 if bad else 0
    out = args.out or args.data
    os.makedirs(out, exist_ok=True)
    for name, lines in derived.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("".join(l + "\n" for l in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
