#!/usr/bin/python3
"""Trains the two demo models that scripts/demo.sh serves, from scratch.

    /usr/bin/python3 scripts/train_demo.py [--out scripts/demo-models]
        [--sentences N] [--epochs E] [--seed S] [--canopy BIN]

1. builds a corpus of real English parse trees (scripts/demo_corpus.py:
   fortunes + Jargon File sentences parsed with link-grammar, the recipe of
   the evaluation set; cached under build/demo-corpus/) and holds out 10%;
2. trains `tagger`, a BiLSTM-CRF part-of-speech tagger (family
   bilstm-tagger, crf), and `phrases`, a binary Tree-LSTM that labels every
   node of a right-binarized parse tree (family treelstm; internal nodes:
   their phrase label, leaves: their tag);
3. exports both with canopy_torch.save, runs the exported directories
   through the C engine (`canopy run`) on the held-out split and checks that
   the engine reproduces the PyTorch logits and labels;
4. prints a table of held-out accuracies against baselines and writes
   OUT/README.md with it.
Deterministic: fixed seeds, one thread.
"""
import argparse
import collections
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import canopy_torch                                    # noqa: E402
from canopy_torch.data import instance_to_input        # noqa: E402
import demo_corpus                                     # noqa: E402

TAGS = ["W", "V", "N", "PU", "A", "CONJ", "ADV"]


def make_vocab(seqs, min_count, max_size):
    """['<unk>'] + the (lowercased) words seen >= min_count times, most
    frequent first (ties alphabetical), at most max_size in all."""
    c = collections.Counter(w.lower() for s in seqs for w in s)
    words = sorted((w for w, n in c.items() if n >= min_count),
                   key=lambda w: (-c[w], w))
    return ["<unk>"] + words[:max_size - 1]


def majority(items):
    """Most frequent item (ties: first in sorted order)."""
    c = collections.Counter(items)
    return min(c, key=lambda k: (-c[k], k))


