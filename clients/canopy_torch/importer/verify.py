"""Verification: the source architecture (the format's own PyTorch
implementation, run on the checkpoint's own tensors) against
``canopy run --outputs all --return-hidden`` on the written directory.

Each comparison records the largest absolute difference (or an agreement
count); ``Report.suspects`` turns the failing comparisons into the tensor
mappings to look at.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .common import EXIT_MISMATCH, ImportFailure


def locate_canopy(opt, script_dir=None):
    """The canopy binary to verify with: --canopy, else $CANOPY_BIN, else
    `canopy` on PATH, else a checkout's build/canopy: the checkout the
    script runs from (clients/canopy-import passes its folder as
    script_dir), or the current directory's when it is a checkout (a
    `pip install ./clients` command lives in a venv, which holds no
    build). A candidate that is named but not executable is an error, not
    skipped: --canopy or CANOPY_BIN pointing nowhere is a mistake to
    report, not a reason to verify with another binary."""
    if opt:
        cands = [("--canopy", opt)]
    elif os.environ.get("CANOPY_BIN"):
        cands = [("$CANOPY_BIN", os.environ["CANOPY_BIN"])]
    else:
        cands = [("PATH", shutil.which("canopy") or "no canopy on $PATH")]
        roots = []
        if script_dir:
            roots.append(os.path.dirname(os.path.abspath(script_dir)))
        roots.append(os.getcwd())
        for root in roots:
            b = os.path.join(root, "build", "canopy")
            if (os.path.isfile(os.path.join(root, "meson.build"))
                    and all(b != p for _, p in cands)):
                cands.append(("the checkout's build", b))
        if len(cands) == 1:
            cands.append(("a checkout's build", "not run from a checkout "
                          "(no meson.build in " + os.getcwd() + ")"))
    for where, p in cands:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise ImportFailure(
        "cannot find the canopy binary to verify with ("
        + "; ".join(f"{w}: {p}" for w, p in cands)
        + "); pass --canopy PATH, set CANOPY_BIN, put canopy on PATH, "
        "run from a checkout with build/canopy, or --no-check",
        status=EXIT_MISMATCH)


class Progress(object):
    """A progress line on stderr for a long import (so that a
    slow one does not look hung), only when
    stderr is a terminal (a log or a pipe reads as before): from `after`
    seconds in (1, or $CANOPY_PROGRESS_AFTER_S, as `canopy run`'s), at
    most 4 times a second, '\\r' rewriting it; erased by done()."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        try:
            self.after = float(os.environ.get("CANOPY_PROGRESS_AFTER_S", 1))
        except ValueError:
            self.after = 1.0
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def show(self, text, force=False):
        now = time.monotonic()
        if not self.tty or now - self.t0 < self.after or \
                (not force and now - self.last < 0.25):
            return
        self.last = now
        self.stream.write("\r\033[Kcanopy-import: " + text)
        self.stream.flush()
        self.shown = True

    def done(self):
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.shown = False


PROGRESS = Progress()


def each(insts, what="the PyTorch reference"):
    """enumerate(insts), with a progress line (PROGRESS) while it runs."""
    n = len(insts)
    for k, inst in enumerate(insts):
        PROGRESS.show(f"{what}: {k}/{n} instances")
        yield k, inst
    PROGRESS.done()


def run_canopy(canopy, model_dir, insts, extra=(), timeout=300):
    """One output object per instance (canopy run --outputs all
    --return-hidden)."""
    fd, path = tempfile.mkstemp(prefix="canopy-import-check.", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for inst in insts:
                f.write(json.dumps(inst, ensure_ascii=False) + "\n")
        cmd = [canopy, "run", "--model", model_dir, "--input", path,
               "--outputs", "all", "--return-hidden"] + list(extra)
        PROGRESS.show(f"canopy run on {len(insts)} instances", force=True)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ImportFailure(f"canopy run failed: {e}", status=EXIT_MISMATCH)
    finally:
        PROGRESS.done()
        os.unlink(path)
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode != 0 and not p.stdout:
        raise ImportFailure(
            f"canopy run (exit {p.returncode}) could not run the written "
            f"model:\n  {err[-2000:]}\n  command: {' '.join(cmd)}",
            status=EXIT_MISMATCH)
    outs = [json.loads(l) for l in p.stdout.decode("utf-8").splitlines()
            if l.strip()]
    if len(outs) != len(insts):
        raise ImportFailure(f"canopy run printed {len(outs)} results for "
                            f"{len(insts)} instances:\n  {err[-2000:]}",
                            status=EXIT_MISMATCH)
    for k, o in enumerate(outs):
        if "error" in o:
            raise ImportFailure(
                f"canopy run rejected check instance {k + 1}: "
                f"{o['error'].get('code')}: {o['error'].get('message')}",
                status=EXIT_MISMATCH)
    return outs


def _flat(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            for z in _flat(y):
                yield z
    elif hasattr(x, "tolist"):
        for z in _flat(x.tolist()):
            yield z
    else:
        yield float(x)


def _shape(x):
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [len(x)] + (_shape(x[0]) if x else [])
    return []


class Report(object):
    def __init__(self, tolerance):
        self.tol = tolerance
        self.diffs = {}     # name -> [max abs diff, count]
        self.agree = {}     # name -> [same, total]
        self.order = []
        self.notes = []

    def _name(self, name, table, init):
        if name not in table:
            table[name] = init
            self.order.append(name)
        return table[name]

    def diff(self, name, ref, got):
        d = self._name(name, self.diffs, [0.0, 0])
        if _shape(ref) != _shape(got):
            d[0] = math.inf
            self.notes.append(f"{name}: shape {_shape(got)} from canopy, "
                              f"{_shape(ref)} from the source model")
            return
        for a, b in zip(_flat(ref), _flat(got)):
            e = abs(a - b)
            if not e <= d[0]:      # NaN counts as a mismatch
                d[0] = e if e == e else math.inf
            d[1] += 1

    def count(self, name, same, total=1):
        a = self._name(name, self.agree, [0, 0])
        a[0] += int(same)
        a[1] += total

    def ok(self, name):
        if name in self.diffs:
            return self.diffs[name][0] <= self.tol
        if name in self.agree:
            return self.agree[name][0] == self.agree[name][1]
        return True

    def seen(self, name):
        return name in self.diffs or name in self.agree

    def passed(self):
        return all(self.ok(n) for n in self.order)

    def lines(self):
        out = []
        for n in self.order:
            if n in self.diffs:
                v, cnt = self.diffs[n]
                out.append(f"  {n:<44} max |diff| {v:.3g} over {cnt} values"
                           + ("" if v <= self.tol else "   MISMATCH"))
            else:
                s, t = self.agree[n]
                out.append(f"  {n:<44} {s}/{t} agree"
                           + ("" if s == t else "   MISMATCH"))
        notes = list(dict.fromkeys(self.notes))     # once each, in order
        return out + ["  note: " + n for n in notes[:5]]


def margin(logits):
    v = sorted(float(x) for x in _flat(logits))
    return v[-1] - v[-2] if len(v) > 1 else math.inf


def argmax(v):
    v = [float(x) for x in _flat(v)]
    return max(range(len(v)), key=lambda i: (v[i], -i))


# ---------------------------------------------------------------------------
# per input kind: comparisons and suspects
# ---------------------------------------------------------------------------

def compare_trees(rep, refs, outs):
    """refs: per instance {"logits": [n_nodes][C] pre-order, "leaf":
    [n_nodes] bools, "h": root h}."""
    for ref, got in zip(refs, outs):
        nodes = got.get("nodes", [])
        if len(nodes) != len(ref["logits"]):
            rep.diff("logits, leaf nodes", ref["logits"],
                     [n.get("logits") for n in nodes])
            continue
        for lg, leaf, n in zip(ref["logits"], ref["leaf"], nodes):
            rep.diff("logits, leaf nodes" if leaf else
                     "logits, internal nodes", lg, n["logits"])
        rep.diff("h (root)", ref["h"], got.get("h", []))
        for lg, n in zip(ref["logits"], nodes):
            same = argmax(lg) == n["label"]
            if same or margin(lg) > 2 * rep.tol:
                rep.count("labels (argmax, every node)", same)


def tree_suspects(rep, names):
    """names: {"embed", "leaf", "internal", "out"} -> text of the mapping."""
    leaf_ok = rep.ok("logits, leaf nodes")
    int_ok = rep.ok("logits, internal nodes")
    h_ok = rep.ok("h (root)")
    if leaf_ok and int_ok and h_ok:
        return []
    if h_ok and not (leaf_ok and int_ok):
        return [names["out"] + " (hidden states match, logits do not)"]
    if leaf_ok:
        return [names["internal"] + " (leaf nodes match, internal nodes "
                "do not)"]
    return [names["leaf"], names["embed"],
            "(leaf nodes already differ; if the leaf cell is right, "
            + names["out"] + ")"]


def compare_tagger(rep, refs, outs, crf=False):
    """refs: per instance {"logits": [n][C], "h": [n][2H], "H": H, and with
    crf "tags", "path_score"}."""
    for ref, got in zip(refs, outs):
        H = ref["H"]
        gh = got.get("h", [])
        if _shape(gh) != _shape(ref["h"]):
            rep.diff("h, forward half [:H]", ref["h"], gh)
            continue
        rep.diff("h, forward half [:H]", [r[:H] for r in ref["h"]],
                 [g[:H] for g in gh])
        rep.diff("h, backward half [H:]", [r[H:] for r in ref["h"]],
                 [g[H:] for g in gh])
        rep.diff("logits (emissions)", ref["logits"], got.get("logits", []))
        if not crf:
            for lg, t in zip(ref["logits"], got.get("tags", [])):
                same = argmax(lg) == t
                if same or margin(lg) > 2 * rep.tol:
                    rep.count("tags (argmax)", same)
        else:
            if "path_score" not in got:
                rep.count("CRF output (path_score) present", False)
                rep.notes.append("canopy printed no path_score: this canopy "
                                 "binary ignores \"crf\" (no CRF support)")
                continue
            rep.diff("CRF path score", ref["path_score"], got["path_score"])
            same = list(ref["tags"]) == list(got.get("tags", []))
            if same or abs(ref["path_score"] - ref.get("second", -math.inf)) \
                    > 2 * rep.tol:
                rep.count("CRF tags (Viterbi)", same)


def tagger_suspects(rep, names, crf=False):
    f_ok = rep.ok("h, forward half [:H]")
    b_ok = rep.ok("h, backward half [H:]")
    l_ok = rep.ok("logits (emissions)")
    t_ok = rep.ok("tags (argmax)")
    c_ok = rep.ok("CRF path score") and rep.ok("CRF tags (Viterbi)") \
        and rep.ok("CRF output (path_score) present")
    if f_ok and b_ok and l_ok and t_ok and c_ok:
        return []
    if not f_ok and not b_ok:
        return [names["embed"] + " (both directions differ)",
                names["fwd"], names["bwd"]]
    if not f_ok:
        return [names["fwd"] + " (the forward half of h differs, the "
                "backward half matches)"]
    if not b_ok:
        return [names["bwd"] + " (the backward half of h differs, the "
                "forward half matches)"]
    if not l_ok or not t_ok:
        return [names["out"] + " (h matches, logits do not)"]
    if not rep.ok("CRF output (path_score) present"):
        return ["the canopy binary has no CRF support (no path_score in its "
                "output): verify with a build that has it (--canopy)"]
    return [names["crf"] + " (logits match, the CRF's tags or path "
            "scores do not)"]


def compare_nmt(rep, refs1, outs1, refs, outs):
    """refs1/outs1: decoding capped at 1 step; refs/outs: at the check cap.
    refs: {"ids": [...], "h": [...], "margins": [...]}."""
    for r, g in zip(refs1, outs1):
        rep.diff("h after decoder step 1 (enc + dec cell)", r["h"],
                 g.get("h", []))
        same = r["ids"] == g.get("output_ids")
        if same or r["margins"][0] > 2 * rep.tol:
            rep.count("first output id", same)
    for r, g in zip(refs, outs):
        gi = g.get("output_ids", [])
        n = 0
        while n < len(r["ids"]) and n < len(gi) and r["ids"][n] == gi[n]:
            n += 1
        same = r["ids"] == gi
        # a difference right after a near-tie of the source's logits is
        # float noise, not a wrong mapping
        tie = (not same and n < len(r["margins"])
               and r["margins"][n] <= 2 * rep.tol)
        if tie:
            rep.notes.append(f"output ids part at step {n + 1} after a "
                             "near-tie (margin "
                             f"{r['margins'][n]:.2g}); not counted")
            continue
        rep.count("output ids (greedy)", same)
        if same:
            rep.diff("h (decoder, last step)", r["h"], g.get("h", []))


def nmt_suspects(rep, names):
    if rep.passed():
        return []
    if not rep.ok("h after decoder step 1 (enc + dec cell)"):
        return [names["enc"], names["dec"], names["src_embed"],
                names["tgt_embed"] + " (row <s> only so far)",
                "(the decoder's first state already differs)"]
    if not rep.ok("first output id"):
        return [names["proj"] + " (the first decoder state matches, its "
                "argmax does not)"]
    return [names["tgt_embed"], names["proj"] + " (the first step matches, "
            "later steps do not)"]


def print_report(rep, suspects, stream=sys.stderr):
    print("verification (source model vs canopy run, tolerance "
          f"{rep.tol:g}):", file=stream)
    for l in rep.lines():
        print(l, file=stream)
    if suspects:
        print("suspect mapping:", file=stream)
        for s in suspects:
            print("  - " + s, file=stream)


# ---------------------------------------------------------------------------
# drivers used by the formats
# ---------------------------------------------------------------------------

def verify_trees(conv, canopy, model_dir, insts, tolerance, node_states,
                 output, names):
    """node_states(tree) -> {id(node): h} from the source model; output(h)
    -> logits. Returns (report, suspects)."""
    from .common import tree_of
    refs = []
    for k, inst in each(insts):
        try:
            t = tree_of(inst)
            hs = node_states(t)
        except ValueError as e:
            raise ImportFailure(f"check instance {k + 1}: {e}")
        pre = t.preorder()
        refs.append({"logits": [output(hs[id(n)]) for n in pre],
                     "leaf": [n.is_leaf() for n in pre],
                     "h": hs[id(t)]})
    outs = run_canopy(canopy, model_dir, insts)
    rep = Report(tolerance)
    compare_trees(rep, refs, outs)
    return rep, tree_suspects(rep, names)
