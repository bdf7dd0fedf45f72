"""canopy-import: converts a torch.save'd state_dict of a well-known public
architecture into a Canopy model directory, and verifies the result.

Each format is one module here with NAME, FAMILY, KEYS (help text),
``convert(sd, args, vocab) -> Conversion`` and
``verify(conv, args, canopy, model_dir, insts) -> (Report, suspects)``
(+ ``sample(conv)``, the built-in check inputs).
"""
import argparse
import os
import shutil
import sys
import tempfile

from .common import (EXIT_MISMATCH, EXIT_USAGE, ImportFailure,
                     load_checkpoint, read_jsonl, read_vocab)
from . import verify as _verify
from . import dgl_treelstm, dgl_childsum, treelstm_pytorch, torch_tagger, \
    torch_seq2seq, canopy_format

FORMATS = {m.NAME: m for m in (dgl_treelstm, dgl_childsum, treelstm_pytorch,
                               torch_tagger, torch_seq2seq,
                               canopy_format)}


class Conversion(object):
    """What a format produced: the family, Canopy's tensors, the arguments
    of write_model_dir, a summary (source -> Canopy) and notes."""

    def __init__(self, family, tensors, meta, summary, notes=(), **extra):
        self.family, self.tensors, self.meta = family, tensors, meta
        self.summary, self.notes = list(summary), list(notes)
        self.__dict__.update(extra)

    def write(self, out_dir):
        from ..modeldir import write_model_dir
        try:
            return write_model_dir(out_dir, self.family, self.tensors,
                                   **self.meta)
        except ValueError as e:
            raise ImportFailure(f"writing {out_dir}: {e}")


DESCRIPTION = """\
Converts a torch.save'd state_dict of a public architecture (FORMAT) into a
Canopy model directory OUT_DIR, then verifies it: the format's own PyTorch
implementation of the source architecture runs on the checkpoint's tensors
and `canopy run --outputs all --return-hidden` runs on the written directory,
over the --check inputs (default: a deterministic sample of random trees /
sentences over the vocabulary's tokens). The largest absolute differences of
logits and hidden states (and label/tag agreement) are printed.

The directory is written to a temporary place first and moved into OUT_DIR
only when the verification passes (--keep-on-mismatch writes it anyway, for
debugging; --no-check writes without verifying). Exit status: 0 written and
verified; 1 verification failed (or canopy could not run the model), the
suspect tensor mappings are named, nothing written; 2 usage, vocabulary, key
or shape errors (an unknown key, a missing key or a shape that does not fit
is named with the shape expected), nothing written.

CHECKPOINT is a state_dict, or a dict holding one under 'state_dict', 'model'
or 'model_state_dict' (--key K names another), or a saved nn.Module.
VOCAB: one token a line, line k = id k; Canopy requires id 0 = '<unk>' (and a
target vocabulary's ids 1, 2 = '<s>', '</s>'). Files that break this are
refused, rows are never permuted. Embedding rows must equal the vocab size.

Canopy's own tensor names, shapes and equations: docs/models.md.
"""


