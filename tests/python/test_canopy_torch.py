"""canopy_torch against the C engine: every family's module, saved with
random weights, must give what `canopy run` gives to 1e-4 (absolute) on real
inputs from data/ (logits of every node/token, hidden states,
labels/tags, lstm-nmt output ids), unbatched-by-request and --batch 16.

    /usr/bin/python3 -m unittest discover -s tests/python -p 'test_canopy_torch.py'

Env: CANOPY_BIN (default build/canopy), CANOPY_DATA (default
the checkout's data/). The CRF-vs-C test needs a binary with CRF support.
"""
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients"))

import torch  # noqa: E402

import canopy_torch as ct  # noqa: E402

BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")
TOL = 1e-4
N = 30                       # instances per family
MAXDIFF = {}                 # family -> largest |difference| seen

torch.set_num_threads(1)


def lines(name, n=N, start=0):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [json.loads(l) for l in f.read().splitlines()[start:start + n]]


def vocab_of(tokens, drop_every=6, first=("<unk>",)):
    """Distinct tokens in order, dropping every drop_every-th (those become
    unknown words)."""
    seen = []
    for t in tokens:
        if t not in seen and t not in first:
            seen.append(t)
    return list(first) + [t for k, t in enumerate(seen) if k % drop_every != 3]


def randomize(module, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * scale)
    return module


def canopy_run(model_dir, instances, batch=None, extra=()):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False,
                                     encoding="utf-8") as f:
        for inst in instances:
            f.write(json.dumps(inst) + "\n")
        path = f.name
    try:
        cmd = [BIN, "run", "--model", model_dir, "--input", path, "--outputs",
               "all", "--return-hidden"] + (["--batch", str(batch)] if batch else [])
        p = subprocess.run(cmd + list(extra), capture_output=True, text=True,
                           timeout=120)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    out = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    assert len(out) == len(instances), (len(out), len(instances))
    return out


def tree_to_json(tree, k=0, rng=None):
    """A Tree as the API's JSON NODE (with random "type"s when rng is given)."""
    n = tree.nodes[k]
    if n.is_leaf():
        return {"word": n.word}
    d = {"children": [tree_to_json(tree, c, rng) for c in n.children]}
    if n.label is not None:
        d["label"] = n.label
    if rng is not None and rng.random() < 0.5:
        d["type"] = rng.choice("ab")
    return d


class EngineCase(unittest.TestCase):
    """Helpers to compare a module with `canopy run` outputs."""

    def close(self, family, got, want, what):
        got = torch.as_tensor(got, dtype=torch.float64).reshape(-1)
        want = torch.as_tensor(want, dtype=torch.float64).reshape(-1)
        self.assertEqual(got.shape, want.shape, f"{family} {what}: shape")
        d = float((got - want).abs().max()) if got.numel() else 0.0
        MAXDIFF[family] = max(MAXDIFF.get(family, 0.0), d)
        self.assertLessEqual(d, TOL, f"{family} {what}: max |diff| {d:.3g}")

    def compare_any(self, m, mo, co, what):
        fam = m.family
        if fam in ("lstm-nmt",):
            self.assertEqual(mo["output_ids"], co["output_ids"], what + " ids")
            self.close(fam, mo["h"], co["h"], what + " h")
            return
        if fam == "latticegru":
            self.assertEqual(mo["label"], co["label"], what + " label")
        elif fam in ("bilstm-tagger", "latticelstm"):
            self.assertEqual(mo["tags"], co["tags"], what + " tags")
        else:
            self.assertEqual(len(co["nodes"]), len(mo["logits"]), what + " nodes")
            for k, nd in enumerate(co["nodes"]):
                self.close(fam, mo["logits"][k], nd["logits"], f"{what} node {k}")
            self.close(fam, mo["h"], co["h"], what + " h")
            return
        self.close(fam, mo["logits"], co["logits"], what + " logits")
        self.close(fam, mo["h"], co["h"], what + " h")

    def check_family(self, m, instances, compare, batches=(None, 16), extra=(),
                     require=()):
        with tempfile.TemporaryDirectory() as tmp:
            d = ct.save(m, os.path.join(tmp, "model"))
            m2 = ct.load(d)                    # what the engine read
            with torch.no_grad():
                mine = [m(*ct.instance_to_input(m.family, inst, m)) for inst in instances]
                again = [m2(*ct.instance_to_input(m.family, inst, m2)) for inst in instances]
            for i, (a, b) in enumerate(zip(mine, again)):
                for key in a:
                    if isinstance(a[key], torch.Tensor):
                        self.assertTrue(torch.equal(a[key], b[key]), f"load: {key} of {i}")
                    else:
                        self.assertEqual(a[key], b[key], f"load: {key} of {i}")
            for batch in batches:
                outs = canopy_run(d, instances, batch, extra)
                for key in require:
                    if key not in outs[0]:
                        self.fail(f"{BIN} does not report {key!r} for {m.family}: "
                                  f"{require[key]}")
                for i, (inst, mo, co) in enumerate(zip(instances, mine, outs)):
                    self.assertNotIn("error", co, f"instance {i}: {co}")
                    with self.subTest(instance=i, batch=batch):
                        compare(m, mo, co, f"instance {i} batch {batch}")
        return mine


