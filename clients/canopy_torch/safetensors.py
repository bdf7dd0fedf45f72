"""Safetensors files with the Python standard library only.

The format (https://huggingface.co/docs/safetensors): an 8-byte
little-endian header length N, N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
end of the header) plus an optional "__metadata__" object of strings, then
the raw little-endian bytes. The header is padded with spaces to a multiple
of 8 bytes, as the reference writer does, so that the data is aligned.

Canopy reads F32 only, so that is all this module writes. Tensors may be
given as anything with a ``tolist()``/``shape`` pair (torch, numpy) or as a
(shape, flat list of floats) pair; torch is never imported here.
"""
import array
import json
import struct
import sys

__all__ = ["save_file", "load_file"]


def _flat(value):
    """(shape, array('f')) from a tensor-like value."""
    if isinstance(value, tuple) and len(value) == 2:
        shape, data = value
        shape = [int(s) for s in shape]
        buf = array.array("f", [float(x) for x in data])
    else:
        shape = [int(s) for s in value.shape]
        if hasattr(value, "detach"):  # torch: no import needed
            value = value.detach().to("cpu").float().contiguous()
            buf = array.array("f")
            buf.frombytes(value.numpy().tobytes())
        elif hasattr(value, "astype"):  # numpy
            buf = array.array("f")
            buf.frombytes(value.astype("<f4", copy=False).tobytes())
        else:
            raise TypeError(f"cannot write a tensor of type {type(value)}")
    n = 1
    for s in shape:
        n *= s
    if len(buf) != n:
        raise ValueError(f"shape {shape} holds {n} floats, data has {len(buf)}")
    if sys.byteorder != "little":
        buf.byteswap()
    return shape, buf


def save_file(tensors, path, metadata=None):
    """Writes an F32 safetensors file. ``tensors``: dict name -> tensor;
    ``metadata``: optional dict of str -> str (``__metadata__``). Tensors
    are written in name order; the file is written to path + ".tmp" and
    renamed, so a reader never sees half a file."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        shape, buf = _flat(tensors[name])
        raw = buf.tobytes()
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * (-len(hj) % 8)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    import os
    os.replace(tmp, path)


def load_file(path):
    """Reads a safetensors file: (dict name -> (shape, array('f')), metadata).
    F32 only; anything else is a ValueError naming the tensor."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header of {n} bytes runs past the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None) or {}
    out = {}
    base = 8 + n
    for name, h in header.items():
        if h.get("dtype") != "F32":
            raise ValueError(f"{path}: tensor '{name}' is {h.get('dtype')}, "
                             "only F32 is read")
        b, e = h["data_offsets"]
        if base + e > len(data):
            raise ValueError(f"{path}: tensor '{name}' is cut short")
        buf = array.array("f")
        buf.frombytes(data[base + b:base + e])
        if sys.byteorder != "little":
            buf.byteswap()
        out[name] = (list(h["shape"]), buf)
    return out, meta