def train_loop(name, model, train, loss_fn, evaluate, epochs, seed, lr, log):
    """Adam, one example a step, examples shuffled each epoch; logs the mean
    loss and the held-out accuracy after each epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = random.Random(seed)
    order = list(range(len(train)))
    t0 = time.time()
    for ep in range(1, epochs + 1):
        rng.shuffle(order)
        model.train()
        total = 0.0
        for i in order:
            loss = loss_fn(train[i])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            total += float(loss)
        model.eval()
        log("%s epoch %d: loss %.4f, held-out accuracy %.4f (%.0f s)" % (
            name, ep, total / len(train), evaluate()[0], time.time() - t0))
    return time.time() - t0


# -- tagger -------------------------------------------------------------------

def train_tagger(train, held, args, log):
    """BiLSTM-CRF over the tokens; returns (model, figures)."""
    vocab = make_vocab([e["tokens"] for e in train], 2, args.max_vocab)
    model = canopy_torch.BiLSTMTagger(vocab, embed=args.embed, hidden=args.hidden,
                                      classes=len(TAGS), crf=True,
                                      lowercase=True, labels=TAGS)
    tid = {t: i for i, t in enumerate(TAGS)}

    def inp(e):
        return instance_to_input("bilstm-tagger", {"tokens": e["tokens"]}, model)[0]

    drop = random.Random(args.seed)

    def loss_fn(e):
        ids = inp(e)
        # word dropout: a training token becomes <unk> (id 0) with
        # probability args.word_dropout, so <unk> learns from context
        ids = torch.tensor([0 if drop.random() < args.word_dropout else int(i)
                            for i in ids])
        return model.nll(ids, torch.tensor([tid[t] for t in e["tags"]]))

    def predict(e):
        with torch.no_grad():
            return [TAGS[int(t)] for t in model.decode(inp(e))[0]]

    def evaluate():
        ok = n = 0
        for e in held:
            p = predict(e)
            ok += sum(a == b for a, b in zip(p, e["tags"]))
            n += len(p)
        return ok / n, n
    secs = train_loop("tagger", model, train, loss_fn, evaluate, args.epochs,
                      args.seed, args.lr, log)
    acc, n = evaluate()
    gold = [t for e in held for t in e["tags"]]
    maj = majority(t for e in train for t in e["tags"])
    per_word = collections.defaultdict(list)
    for e in train:
        for w, t in zip(e["tokens"], e["tags"]):
            per_word[w.lower()].append(t)
    per_word = {w: majority(ts) for w, ts in per_word.items()}
    pw = [per_word.get(w.lower(), maj) for e in held for w in e["tokens"]]
    return model, {
        "accuracy": acc, "units": n, "seconds": secs, "vocab": len(vocab),
        "baselines": {
            "majority tag (%s)" % maj: sum(g == maj for g in gold) / n,
            "majority tag per word": sum(a == b for a, b in zip(pw, gold)) / n}}


# -- phrases ------------------------------------------------------------------

def train_phrases(train, held, args, log):
    """Tree-LSTM labelling every node; returns (model, figures)."""
    vocab = make_vocab([e["tokens"] for e in train], 2, args.max_vocab)
    parsed = {id(e): canopy_torch.data.parse_tree(e["tree"]) for e in train + held}
    counts = collections.Counter(l for e in train for l in parsed[id(e)].labels())
    labels = sorted(counts, key=lambda l: (-counts[l], l))
    lid = {l: i for i, l in enumerate(labels)}
    model = canopy_torch.TreeLSTM(vocab, embed=args.embed, hidden=args.tree_hidden,
                                  classes=len(labels), lowercase=True,
                                  labels=labels)

    def gold(e):
        return torch.tensor([lid.get(l, -1) for l in parsed[id(e)].labels()])

    drop = random.Random(args.seed)

    def loss_fn(e):
        t = parsed[id(e)]
        # word dropout, as for the tagger: leaf words become <unk>
        t = canopy_torch.Tree([canopy_torch.Node(
            n.label, "<unk>" if n.is_leaf() and drop.random() < args.word_dropout
            else n.word, list(n.children), n.type) for n in t.nodes])
        return F.cross_entropy(model(t)["logits"], gold(e))

    def evaluate():
        ok = n = ok_in = n_in = 0
        for e in held:
            t = parsed[id(e)]
            with torch.no_grad():
                pred = model(t)["logits"].argmax(1).tolist()
            for node, p in zip(t.nodes, pred):
                hit = labels[p] == node.label
                ok, n = ok + hit, n + 1
                if not node.is_leaf():
                    ok_in, n_in = ok_in + hit, n_in + 1
        return ok / n, n, ok_in / n_in, n_in
    secs = train_loop("phrases", model, train, loss_fn, evaluate, args.epochs,
                      args.seed, args.lr, log)
    acc, n, acc_in, n_in = evaluate()
    nodes = [nd for e in held for nd in parsed[id(e)].nodes]
    maj = labels[0]
    maj_in = majority(nd.label for e in train for nd in parsed[id(e)].nodes
                      if not nd.is_leaf())
    return model, {
        "accuracy": acc, "units": n, "internal accuracy": acc_in,
        "internal units": n_in, "seconds": secs, "vocab": len(vocab),
        "labels": labels,
        "baselines": {
            "majority label (%s)" % maj:
                sum(nd.label == maj for nd in nodes) / n,
            "internal nodes: majority (%s)" % maj_in:
                sum(nd.label == maj_in for nd in nodes if not nd.is_leaf()) / n_in}}


# -- the engine check ---------------------------------------------------------

def engine_check(canopy, model_dir, family, model, held, tmp):
    """Runs `canopy run` on the held-out split and compares every output with
    the PyTorch module: max |logit difference| and label agreement."""
    path = os.path.join(tmp, family + "-heldout.jsonl")
    key = "tree" if family == "treelstm" else "tokens"
    with open(path, "w") as f:
        for e in held:
            f.write(json.dumps({key: e[key]}) + "\n")
    cmd = [canopy, "run", "--model", model_dir, "--input", path]
    if family == "treelstm":
        cmd += ["--outputs", "all"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd), r.stderr[-2000:]))
    outs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert len(outs) == len(held), (len(outs), len(held))
    diff, agree, n, crf = 0.0, 0, 0, False
    for e, o in zip(held, outs):
        x, = instance_to_input(family, {key: e[key]}, model)
        with torch.no_grad():
            ref = model(x)["logits"]
            if family == "treelstm":
                got = torch.tensor([nd["logits"] for nd in o["nodes"]])
                mine, theirs = ref.argmax(1).tolist(), [nd["label"] for nd in o["nodes"]]
            else:
                got = torch.tensor(o["logits"])
                crf = "path_score" in o
                # an engine without the CRF gives per-token argmax tags
                mine = ([int(t) for t in model.decode(x)[0]] if crf
                        else ref.argmax(1).tolist())
                theirs = o["tags"]
        diff = max(diff, float((got - ref).abs().max()))
        agree += sum(a == b for a, b in zip(mine, theirs))
        n += len(mine)
    return {"max_abs_logit_diff": diff, "label_agreement": agree / n,
            "units": n, "engine_crf": crf}


def dir_size(d):
    """Total bytes of the files in a directory."""
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def write_readme(out, args, corpus, figs, checks):
    """OUT/README.md: how the models were made and the held-out figures."""
    t, p = figs["tagger"], figs["phrases"]
    rows = [("tagger", "per-token accuracy", t["accuracy"], t["units"])]
    rows += [("tagger", "  baseline: " + k, v, t["units"]) for k, v in t["baselines"].items()]
    rows += [("phrases", "per-node accuracy", p["accuracy"], p["units"]),
             ("phrases", "internal nodes only", p["internal accuracy"], p["internal units"])]
    rows += [("phrases", "  baseline: " + k, v,
              p["internal units"] if k.startswith("internal") else p["units"])
             for k, v in p["baselines"].items()]
    table = "| model | figure | held-out | units |\n|---|---|---|---|\n" + "".join(
        "| %s | %s | %.4f | %d |\n" % r for r in rows)
    src = collections.Counter(e["source"] for e in corpus)
    ntok = sum(len(e["tokens"]) for e in corpus)
    text = f"""# Demo models: `tagger` and `phrases`