# -- trees --------------------------------------------------------------------

def tree_instances(fname, rng, json_every=5, types=False):
    insts = lines(fname)
    out = []
    for k, inst in enumerate(insts):
        if k % json_every == 4:       # some as JSON NODE objects
            inst = {"tree": tree_to_json(ct.parse_tree(inst["tree"]), 0,
                                         rng if types else None)}
        out.append(inst)
    return out


def tree_words(insts):
    words = []
    for inst in insts:
        words += ct.parse_tree_instance(inst).leaves()
    return words


class TestTrees(EngineCase):
    def compare_tree(self, m, mo, co, what):
        fam = m.family
        self.close(fam, mo["logits"][0], co["logits"], what + " root logits")
        self.assertEqual(int(mo["logits"][0].argmax()), co["label"], what + " label")
        self.assertEqual(len(co["nodes"]), len(mo["logits"]), what + " node count")
        for k, nd in enumerate(co["nodes"]):
            self.close(fam, mo["logits"][k], nd["logits"], f"{what} node {k} logits")
            self.assertEqual(int(mo["logits"][k].argmax()), nd["label"], f"{what} node {k}")
            if m.labels:
                self.assertEqual(m.labels[nd["label"]], nd["label_name"])
        self.close(fam, mo["h"], co["h"], what + " h")

    def run_tree_family(self, cls, fname, seed, scale=0.5, lowercase=False,
                        types=False, **kw):
        rng = random.Random(seed)
        insts = tree_instances(fname, rng, types=types)
        words = tree_words(insts)
        if lowercase:
            words = [ct.ascii_lower(w) for w in words]
        vocab = vocab_of(words)
        m = randomize(cls(vocab, lowercase=lowercase, **kw), seed, scale)
        self.check_family(m, insts, self.compare_tree)
        return m

    def test_treelstm(self):
        self.run_tree_family(ct.TreeLSTM, "trees-binary.jsonl", 1, hidden=8,
                             embed=6, classes=5, labels=list("abcde"))

    def test_treelstm_2type(self):
        self.run_tree_family(ct.TreeLSTM2Type, "trees-binary.jsonl", 2, hidden=8,
                             embed=6, classes=4, types=True,
                             type_b_labels=["NP", "VP", "PP"])

    def test_treegru(self):
        self.run_tree_family(ct.TreeGRU, "trees-binary.jsonl", 3, hidden=8,
                             embed=5, classes=3, lowercase=True)

    def test_childsum_treelstm(self):
        m = self.run_tree_family(ct.ChildSumTreeLSTM, "trees-nary.jsonl", 4,
                                 hidden=8, embed=6, classes=5)
        arity = max(len(n.children) for inst in lines("trees-nary.jsonl")
                    for n in ct.parse_tree_instance(inst).nodes)
        self.assertGreaterEqual(arity, 4)      # the data exercises any arity
        with self.assertRaises(ValueError):
            ct.instance_to_input("treelstm", {"tree": "(S (a) b c d)"}, m)

    def test_mvrnn(self):
        # K rows of leaf.M < V: later words share leaf.M[0]
        vocab_len = len(vocab_of(tree_words(lines("trees-binary.jsonl"))))
        self.run_tree_family(ct.MVRNN, "trees-binary.jsonl", 5, scale=0.3,
                             hidden=6, classes=4, matrices=vocab_len // 2)

    def test_tree_parsing(self):
        t = ct.parse_tree("(3 (2 It) (4 (2 's) (NP the (NN film))))")
        self.assertEqual([(n.label, n.word, n.children) for n in t.nodes],
                         [("3", None, [1, 2]), ("2", "It", []), ("4", None, [3, 4]),
                          ("2", "'s", []), ("NP", None, [5, 6]), (None, "the", []),
                          ("NN", "film", [])])
        u = ct.parse_tree("((A a) (B b c))")
        self.assertEqual([(n.label, n.word) for n in u.nodes],
                         [(None, None), ("A", "a"), ("B", None), (None, "b"), (None, "c")])
        for bad in ("(w)", "()", "x (A b)", "(A b) (C d)", "(A (B c)", "A b)"):
            with self.assertRaises(ValueError, msg=bad):
                ct.parse_tree(bad)
        j = ct.tree_from_json({"label": "S", "children": [
            {"word": "a"}, {"type": "b", "children": [{"word": "b"}]}]})
        self.assertEqual([(n.word, n.type, n.children) for n in j.nodes],
                         [(None, "a", [1, 2]), ("a", None, []), (None, "b", [3]),
                          ("b", None, [])])


# -- sequences ------------------------------------------------------------------

def pick_eos_bias(m, srcs, cap):
    """Sets proj.b[</s>] so that about half the decodes stop with </s> and
    the others run to the cap, with no step near a tie (top-2 margin > 1e-3,
    so greedy decoding cannot flip on rounding)."""
    def lens_margin(bias):
        m.proj.b[2] = bias
        outs = [m(s) for s in srcs]
        top2 = torch.cat([o["logits"] for o in outs]).topk(2, -1).values
        return ([len(o["output_ids"]) for o in outs],
                float((top2[:, 0] - top2[:, 1]).min()))
    with torch.no_grad():
        lo, hi = -8.0, 8.0
        for _ in range(12):
            mid = (lo + hi) / 2
            lens, _ = lens_margin(mid)
            lo, hi = (mid, hi) if sum(n == cap for n in lens) > len(srcs) // 2 else (lo, mid)
        for off in [k * s for k in range(1, 40) for s in (0.01, -0.01)]:
            lens, margin = lens_margin(mid + off)
            capped = sum(n == cap for n in lens)
            if 3 <= capped <= len(srcs) - 3 and margin > 1e-3:
                return lens
    raise AssertionError(f"no </s> bias gives varied decode lengths: {lens}")


class TestSequences(EngineCase):
    def compare_tagger(self, m, mo, co, what):
        fam = m.family
        self.assertEqual(len(co["logits"]), len(mo["logits"]), what)
        self.close(fam, mo["logits"], co["logits"], what + " logits")
        self.close(fam, mo["h"], co["h"], what + " h")
        self.assertEqual(mo["tags"], co["tags"], what + " tags")
        if m.has_crf:
            self.close(fam + "+crf", mo["path_score"], co["path_score"],
                       what + " path_score")
        if m.labels:
            self.assertEqual([m.labels[t] for t in co["tags"]], co["tag_names"])

    def tagger(self, seed, crf, classes=5):
        insts = lines("sequences.jsonl")
        for k in range(0, N, 7):          # some as "text"
            insts[k] = {"text": " ".join(insts[k]["tokens"])}
        toks = [ct.ascii_lower(t) for i in lines("sequences.jsonl") for t in i["tokens"]]
        m = ct.BiLSTMTagger(vocab_of(toks), hidden=8, embed=6, classes=classes,
                            crf=crf, lowercase=True,
                            labels=[f"T{k}" for k in range(classes)])
        return randomize(m, seed), insts

    def test_bilstm_tagger(self):
        m, insts = self.tagger(6, crf=False)
        self.check_family(m, insts, self.compare_tagger)

    def test_bilstm_crf_engine(self):
        """Needs a canopy binary with the CRF (branch crf)."""
        m, insts = self.tagger(7, crf=True)
        mine = self.check_family(m, insts, self.compare_tagger, require={
            "path_score": "no CRF support in this binary"})
        # the CRF must matter: Viterbi tags differ from the per-token argmax
        self.assertTrue(any(o["tags"] != o["logits"].argmax(-1).tolist() for o in mine))

    def test_lstm_nmt(self):
        insts = lines("sequences.jsonl")
        src = vocab_of([t for i in insts for t in i["tokens"]])
        tgt = ["<unk>", "<s>", "</s>"] + src[1:40]
        m = ct.LSTMNMT(src, tgt, hidden=8, embed=6, max_decode_len=12)
        randomize(m, 8, 1.5)
        pick_eos_bias(m, [m.vocab.ids(i["tokens"]) for i in insts], 12)

        def compare(m, mo, co, what):
            self.assertEqual(mo["output_ids"], co["output_ids"], what + " ids")
            self.assertEqual([m.tgt_vocab.token(i) for i in mo["output_ids"]],
                             co["output_tokens"], what)
            self.close("lstm-nmt", mo["h"], co["h"], what + " h")
            top2 = mo["logits"].topk(2, -1).values
            self.assertGreater(float((top2[:, 0] - top2[:, 1]).min()), 1e-4,
                               what + ": a near-tie makes greedy decoding fragile")
        mine = self.check_family(m, insts, compare)
        stops = [len(o["logits"]) > len(o["output_ids"]) for o in mine]
        self.assertTrue(any(stops) and not all(stops), stops)
        # a request cap below the model's
        with tempfile.TemporaryDirectory() as tmp:
            d = ct.save(m, os.path.join(tmp, "nmt"))
            outs = canopy_run(d, insts[:10], extra=("--max-decode-len", "3"))
            for inst, co in zip(insts[:10], outs):
                self.assertEqual(m(m.vocab.ids(inst["tokens"]), max_len=3)["output_ids"],
                                 co["output_ids"])

    def test_teacher_forced_matches_greedy(self):
        m = randomize(ct.LSTMNMT(["<unk>", "a", "b"], ["<unk>", "<s>", "</s>", "x", "y"],
                                 hidden=4, embed=3), 9)
        src = torch.tensor([1, 2, 0, 1])
        out = m(src, max_len=6)
        tf = m.teacher_forced(src, out["output_ids"])
        self.assertTrue(torch.allclose(tf[:len(out["logits"])], out["logits"], atol=1e-6))


class TestCRF(unittest.TestCase):
    """decode and nll of the CRF against brute force over all tag paths."""

    def brute(self, m, ids):
        e = m.emissions(ids)[0].detach().double()
        st, en, tr = (m.crf.start.double(), m.crf.end.double(), m.crf.trans.double())
        n, C = e.shape
        scores = {}
        for path in itertools.product(range(C), repeat=n):
            s = float(st[path[0]] + en[path[-1]]) + sum(float(e[t, y]) for t, y in enumerate(path))
            s += sum(float(tr[a, b]) for a, b in zip(path, path[1:]))
            scores[path] = s
        return scores

    def test_decode_and_nll(self):
        torch.manual_seed(0)
        m = randomize(ct.BiLSTMTagger(["<unk>", "a", "b", "c"], hidden=4, embed=3,
                                      classes=3, crf=True), 10, 1.0)
        rng = random.Random(1)
        for n in range(1, 6):
            ids = torch.tensor([rng.randrange(4) for _ in range(n)])
            scores = self.brute(m, ids)
            best = max(scores, key=lambda p: (scores[p], [-y for y in p]))
            tags, score = m.decode(ids)
            self.assertEqual(tuple(tags), best)
            self.assertAlmostEqual(score, scores[best], delta=1e-4)
            logz = math.log(sum(math.exp(s) for s in scores.values()))
            gold = list(rng.choice(list(scores)))
            nll = m.nll(ids, gold)
            self.assertAlmostEqual(float(nll), logz - scores[tuple(gold)], delta=1e-4)
        nll.backward()
        self.assertGreater(float(m.crf.trans.grad.abs().sum()), 0)

    def test_decode_ties_lowest_id(self):
        m = ct.BiLSTMTagger(["<unk>", "a"], hidden=2, embed=2, classes=3, crf=True)
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
        self.assertEqual(m.decode(torch.tensor([1, 0, 1])), ([0, 0, 0], 0.0))


# -- lattices -------------------------------------------------------------------

class TestLattices(EngineCase):
    def test_latticelstm(self):
        insts = lines("lattices.jsonl", 25)
        chars = [c for i in insts for c in i["chars"]]
        spans = ["".join(i["chars"][w["start"]:w["end"]]) for i in insts for w in i["words"]]
        with open(os.path.join(DATA, "lexicon.txt"), encoding="utf-8") as f:
            lexicon = [w for w in f.read().split("\n") if w]
        insts[3]["words"][0]["token"] = "future"           # explicit tokens
        insts[3]["words"][1]["token"] = "NotAWord"
        extra = [{"text": "MayYourFutureBeLimitedOnlyByYourDreams"},  # lexicon spans
                 {"chars": list("thecatsat")},
                 {"chars": list("nowords"), "words": []},
                 {"text": "q"}]
        insts += extra
        m = ct.LatticeLSTM(vocab_of(chars, drop_every=9), vocab_of(spans),
                           hidden=8, embed=6, word_embed=5, classes=4,
                           lexicon=lexicon, lowercase=True)
        randomize(m, 11)
        _, words = ct.instance_to_input(m.family, extra[0], m)
        self.assertGreater(len(words), 10)

        def compare(m, mo, co, what):
            self.close("latticelstm", mo["logits"], co["logits"], what + " logits")
            self.close("latticelstm", mo["h"], co["h"], what + " h")
            self.assertEqual(mo["tags"], co["tags"], what + " tags")
        self.check_family(m, insts, compare)

    def test_latticegru(self):
        insts = lines("dags.jsonl", 20)
        insts.append({"nodes": [{"token": "Only", "prev": []}]})
        toks = [nd["token"] for i in insts for nd in i["nodes"]]
        m = randomize(ct.LatticeGRU(vocab_of(toks), hidden=8, embed=6, classes=3), 12)

        def compare(m, mo, co, what):
            self.close("latticegru", mo["logits"], co["logits"], what + " logits")
            self.assertEqual(mo["label"], co["label"], what + " label")
            self.close("latticegru", mo["h"], co["h"], what + " h")
        self.check_family(m, insts, compare)
        with self.assertRaises(ValueError):
            ct.instance_to_input("latticegru", {"nodes": [{"token": "a", "prev": []},
                                                          {"token": "b", "prev": []}]}, m)


# -- save / load ------------------------------------------------------------------

def small(family):
    v = ["<unk>", "a", "b", "C"]
    kw = dict(hidden=4)
    if family == "lstm-nmt":
        return ct.LSTMNMT(v, ["<unk>", "<s>", "</s>", "x"], embed=3,
                          max_decode_len=7, **kw)
    if family == "latticelstm":
        return ct.LatticeLSTM(v, ["<unk>", "ab"], embed=3, word_embed=2, classes=3,
                              lexicon=["ab", "ba"], labels=["B", "I", "O"], **kw)
    if family == "mvrnn":
        return ct.MVRNN(v, classes=2, matrices=2, **kw)
    extra = {"treelstm-2type": {"type_b_labels": ["NP"]},
             "bilstm-tagger": {"crf": True}}.get(family, {})
    return ct.MODULES[family](v, embed=3, classes=2, lowercase=True, **extra, **kw)


class TestSaveLoad(unittest.TestCase):
    def test_round_trip(self):
        for family in ct.MODULES:
            with self.subTest(family=family), tempfile.TemporaryDirectory() as tmp:
                m = small(family)
                d1 = ct.save(m, os.path.join(tmp, "a"))
                m1 = ct.load(d1)
                d2 = ct.save(m1, os.path.join(tmp, "b"))
                m2 = ct.load(d2)
                self.assertIs(type(m2), type(m))
                for k, v in m.state_dict().items():
                    self.assertTrue(torch.equal(v, m2.state_dict()[k]), k)
                self.assertEqual(sorted(os.listdir(d1)), sorted(os.listdir(d2)))
                for name in os.listdir(d1):
                    with open(os.path.join(d1, name), "rb") as f1, \
                            open(os.path.join(d2, name), "rb") as f2:
                        self.assertEqual(f1.read(), f2.read(), name)
                with open(os.path.join(d1, "model.json")) as f:
                    meta = json.load(f)
                self.assertEqual(meta["family"], family)
                if family == "bilstm-tagger":
                    self.assertIs(meta["crf"], True)
                if family == "treelstm-2type":
                    self.assertEqual(meta["type_b_labels"], ["NP"])
                if family == "lstm-nmt":
                    self.assertEqual(meta["max_decode_len"], 7)
                    self.assertNotIn("classes", meta)

    def test_save_refuses_bad_state_dict(self):
        with tempfile.TemporaryDirectory() as tmp:
            m = small("treelstm")
            m.out.register_parameter("Wt", m.out.W)
            del m.out.W
            with self.assertRaisesRegex(ValueError, r"out\.W"):
                ct.save(m, os.path.join(tmp, "x"))
            m = small("bilstm-tagger")
            m.fwd.W_hh = torch.nn.Parameter(torch.zeros(16, 5))
            with self.assertRaisesRegex(ValueError, r"fwd\.W_hh.*\[16, 5\]"):
                ct.save(m, os.path.join(tmp, "x"))
            m = small("treegru")
            with self.assertRaisesRegex(ValueError, r"'embed'"):
                ct.save(m, os.path.join(tmp, "x"), vocab=["<unk>", "a"])
            self.assertFalse(os.path.exists(os.path.join(tmp, "x")))
            sd = small("latticegru").state_dict()
            sd["gru.b_hh"] = torch.zeros(5)
            with self.assertRaisesRegex(ValueError, r"gru\.b_hh"):
                ct.from_state_dict("latticegru", sd)


class TestTraining(unittest.TestCase):
    """One optimiser step per family: every parameter gets a gradient and
    the loss goes down."""

    def inputs(self, m):
        fam = m.family
        if fam in ("treelstm", "treelstm-2type", "treegru", "childsum-treelstm", "mvrnn"):
            tree = "(S (NP (W a) (N b)) (VP (V C) (PU a)))" if fam != "childsum-treelstm" \
                else "(S (NP a b C) (VP (V b)))"
            return ct.instance_to_input(fam, {"tree": tree}, m)
        if fam == "latticelstm":
            return ct.instance_to_input(fam, {"text": "abab"}, m)
        if fam == "latticegru":
            return ct.instance_to_input(fam, {"nodes": [
                {"token": "a", "prev": []}, {"token": "b", "prev": []},
                {"token": "C", "prev": [0, 1]}]}, m)
        return ct.instance_to_input(fam, {"text": "a b C a"}, m)

    def loss(self, m, x):
        if m.family == "bilstm-tagger":
            return m.nll(x[0], [0, 1, 1, 0])
        if m.family == "lstm-nmt":
            y = torch.tensor([3, 3, 2])
            return torch.nn.functional.cross_entropy(m.teacher_forced(x[0], y[:-1]), y)
        lg = m(*x)["logits"]
        lg = lg if lg.dim() == 2 else lg.unsqueeze(0)
        return torch.nn.functional.cross_entropy(lg, torch.ones(len(lg), dtype=torch.long))

    def test_one_step(self):
        for family in ct.MODULES:
            with self.subTest(family=family):
                torch.manual_seed(0)
                m = small(family)
                if family == "treelstm-2type":
                    m.type_b_labels.append("VP")
                x = self.inputs(m)
                opt = torch.optim.SGD(m.parameters(), lr=0.1)
                loss = self.loss(m, x)
                loss.backward()
                for name, p in m.named_parameters():
                    self.assertIsNotNone(p.grad, name)
                    self.assertGreater(float(p.grad.abs().sum()), 0, name)
                opt.step()
                self.assertLess(float(self.loss(m, x)), float(loss))


class TestEngineMadeModels(EngineCase):
    """``load`` reads directories the engine wrote itself (`canopy model
    init`), and the module then computes what the engine computes."""

    DATA_OF = {"childsum-treelstm": "trees-nary.jsonl", "bilstm-tagger": "sequences.jsonl",
               "lstm-nmt": "sequences.jsonl", "latticelstm": "lattices.jsonl",
               "latticegru": "dags.jsonl"}

    def test_load_engine_init(self):
        for family in ct.MODULES:
            with self.subTest(family=family), tempfile.TemporaryDirectory() as tmp:
                data = os.path.join(DATA, self.DATA_OF.get(family, "trees-binary.jsonl"))
                d = os.path.join(tmp, "m")
                p = subprocess.run([BIN, "model", "init", family, d, "--hidden", "6",
                                    "--embed", "6", "--classes", "3", "--vocab-from", data],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                m = ct.load(d)
                self.assertEqual((m.family, m.hidden), (family, 6))
                insts = lines(os.path.basename(data), 8)
                outs = canopy_run(d, insts)
                with torch.no_grad():
                    for i, (inst, co) in enumerate(zip(insts, outs)):
                        mo = m(*ct.instance_to_input(family, inst, m))
                        self.compare_any(m, mo, co, f"engine-made {family} instance {i}")



class TestModes(unittest.TestCase):
    """A model directory written by canopy_torch.save,
    save_cells or canopy-import is 0755 with 0644 files, whatever the
    umask (tempfile.mkdtemp made it 0700: a daemon running as another
    user could not enter it). Written here under umask 077, the strictest
    a user may have, so the modes cannot come from the umask."""

    def assert_modes(self, d):
        import stat
        self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o755, d)
        names = sorted(os.listdir(d))
        self.assertIn("model.json", names)
        self.assertIn("weights.safetensors", names)
        for n in names:
            m = stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode)
            self.assertEqual(m, 0o644, f"{d}/{n}: {oct(m)}")

    def test_written_dirs_are_0755_files_0644(self):
        old = os.umask(0o077)
        tmp = tempfile.mkdtemp(prefix="canopy-modes-")
        try:
            vocab = ["<unk>", "a", "b"]
            m = ct.TreeLSTM(vocab, hidden=4, embed=4, classes=2)
            self.assert_modes(ct.save(m, os.path.join(tmp, "saved")))
            leaf, internal = torch.nn.Linear(4, 4), torch.nn.Linear(8, 4)
            d = ct.save_cells(os.path.join(tmp, "cells"), "tree",
                              {"leaf": _Leaf(leaf), "internal":
                               _Internal(internal)}, state=4,
                              output=torch.nn.Linear(4, 2),
                              embed=torch.nn.Embedding(3, 4), vocab=vocab)
            self.assert_modes(d)
            ckpt = os.path.join(tmp, "ckpt.pt")
            torch.save(m.state_dict(), ckpt)
            vfile = os.path.join(tmp, "vocab.txt")
            with open(vfile, "w") as f:
                f.write("\n".join(vocab) + "\n")
            out = os.path.join(tmp, "imported")
            p = subprocess.run(
                [sys.executable, os.path.join(ROOT, "clients",
                                              "canopy-import"),
                 "canopy", ckpt, out, "--vocab", vfile, "--canopy", BIN],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("(verified)", p.stderr)
            self.assert_modes(out)
        finally:
            os.umask(old)
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


class _Leaf(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return torch.tanh(self.lin(x))


class _Internal(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, s1, s2):
        return torch.tanh(self.lin(torch.cat([s1, s2], -1)))

def tearDownModule():
    if MAXDIFF:
        sys.stderr.write("\nmax |module - canopy| per family: " + ", ".join(
            f"{k} {v:.2g}" for k, v in sorted(MAXDIFF.items())) + "\n")


if __name__ == "__main__":
    unittest.main()
