#!/usr/bin/python3
"""Compare `canopy run` against the float32 reference (canopy_ref.py).

  compare.py --canopy BUILD/canopy --model DIR --input FILE.jsonl
             [--outputs root|all] [--return-hidden] [--max-decode-len N]
             [--policies none,depth,agenda] [--batch 1,7,64] [--tol 1e-4]
             [--tie-tol 1e-5] [--limit N] [--timeout S] [--show N]
             [--canopy-arg ARG ...]

Runs the reference once, then `canopy run --model DIR --input FILE
--outputs X [--return-hidden] [--max-decode-len N] --policy P --batch B`
for every policy and batch size.  canopy prints one JSON object per input
line on stdout (in input order) and a JSON summary line last on stderr.

Every numeric field ("logits", "h", per node and per token) is compared
elementwise to --tol (absolute).  Labels, tags, label names, error codes and
lstm-nmt tokens are compared exactly, with two allowances that keep the test
about arithmetic, not about luck:
  * a label/tag that differs from the reference's is accepted (counted as a
    "tie") when the reference logit of canopy's choice is within --tie-tol of
    the reference maximum (a genuine near tie; --tie-tol 0 makes it strict);
  * a CRF tagger's (model.json "crf") tag path that differs from the
    reference's is accepted when the reference's score of canopy's path is
    within --tie-tol of the reference's best path score; "path_score" is a
    number compared to --tol;
  * lstm-nmt output ids are compared only up to the first decoder step whose
    reference top-2 logit margin is <= 1e-3 (that step and later ones may
    legitimately differ); "h" is then not compared.  Without such a step the
    whole output (ids, tokens, and the stop at </s> or at the cap) must match.

Exit status 0 when every run matches, 1 on any mismatch, missing or extra
output line, or canopy failure.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canopy_ref  # noqa: E402

NMT_MARGIN = 1e-3
TAGGER_FAMILIES = ("bilstm-tagger", "latticelstm")
# fields the reference emits that the API does not promise for a family:
# compared when canopy sends them, not required.
OPTIONAL_FIELDS = {"bilstm-tagger": ("logits",), "latticelstm": ("logits",)}
# fields canopy may send that the reference does not check for a family
IGNORED_EXTRA = {"lstm-nmt": ("logits",)}


class Cmp(object):
    """Accumulates the comparison of one instance."""

    def __init__(self, tol, tie_tol, labels):
        self.tol = tol
        self.tie_tol = tie_tol
        self.labels = labels
        self.maxdiff = 0.0
        self.problems = []
        self.ties = 0

    def bad(self, where, what):
        self.problems.append("%s: %s" % (where, what))

    def numbers(self, where, ref, got):
        if isinstance(ref, list):
            if not isinstance(got, list):
                self.bad(where, "expected a list, got %s" % _short(got))
                return
            if len(ref) != len(got):
                self.bad(where, "length %d, reference %d" % (len(got), len(ref)))
                return
            for k, (r, g) in enumerate(zip(ref, got)):
                self.numbers("%s[%d]" % (where, k), r, g)
            return
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            self.bad(where, "expected a number, got %s" % _short(got))
            return
        r, g = float(ref), float(got)
        if math.isnan(r) or math.isnan(g):
            if not (math.isnan(r) and math.isnan(g)):
                self.bad(where, "NaN mismatch (canopy %r, reference %r)" % (g, r))
            return
        if math.isinf(r) or math.isinf(g):
            if r != g:
                self.bad(where, "canopy %r, reference %r" % (g, r))
            return
        d = abs(r - g)
        if d > self.maxdiff:
            self.maxdiff = d
        if d > self.tol:
            self.bad(where, "canopy %r, reference %r (|diff| %.3g > %g)" % (g, r, d, self.tol))

    def label(self, where, ref_label, got_label, ref_logits):
        if isinstance(got_label, bool) or not isinstance(got_label, int):
            self.bad(where, "expected an integer label, got %s" % _short(got_label))
            return False
        if got_label == ref_label:
            return True
        if 0 <= got_label < len(ref_logits) and \
                ref_logits[got_label] >= ref_logits[ref_label] - self.tie_tol:
            self.ties += 1
            return True
        self.bad(where, "label %d, reference %d" % (got_label, ref_label))
        return False

    def label_name(self, where, got_label, got_name):
        if self.labels is None:
            if got_name is not None:
                self.bad(where, "label name %r but the model has no labels" % (got_name,))
            return
        want = self.labels[got_label] if isinstance(got_label, int) and \
            0 <= got_label < len(self.labels) else None
        if got_name != want:
            self.bad(where, "label name %r, expected %r" % (got_name, want))


def _short(v):
    s = json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."


def compare_classified(c, where, ref, got):
    """A dict with logits, label, label_name (root or one tree node)."""
    c.numbers(where + ".logits", ref["logits"], got.get("logits"))
    if "label" not in got:
        c.bad(where, "no \"label\"")
        return
    if c.label(where + ".label", ref["label"], got["label"], ref["logits"]):
        if "label_name" in ref or "label_name" in got:
            c.label_name(where + ".label_name", got["label"], got.get("label_name"))


def compare_instance(model, ref, got, tol, tie_tol, cap):
    """Return a Cmp for one instance (ref: reference dict with private keys)."""
    c = Cmp(tol, tie_tol, model.labels)
    fam = model.family
    if "error" in ref:
        if not isinstance(got, dict) or "error" not in got:
            c.bad("error", "reference rejects the instance (%s: %s); canopy answered %s"
                  % (ref["error"]["code"], ref["error"]["message"], _short(got)))
        elif not isinstance(got["error"], dict) or got["error"].get("code") != ref["error"]["code"]:
            c.bad("error", "code %s, reference %s (%s)"
                  % (_short(got["error"]), ref["error"]["code"], ref["error"]["message"]))
        return c
    if not isinstance(got, dict):
        c.bad("line", "not a JSON object: %s" % _short(got))
        return c
    if "error" in got:
        c.bad("error", "canopy rejected the instance: %s" % _short(got["error"]))
        return c
    public = [k for k in ref if not k.startswith("_")]
    optional = OPTIONAL_FIELDS.get(fam, ())
    for k in public:
        if k not in got and k not in optional:
            c.bad(k, "missing")
    for k in got:
        if k not in ref and k not in IGNORED_EXTRA.get(fam, ()):
            c.bad(k, "unexpected field")

    if fam == "lstm-nmt":
        compare_nmt(c, ref, got, cap)
        return c

    if "label" in ref:                       # trees, latticegru
        compare_classified(c, "root", ref, got)
    if "nodes" in ref and isinstance(got.get("nodes"), list):
        if len(got["nodes"]) != len(ref["nodes"]):
            c.bad("nodes", "%d nodes, reference %d" % (len(got["nodes"]), len(ref["nodes"])))
        else:
            for k, (rn, gn) in enumerate(zip(ref["nodes"], got["nodes"])):
                if not isinstance(gn, dict):
                    c.bad("nodes[%d]" % k, "not an object")
                    continue
                for f in gn:
                    if f not in rn:
                        c.bad("nodes[%d].%s" % (k, f), "unexpected field")
                compare_classified(c, "nodes[%d]" % k, rn, gn)
    if "tags" in ref and isinstance(got.get("tags"), list):
        if "logits" in got:
            c.numbers("logits", ref["logits"], got["logits"])
        if len(got["tags"]) != len(ref["tags"]):
            c.bad("tags", "%d tags, reference %d" % (len(got["tags"]), len(ref["tags"])))
        else:
            names = got.get("tag_names")
            if "tag_names" in ref and (not isinstance(names, list) or len(names) != len(ref["tags"])):
                c.bad("tag_names", "expected %d names, got %s" % (len(ref["tags"]), _short(names)))
                names = None
            if getattr(model, "crf", False):
                compare_crf_path(c, model, ref, got)
            else:
                for t, (rt, gt) in enumerate(zip(ref["tags"], got["tags"])):
                    if c.label("tags[%d]" % t, rt, gt, ref["logits"][t]) and names is not None:
                        c.label_name("tag_names[%d]" % t, gt, names[t])
            if getattr(model, "crf", False) and names is not None:
                for t, gt in enumerate(got["tags"]):
                    c.label_name("tag_names[%d]" % t, gt, names[t])
    if "h" in ref and "h" in got:
        c.numbers("h", ref["h"], got["h"])
    return c


def compare_crf_path(c, model, ref, got):
    """Tags of a CRF tagger: the whole path is one decision."""
    c.numbers("path_score", ref["path_score"], got.get("path_score"))
    tags = got["tags"]
    C = len(ref["logits"][0])
    if not all(isinstance(y, int) and not isinstance(y, bool) and 0 <= y < C for y in tags):
        c.bad("tags", "not tag ids below %d: %s" % (C, _short(tags)))
        return
    if tags == ref["tags"]:
        return
    s = float(canopy_ref.crf_path_score(model.p, ref["logits"], tags))
    if s >= ref["path_score"] - c.tie_tol:
        c.ties += 1
    else:
        c.bad("tags", "%s, reference %s (reference scores canopy's path %r, its own %r)"
              % (_short(tags), _short(ref["tags"]), s, ref["path_score"]))


def compare_nmt(c, ref, got, cap):
    ids = got.get("output_ids")
    toks = got.get("output_tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                             for i in ids):
        c.bad("output_ids", "expected a list of integers, got %s" % _short(ids))
        return
    if not isinstance(toks, list) or len(toks) != len(ids):
        c.bad("output_tokens", "expected %d tokens, got %s" % (len(ids), _short(toks)))
        toks = None
    if len(ids) > cap:
        c.bad("output_ids", "%d ids, more than the cap %d" % (len(ids), cap))
    if canopy_ref.EOS_ID in ids:
        c.bad("output_ids", "contains </s> (id %d)" % canopy_ref.EOS_ID)
    # step sequences including the </s> that ended decoding, if any
    ref_ext = list(ref["output_ids"]) + ([canopy_ref.EOS_ID] if ref["_stopped_eos"] else [])
    got_ext = list(ids) + ([canopy_ref.EOS_ID] if len(ids) < cap else [])
    margins = ref["_margins"]
    cut = None
    for t, m in enumerate(margins):
        if m <= NMT_MARGIN:
            cut = t
            break
    if cut is None:
        if got_ext != ref_ext:
            c.bad("output_ids", "%s, reference %s" % (_short(ids), _short(ref["output_ids"])))
        elif toks is not None and toks != ref["output_tokens"]:
            c.bad("output_tokens", "%s, reference %s" % (_short(toks), _short(ref["output_tokens"])))
        if "h" in ref and "h" in got:
            c.numbers("h", ref["h"], got["h"])
    else:
        c.ties += 1
        if got_ext[:cut] != ref_ext[:cut]:
            c.bad("output_ids", "first %d steps (before a near tie at step %d) differ: %s, "
                  "reference %s" % (cut, cut, _short(got_ext[:cut]), _short(ref_ext[:cut])))
        elif toks is not None:
            n = min(cut, len(ref["output_tokens"]))
            if toks[:n] != ref["output_tokens"][:n]:
                c.bad("output_tokens", "%s, reference %s"
                      % (_short(toks[:n]), _short(ref["output_tokens"][:n])))


def run_canopy(args, input_path, policy, batch, layout="pq"):
    cmd = [args.canopy, "run", "--model", args.model, "--input", input_path,
           "--outputs", args.outputs]
    if args.return_hidden:
        cmd.append("--return-hidden")
    if args.max_decode_len is not None:
        cmd += ["--max-decode-len", str(args.max_decode_len)]
    cmd += ["--policy", policy, "--batch", str(batch)]
    if layout != "pq":
        cmd += ["--layout", layout]
    cmd += args.canopy_arg
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=args.timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return cmd, None, [], None, str(e)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    lines = [l for l in out.split("\n") if l.strip() != ""]
    summary = None
    errlines = [l for l in err.split("\n") if l.strip() != ""]
    if errlines:
        try:
            summary = json.loads(errlines[-1])
        except ValueError:
            summary = None
    return cmd, p.returncode, lines, summary, err


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare canopy run with the float32 reference")
    ap.add_argument("--canopy", required=True, help="path to the canopy binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--outputs", choices=("root", "all"), default="root")
    ap.add_argument("--return-hidden", action="store_true")
    ap.add_argument("--max-decode-len", type=int, default=None)
    ap.add_argument("--policies", default="none,depth,agenda")
    ap.add_argument("--layouts", default="pq",
                    help="comma list of canopy run --layout values (pq, naive)")
    ap.add_argument("--batch", default="1,7,64")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--tie-tol", type=float, default=1e-5,
                    help="accept a different label when the reference logits are this close (0: strict)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N input lines")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per canopy run")
    ap.add_argument("--show", type=int, default=10, help="print at most this many problems per run")
    ap.add_argument("--canopy-arg", action="append", default=[],
                    help="extra argument passed to canopy run (repeatable)")
    args = ap.parse_args(argv)

    model = canopy_ref.Model(args.model)
    lines = canopy_ref.read_lines(args.input)
    tmpdir = None
    input_path = args.input
    if args.limit is not None:
        lines = lines[:args.limit]
        tmpdir = tempfile.mkdtemp(prefix="canopy-compare-")
        input_path = os.path.join(tmpdir, "input.jsonl")
        with open(input_path, "w", encoding="utf-8") as f:
            for l in lines:
                f.write(l + "\n")
    refs = [canopy_ref.to_plain(canopy_ref.run_line(model, l, i, args.outputs, args.return_hidden,
                                                    args.max_decode_len))
            for i, l in enumerate(lines)]
    cap = model.decode_cap(args.max_decode_len) if model.family == "lstm-nmt" else None

    policies = [p for p in args.policies.split(",") if p]
    batches = [int(b) for b in args.batch.split(",") if b]
    rows = []
    failed = False
    combos = [(p, l) for l in args.layouts.split(",") if l for p in policies]
    for policy, layout in combos:
        for batch in batches:
            cmd, rc, out_lines, summary, err = run_canopy(args, input_path, policy, batch,
                                                          layout)
            mism = 0
            ties = 0
            maxdiff = 0.0
            shown = 0
            notes = []
            if rc is None:
                notes.append("could not run: %s" % err)
                mism = len(refs)
            else:
                if rc != 0:
                    notes.append("exit status %d; stderr tail: %s" % (rc, err.strip()[-300:]))
                if len(out_lines) != len(refs):
                    notes.append("%d output lines for %d input lines" % (len(out_lines), len(refs)))
                    mism += abs(len(out_lines) - len(refs))
                for i in range(min(len(out_lines), len(refs))):
                    try:
                        got = json.loads(out_lines[i])
                    except ValueError as e:
                        got = None
                        c = Cmp(args.tol, args.tie_tol, model.labels)
                        c.bad("line", "bad JSON: %s" % e)
                    else:
                        if isinstance(got, dict) and isinstance(got.get("outputs"), list) \
                                and len(got["outputs"]) == 1 and "logits" not in got:
                            got = got["outputs"][0]   # tolerate a whole response object
                        c = compare_instance(model, refs[i], got, args.tol, args.tie_tol, cap)
                    maxdiff = max(maxdiff, c.maxdiff)
                    ties += c.ties
                    if c.problems:
                        mism += 1
                        for p in c.problems:
                            if shown < args.show:
                                notes.append("line %d: %s" % (i + 1, p))
                            shown += 1
                if shown > args.show:
                    notes.append("... %d more problems" % (shown - args.show))
            bl = ""
            if isinstance(summary, dict):
                b = summary.get("batches")
                lb = summary.get("lower_bound")
                if b is not None or lb is not None:
                    bl = "%s/%s" % (b, lb)
            ok = rc == 0 and mism == 0
            failed = failed or not ok
            rows.append((policy if layout == "pq" else policy + "/" + layout, batch, len(refs), maxdiff, mism, ties, bl, "ok" if ok else "FAIL"))
            if notes:
                sys.stderr.write("[%s batch=%d] %s\n" % (policy, batch, " ".join(cmd)))
                for n in notes:
                    sys.stderr.write("  " + n + "\n")

    hdr = ("policy", "batch", "instances", "max_abs_diff", "mismatches", "ties",
           "batches/lower_bound", "result")
    print("model %s (%s), input %s, outputs=%s%s, tol %g"
          % (args.model, model.family, args.input, args.outputs,
             ", return_hidden" if args.return_hidden else "", args.tol))
    fmt = "%-12s %6s %10s %13s %11s %6s %20s %7s"
    print(fmt % hdr)
    for r in rows:
        print(fmt % (r[0], r[1], r[2], "%.3e" % r[3], r[4], r[5], r[6], r[7]))
    if tmpdir:
        try:
            os.remove(input_path)
            os.rmdir(tmpdir)
        except OSError:
            pass
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