def build_parser():
    epi = ["formats (source keys -> Canopy family):"]
    for name, m in FORMATS.items():
        epi.append("")
        epi.append(f"{name} -> {m.FAMILY}")
        epi.extend("  " + l for l in m.KEYS.strip("\n").splitlines())
    epi.append("")
    epi.append("Canopy's tensor names and equations per family: "
               "docs/models.md (in the repository).")
    p = argparse.ArgumentParser(
        prog="canopy-import", description=DESCRIPTION, epilog="\n".join(epi),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", metavar="FORMAT", choices=list(FORMATS),
                   help="one of: " + ", ".join(FORMATS))
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="torch.save'd state_dict (or a dict holding one)")
    p.add_argument("out_dir", metavar="OUT_DIR",
                   help="the model directory to write (replaced atomically)")
    g = p.add_argument_group("common options")
    g.add_argument("--vocab", required=True, metavar="VOCAB.txt",
                   help="(source) vocabulary, one token a line; id 0 = <unk>")
    g.add_argument("--labels", metavar="LABELS.txt",
                   help="class / tag names, one a line (C lines)")
    g.add_argument("--key", metavar="K",
                   help="the checkpoint key that holds the state_dict")
    g.add_argument("--lowercase", action="store_true",
                   help="the model's vocabulary is lowercase: Canopy "
                   "ASCII-lowercases every token before look-up")
    g.add_argument("--canopy", metavar="PATH",
                   help="canopy binary to verify with (default $CANOPY_BIN, "
                   "else canopy on PATH, else the checkout's build/canopy)")
    g.add_argument("--check", metavar="FILE.jsonl",
                   help="inputs (instances of docs/api.md) to verify on")
    g.add_argument("--no-check", action="store_true",
                   help="write without verifying")
    g.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest absolute difference accepted (default 1e-4)")
    g.add_argument("--keep-on-mismatch", action="store_true",
                   help="write OUT_DIR even when the verification fails "
                   "(exit status still 1)")
    g = p.add_argument_group("format options")
    g.add_argument("--head", metavar="PREFIX",
                   help="treelstm-pytorch: PREFIX.weight [C,H], PREFIX.bias "
                   "[C] is the output layer (default: none, a zero layer "
                   "of 1 class; read h)")
    g.add_argument("--embedding", metavar="NAME",
                   help="torch-tagger: the nn.Embedding's name (default "
                   "word_embeds, else auto-detected)")
    g.add_argument("--lstm", metavar="NAME",
                   help="torch-tagger: the nn.LSTM's name (default lstm)")
    g.add_argument("--linear", metavar="NAME",
                   help="torch-tagger: the nn.Linear's name (default "
                   "hidden2tag)")
    g.add_argument("--crf", metavar="NAME",
                   help="torch-tagger: the CRF transitions parameter "
                   "(default transitions, if present); 'none' for no CRF")
    g.add_argument("--start-tag", type=int, metavar="I",
                   help="torch-tagger CRF: START's tag id")
    g.add_argument("--stop-tag", type=int, metavar="J",
                   help="torch-tagger CRF: STOP's tag id")
    g.add_argument("--tgt-vocab", metavar="FILE",
                   help="torch-seq2seq: target vocabulary (ids 0, 1, 2 = "
                   "<unk>, <s>, </s>)")
    g.add_argument("--max-decode-len", type=int, metavar="N",
                   help="torch-seq2seq: model.json max_decode_len "
                   "(default 50)")
    g.add_argument("--family", metavar="F",
                   help="canopy: the family (default: inferred from keys)")
    g.add_argument("--word-vocab", metavar="FILE",
                   help="canopy/latticelstm: the word vocabulary")
    g.add_argument("--lexicon", metavar="FILE",
                   help="canopy/latticelstm: lexicon word list (optional)")
    g.add_argument("--type-b-labels", metavar="L1,L2",
                   help="canopy/treelstm-2type: bracket labels of type b")
    return p


def _say(msg):
    print(msg, file=sys.stderr)


def main(argv=None, script_dir=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    fmt = FORMATS[args.format]
    try:
        sd, note = load_checkpoint(args.checkpoint, args.key)
        _say(f"canopy-import: {args.checkpoint}: {note}")
        vocab = read_vocab(args.vocab, "--vocab")
        conv = fmt.convert(sd, args, vocab)
        conv.args = args
        _say(f"{args.format} -> {conv.family} (H={conv.meta['hidden']}, "
             f"D={conv.meta['embed']}"
             + (f", C={conv.meta['classes']}" if conv.meta.get('classes')
                is not None else "") + f", V={len(vocab)}):")
        for l in conv.summary:
            _say("  " + l)
        for n in conv.notes:
            _say("note: " + n)
        if args.no_check:
            conv.write(args.out_dir)
            _say(f"wrote {args.out_dir} (not verified: --no-check)")
            return 0
        canopy = _verify.locate_canopy(args.canopy, script_dir)
        if args.check:
            insts = read_jsonl(args.check)
            what = f"{len(insts)} instances of {args.check}"
        else:
            insts = fmt.sample(conv)
            what = f"{len(insts)} built-in sample instances"
        staging = tempfile.mkdtemp(prefix="canopy-import.")
        try:
            mdir = conv.write(os.path.join(staging, "model"))
            _say(f"verifying with {canopy} on {what}")
            rep, suspects = fmt.verify(conv, args, canopy, mdir, insts)
            _verify.print_report(rep, suspects)
            ok = rep.passed()
            if ok or args.keep_on_mismatch:
                conv.write(args.out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if ok:
            _say(f"wrote {args.out_dir} (verified)")
            return 0
        if args.keep_on_mismatch:
            _say(f"VERIFICATION FAILED; wrote {args.out_dir} anyway "
                 "(--keep-on-mismatch)")
        else:
            _say(f"VERIFICATION FAILED: nothing written to {args.out_dir} "
                 "(--keep-on-mismatch keeps it for debugging)")
        return EXIT_MISMATCH
    except ImportFailure as e:
        _say(f"canopy-import: error: {e}")
        if e.status == EXIT_USAGE:
            _say(f"nothing written to {args.out_dir}")
        return e.status
