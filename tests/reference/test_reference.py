#!/usr/bin/python3
"""Self-checks of the float32 reference (canopy_ref.py); no canopy needed.

Run: /usr/bin/python3 tests/reference/test_reference.py   (unittest; non-zero exit on failure)

Hand computations below are written out again, separately, in float64 with
explicit row slices, and compared with the reference to 1e-5.
"""

import json
import math
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import canopy_ref as R  # noqa: E402
# the DEV data: $CANOPY_DATA, else the checkout's data/
DATA = os.environ.get("CANOPY_DATA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")

PY = sys.executable or "/usr/bin/python3"


def sg(x):
    return 1.0 / (1.0 + np.exp(-x))


def rows(W, k, n):
    """Part k of n equal consecutive row blocks of W (float64)."""
    m = W.shape[0] // n
    return np.asarray(W[k * m:(k + 1) * m], dtype=np.float64)


class TmpDirCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="canopy-ref-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def model(self, family, **kw):
        d = os.path.join(self.tmp, family + str(kw.pop("tag", "")))
        t = R.write_model(d, family, **kw)
        return R.Model(d), {k: np.asarray(v, dtype=np.float64) for k, v in t.items()}

    def close(self, got, want, tol=1e-5):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        self.assertEqual(got.shape, want.shape)
        self.assertLess(float(np.max(np.abs(got - want))) if got.size else 0.0, tol,
                        "got %r want %r" % (got, want))