Trained from scratch by `scripts/train_demo.py` (this file is written by it)
on {datetime.datetime.utcnow():%Y-%m-%d}, {platform.machine()} 2-core Debian 12 (shared), CPU, one
thread, PyTorch {torch.__version__}.
Regenerate (same weights: fixed seeds, one thread):

    /usr/bin/python3 scripts/train_demo.py --out {args.out} --sentences {args.sentences} \\
        --epochs {args.epochs} --seed {args.seed} --embed {args.embed} --hidden {args.hidden} \\
        --tree-hidden {args.tree_hidden} --max-vocab {args.max_vocab} --lr {args.lr} --word-dropout {args.word_dropout}

## Data
{len(corpus)} English sentences ({src['fortunes']} from the Debian `fortunes` /
`fortunes-min` files the evaluation set was drawn from, {src['jargon']} from the
Jargon File of `jargon-text`), {ntok} tokens, parsed with link-grammar 5.12
(`link-parser -constituents=3`, no null links, no panic mode, 3 s limit a
sentence; sentences not fully linked are dropped) and turned into trees as
the evaluation set was (`scripts/demo_corpus.py`: leaves (TAG word), TAG
N/V/A/ADV/CONJ from link-grammar subscripts, PU punctuation, else W; unary
chains collapsed; right-binarized). Sentences equal to one of the evaluation
set (data/) are excluded. {len(corpus) - args.heldout} train /
{args.heldout} held out.

