"""Tests of clients/canopy-import, one class per format.

Each test builds a small model with the format's public key names
(tests/python/import_sources.py, independent of the importer), saves it
with torch.save, runs the real canopy-import executable as a subprocess and
compares `canopy run --outputs all --return-hidden` on real trees/sentences
of CANOPY_DATA with the test's own forward of the source model (1e-4).
Also: a renamed key is exit 2 naming it; a transposed square block and a
swapped gate block in the mapping (tests/python/import_fault.py) are caught
by the importer's verification (exit 1, suspect named); nothing is written
to OUT_DIR when it fails.

Run from the repository root:
    /usr/bin/python3 -m unittest discover -s tests/python -p 'test_import*.py'
Environment: CANOPY_BIN (default build/canopy), CANOPY_DATA (default
the checkout's data/), CANOPY_CRF_BIN (a canopy with CRF support; default
CANOPY_BIN; the CRF tests are skipped, saying so, when it prints no
CRF path_score).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import import_sources as S  # noqa: E402

EXE = os.path.join(REPO, "clients", "canopy-import")
FAULT = os.path.join(HERE, "import_fault.py")
CANOPY = os.environ.get("CANOPY_BIN", os.path.join(REPO, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")
# canopy binaries to run CRF taggers with, first that supports them
CRF_CANDIDATES = [os.environ["CANOPY_CRF_BIN"]] if \
    os.environ.get("CANOPY_CRF_BIN") else \
    [CANOPY]
LINES = 40          # instances of each data file used
TOL = 1e-4
PY = sys.executable  # /usr/bin/python3 (torch)

torch.set_num_threads(1)
RESULTS = {}         # test name -> max differences (printed at the end)


def _t(x):
    if isinstance(x, list) and x and not isinstance(x[0], (list, float, int)):
        x = [_t(y) for y in x]          # rows of numpy arrays / tensors
        return torch.stack(x) if x else torch.zeros(0)
    return torch.as_tensor(x, dtype=torch.float64)


def max_diff(a, b):
    a, b = _t(a).double(), _t(b).double()
    assert a.shape == b.shape, f"shape {list(b.shape)} != {list(a.shape)}"
    return float((a - b).abs().max()) if a.numel() else 0.0


def suspects(stderr):
    return stderr.split("suspect mapping:", 1)[1] if \
        "suspect mapping:" in stderr else ""


class ImportTest(unittest.TestCase):
    data_file = None

    @classmethod
    def setUpClass(cls):
        if not os.access(CANOPY, os.X_OK):
            raise unittest.SkipTest(f"no canopy binary at {CANOPY}")
        cls.tmp = tempfile.mkdtemp(prefix="test_import.")
        if cls.data_file:
            src = os.path.join(DATA, cls.data_file)
            with open(src, encoding="utf-8") as f:
                lines = [l for _, l in zip(range(LINES), f)]
            cls.check = os.path.join(cls.tmp, "check.jsonl")
            with open(cls.check, "w", encoding="utf-8") as f:
                f.writelines(lines)
            cls.insts = [json.loads(l) for l in lines]
            cls.vocab = S.make_vocab(src, lines=LINES)
            cls.vocab_file = cls.write_lines("vocab.txt", cls.vocab)
            look = {t: i for i, t in enumerate(cls.vocab)}
            cls.ids = staticmethod(lambda t: look.get(t, 0))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)

    @classmethod
    def write_lines(cls, name, lines):
        p = os.path.join(cls.tmp, name)
        with open(p, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return p

    def path(self, name):
        return os.path.join(self.tmp, f"{self._testMethodName}.{name}")

    def save(self, model_or_sd, name="ckpt.pt", wrap=None):
        sd = model_or_sd if isinstance(model_or_sd, dict) else \
            model_or_sd.state_dict()
        sd = {k: v.detach().float().clone() for k, v in sd.items()}
        p = self.path(name)
        torch.save({wrap: sd} if wrap else sd, p)
        return p

    def importer(self, fmt, ckpt, out, *opts, fault=None, vocab=None):
        cmd = ([PY, FAULT, fault] if fault else [PY, EXE]) + [
            fmt, ckpt, out, "--vocab", vocab or self.vocab_file,
            "--canopy", opts_canopy(opts)] + [o for o in opts
                                               if not o.startswith("@")]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
        return p.returncode, p.stderr

    def canopy_run(self, model_dir, *extra, binary=CANOPY, check=None):
        p = subprocess.run([binary, "run", "--model", model_dir, "--input",
                            check or self.check, "--outputs", "all",
                            "--return-hidden"] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]

    # -- the failure cases every format shares -----------------------------
    def assert_rejected(self, fmt, sd, key, *opts, expect=()):
        """exit 2, the key named, nothing written."""
        out = self.path("out")
        rc, err = self.importer(fmt, self.save(sd), out, *opts)
        self.assertEqual(rc, 2, err)
        self.assertIn(repr(key), err)
        for e in expect:
            self.assertIn(e, err)
        self.assertFalse(os.path.exists(out), "OUT_DIR written on error")
        return err

    def assert_caught(self, fmt, model, fault, suspect, *opts):
        """A mapping fault: exit 1, the suspect named, OUT_DIR untouched
        (an existing directory keeps its old contents)."""
        out = self.path("out")
        os.makedirs(out)
        with open(os.path.join(out, "old"), "w") as f:
            f.write("old model\n")
        ckpt = self.save(model)
        rc, err = self.importer(fmt, ckpt, out, *opts, fault=fault)
        self.assertEqual(rc, 1, err)
        self.assertIn("MISMATCH", err)
        self.assertIn(suspect, suspects(err), err)
        self.assertEqual(sorted(os.listdir(out)), ["old"])
        return err


def opts_canopy(opts):
    for o in opts:
        if o.startswith("@canopy="):
            return o[len("@canopy="):]
    return CANOPY


# ---------------------------------------------------------------------------
# tree formats
# ---------------------------------------------------------------------------

class TreeMixin(object):
    def compare_trees(self, model, out_dir, name):
        outs = self.canopy_run(out_dir)
        dl = dh = 0.0
        model = model.double()
        for inst, got in zip(self.insts, outs):
            self.assertNotIn("error", got)
            root = S.parse_tree(inst)
            logits, h = model(root, self.ids)
            nodes = got["nodes"]
            self.assertEqual(len(nodes), logits.shape[0])
            dl = max(dl, max_diff(logits, [n["logits"] for n in nodes]))
            dh = max(dh, max_diff(h, got["h"]))
            self.assertEqual([n["label"] for n in nodes],
                             [int(x) for x in logits.argmax(1)])
        RESULTS[name] = f"logits {dl:.2g}, h {dh:.2g} over {len(outs)} trees"
        self.assertLess(dl, TOL)
        self.assertLess(dh, TOL)


class TestDGLTreeLSTM(ImportTest, TreeMixin):
    data_file = "trees-binary.jsonl"

    def model(self, seed=1):
        return S.randomize(S.DGLTreeLSTM(len(self.vocab), 8, 6, 5), seed)

    def test_matches_source(self):
        m = self.model()
        labels = self.write_lines("labels5.txt", ["a", "b", "c", "d", "e"])
        out = self.path("out")
        rc, err = self.importer("dgl-treelstm", self.save(m, wrap="model"),
                                out, "--check", self.check, "--labels",
                                labels)
        self.assertEqual(rc, 0, err)
        self.assertIn("verified", err)
        self.compare_trees(m, out, "dgl-treelstm")

    def test_renamed_key(self):
        sd = self.model().state_dict()
        sd["cell.U_f.weights"] = sd.pop("cell.U_f.weight")
        self.assert_rejected("dgl-treelstm", sd, "cell.U_f.weights",
                             expect=["'cell.U_f.weight'", "[2H=12, 2H=12]"])

    def test_transposed_U_f(self):
        # U_f [2H, 2H] = internal.U rows f1, f2 (blocks 1..2 of 5)
        self.assert_caught("dgl-treelstm", self.model(),
                           "transpose:internal.U:1-3/5", "internal.U")

    def test_swapped_gates(self):
        self.assert_caught("dgl-treelstm", self.model(),
                           "swap:leaf.W:0,2/3", "leaf.W")

    def test_keep_on_mismatch(self):
        out = self.path("out")
        rc, err = self.importer("dgl-treelstm", self.save(self.model()), out,
                                "--keep-on-mismatch",
                                fault="swap:internal.b:1,2/5")
        self.assertEqual(rc, 1, err)
        self.assertIn("internal.U / internal.b", suspects(err))
        self.assertTrue(os.path.exists(os.path.join(out, "model.json")))

    def test_vocab_without_unk_first(self):
        bad = self.write_lines("bad_vocab.txt", self.vocab[1:2] + ["<unk>"]
                               + self.vocab[2:])
        out = self.path("out")
        rc, err = self.importer("dgl-treelstm", self.save(self.model()), out,
                                vocab=bad)
        self.assertEqual(rc, 2, err)
        self.assertIn("Canopy requires id 0 = '<unk>'", err)
        self.assertIn("'<unk>' is on line 2", err)
        self.assertFalse(os.path.exists(out))

    def test_embedding_rows(self):
        more = self.write_lines("vocab_plus.txt", self.vocab + ["extra"])
        out = self.path("out")
        rc, err = self.importer("dgl-treelstm", self.save(self.model()), out,
                                vocab=more)
        self.assertEqual(rc, 2, err)
        self.assertIn("'embedding.weight' has %d rows" % len(self.vocab), err)
        self.assertIn("%d tokens" % (len(self.vocab) + 1), err)
        self.assertFalse(os.path.exists(out))


class TestDGLChildSum(ImportTest, TreeMixin):
    data_file = "trees-nary.jsonl"

    def model(self, seed=2):
        return S.randomize(S.DGLTreeLSTM(len(self.vocab), 8, 6, 4,
                                         cell_type="childsum"), seed)

    def test_matches_source(self):
        m = self.model()
        out = self.path("out")
        rc, err = self.importer("dgl-childsum", self.save(m, wrap="net"),
                                out, "--check", self.check, "--key", "net")
        self.assertEqual(rc, 0, err)
        self.compare_trees(m, out, "dgl-childsum")

    def test_renamed_key(self):
        sd = self.model().state_dict()
        sd["cell.bias_iou"] = sd.pop("cell.b_iou")
        self.assert_rejected("dgl-childsum", sd, "cell.bias_iou",
                             expect=["'cell.b_iou'"])

    def test_transposed_U_f(self):
        self.assert_caught("dgl-childsum", self.model(),
                           "transpose:cell.U:1-2/4", "cell.U")

    def test_swapped_gates(self):
        self.assert_caught("dgl-childsum", self.model(),
                           "swap:cell.W:0,3/4", "cell.W")


class TestTreeLSTMPytorch(ImportTest, TreeMixin):
    data_file = "trees-nary.jsonl"

    def model(self, seed=3, head=True):
        return S.randomize(S.SimilarityTreeLSTM(len(self.vocab), 8, 6, 3,
                                                with_head=head), seed)

    def test_matches_source_with_head(self):
        m = self.model()
        out = self.path("out")
        rc, err = self.importer("treelstm-pytorch", self.save(m), out,
                                "--check", self.check, "--head", "head")
        self.assertEqual(rc, 0, err)
        self.assertIn("ignored the similarity head", err)
        self.assertIn("leaves only", err)
        self.compare_trees(m, out, "treelstm-pytorch --head")

    def test_without_head_reads_h(self):
        m = self.model(head=False)
        out = self.path("out")
        rc, err = self.importer("treelstm-pytorch", self.save(m), out,
                                "--check", self.check)
        self.assertEqual(rc, 0, err)
        self.assertIn("no --head", err)
        self.compare_trees(m, out, "treelstm-pytorch (h only)")

    def test_renamed_key(self):
        sd = self.model().state_dict()
        sd["childsumtreelstm.fh.W"] = sd.pop("childsumtreelstm.fh.weight")
        self.assert_rejected("treelstm-pytorch", sd, "childsumtreelstm.fh.W",
                             "--head", "head",
                             expect=["'childsumtreelstm.fh.weight'"])

    def test_transposed_fh(self):
        self.assert_caught("treelstm-pytorch", self.model(),
                           "transpose:cell.U:1-2/4", "cell.U",
                           "--head", "head")

    def test_swapped_gates(self):
        self.assert_caught("treelstm-pytorch", self.model(),
                           "swap:cell.W:0,2/4", "cell.W", "--head", "head")

    def test_dasguptar_vocab_refused(self):
        # dasguptar's vocabularies start <blank>, <unk>, <s>, </s>
        bad = self.write_lines("vocab_blank.txt", ["<blank>"] +
                               self.vocab[:])
        sd = self.model().state_dict()
        sd["emb.weight"] = torch.cat([sd["emb.weight"][:1],
                                      sd["emb.weight"]])
        out = self.path("out")
        rc, err = self.importer("treelstm-pytorch", self.save(sd), out,
                                "--head", "head", vocab=bad)
        self.assertEqual(rc, 2, err)
        self.assertIn("line 1 (id 0) is '<blank>'", err)
        self.assertFalse(os.path.exists(out))


# ---------------------------------------------------------------------------
# torch-tagger
# ---------------------------------------------------------------------------

TAGS = ["B", "I", "O", "X", "<START>", "<STOP>"]


_CRF_BINARY = []


def crf_binary(test):
    """The first of CRF_CANDIDATES whose `canopy run` prints a CRF's
    path_score for a CRF model (written with --no-check), else None."""
    if _CRF_BINARY:
        return _CRF_BINARY[0]
    m = test.model(seed=5, crf=True)
    out = test.path("probe")
    rc, err = test.importer("torch-tagger", test.save(m, "probe.pt"), out,
                            "--no-check")
    test.assertEqual(rc, 0, err)
    found = None
    for b in CRF_CANDIDATES:
        if not os.access(b, os.X_OK):
            continue
        p = subprocess.run([b, "run", "--model", out, "--input", test.check],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=120)
        if p.returncode == 0 and '"path_score"' in p.stdout:
            found = b
            break
    _CRF_BINARY.append(found)
    return found


class TestTorchTagger(ImportTest):
    data_file = "sequences.jsonl"

    def model(self, seed=4, crf=False, names=None):
        m = S.randomize(S.BiLSTMTagger(len(self.vocab), 8, 6,
                                       6 if crf else 5, crf=crf,
                                       names=names), seed)
        if crf:
            with torch.no_grad():
                m.trans()[4, :] = -10000.    # nothing goes to START
                m.trans()[:, 5] = -10000.    # nothing leaves STOP
        return m

    def compare(self, m, outs, name, crf=False):
        m = m.double()
        dl = dh = ds = 0.0
        for inst, got in zip(self.insts, outs):
            hs, feats = m.features(inst["tokens"], self.ids)
            dh = max(dh, max_diff(hs, got["h"]))
            if crf:
                score, path = m.viterbi(feats, 4, 5)
                dl = max(dl, max_diff(feats[:, :4], got["logits"]))
                self.assertEqual(got["tags"], path)
                self.assertEqual(got["tag_names"], [TAGS[t] for t in path])
                ds = max(ds, abs(score - got["path_score"]))
            else:
                dl = max(dl, max_diff(feats, got["logits"]))
                self.assertEqual(got["tags"],
                                 [int(t) for t in feats.argmax(1)])
        RESULTS[name] = f"logits {dl:.2g}, h {dh:.2g}" + \
            (f", path score {ds:.2g}" if crf else "") + \
            f" over {len(outs)} sentences"
        self.assertLess(dl, TOL)
        self.assertLess(dh, TOL)
        self.assertLess(ds, TOL)

    def test_matches_source_detected_names(self):
        names = dict(embedding="emb", lstm="bilstm", linear="proj")
        m = self.model(names=names)
        out = self.path("out")
        rc, err = self.importer("torch-tagger", self.save(m), out,
                                "--check", self.check)
        self.assertEqual(rc, 0, err)
        self.assertIn("bilstm.*_l0_reverse -> bwd.*", err)
        self.compare(m, self.canopy_run(out), "torch-tagger")

    def test_lowercase(self):
        low = list(dict.fromkeys(t.lower() for t in self.vocab))
        vfile = self.write_lines("vocab_lower.txt", low)
        look = {t: i for i, t in enumerate(low)}
        m = S.randomize(S.BiLSTMTagger(len(low), 8, 6, 5), 8)
        out = self.path("out")
        rc, err = self.importer("torch-tagger", self.save(m), out, "--check",
                                self.check, "--lowercase", vocab=vfile)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out, "model.json")) as f:
            self.assertTrue(json.load(f)["lowercase"])
        m = m.double()
        outs = self.canopy_run(out)
        d = 0.0
        for inst, got in zip(self.insts, outs):
            hs, feats = m.features(inst["tokens"],
                                   lambda t: look.get(t.lower(), 0))
            d = max(d, max_diff(feats, got["logits"]), max_diff(hs, got["h"]))
        RESULTS["torch-tagger --lowercase"] = f"logits/h {d:.2g}"
        self.assertLess(d, TOL)

    def test_renamed_key(self):
        sd = self.model().state_dict()
        sd["lstm.weight_hh_l0_rev"] = sd.pop("lstm.weight_hh_l0_reverse")
        self.assert_rejected("torch-tagger", sd, "lstm.weight_hh_l0_rev",
                             expect=["'lstm.weight_hh_l0_reverse'",
                                     "[4H=24, H=6]"])

    def test_transposed_W_hh_block(self):
        self.assert_caught("torch-tagger", self.model(),
                           "transpose:bwd.W_hh:2-3/4", "bwd.*")

    def test_swapped_gates(self):
        self.assert_caught("torch-tagger", self.model(),
                           "swap:fwd.W_ih:0,1/4", "fwd.*")

    def test_two_layers_refused(self):
        m = S.randomize(torch.nn.LSTM(8, 6, num_layers=2, bidirectional=True),
                        1)
        sd = {"lstm." + k: v for k, v in m.state_dict().items()}
        sd.update({k: v for k, v in self.model().state_dict().items()
                   if not k.startswith("lstm.")})
        err = self.assert_rejected("torch-tagger", sd, "lstm.weight_ih_l1")
        self.assertIn("num_layers=1", err)

    def test_unidirectional_refused(self):
        sd = {k: v for k, v in self.model().state_dict().items()
              if "_reverse" not in k}
        err = self.assert_rejected("torch-tagger", sd,
                                   "lstm.weight_ih_l0_reverse")
        self.assertIn("bidirectional=True", err)

    def gru_tagger(self, name):
        """nn.Embedding + bidirectional nn.GRU + nn.Linear: the keys of an
        LSTM tagger, with 3 gate blocks instead of 4."""
        m = self.model()
        g = S.randomize(torch.nn.GRU(6, 8, bidirectional=True), 2)
        sd = {k: v for k, v in m.state_dict().items()
              if not k.startswith("lstm.") and not k.startswith("hidden2")}
        sd.update({name + "." + k: v for k, v in g.state_dict().items()})
        sd["hidden2tag.weight"] = torch.randn(5, 16)
        sd["hidden2tag.bias"] = torch.randn(5)
        return sd

    def test_gru_named_as_gru(self):
        """A GRU's 3H = 24 rows (H = 6) are not read as an LSTM's 4H: the
        error names the GRU it found and the LSTM the format takes, not a
        shape mismatch or "found no nn.Linear ([T, 12] with bias)"."""
        for name in ("gru", "lstm"):
            out = self.path("out")
            rc, err = self.importer("torch-tagger", self.save(self.gru_tagger(
                name)), out)
            self.assertEqual(rc, 2, err)
            self.assertIn(f"'{name}' is an nn.GRU", err)
            self.assertIn("takes an nn.LSTM", err)
            self.assertNotIn("found no nn.Linear", err)
            self.assertFalse(os.path.exists(out))

    def crf_binary(self):
        b = crf_binary(self)
        if b is None:
            self.skipTest("CRF support missing: none of "
                          + ", ".join(CRF_CANDIDATES) + " prints a CRF's "
                          "path_score (\"crf\": true is ignored)")
        return b

    def test_crf_matches_tutorial_viterbi(self):
        binary = self.crf_binary()
        m = self.model(seed=5, crf=True)
        labels = self.write_lines("tags.txt", TAGS)
        out = self.path("out")
        rc, err = self.importer("torch-tagger", self.save(m, wrap="state_dict"),
                                out, "--check", self.check, "--labels",
                                labels, "@canopy=" + binary)
        self.assertEqual(rc, 0, err)
        self.assertIn("by name in --labels", err)
        with open(os.path.join(out, "model.json")) as f:
            meta = json.load(f)
        self.assertTrue(meta["crf"])
        self.assertEqual(meta["labels"], TAGS[:4])
        outs = self.canopy_run(out, binary=binary)
        if "path_score" not in outs[0]:
            self.skipTest(f"CRF support missing: {binary} prints no "
                          "path_score")
        self.compare(m, outs, "torch-tagger CRF", crf=True)

    def test_crf_fault_caught(self):
        binary = self.crf_binary()
        self.assert_caught("torch-tagger", self.model(seed=5, crf=True),
                           "transpose:crf.trans:0-1/1", "crf.trans",
                           "@canopy=" + binary)

    def test_crf_with_default_canopy(self):
        """With build/canopy: verified if it has CRF support, else exit 1
        naming the missing support (a binary that ignores "crf" would serve
        argmax tags instead of Viterbi ones)."""
        m = self.model(seed=5, crf=True)
        out = self.path("out")
        rc, err = self.importer("torch-tagger", self.save(m), out)
        if rc == 0:      # build/canopy has CRF support by now: fine
            self.assertIn("CRF path score", err)
            return
        self.assertEqual(rc, 1, err)
        self.assertIn("no CRF support", err)
        self.assertIn("START = tag 4, STOP = tag 5: assumed", err)
        self.assertFalse(os.path.exists(out))


# ---------------------------------------------------------------------------
# torch-seq2seq
# ---------------------------------------------------------------------------

class TestTorchSeq2Seq(ImportTest):
    data_file = "sequences.jsonl"
    CAP = 12

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tgt = ["<unk>", "<s>", "</s>"] + cls.vocab[1:60]
        cls.tgt_file = cls.write_lines("tgt.txt", cls.tgt)

    def model(self, seed=6, Ht=6):
        m = S.Seq2Seq(len(self.vocab), len(self.tgt), 8, 6)
        if Ht != 6:
            m.decoder = S.Decoder(len(self.tgt), 8, Ht)
        return S.randomize(m, seed)

    def opts(self):
        return ("--tgt-vocab", self.tgt_file, "--max-decode-len",
                str(self.CAP))

    def test_matches_source(self):
        m = self.model()
        out = self.path("out")
        rc, err = self.importer("torch-seq2seq", self.save(m), out,
                                "--check", self.check, *self.opts())
        self.assertEqual(rc, 0, err)
        outs = self.canopy_run(out)
        m = m.double()
        dh, n = 0.0, 0
        for inst, got in zip(self.insts, outs):
            ids, h, margins = m.greedy(inst["tokens"], self.ids, self.CAP)
            k = 0
            while k < len(ids) and k < len(got["output_ids"]) and \
                    ids[k] == got["output_ids"][k]:
                k += 1
            if ids != got["output_ids"]:     # only after a near-tie
                self.assertLess(margins[k], 2 * TOL, (ids, got))
                continue
            self.assertEqual(got["output_tokens"], [self.tgt[i] for i in ids])
            dh = max(dh, max_diff(h, got["h"]))
            n += 1
        RESULTS["torch-seq2seq"] = f"h {dh:.2g}, output ids equal on " \
            f"{n}/{len(outs)} sentences"
        self.assertGreater(n, len(outs) // 2)
        self.assertLess(dh, TOL)

    def test_renamed_key(self):
        sd = self.model().state_dict()
        sd["decoder.proj.weight"] = sd.pop("decoder.out.weight")
        self.assert_rejected("torch-seq2seq", sd, "decoder.proj.weight",
                             *self.opts(), expect=["'decoder.out.weight'"])

    def test_hidden_sizes_differ(self):
        err = self.assert_rejected("torch-seq2seq",
                                   self.model(Ht=4).state_dict(),
                                   "decoder.lstm.weight_hh_l0", *self.opts())
        self.assertIn("H=6) differs from the decoder's", err)

    def test_target_vocab_refused(self):
        bad = self.write_lines("tgt_bad.txt", ["<unk>", "</s>", "<s>"] +
                               self.tgt[3:])
        out = self.path("out")
        rc, err = self.importer("torch-seq2seq", self.save(self.model()), out,
                                "--tgt-vocab", bad)
        self.assertEqual(rc, 2, err)
        self.assertIn("Canopy requires id 1 = '<s>'", err)
        self.assertFalse(os.path.exists(out))

    def test_transposed_W_hh_block(self):
        self.assert_caught("torch-seq2seq", self.model(),
                           "transpose:dec.W_hh:0-1/4", "dec.*", *self.opts())

    def test_swapped_gates(self):
        self.assert_caught("torch-seq2seq", self.model(),
                           "swap:enc.W_ih:1,2/4", "enc.*", *self.opts())


# ---------------------------------------------------------------------------
# canopy (canopy_torch state_dicts)
# ---------------------------------------------------------------------------

class TestCanopyFormat(ImportTest):
    data_file = "trees-binary.jsonl"

    def model(self):
        sys.path.insert(0, os.path.join(REPO, "clients"))
        try:
            import canopy_torch as ct
            ct.TreeLSTM
        except (ImportError, AttributeError) as e:
            self.skipTest(f"canopy_torch modules not available: {e}")
        torch.manual_seed(7)
        return ct.TreeLSTM(self.vocab, hidden=6, embed=8, classes=3)

    def test_matches_numpy_reference(self):
        """Inferred family; canopy run equals the independent numpy
        reference (tests/reference/canopy_ref.py) on the written dir, and
        the tensors are the checkpoint's."""
        m = self.model()
        out = self.path("out")
        rc, err = self.importer("canopy", self.save(m, wrap="model"), out,
                                "--check", self.check)
        self.assertEqual(rc, 0, err)
        self.assertIn("inferred from key 'internal.U'", err)
        ref = S.canopy_ref.Model(out)
        for k, v in m.state_dict().items():
            self.assertEqual(max_diff(v, ref.p[k]), 0.0, k)
        outs = self.canopy_run(out)
        dl = 0.0
        for inst, got in zip(self.insts, outs):
            r = ref.run(inst, outputs="all", return_hidden=True)
            dl = max(dl, max_diff([n["logits"] for n in r["nodes"]],
                                  [n["logits"] for n in got["nodes"]]),
                     max_diff(r["h"], got["h"]))
        RESULTS["canopy (treelstm)"] = f"logits/h vs numpy reference {dl:.2g}"
        self.assertLess(dl, TOL)

    def test_tagger_inferred_no_check(self):
        import canopy_torch as ct
        self.model()        # skips when canopy_torch is not there
        m = ct.BiLSTMTagger(self.vocab, hidden=4, embed=8, classes=3)
        out = self.path("out")
        rc, err = self.importer("canopy", self.save(m), out, "--no-check")
        self.assertEqual(rc, 0, err)
        self.assertIn("family bilstm-tagger (inferred from key 'fwd.W_ih')",
                      err)
        self.assertIn("not verified: --no-check", err)
        with open(os.path.join(out, "model.json")) as f:
            self.assertEqual(json.load(f)["family"], "bilstm-tagger")

    def test_unknown_key(self):
        sd = self.model().state_dict()
        sd["internal.V"] = sd["internal.U"]
        self.assert_rejected("canopy", sd, "internal.V")

    def test_fault_caught(self):
        self.assert_caught("canopy", self.model(),
                           "transpose:internal.U:1-3/5", "internal")


def tearDownModule():
    if RESULTS:
        sys.stderr.write("\nmax |canopy run - source forward|:\n")
        for k in sorted(RESULTS):
            sys.stderr.write(f"  {k:<28} {RESULTS[k]}\n")


if __name__ == "__main__":
    unittest.main()