# ---------------------------------------------------------------------------
class SafetensorsTest(TmpDirCase):
    def test_roundtrip(self):
        p = os.path.join(self.tmp, "w.safetensors")
        t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b.c": np.array([1.5], np.float32),
             "z": np.random.RandomState(1).randn(2, 3, 4).astype(np.float32)}
        R.write_safetensors(p, t)
        with open(p, "rb") as f:
            data = f.read()
        hlen = int.from_bytes(data[:8], "little")
        self.assertEqual(hlen % 8, 0)
        hdr = json.loads(data[8:8 + hlen])
        self.assertEqual(hdr["a"], {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})
        back = R.read_safetensors(p)
        self.assertEqual(sorted(back), sorted(t))
        for k in t:
            self.assertEqual(back[k].dtype, np.float32)
            self.assertTrue(np.array_equal(back[k], t[k]))

    def test_metadata_and_errors(self):
        p = os.path.join(self.tmp, "w.safetensors")
        hdr = json.dumps({"__metadata__": {"x": "y"},
                          "t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
        with open(p, "wb") as f:
            f.write(len(hdr).to_bytes(8, "little") + hdr + np.array([1, 2], "<f4").tobytes())
        self.assertEqual(R.read_safetensors(p)["t"].tolist(), [1.0, 2.0])
        with open(p, "wb") as f:  # cut short
            f.write(len(hdr).to_bytes(8, "little") + hdr + np.array([1], "<f4").tobytes())
        with self.assertRaisesRegex(R.LoadError, "t"):
            R.read_safetensors(p)
        hdr2 = json.dumps({"t": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
        with open(p, "wb") as f:
            f.write(len(hdr2).to_bytes(8, "little") + hdr2 + b"\0" * 4)
        with self.assertRaisesRegex(R.LoadError, "F32"):
            R.read_safetensors(p)

    def test_model_load_errors(self):
        d = os.path.join(self.tmp, "m")
        R.write_model(d, "treelstm", H=3, D=2, C=2)
        R.Model(d)
        t = R.read_safetensors(os.path.join(d, "weights.safetensors"))
        del t["internal.U"]
        R.write_safetensors(os.path.join(d, "weights.safetensors"), t)
        with self.assertRaisesRegex(R.LoadError, "internal.U"):
            R.Model(d)
        R.write_model(d, "treelstm", H=3, D=2, C=2, tensors={"out.W": np.zeros((2, 4))})
        with self.assertRaisesRegex(R.LoadError, "out.W"):
            R.Model(d)

    def test_every_family_writes_and_loads(self):
        for fam in R.FAMILIES:
            d = os.path.join(self.tmp, "f-" + fam)
            R.write_model(d, fam, H=3, D=3, C=4, labels=True, lexicon=["ab", "bc"])
            m = R.Model(d)
            self.assertEqual(m.family, fam)


# ---------------------------------------------------------------------------
class BracketParserTest(unittest.TestCase):
    def shape(self, t):
        if t.is_leaf():
            return ("leaf", t.label, t.word)
        return (t.label, [self.shape(c) for c in t.children])

    def test_leaf_and_internal(self):
        t = R.parse_bracketed("(3 (2 It) (4 (2 's) (2 fine)))")
        self.assertEqual(self.shape(t), ("3", [("leaf", "2", "It"),
                                               ("4", [("leaf", "2", "'s"), ("leaf", "2", "fine")])]))
        self.assertEqual(self.shape(R.parse_bracketed("(DT the)")), ("leaf", "DT", "the"))

    def test_two_bare_words(self):
        self.assertEqual(self.shape(R.parse_bracketed("(X a b)")),
                         ("X", [("leaf", None, "a"), ("leaf", None, "b")]))

    def test_bare_word_in_child_position(self):
        self.assertEqual(self.shape(R.parse_bracketed("(NP the (NN film))")),
                         ("NP", [("leaf", None, "the"), ("leaf", "NN", "film")]))

    def test_unlabelled_bracket(self):
        self.assertEqual(self.shape(R.parse_bracketed("((A a) (B b))")),
                         (None, [("leaf", "A", "a"), ("leaf", "B", "b")]))
        self.assertEqual(self.shape(R.parse_bracketed("( (S (A a) b) )")),
                         (None, [("S", [("leaf", "A", "a"), ("leaf", None, "b")])]))
        self.assertEqual(self.shape(R.parse_bracketed("((A a) b)")),
                         (None, [("leaf", "A", "a"), ("leaf", None, "b")]))

    def test_unary(self):
        self.assertEqual(self.shape(R.parse_bracketed("(NP (N x))")), ("NP", [("leaf", "N", "x")]))

    def test_escaped_quote_from_json(self):
        inst = json.loads('{"tree": "(S (PU \\") (W a))"}')
        t = R.parse_tree_instance(inst)
        self.assertEqual(self.shape(t), ("S", [("leaf", "PU", '"'), ("leaf", "W", "a")]))

    def test_whitespace_kinds(self):
        t = R.parse_bracketed("(S\t(A\na)\u3000(B b))")
        self.assertEqual(self.shape(t), ("S", [("leaf", "A", "a"), ("leaf", "B", "b")]))

    def test_errors(self):
        for s in ["(w)", "()", "x (A a)", "(A a) x", "(A a)(B b)", "A", "", "   ", "(A (B b)",
                  "(A a))", "(S (w) (A a))", "(S () (A a))", ")"]:
            with self.assertRaises(R.RefError, msg=repr(s)) as cm:
                R.parse_bracketed(s)
            self.assertEqual(cm.exception.code, "bad_tree", s)

    def test_preorder(self):
        t = R.parse_bracketed("(A (B (C c) d) (E e))")
        self.assertEqual([n.label if not n.is_leaf() or n.label else n.word for n in R.preorder(t)],
                         ["A", "B", "C", "d", "E"])
        post = R.postorder(t)
        pos = {id(n): k for k, n in enumerate(post)}
        for n in post:
            for c in n.children:
                self.assertLess(pos[id(c)], pos[id(n)])

    def test_json_tree(self):
        t = R.parse_tree_instance({"tree": {"label": "NP", "type": "b", "children": [
            {"word": "the"}, {"label": "N", "word": "film"}]}})
        self.assertEqual(self.shape(t), ("NP", [("leaf", None, "the"), ("leaf", "N", "film")]))
        self.assertEqual(t.type, "b")
        for bad in [{"label": "X"}, {"children": []}, {"word": "a", "children": [{"word": "b"}]},
                    {"word": 3}, {"children": [{"word": "a"}], "type": "c"}, ["x"]]:
            with self.assertRaises(R.RefError, msg=repr(bad)):
                R.parse_tree_instance({"tree": bad})

    def test_deep_tree_no_recursion(self):
        depth = 20000
        s = "(X " * depth + "(W w)" + ")" * depth
        t = R.parse_bracketed(s)
        self.assertEqual(len(R.preorder(t)), depth + 1)


# ---------------------------------------------------------------------------
class TreeFamiliesTest(TmpDirCase):
    def treelstm_leaf(self, t, x):
        H = t["leaf.b"].shape[0] // 3
        W, b = t["leaf.W"], t["leaf.b"]
        i = sg(rows(W, 0, 3) @ x + b[:H])
        o = sg(rows(W, 1, 3) @ x + b[H:2 * H])
        u = np.tanh(rows(W, 2, 3) @ x + b[2 * H:])
        c = i * u
        return o * np.tanh(c), c

    def treelstm_internal(self, t, pre, l, r):
        U, b = t[pre + ".U"], t[pre + ".b"]
        hh = np.concatenate([l[0], r[0]])
        g = [rows(U, k, 5) @ hh + rows(b[:, None], k, 5)[:, 0] for k in range(5)]
        c = sg(g[0]) * np.tanh(g[4]) + sg(g[1]) * l[1] + sg(g[2]) * r[1]
        return sg(g[3]) * np.tanh(c), c

    def test_treelstm_one_leaf(self):
        m, t = self.model("treelstm", H=3, D=2, C=4, vocab=["a", "b"], seed=1)
        res = m.run({"tree": "(X b)"}, "all", True)
        h, _ = self.treelstm_leaf(t, t["embed"][2])
        logits = t["out.W"] @ h + t["out.b"]
        self.close(res["logits"], logits)
        self.close(res["h"], h)
        self.assertEqual(res["label"], int(np.argmax(logits)))
        self.assertEqual(len(res["nodes"]), 1)
        self.assertNotIn("label_name", res)

    def test_treelstm_two_leaves_and_unary(self):
        m, t = self.model("treelstm", H=3, D=2, C=4, vocab=["a", "b"], seed=2, labels=True)
        res = m.run({"tree": "(S (A a) (B zzz))"}, "all", True)
        la = self.treelstm_leaf(t, t["embed"][1])
        lb = self.treelstm_leaf(t, t["embed"][0])  # unknown word -> id 0
        root = self.treelstm_internal(t, "internal", la, lb)
        for k, hs in enumerate([root[0], la[0], lb[0]]):
            lg = t["out.W"] @ hs + t["out.b"]
            self.close(res["nodes"][k]["logits"], lg)
            self.assertEqual(res["nodes"][k]["label"], int(np.argmax(lg)))
            self.assertEqual(res["nodes"][k]["label_name"], "L%d" % int(np.argmax(lg)))
        self.close(res["h"], root[0])
        self.assertEqual(res["label_name"], "L%d" % res["label"])
        un = m.run({"tree": "(S (A a))"}, "root", True)
        z = (np.zeros(3), np.zeros(3))
        self.close(un["h"], self.treelstm_internal(t, "internal", la, z)[0])

    def test_treelstm_arity(self):
        m, _ = self.model("treelstm", H=2, D=2, C=2)
        with self.assertRaises(R.RefError) as cm:
            m.run({"tree": "(S (A a) (B b) (C c))"})
        self.assertEqual(cm.exception.code, "too_many_children")

    def test_treelstm_2type(self):
        m, t = self.model("treelstm-2type", H=3, D=2, C=2, vocab=["a", "b"], seed=3,
                          type_b_labels=["NP"])
        la = self.treelstm_leaf(t, t["embed"][1])
        lb = self.treelstm_leaf(t, t["embed"][2])
        ha = self.treelstm_internal(t, "internal_a", la, lb)[0]
        hb = self.treelstm_internal(t, "internal_b", la, lb)[0]
        self.assertGreater(np.max(np.abs(ha - hb)), 1e-3)
        self.close(m.run({"tree": "(NP (A a) (B b))"}, "root", True)["h"], hb)
        self.close(m.run({"tree": "(VP (A a) (B b))"}, "root", True)["h"], ha)
        self.close(m.run({"tree": "((A a) (B b))"}, "root", True)["h"], ha)
        kids = [{"word": "a"}, {"word": "b"}]
        self.close(m.run({"tree": {"type": "b", "children": kids}}, "root", True)["h"], hb)
        self.close(m.run({"tree": {"label": "VP", "type": "b", "children": kids}}, "root", True)["h"], hb)
        self.close(m.run({"tree": {"label": "NP", "type": "a", "children": kids}}, "root", True)["h"], ha)
        self.close(m.run({"tree": {"label": "NP", "children": kids}}, "root", True)["h"], ha)

    def test_treegru(self):
        m, t = self.model("treegru", H=3, D=2, C=2, vocab=["a", "b"], seed=4)
        res = m.run({"tree": "(S (A a) (B b))"}, "root", True)
        leaf = lambda w: np.tanh(t["leaf.W"] @ t["embed"][w] + t["leaf.b"])
        h1, h2 = leaf(1), leaf(2)
        hh = np.concatenate([h1, h2])
        r1 = sg(rows(t["internal.Ug"], 0, 3) @ hh + t["internal.bg"][0:3])
        r2 = sg(rows(t["internal.Ug"], 1, 3) @ hh + t["internal.bg"][3:6])
        z = sg(rows(t["internal.Ug"], 2, 3) @ hh + t["internal.bg"][6:9])
        n = np.tanh(t["internal.Un"] @ np.concatenate([r1 * h1, r2 * h2]) + t["internal.bn"])
        h = z * (h1 + h2) / 2 + (1 - z) * n
        self.close(res["h"], h)
        self.close(res["logits"], t["out.W"] @ h + t["out.b"])

    def test_childsum(self):
        m, t = self.model("childsum-treelstm", H=3, D=2, C=2, vocab=["a", "b", "c"], seed=5)
        W, U, b = t["cell.W"], t["cell.U"], t["cell.b"]
        bb = b[:, None]

        def cell(x, kids):
            hs = sum((k[0] for k in kids), np.zeros(3))
            i = sg(rows(W, 0, 4) @ x + rows(U, 0, 4) @ hs + rows(bb, 0, 4)[:, 0])
            o = sg(rows(W, 2, 4) @ x + rows(U, 2, 4) @ hs + rows(bb, 2, 4)[:, 0])
            u = np.tanh(rows(W, 3, 4) @ x + rows(U, 3, 4) @ hs + rows(bb, 3, 4)[:, 0])
            c = i * u
            for hk, ck in kids:
                c = c + sg(rows(W, 1, 4) @ x + rows(U, 1, 4) @ hk + rows(bb, 1, 4)[:, 0]) * ck
            return o * np.tanh(c), c

        leaves = [cell(t["embed"][w], []) for w in (1, 2, 3)]
        inner = cell(np.zeros(2), leaves[1:])
        root = cell(np.zeros(2), [leaves[0], inner, leaves[2]])
        res = m.run({"tree": "(S (X a) (Y (X b) (X c)) (Z c))"}, "all", True)
        self.close(res["h"], root[0])
        self.close(res["nodes"][2]["logits"], t["out.W"] @ inner[0] + t["out.b"])
        self.assertEqual(len(res["nodes"]), 6)

    def test_mvrnn(self):
        m, t = self.model("mvrnn", H=3, D=3, C=2, vocab=["a", "b", "c"], seed=6, K=2)
        E, M = t["embed"], t["leaf.M"]
        la = (E[1], M[1])          # id 1 < K
        lc = (E[3], M[0])          # id 3 >= K -> leaf.M[0]

        def comb(l, r):
            (a, A), (b, B) = l, r
            p = np.tanh(t["internal.W"] @ np.concatenate([B @ a, A @ b]) + t["internal.b"])
            P = t["internal.WM"] @ np.vstack([A, B])
            return p, P

        ac = comb(la, lc)
        un = comb(ac, (np.zeros(3), np.eye(3)))
        res = m.run({"tree": "(S (T (A a) (C c)))"}, "all", True)
        self.close(res["h"], un[0])
        self.close(res["nodes"][1]["logits"], t["out.W"] @ ac[0] + t["out.b"])
        self.close(res["nodes"][3]["logits"], t["out.W"] @ E[3] + t["out.b"])
        leaf_only = m.run({"tree": "(A a)"}, "root", True)
        self.close(leaf_only["h"], E[1])

    def test_outputs_all_preorder_matches_subtrees(self):
        m, _ = self.model("treelstm", H=4, D=3, C=3, vocab=["a", "b", "c", "d"], seed=7)
        full = m.run({"tree": "(S (X (A a) (B b)) (Y (C c) (D d)))"}, "all")
        sub = m.run({"tree": "(Y (C c) (D d))"}, "root")
        self.close(full["nodes"][4]["logits"], sub["logits"])
        self.close(full["nodes"][0]["logits"], full["logits"])


# ---------------------------------------------------------------------------
def lstm64(t, pre, x, h, c):
    g = t[pre + ".W_ih"] @ x + t[pre + ".b_ih"] + t[pre + ".W_hh"] @ h + t[pre + ".b_hh"]
    H = h.shape[0]
    i, f, gg, o = g[:H], g[H:2 * H], g[2 * H:3 * H], g[3 * H:]
    c2 = sg(f) * c + sg(i) * np.tanh(gg)
    return sg(o) * np.tanh(c2), c2


class SequenceFamiliesTest(TmpDirCase):
    def test_bilstm(self):
        m, t = self.model("bilstm-tagger", H=3, D=2, C=4, vocab=["the", "cat"], seed=8,
                          labels=["A", "B", "C", "D"], lowercase=True)
        res = m.run({"text": "The  cat\u00a0DOG"}, return_hidden=True)
        ids = [1, 2, 0]
        xs = [t["embed"][i] for i in ids]
        z = np.zeros(3)
        hf, (h, c) = [], (z, z)
        for x in xs:
            h, c = lstm64(t, "fwd", x, h, c)
            hf.append(h)
        hb, (h, c) = [None] * 3, (z, z)
        for k in (2, 1, 0):
            h, c = lstm64(t, "bwd", xs[k], h, c)
            hb[k] = h
        for k in range(3):
            hk = np.concatenate([hf[k], hb[k]])
            self.close(res["h"][k], hk)
            lg = t["out.W"] @ hk + t["out.b"]
            self.close(res["logits"][k], lg)
            self.assertEqual(res["tags"][k], int(np.argmax(lg)))
            self.assertEqual(res["tag_names"][k], "ABCD"[res["tags"][k]])
        self.assertEqual(m.run({"tokens": []})["tags"], [])

    def test_bilstm_crf_against_brute_force(self):
        """The reference's Viterbi against every tag path, scored in float64."""
        import itertools
        rs = np.random.RandomState(21)
        for case in range(30):
            C = 2 + case % 4
            m, t = self.model("bilstm-tagger", H=3, D=2, C=C, vocab=["a", "b", "c"], seed=30 + case,
                              tag=case, crf=True, scale=2.0)
            self.assertTrue(m.crf)
            toks = [str(x) for x in rs.choice(["a", "b", "c", "zz"], size=1 + case % 6)]
            res = m.run({"tokens": toks})
            e = np.asarray(res["logits"], dtype=np.float64)

            def score(y):
                return (t["crf.start"][y[0]] + t["crf.end"][y[-1]] + sum(e[k][y[k]] for k in range(len(y)))
                        + sum(t["crf.trans"][y[k - 1], y[k]] for k in range(1, len(y))))
            best = max(itertools.product(range(C), repeat=len(toks)), key=score)
            self.assertEqual(res["tags"], list(best), "case %d" % case)
            self.close([res["path_score"]], [score(best)], tol=1e-4)
        # trans[i, j] is tag j after tag i: only 1 -> 0 pays, so the path is 1, 0
        m, t = self.model("bilstm-tagger", H=3, D=2, C=2, vocab=["a"], seed=3, tag="dir", crf=True,
                          tensors={"out.W": np.zeros((2, 6)), "out.b": np.zeros(2),
                                   "crf.start": np.zeros(2), "crf.end": np.zeros(2),
                                   "crf.trans": np.array([[0.0, 0.0], [5.0, 0.0]])})
        res = m.run({"tokens": ["a", "a"]})
        self.assertEqual((res["tags"], float(res["path_score"])), ([1, 0], 5.0))
        # all paths tie: the lowest final tag, then the lowest previous tags
        res = m.run({"tokens": ["a"]})
        self.assertEqual(res["tags"], [0])

    def test_crf_key_checked(self):
        # on a tree family; on a tagger whose weights have no transitions
        for name, family in (("crf-tree", "treelstm"),
                             ("crf-missing", "bilstm-tagger")):
            with self.subTest(family):
                d = os.path.join(self.tmp, name)
                R.write_model(d, family, H=2, D=2, C=2, seed=1)
                with open(os.path.join(d, "model.json")) as f:
                    cfg = json.load(f)
                cfg["crf"] = True
                with open(os.path.join(d, "model.json"), "w") as f:
                    json.dump(cfg, f)
                self.assertRaises(R.LoadError, R.Model, d)

    def test_nmt(self):
        m, t = self.model("lstm-nmt", H=3, D=2, vocab=["x", "y"], tgt_vocab=["p", "q", "r"],
                          seed=9, scale=1.0, max_decode_len=7)
        for req in (None, 3, 100, 0):
            res = m.run({"tokens": ["x", "y", "nope"]}, return_hidden=True, max_decode_len=req)
            cap = min(7 if req is None else req, 7)
            z = np.zeros(3)
            h, c = z, z
            for i in (1, 2, 0):
                h, c = lstm64(t, "enc", t["src_embed"][i], h, c)
            y, ids, stopped = 1, [], False
            for _ in range(cap):
                h, c = lstm64(t, "dec", t["tgt_embed"][y], h, c)
                lg = t["proj.W"] @ h + t["proj.b"]
                y = int(np.argmax(lg))
                if y == 2:
                    stopped = True
                    break
                ids.append(y)
            self.assertEqual(res["output_ids"], ids, "req %r" % req)
            self.assertEqual(res["output_tokens"], [["<unk>", "<s>", "</s>", "p", "q", "r"][i] for i in ids])
            self.assertEqual(res["_stopped_eos"], stopped)
            self.assertEqual(len(res["_margins"]), len(ids) + (1 if stopped else 0))
            self.close(res["h"], h)

    def test_nmt_stops_at_eos(self):
        m, t = self.model("lstm-nmt", H=3, D=2, seed=10, tensors={
            "proj.W": np.zeros((12, 3)), "proj.b": np.array([0, 0, 5] + [0] * 9)})
        res = m.run({"tokens": ["w1"]})
        self.assertEqual(res["output_ids"], [])
        self.assertTrue(res["_stopped_eos"])
        m2, _ = self.model("lstm-nmt", H=3, D=2, seed=10, tag="b", tensors={
            "proj.W": np.zeros((12, 3)), "proj.b": np.array([0, 0, 0, 1, 1] + [0] * 7)})
        res = m2.run({"tokens": ["w1"]})  # tie between 3 and 4: lowest id; default cap 50
        self.assertEqual(res["output_ids"], [3] * 50)
        self.assertEqual(res["_margins"][0], 0.0)


# ---------------------------------------------------------------------------
class LatticeTest(TmpDirCase):
    def test_find_spans_vs_brute_force(self):
        rnd = random.Random(11)
        for trial in range(200):
            alphabet = "abc"
            lex_words = set("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 5)))
                            for _ in range(rnd.randint(0, 12)))
            lex = R.Lexicon(lex_words)
            chars = [rnd.choice(alphabet + "AB") for _ in range(rnd.randint(0, 14))]
            lower = trial % 2 == 0
            norm = R.ascii_lower if lower else (lambda s: s)
            brute = sorted((b, e) for b in range(len(chars)) for e in range(len(chars) + 1)
                           if e - b >= 2 and norm("".join(chars[b:e])) in lex_words)
            self.assertEqual(R.find_spans(chars, lex, norm), brute)

    def test_find_spans_data_line(self):
        lex = R.load_lexicon(os.path.join(DATA, "lexicon.txt"))
        with open(os.path.join(DATA, "lattices.jsonl")) as f:
            inst = json.loads(f.readline())
        got = R.find_spans(inst["chars"], lex)
        want = sorted((w["start"], w["end"]) for w in inst["words"])
        self.assertEqual(got, want)

    def lattice_by_hand(self, t, cids, words, H):
        """words: list of (b, e, word id)."""
        E = t["embed"]
        hs, cs = [], []
        h, c = np.zeros(H), np.zeros(H)
        for j, cid in enumerate(cids):
            x = E[cid]
            g = t["char.W"] @ np.concatenate([x, h]) + t["char.b"]
            i, f, o, u = g[:H], g[H:2 * H], g[2 * H:3 * H], g[3 * H:]
            ends = [w for w in words if w[1] == j + 1]
            if not ends:
                c = sg(f) * c + sg(i) * np.tanh(u)
            else:
                num = np.exp(sg(i)) * np.tanh(u)
                den = np.exp(sg(i))
                for (b, e, wid) in ends:
                    wg = t["word.W"] @ np.concatenate([t["word_embed"][wid], hs[b]]) + t["word.b"]
                    cw = sg(wg[H:2 * H]) * cs[b] + sg(wg[:H]) * np.tanh(wg[2 * H:])
                    l = sg(t["link.W"] @ np.concatenate([x, cw]) + t["link.b"])
                    num = num + np.exp(l) * cw
                    den = den + np.exp(l)
                c = num / den
            h = sg(o) * np.tanh(c)
            hs.append(h)
            cs.append(c)
        return hs

    def test_latticelstm(self):
        m, t = self.model("latticelstm", H=3, D=2, C=3, vocab=["a", "b", "c"], Dw=4,
                          word_vocab=["ab", "abc", "bc", "zz"], lexicon=["ab", "bc", "abc", "ca"],
                          seed=12, labels=True, lowercase=True)
        # explicit words with tokens
        res = m.run({"text": "Abc", "words": [{"start": 0, "end": 2}, {"start": 0, "end": 3, "token": "zz"},
                                              {"start": 1, "end": 3}]}, return_hidden=True)
        hs = self.lattice_by_hand(t, [1, 2, 3], [(0, 2, 1), (0, 3, 4), (1, 3, 3)], 3)
        for j in range(3):
            self.close(res["h"][j], hs[j])
            lg = t["out.W"] @ hs[j] + t["out.b"]
            self.close(res["logits"][j], lg)
            self.assertEqual(res["tags"][j], int(np.argmax(lg)))
        self.assertEqual(res["tag_names"], ["L%d" % k for k in res["tags"]])
        # lexicon spans: "abca" lowercased -> ab, abc, bc, ca
        res2 = m.run({"chars": ["a", "B", "c", "a"]}, return_hidden=True)
        hs2 = self.lattice_by_hand(t, [1, 2, 3, 1], [(0, 2, 1), (0, 3, 2), (1, 3, 3), (2, 4, 0)], 3)
        for j in range(4):
            self.close(res2["h"][j], hs2[j])
        # "words": [] means no words: plain LSTM-like chain
        res3 = m.run({"text": "abc", "words": []}, return_hidden=True)
        hs3 = self.lattice_by_hand(t, [1, 2, 3], [], 3)
        self.close(res3["h"], hs3)
        for bad in ([{"start": 0, "end": 1}], [{"start": 2, "end": 4}], [{"start": -1, "end": 1}],
                    [{"start": 0}], "x"):
            with self.assertRaises(R.RefError) as cm:
                m.run({"text": "abc", "words": bad})
            self.assertEqual(cm.exception.code, "bad_lattice")

    def test_latticegru_two_nodes(self):
        m, t = self.model("latticegru", H=3, D=2, C=2, vocab=["a", "b"], seed=13)

        def gru(x, h):
            gx = t["gru.W_ih"] @ x + t["gru.b_ih"]
            gh = t["gru.W_hh"] @ h + t["gru.b_hh"]
            r = sg(gx[:3] + gh[:3])
            z = sg(gx[3:6] + gh[3:6])
            n = np.tanh(gx[6:] + r * gh[6:])
            return (1 - z) * n + z * h

        res = m.run({"nodes": [{"token": "a", "prev": []}, {"token": "b", "prev": [0]}]},
                    return_hidden=True)
        h0 = gru(t["embed"][1], np.zeros(3))
        h1 = gru(t["embed"][2], h0)
        self.close(res["h"], h1)
        self.close(res["logits"], t["out.W"] @ h1 + t["out.b"])
        res = m.run({"nodes": [{"token": "a", "prev": []}, {"token": "b", "prev": []},
                               {"token": "q", "prev": [0, 1]}]}, return_hidden=True)
        h2 = gru(t["embed"][0], (gru(t["embed"][1], np.zeros(3)) + gru(t["embed"][2], np.zeros(3))) / 2)
        self.close(res["h"], h2)
        for bad in ([], [{"token": "a", "prev": [0]}],
                    [{"token": "a", "prev": []}, {"token": "b", "prev": []}]):
            with self.assertRaises(R.RefError):
                m.run({"nodes": bad})


# ---------------------------------------------------------------------------
class OutputTest(TmpDirCase):
    def test_float_formatting_roundtrips_float32(self):
        v = np.random.RandomState(0).randn(100).astype(np.float32) * np.float32(1e3)
        back = np.array(json.loads(R.to_json(v)), dtype=np.float32)
        self.assertTrue(np.array_equal(back, v))
        self.assertEqual(R.to_json({"a": [1, np.float32(0.5)], "b": "x\"y"}), '{"a":[1,0.5],"b":"x\\"y"}')

    def test_cli_all_families_on_data(self):
        data = DATA
        inputs = {"treelstm": "trees-binary", "treelstm-2type": "trees-binary", "treegru": "trees-binary",
                  "mvrnn": "trees-binary", "childsum-treelstm": "trees-nary",
                  "bilstm-tagger": "sequences", "lstm-nmt": "sequences", "latticelstm": "lattices",
                  "latticegru": "dags"}
        for fam, name in inputs.items():
            src = os.path.join(data, name + ".jsonl")
            inp = os.path.join(self.tmp, name + ".jsonl")
            with open(src) as f, open(inp, "w") as g:
                for _ in range(5):
                    g.write(f.readline())
            d = os.path.join(self.tmp, "cli-" + fam)
            mk = [PY, os.path.join(HERE, "canopy_ref.py"), "--make-model", d, "--family", fam,
                  "--hidden", "4", "--embed", "4", "--classes", "3", "--vocab-from", inp, "--labels"]
            if fam == "latticelstm":
                mk += ["--lexicon", os.path.join(data, "lexicon.txt")]
            subprocess.check_call(mk)
            out = subprocess.check_output([PY, os.path.join(HERE, "canopy_ref.py"), "--model", d,
                                           "--input", inp, "--outputs", "all", "--return-hidden"])
            lines = out.decode().strip().split("\n")
            self.assertEqual(len(lines), 5, fam)
            for l in lines:
                o = json.loads(l)
                self.assertNotIn("error", o, fam)
                self.assertIn("h", o, fam)
                self.assertFalse(any(k.startswith("_") for k in o))
                if fam in R.TREE_FAMILIES:
                    self.assertEqual(o["nodes"][0]["logits"], o["logits"])
                    self.assertIn("label_name", o["nodes"][-1])

    def test_compare_against_fake_canopy(self):
        """compare.py accepts a canopy that agrees and rejects one that does not."""
        d = os.path.join(self.tmp, "cmp-model")
        R.write_model(d, "treelstm", H=4, D=3, C=3, vocab=["a", "b", "c"], labels=True, seed=14)
        inp = os.path.join(self.tmp, "in.jsonl")
        with open(inp, "w") as f:
            for s in ["(S (A a) (B b))", "(S (A a) (X (B b) (C c)))", "(C c)", "(S (A a) b c)"]:
                f.write(json.dumps({"tree": s}) + "\n")
        fake = os.path.join(self.tmp, "fake-canopy")
        with open(fake, "w") as f:
            f.write("""#!%s
import json, os, sys
sys.path.insert(0, %r)
import canopy_ref as R
a = sys.argv[2:]
args = [x for x in a if x != "--return-hidden"]
opt = dict(zip(args[::2], args[1::2]))
m = R.Model(opt["--model"])
delta = float(os.environ.get("FAKE_DELTA", "0"))
drop = os.environ.get("FAKE_DROP") == "1"
lines = R.read_lines(opt["--input"])
if drop: lines = lines[:-1]
for i, l in enumerate(lines):
    r = R.run_line(m, l, i, opt["--outputs"], "--return-hidden" in a)
    r = R.to_plain({k: v for k, v in r.items() if not k.startswith("_")})
    if "logits" in r and int(opt["--batch"]) > 1:
        r["logits"][0] += delta
    print(json.dumps(r))
sys.stderr.write(json.dumps({"batches": 3, "lower_bound": 3}) + "\\n")
""" % (PY, HERE))
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
        cmd = [PY, os.path.join(HERE, "compare.py"), "--canopy", fake, "--model", d, "--input", inp,
               "--outputs", "all", "--return-hidden", "--policies", "none,depth", "--batch", "1,7"]
        env = dict(os.environ)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 0, p.stdout.decode() + p.stderr.decode())
        self.assertIn("3/3", p.stdout.decode())
        env["FAKE_DELTA"] = "3e-4"
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 1, p.stdout.decode())
        env["FAKE_DELTA"] = "5e-5"
        p = subprocess.run(cmd + ["--limit", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 0, p.stdout.decode() + p.stderr.decode())
        env["FAKE_DELTA"] = "0"
        env["FAKE_DROP"] = "1"
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 1, p.stdout.decode())


class CompareNmtTest(TmpDirCase):
    def test_near_tie_cut(self):
        sys.path.insert(0, HERE)
        import compare
        m, _ = self.model("lstm-nmt", H=2, D=2, seed=15)
        ref = {"output_ids": [5, 6, 7], "output_tokens": ["t3", "t4", "t5"],
               "_margins": [0.5, 0.5, 1e-4, 0.3], "_stopped_eos": True, "h": [0.0, 0.0]}
        ok = {"output_ids": [5, 6, 9, 9], "output_tokens": ["t3", "t4", "t7", "t7"], "h": [1.0, 1.0]}
        self.assertEqual(compare.compare_instance(m, ref, ok, 1e-4, 1e-5, 50).problems, [])
        bad = {"output_ids": [5, 8, 7], "output_tokens": ["t3", "t6", "t5"], "h": [0.0, 0.0]}
        self.assertNotEqual(compare.compare_instance(m, ref, bad, 1e-4, 1e-5, 50).problems, [])
        short = {"output_ids": [5], "output_tokens": ["t3"], "h": [0.0, 0.0]}
        self.assertNotEqual(compare.compare_instance(m, ref, short, 1e-4, 1e-5, 50).problems, [])
        ref2 = dict(ref, _margins=[0.5, 0.5, 0.5, 0.5])
        same = {"output_ids": [5, 6, 7], "output_tokens": ["t3", "t4", "t5"], "h": [0.0, 0.00005]}
        self.assertEqual(compare.compare_instance(m, ref2, same, 1e-4, 1e-5, 50).problems, [])
        hoff = dict(same, h=[0.0, 0.001])
        self.assertNotEqual(compare.compare_instance(m, ref2, hoff, 1e-4, 1e-5, 50).problems, [])
        capped = {"output_ids": [5, 6, 7], "output_tokens": ["t3", "t4", "t5"], "h": [0.0, 0.0]}
        # reference stopped at </s> after 3 ids; a canopy capped at 3 never emitted it
        self.assertNotEqual(compare.compare_instance(m, ref2, capped, 1e-4, 1e-5, 3).problems, [])

    def test_label_tie_tolerance(self):
        sys.path.insert(0, HERE)
        import compare
        m, _ = self.model("latticegru", H=2, D=2, C=3, seed=16, labels=True)
        ref = {"logits": [0.1, 0.3, 0.3 - 1e-6], "label": 1, "label_name": "L1"}
        tie = {"logits": [0.1, 0.3, 0.3], "label": 2, "label_name": "L2"}
        c = compare.compare_instance(m, ref, tie, 1e-4, 1e-5, None)
        self.assertEqual((c.problems, c.ties), ([], 1))
        self.assertNotEqual(compare.compare_instance(m, ref, tie, 1e-4, 0.0, None).problems, [])
        wrong_name = dict(tie, label_name="L1")
        self.assertNotEqual(compare.compare_instance(m, ref, wrong_name, 1e-4, 1e-5, None).problems, [])


if __name__ == "__main__":
    unittest.main()
