#!/usr/bin/python3
"""Runs clients/canopy-import with a deliberate fault in its tensor mapping,
to test that the verification catches wrong mappings (test_import.py).

    import_fault.py FAULT FORMAT CHECKPOINT OUT_DIR [canopy-import options]

FAULT, applied to the Canopy tensors the format produced (rows cut into N
equal blocks, e.g. N = 5 for treelstm's internal.U (i, f1, f2, o, u)):
    transpose:TENSOR:A-B/N   transpose the square block of rows A..B-1
    swap:TENSOR:A,B/N        swap row blocks A and B (e.g. two gates)
A checkpoint cannot carry such a fault (the source model would read the same
tensors), so the fault goes where a mapping bug would be: after convert().
"""
import importlib.machinery
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
EXE = os.path.join(HERE, "..", "..", "clients", "canopy-import")


def apply(tensors, spec):
    kind, name, rng = spec.split(":")
    blocks, n = rng.split("/")
    t = tensors[name].clone()
    rows = t.shape[0] // int(n)
    if kind == "transpose":
        a, b = (int(x) for x in blocks.split("-"))
        blk = t[a * rows:b * rows]
        assert blk.shape[0] == blk.shape[1], f"block of {name} is not square"
        t[a * rows:b * rows] = blk.t().clone()
    elif kind == "swap":
        a, b = (int(x) for x in blocks.split(","))
        ta = t[a * rows:(a + 1) * rows].clone()
        t[a * rows:(a + 1) * rows] = t[b * rows:(b + 1) * rows]
        t[b * rows:(b + 1) * rows] = ta
    else:
        raise SystemExit(f"unknown fault {spec!r}")
    tensors[name] = t.contiguous()


def main():
    spec, argv = sys.argv[1], sys.argv[2:]
    exe = importlib.machinery.SourceFileLoader(
        "canopy_import_exe", os.path.abspath(EXE)).load_module()
    from canopy_torch import importer
    fmt = importer.FORMATS[argv[0]]
    convert = fmt.convert

    def faulty(sd, args, vocab):
        conv = convert(sd, args, vocab)
        apply(conv.tensors, spec)
        return conv
    fmt.convert = faulty
    sys.exit(exe.main(argv, script_dir=os.path.dirname(os.path.abspath(EXE))))


if __name__ == "__main__":
    main()