## Models
- `tagger/`: bilstm-tagger with `"crf": true`, D={args.embed}, H={args.hidden},
  tags {", ".join(TAGS)}; `lowercase` (the capped vocabulary then covers more
  running text; case, a hint for names, was not tried); vocabulary: the
  {t['vocab'] - 1} most frequent of the words seen >= 2 times in training
  (cap {args.max_vocab - 1}), others `<unk>`.
  {dir_size(os.path.join(out, "tagger")) // 1024} KB, {t['seconds']:.0f} s to train.
- `phrases/`: treelstm, D={args.embed}, H={args.tree_hidden}, labels {", ".join(p['labels'])};
  every node is labelled, internal nodes with their phrase label and leaves
  with their tag (a leaf's Tree-LSTM state sees only its word, so leaf labels
  are a context-free tagger; the internal-node figure is the one that
  matters). Serve with `"outputs": "all"`. Same vocabulary rule ({p['vocab'] - 1} words).
  {dir_size(os.path.join(out, "phrases")) // 1024} KB, {p['seconds']:.0f} s to train.
Adam (lr {args.lr}), one sentence a step, {args.epochs} epochs each, word
dropout {args.word_dropout} (a training word becomes `<unk>`). The sizes, vocabulary
rule and epochs were chosen on a dev split cut from the training sentences,
not on the held-out split.

## Held-out figures
Units: tokens (tagger), tree nodes (phrases).

{table}
## Engine check
`canopy run` on the held-out split vs the PyTorch modules:
""" + "".join(f"- {k}: max |logit diff| {c['max_abs_logit_diff']:.2e}, labels agree "
              f"{c['label_agreement']:.4f} of {c['units']}"
              f"{' (Viterbi path, engine CRF)' if c['engine_crf'] else ''}\n"
              for k, c in checks.items())
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="scripts/demo-models")
    ap.add_argument("--sentences", type=int, default=8000)
    ap.add_argument("--heldout", type=int, default=400)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--embed", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--tree-hidden", type=int, default=48)
    ap.add_argument("--max-vocab", type=int, default=5000)
    ap.add_argument("--word-dropout", type=float, default=0.1)
    ap.add_argument("--cache", default="build/demo-corpus")
    ap.add_argument("--canopy", default=os.environ.get("CANOPY_BIN", "build/canopy"))
    args = ap.parse_args()
    os.chdir(ROOT)
    torch.set_num_threads(1)
    log = lambda s: print(s, flush=True)     # noqa: E731

    corpus = demo_corpus.build_corpus(args.sentences, 0, args.cache, log=log)
    held, train = corpus[:args.heldout], corpus[args.heldout:]
    for name, part in (("train", train), ("heldout", held)):
        with open(os.path.join(args.cache, name + ".jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in part)
    log("corpus: %d train, %d held out (%s/{train,heldout}.jsonl)" % (
        len(train), len(held), args.cache))

    figs, models = {}, {}
    for name, fn in (("tagger", train_tagger), ("phrases", train_phrases)):
        torch.manual_seed(args.seed)
        models[name], figs[name] = fn(train, held, args, log)
        canopy_torch.save(models[name], os.path.join(args.out, name))

    checks = {}
    if os.path.exists(args.canopy):
        for name, fam in (("tagger", "bilstm-tagger"), ("phrases", "treelstm")):
            checks[name] = engine_check(args.canopy, os.path.join(args.out, name),
                                        fam, models[name], held, args.cache)
            log("engine check %s (%s): %s" % (name, args.canopy, checks[name]))
    else:
        log("engine check skipped: no %s (build it, or --canopy)" % args.canopy)
    table = write_readme(args.out, args, corpus, figs, checks)
    print("\n" + table)
    for name in ("tagger", "phrases"):
        print("%s: %d KB, %.0f s training, vocabulary %d" % (
            name, dir_size(os.path.join(args.out, name)) // 1024,
            figs[name]["seconds"], figs[name]["vocab"]))


if __name__ == "__main__":
    main()
