"""Bring your own cell: trace a PyTorch cell into Canopy's cells JSON.

A *cell* is an ``nn.Module`` whose ``forward`` computes one vertex's new
state from its inputs, one row per vertex (so batching B vertices is B
rows). ``trace_cell`` runs ``torch.fx`` over it and writes the op graph of
docs/cells.md ("## model.json: cells"); ``save_cells`` writes a whole
model directory that ``canopy run`` and ``canopy serve`` load with no C
change. docs/cells.md walks through an example from a cell to curl.

Signatures (``x`` is the vertex's token embedding ``[B, D]``; a state is
one tensor ``[B, S]``, ``S = state``, that the cell slices as it likes):

=========== =================== ===========================================
structure   vertex type (when)  ``forward``
=========== =================== ===========================================
tree        ``leaf``            ``forward(x) -> s``
tree        ``internal`` / a    ``forward(s1, ..., sK) -> s`` with K =
            label type          ``arity`` (a missing child reads zeros);
                                with ``arity=0`` (any number of children)
                                ``forward(children) -> s``, where
                                ``children`` is ``[K, B, S]`` and may only
                                be reduced, ``children.sum(0)`` or
                                ``children.mean(0)``, or indexed
                                ``children[k]`` (zeros when absent)
sequence    ``step``            ``forward(x, s_prev) -> s``
bisequence  ``forward``,        ``forward(x, s_prev) -> s`` each (s_prev is
            ``backward``        the next token's state for ``backward``)
dag         ``node``            ``forward(x, preds) -> s``, ``preds`` as
                                ``children`` above (edge k = k-th "prev")
=========== =================== ===========================================

The output layer is an ``nn.Linear`` (or any module whose ``forward(s)``
is one ``Linear``/``F.linear``/``@`` over a column slice of ``s``; for a
bisequence ``forward(s_fwd, s_bwd)`` over
``torch.cat([s_fwd[:, a:b], s_bwd[:, a:b]], -1)``).

Supported inside a cell: ``nn.Linear``, ``F.linear``, ``x @ W`` /
``x @ W.t()`` / ``torch.matmul``/``torch.mm`` with a parameter ``W``,
``+ - * /`` between vectors, with a 1-D parameter or with a number,
unary ``-``, ``sigmoid``, ``tanh``, ``relu``, ``exp`` (functions, methods
or ``nn.Sigmoid``/``nn.Tanh``/``nn.ReLU`` modules), ``split``, ``chunk``,
``narrow``, column slicing ``a[:, i:j]``, ``cat`` along the last dim, and
the sum/mean over children. ``nn.Dropout`` and ``nn.Identity`` are the
identity (inference). Anything else is refused with a ``CellTraceError``
naming the line of the user's code.
"""
import dis
import inspect
import json
import numbers
import operator
import os
import traceback

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .modeldir import write_model_dir

__all__ = ["CellTraceError", "trace_cell", "cells_json", "save_cells",
           "STRUCTURES"]

STRUCTURES = ("tree", "sequence", "bisequence", "dag")
_WHEN = {"tree": ("leaf", "internal"), "sequence": ("step",),
         "bisequence": ("forward", "backward"), "dag": ("node",)}
_B = 3            # rows of the example inputs shapes are propagated with

_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


class CellTraceError(ValueError):
    """A cell that cannot be expressed as Canopy cells, with the user's line."""


# -- tracing -------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    """fx's tracer with stack traces on, and tuple unpacking of a proxy
    (``a, b = g.chunk(2, -1)``) that works on Python 3.11, where
    torch 1.13's own bytecode look-up misses it."""

    def __init__(self):
        super().__init__()
        self.record_stack_traces = True

    def proxy(self, node):
        return _Proxy(node, self)

    def iter(self, obj, user=None):
        if user is not None:
            for inst in dis.get_instructions(user.f_code):
                if inst.offset == user.f_lasti:
                    if inst.opname == "UNPACK_SEQUENCE":
                        return (obj[i] for i in range(inst.argval))
                    break
        raise torch.fx.proxy.TraceError(
            "a traced value is iterated (a for loop over it, or *args); "
            "unpack a split/chunk into names instead: a, b = g.chunk(2, -1)")


class _Proxy(torch.fx.Proxy):
    def __iter__(self):
        frame = inspect.currentframe()
        return self.tracer.iter(self, frame.f_back if frame else None)


def _user_frame_of_tb(tb):
    """The innermost traceback frame in the user's code (not torch, not here)."""
    best = None
    for fr in traceback.extract_tb(tb):
        f = os.path.abspath(fr.filename)
        if f.startswith(_TORCH) or f.startswith(_HERE):
            continue
        best = fr
    return best


def _where_of_stack(stack):
    """'FILE:LINE: CODE' of the innermost frame of an fx node's stack trace."""
    if not stack:
        return None
    lines = stack.splitlines()
    for i, l in enumerate(lines):
        l = l.strip()
        if l.startswith("File \""):
            try:
                fname = l.split("\"")[1]
                lineno = int(l.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            f = os.path.abspath(fname)
            if f.startswith(_TORCH) or f.startswith(_HERE):
                continue  # torch's dispatch (F.softmax), the tracer itself
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if code.startswith("File \""):  # no source (exec'd code)
                code = ""
            return (f"{os.path.basename(fname)}, line {lineno}"
                    + (f" (`{code}`)" if code else ""))
    return None


# -- values while converting ----------------------------------------------------

class _V:
    """A computed vector: op index and width."""
    __slots__ = ("op", "width")

    def __init__(self, op, width):
        self.op, self.width = op, width


class _P:
    """A parameter: its name in the model, the tensor, transposed or not."""
    __slots__ = ("name", "t", "transposed")

    def __init__(self, name, t, transposed=False):
        self.name, self.t, self.transposed = name, t, transposed


class _Kids:
    """The children (or predecessors) stack [K, B, S], optionally sliced."""
    __slots__ = ("cols",)

    def __init__(self, cols):
        self.cols = cols


def _is_num(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


_UNARY = {torch.sigmoid: "sigmoid", torch.tanh: "tanh", torch.relu: "relu",
          torch.exp: "exp", F.relu: "relu", F.sigmoid: "sigmoid",
          F.tanh: "tanh"}
_UNARY_METHODS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu",
                  "exp": "exp"}
_BINARY = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
           operator.truediv: "div", torch.add: "add", torch.sub: "sub",
           torch.mul: "mul", torch.div: "div"}
_BINARY_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}
_IDENTITY_METHODS = ("contiguous", "clone")

SUPPORTED = ("nn.Linear, F.linear, matmul/mm/@ with a parameter, "
             "add/sub/mul/div (vectors, 1-D parameters, numbers), neg, "
             "sigmoid, tanh, relu, exp, split, chunk, narrow, column "
             "slicing, cat on the last dim, children.sum(0)/.mean(0), "
             "per-child work on the children stack summed with .sum(0)")
_SOURCES = ("input", "input_sum", "input_mean", "input_each", "param", "embed")


class _Cell:
    """Converts one traced cell into the op list of docs/cells.md."""

    def __init__(self, name, module, structure, role, state, names, arity,
                 embed_name, embed_dim):
        self.name, self.module, self.structure = name, module, structure
        self.role, self.state, self.names = role, state, names
        self.arity, self.embed_name, self.embed_dim = arity, embed_name, embed_dim
        self.ops = []          # dicts; refs are indices into self.ops
        self.where = None      # the user's line being converted
        self.memo = {}
        self.transposed = {}   # parameter name -> tensor stored transposed
        self.direct = set()    # parameter names used as W [N, K]

    # errors ------------------------------------------------------------------
    def fail(self, msg):
        loc = f" at {self.where}" if self.where else ""
        raise CellTraceError(f"cell '{self.name}' ({type(self.module).__name__})"
                             f"{loc}: {msg}")

    # ops ---------------------------------------------------------------------
    def emit(self, op, width, hint, **fields):
        key = (op, json.dumps(fields, sort_keys=True, default=str))
        if op in _SOURCES and key in self.memo:
            return _V(self.memo[key], width)
        self.ops.append({"op": op, "width": int(width), "_hint": hint,
                         "_where": self.where,
                         "_edge": self.per_edge_of(op, fields), **fields})
        k = len(self.ops) - 1
        if op in _SOURCES:
            self.memo[key] = k
        return _V(k, width)

    def per_edge_of(self, op, fields):
        """Whether an op computes one value per child (docs/cells.md,
        "Per-edge values"): input_each does, edge_sum does not, any other
        op does when its operands do; mixing the two is refused."""
        if op in ("input_each", "edge_sum"):
            return op == "input_each"
        refs = [fields[f] for f in ("a", "b") if f in fields]
        x = fields.get("x")
        refs += x if isinstance(x, list) else [x] if x is not None else []
        kinds = {self.ops[r]["_edge"] for r in refs
                 if self.ops[r]["op"] != "param"}
        if len(kinds) > 1:
            self.fail("an op mixes a per-child value (computed from the "
                      "children stack) with a per-vertex one; sum the "
                      "per-child one over the children first (.sum(0))")
        return kinds == {True}

    def is_edge(self, v):
        return isinstance(v, _V) and self.ops[v.op]["_edge"]

    def ndim(self, v):
        """Dims of a value as the cell's code sees it: [K, B, W] per child."""
        return 3 if isinstance(v, _Kids) or self.is_edge(v) else 2

    def vec(self, v, hint):
        """v as a vector (_V): 1-D parameters become a param op."""
        if isinstance(v, _V):
            return v
        if isinstance(v, _P):
            if v.t.dim() != 1 or v.transposed:
                self.fail(f"parameter '{v.name}' (shape {list(v.t.shape)}) is "
                          "used as a vector; only 1-D parameters can be "
                          "(a matrix must be multiplied: x @ W.t())")
            return self.emit("param", v.t.shape[0], v.name.replace(".", "_"),
                             tensor=v.name)
        if isinstance(v, _Kids):  # per-child work: one value per child
            return self.emit("input_each", v.cols[1] - v.cols[0], hint,
                             cols=list(v.cols))
        if isinstance(v, (tuple, list)):
            self.fail("a tuple (from split/chunk) is used as a tensor; pick "
                      "one part first")
        self.fail(f"{type(v).__name__} {v!r} is used as a tensor; only the "
                  "cell's inputs, parameters and what is computed from them "
                  "can be")

    def slice_(self, v, a, b, hint):
        v = self.vec(v, hint)
        if not (0 <= a <= b <= v.width) or a == b:
            self.fail(f"column slice [{a}, {b}) of a value of width {v.width}")
        if a == 0 and b == v.width:
            return v
        src = self.ops[v.op]
        if src["op"] in ("input", "input_sum", "input_mean", "input_each",
                         "param"):
            c0 = src.get("cols", [0, src["width"]])[0]
            f = {k: x for k, x in src.items()
                 if not k.startswith("_") and k not in ("op", "width", "cols")}
            return self.emit(src["op"], b - a, hint, cols=[c0 + a, c0 + b], **f)
        return self.emit("slice", b - a, hint, a=v.op, cols=[a, b])

    def linear(self, x, w, bias, hint):
        """A linear op. ``w.transposed``: the cell multiplies by W.t() (or
        calls nn.Linear / F.linear), W [N, K] is stored as it is; else it
        computes x @ W with W [K, N], stored transposed under W's name."""
        if not isinstance(w, _P) or w.t.dim() != 2:
            self.fail("a matrix product needs a 2-D parameter as its right "
                      "operand (x @ W.t(), x @ W, F.linear(x, W, b))")
        if w.transposed:
            wname, N, K = w.name, w.t.shape[0], w.t.shape[1]
            self.direct.add(wname)
        else:  # x @ W with W [K, N]: Canopy wants [N, K]
            wname, K, N = w.name, w.t.shape[0], w.t.shape[1]
            self.transposed[wname] = w.t
        if wname in self.direct and wname in self.transposed:
            self.fail(f"parameter '{wname}' is used both as x @ W and as "
                      "x @ W.t(); it is saved once, so use one form")
        x = self.vec(x, hint)
        if x.width != K:
            self.fail(f"matrix product of a width-{x.width} vector with "
                      f"'{w.name}' {list(w.t.shape)}: inner sizes differ")
        f = {"x": x.op, "weight": wname}
        if bias is not None:
            if not isinstance(bias, _P) or bias.t.dim() != 1 \
                    or bias.t.shape[0] != N:
                self.fail(f"the bias must be a 1-D parameter of {N} floats")
            f["bias"] = bias.name
        return self.emit("linear", N, hint, **f)

    def binary(self, op, a, b, hint):
        if _is_num(a) and _is_num(b):
            return {"add": operator.add, "sub": operator.sub,
                    "mul": operator.mul, "div": operator.truediv}[op](a, b)
        if _is_num(b):
            a = self.vec(a, hint)
            k = float(b)
            if op == "add":
                return self.emit("shift", a.width, hint, a=a.op, k=k)
            if op == "sub":
                return self.emit("shift", a.width, hint, a=a.op, k=-k)
            if op == "mul":
                return self.emit("scale", a.width, hint, a=a.op, k=k)
            if k == 0:
                self.fail("division by the number 0")
            return self.emit("scale", a.width, hint, a=a.op, k=1.0 / k)
        if _is_num(a):
            b = self.vec(b, hint)
            k = float(a)
            if op == "add":
                return self.emit("shift", b.width, hint, a=b.op, k=k)
            if op == "sub":
                return self.emit("rsub", b.width, hint, a=b.op, k=k)
            if op == "mul":
                return self.emit("scale", b.width, hint, a=b.op, k=k)
            self.fail("a number divided by a tensor is not supported "
                      "(no reciprocal op)")
        # linear + 1-D parameter of its width: the linear's bias
        if op == "add":
            for lin, par in ((a, b), (b, a)):
                if isinstance(lin, _V) and isinstance(par, _P) \
                        and par.t.dim() == 1 and not par.transposed:
                    src = self.ops[lin.op]
                    if src["op"] == "linear" and "bias" not in src \
                            and par.t.shape[0] == lin.width:
                        f = {k: x for k, x in src.items()
                             if not k.startswith("_") and k not in ("op", "width")}
                        return self.emit("linear", lin.width, hint,
                                         bias=par.name, **f)
        a, b = self.vec(a, hint), self.vec(b, hint)
        if a.width != b.width:
            self.fail(f"{op} of widths {a.width} and {b.width} (no "
                      "broadcasting between different widths)")
        return self.emit(op, a.width, hint, a=a.op, b=b.op)

    # fx nodes ----------------------------------------------------------------
    def dim_last(self, dim, ndim=2):
        if dim not in (-1, ndim - 1):
            self.fail(f"dim={dim}: only the last dim (features) can be split, "
                      "sliced or concatenated; rows are vertices")

    def pieces(self, v, sizes, hint):
        v = self.vec(v, hint)
        if sum(sizes) != v.width:
            self.fail(f"split sizes {sizes} do not add up to the width {v.width}")
        out, c = [], 0
        for i, s in enumerate(sizes):
            out.append(self.slice_(v, c, c + s, f"{hint}[{i}]"))
            c += s
        return tuple(out)

    def split(self, v, size, dim, hint):
        self.dim_last(dim, self.ndim(v))
        w = self.vec(v, hint).width
        if isinstance(size, int):
            if size <= 0:
                self.fail(f"split size {size}")
            sizes = [size] * (w // size) + ([w % size] if w % size else [])
        else:
            sizes = [int(s) for s in size]
        return self.pieces(v, sizes, hint)

    def chunk(self, v, n, dim, hint):
        self.dim_last(dim, self.ndim(v))
        w = self.vec(v, hint).width
        size = -(-w // n)
        sizes = [size] * (w // size) + ([w % size] if w % size else [])
        return self.pieces(v, sizes, hint)

    def getitem(self, v, idx, hint):
        if isinstance(v, (tuple, list)):
            if not isinstance(idx, int):
                self.fail(f"index {idx!r} into a tuple")
            return v[idx]
        if isinstance(v, _Kids):
            if isinstance(idx, int) and idx >= 0:
                return self.input_edge(idx, v.cols, hint)
            if isinstance(idx, tuple) and len(idx) == 3 \
                    and idx[0] == slice(None) and idx[1] == slice(None) \
                    and isinstance(idx[2], slice):
                a, b = self.colrange(idx[2], v.cols[1] - v.cols[0])
                return _Kids([v.cols[0] + a, v.cols[0] + b])
            self.fail(f"index {idx!r} into the children: use children[k], "
                      "children.sum(0), children.mean(0) or "
                      "children[:, :, a:b]")
        if self.is_edge(v):  # [K, B, W]: v[:, :, a:b] or v[..., a:b]
            if isinstance(idx, tuple) and len(idx) == 3 \
                    and idx[0] == slice(None) and idx[1] == slice(None) \
                    and isinstance(idx[2], slice):
                idx = (Ellipsis, idx[2])
            if not (isinstance(idx, tuple) and len(idx) == 2
                    and idx[0] is Ellipsis and isinstance(idx[1], slice)):
                self.fail(f"index {idx!r} into a per-child value [K, B, W]: "
                          "only its columns can be sliced, v[:, :, a:b] "
                          "or v[..., a:b]")
        if isinstance(idx, tuple) and len(idx) == 2 and \
                (idx[0] == slice(None) or idx[0] is Ellipsis) \
                and isinstance(idx[1], slice):
            w = self.vec(v, hint).width
            a, b = self.colrange(idx[1], w)
            return self.slice_(v, a, b, hint)
        if isinstance(v, _P) and v.t.dim() == 1 and isinstance(idx, slice):
            a, b = self.colrange(idx, v.t.shape[0])
            return self.slice_(v, a, b, hint)
        self.fail(f"index {idx!r}: only column slices a[:, i:j] (or "
                  "a[..., i:j]) are supported; the rows are the vertices")

    def colrange(self, sl, w):
        if sl.step not in (None, 1):
            self.fail("a slice with a step")
        a, b, _ = sl.indices(w)
        return a, b

    def input_edge(self, k, cols, hint):
        if self.structure == "tree" and self.arity and k >= self.arity:
            self.fail(f"child {k} of a tree of arity {self.arity}")
        return self.emit("input", cols[1] - cols[0], hint, edge=int(k),
                         cols=list(cols))

    def reduce(self, v, how, dim, keepdim, hint):
        if self.is_edge(v):
            if dim != 0 or keepdim:
                self.fail(f"{how} over dim {dim} of a per-child value "
                          "[K, B, W]: it is reduced over the children, "
                          "dim 0 (.sum(0))")
            if how != "sum":
                self.fail("the mean of a per-child value is not supported "
                          "(only the sum, .sum(0)); the mean of the "
                          "children's own state is: children.mean(0)")
            return self.emit("edge_sum", v.width, hint, a=v.op)
        if not isinstance(v, _Kids):
            self.fail(f"{how} of a tensor: only the children stack can be "
                      "summed or averaged (over dim 0)")
        if dim != 0 or keepdim:
            self.fail(f"{how} over dim {dim}: the children are reduced over "
                      "dim 0 (children.sum(0))")
        return self.emit("input_" + how, v.cols[1] - v.cols[0], hint,
                         cols=list(v.cols))

    def concat(self, xs, dim, hint):
        self.dim_last(dim, self.ndim(xs[0]) if xs else 2)
        vs = [self.vec(x, hint) for x in xs]
        while len(vs) > MAX_LIST:  # the loader's limit: concats of concats
            vs = [self.concat_ops(vs[i:i + MAX_LIST], hint)
                  for i in range(0, len(vs), MAX_LIST)]
        return self.concat_ops(vs, hint)

    def concat_ops(self, vs, hint):
        if len(vs) == 1:
            return vs[0]
        return self.emit("concat", sum(v.width for v in vs), hint,
                         x=[v.op for v in vs])

    def param_of(self, target):
        obj = self.module
        for part in target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            self.fail(f"attribute {target} is not a tensor")
        name = self.names.get(id(obj))
        if name is None:
            self.fail(f"tensor {target} is not a parameter or buffer of the "
                      "model (constants must be registered so that they are "
                      "saved)")
        return _P(name, obj.detach().float())

    def module_of(self, target):
        obj = self.module
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def call_module(self, mod, args, kwargs, hint):
        if not isinstance(mod, (nn.Linear, nn.Sigmoid, nn.Tanh, nn.ReLU,
                                nn.Dropout, nn.Identity)):
            self.fail(f"module {type(mod).__name__} is not supported; "
                      f"supported: {SUPPORTED}")
        if kwargs or len(args) != 1:
            self.fail(f"{type(mod).__name__} called with {len(args)} "
                      "arguments")
        x = args[0]
        if isinstance(mod, nn.Linear):
            w = self.names.get(id(mod.weight))
            b = self.names.get(id(mod.bias)) if mod.bias is not None else None
            if w is None:
                self.fail("an nn.Linear outside the model given to save_cells")
            return self.linear(x, _P(w, mod.weight.detach().float(), True),
                               _P(b, mod.bias.detach().float())
                               if b is not None else None, hint)
        for cls, op in ((nn.Sigmoid, "sigmoid"), (nn.Tanh, "tanh"),
                        (nn.ReLU, "relu")):
            if isinstance(mod, cls):
                v = self.vec(x, hint)
                return self.emit(op, v.width, hint, a=v.op)
        if isinstance(mod, (nn.Dropout, nn.Identity)):
            return x
        self.fail(f"module {type(mod).__name__} is not supported; "
                  f"supported: {SUPPORTED}")

    def call(self, fn, args, kwargs, hint, method=False):
        a0 = args[0] if args else None
        name = fn if method else getattr(fn, "__name__", str(fn))

        def kw(k, default, pos=None):
            if k in kwargs:
                return kwargs[k]
            if pos is not None and len(args) > pos:
                return args[pos]
            return default

        if method:
            if fn in _UNARY_METHODS and len(args) == 1 and not kwargs:
                v = self.vec(a0, hint)
                return self.emit(_UNARY_METHODS[fn], v.width, hint, a=v.op)
            if fn in _BINARY_METHODS and len(args) == 2 and not kwargs:
                return self.binary(_BINARY_METHODS[fn], a0, args[1], hint)
            if fn == "neg" and len(args) == 1:
                return self.binary("mul", a0, -1.0, hint)
            if fn in _IDENTITY_METHODS:
                return a0
            if fn == "t" and isinstance(a0, _P) and a0.t.dim() == 2:
                return _P(a0.name, a0.t, not a0.transposed)
            if fn == "split":
                return self.split(a0, kw("split_size", None, 1), kw("dim", 0, 2), hint)
            if fn == "chunk":
                return self.chunk(a0, kw("chunks", None, 1), kw("dim", 0, 2), hint)
            if fn == "narrow":
                self.dim_last(kw("dim", None, 1), self.ndim(a0))
                s, n = kw("start", None, 2), kw("length", None, 3)
                return self.slice_(a0, s, s + n, hint)
            if fn in ("sum", "mean"):
                return self.reduce(a0, fn, kw("dim", None, 1),
                                   kw("keepdim", False, 2), hint)
            if fn == "matmul" or fn == "mm":
                return self.linear(a0, args[1], None, hint)
            self.fail(f"method .{fn}() is not supported; supported: {SUPPORTED}")
        if fn in _UNARY and len(args) == 1 and not kwargs.get("inplace"):
            v = self.vec(a0, hint)
            return self.emit(_UNARY[fn], v.width, hint, a=v.op)
        if fn in _BINARY and len(args) == 2 and not set(kwargs) - {"out"} \
                and kwargs.get("out") is None:
            return self.binary(_BINARY[fn], a0, args[1], hint)
        if fn is operator.neg:
            return self.binary("mul", a0, -1.0, hint)
        if fn is operator.getitem:
            return self.getitem(a0, args[1], hint)
        if fn in (operator.matmul, torch.matmul, torch.mm):
            return self.linear(a0, args[1], None, hint)
        if fn is F.linear:
            return self.linear(a0, _P(args[1].name, args[1].t,
                                      not args[1].transposed)
                               if isinstance(args[1], _P) else args[1],
                               kw("bias", None, 2), hint)
        if fn is torch.cat or fn is torch.concat:
            return self.concat(kw("tensors", None, 0), kw("dim", 0, 1), hint)
        if fn is torch.split:
            return self.split(a0, kw("split_size_or_sections", None, 1),
                              kw("dim", 0, 2), hint)
        if fn is torch.chunk:
            return self.chunk(a0, kw("chunks", None, 1), kw("dim", 0, 2), hint)
        if fn is torch.narrow:
            self.dim_last(kw("dim", None, 1), self.ndim(a0))
            s, n = kw("start", None, 2), kw("length", None, 3)
            return self.slice_(a0, s, s + n, hint)
        if fn in (torch.sum, torch.mean):
            return self.reduce(a0, fn.__name__, kw("dim", None, 1),
                               kw("keepdim", False, 2), hint)
        if fn is torch.t and isinstance(a0, _P):
            return _P(a0.name, a0.t, not a0.transposed)
        if fn is getattr and len(args) == 2 and args[1] == "T" \
                and isinstance(a0, _P) and a0.t.dim() == 2:
            return _P(a0.name, a0.t, not a0.transposed)
        mod = getattr(fn, "__module__", None) or ""
        pretty = f"{mod}.{name}" if mod and not mod.startswith("_") else name
        self.fail(f"{pretty} is not supported; supported: {SUPPORTED}")

    def convert(self, graph, placeholders):
        env = {}
        k_ph = 0

        def val(a):
            return torch.fx.node.map_arg(a, lambda n: env[n])

        n_ph = sum(1 for n in graph.nodes if n.op == "placeholder")
        if n_ph != len(placeholders):
            why = {("tree", "leaf"): "forward(x)",
                   ("tree", "internal"): "forward(children)" if not self.arity
                   else "forward(" + ", ".join(f"s{k + 1}" for k in
                                               range(self.arity)) + ")"
                   " (internal nodes have no token, so no x)",
                   ("dag", "node"): "forward(x, preds)"}.get(
                       (self.structure, self.role), "forward(x, s_prev)")
            if self.role == "output":
                why = ("forward(s_fwd, s_bwd)" if len(placeholders) == 2
                       else "forward(s)")
            self.fail(f"forward takes {n_ph} arguments; a '{self.role}' cell "
                      f"of a {self.structure} takes {len(placeholders)}: {why}")
        out = None
        for node in graph.nodes:
            where = _where_of_stack(node.stack_trace)
            if where is None and node.op == "get_attr":
                # a constant's node is made by the tracer: name its first use
                where = next((w for w in (_where_of_stack(u.stack_trace)
                                          for u in node.users) if w), None)
            self.where = where or self.where
            hint = node.name
            if node.op == "placeholder":
                env[node] = placeholders[k_ph](hint)
                k_ph += 1
            elif node.op == "get_attr":
                env[node] = self.param_of(node.target)
            elif node.op == "call_module":
                env[node] = self.call_module(self.module_of(node.target),
                                             val(node.args), val(node.kwargs),
                                             hint)
            elif node.op == "call_function":
                env[node] = self.call(node.target, val(node.args),
                                      val(node.kwargs), hint)
            elif node.op == "call_method":
                env[node] = self.call(node.target, val(node.args),
                                      val(node.kwargs), hint, method=True)
            elif node.op == "output":
                out = val(node.args[0])
        return out


def _trace(module, name):
    tracer = _Tracer()
    try:
        graph = tracer.trace(module)
    except Exception as e:  # fx refuses control flow, iteration, ...
        fr = _user_frame_of_tb(e.__traceback__)
        loc = (f" at {os.path.basename(fr.filename)}, line {fr.lineno}"
               + (f" (`{fr.line}`)" if fr.line else "")) if fr else ""
        msg = str(e)
        if "control flow" in msg:
            msg = ("a branch or loop depends on a traced value (data-dependent "
                   "control flow); a cell must do the same ops for every vertex")
        raise CellTraceError(f"cell '{name}' ({type(module).__name__}){loc}: "
                             f"{msg}") from e
    return graph


def _param_names(model, extra):
    names = {}
    if model is not None:
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
        for n, b in model.named_buffers():
            names.setdefault(id(b), n)
    for prefix, m in extra:
        if isinstance(m, nn.Module):
            for n, p in m.named_parameters():
                names.setdefault(id(p), f"{prefix}.{n}")
            for n, b in m.named_buffers():
                names.setdefault(id(b), f"{prefix}.{n}")
        elif isinstance(m, torch.Tensor):
            names.setdefault(id(m), prefix)
    return names


MAX_OPS = 256        # the loader's limits (docs/cells.md, Tensors)
MAX_TENSORS = 32
MAX_LIST = 16        # operands of a concat or a linear, parts of a state
_FIELD_ORDER = ("a", "b", "x", "edge", "cols", "tensor", "weight", "bias",
                "k")


def _finish(cell, out, state):
    """Dead-op elimination, names, JSON ops and the state list."""
    if isinstance(out, (tuple, list)):
        parts = [cell.vec(v, "state") for v in out]
    else:
        v = cell.vec(out, "state")
        src = cell.ops[v.op]
        parts = ([_V(r, cell.ops[r]["width"]) for r in src["x"]]
                 if src["op"] == "concat" else [v])
    cell.where = None
    while len(parts) > MAX_LIST:
        parts = [cell.concat_ops(parts[i:i + MAX_LIST], "state")
                 for i in range(0, len(parts), MAX_LIST)]
    for p in parts:
        if cell.ops[p.op]["_edge"]:
            cell.fail("returns a per-child value as (part of) the state; sum "
                      "it over the children first (.sum(0))")
    width = sum(p.width for p in parts)
    if width != state:
        cell.fail(f"returns a state of width {width}; the model's state is "
                  f"{state} (every vertex type returns the same width)")
    live = set()
    work = [p.op for p in parts]
    while work:
        k = work.pop()
        if k in live:
            continue
        live.add(k)
        op = cell.ops[k]
        for f in ("a", "b"):
            if f in op:
                work.append(op[f])
        if "x" in op:
            work.extend(op["x"] if isinstance(op["x"], list) else [op["x"]])
    order = sorted(live)
    names, seen = {}, set()
    if len(order) > MAX_OPS:
        cell.fail(f"{len(order)} ops; a vertex type may have at most "
                  f"{MAX_OPS} (docs/cells.md)")
    for k in order:
        base = cell.ops[k]["_hint"][:56]
        nm, j = base, 1
        while nm in seen:
            j += 1
            nm = f"{base}_{j}"
        seen.add(nm)
        names[k] = nm
    ops = []
    for k in order:
        src = cell.ops[k]
        op = {"name": names[k], "op": src["op"]}
        for f in _FIELD_ORDER:
            if f not in src:
                continue
            x = src[f]
            if f in ("a", "b"):
                x = names[x]
            elif f == "x":
                x = [names[r] for r in x] if isinstance(x, list) else names[x]
            op[f] = x
        op["width"] = src["width"]
        ops.append(op)
    tensors = set()
    for k in order:
        for f in ("tensor", "weight", "bias"):
            if f in cell.ops[k]:
                tensors.add(cell.ops[k][f])
    return ops, [names[p.op] for p in parts], tensors


def trace_cell(module, *, name, structure, when, state, arity=2, names=None,
               embed_name=None, embed_dim=None, shared=None):
    """Traces ``module`` (an ``nn.Module`` cell of the signature its
    structure and ``when`` call for, see the module docstring) into one
    element of ``cells.types``: ``({"name", "when", "ops", "state"},
    [tensor names the ops read], {name: parameter the ops read transposed,
    as x @ W})``. ``names`` maps ``id(parameter)`` to the name
    it is saved under (default: ``NAME.<parameter path>``). Raises
    ``CellTraceError`` naming the line of the cell's code that cannot be
    expressed."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {', '.join(STRUCTURES)}")
    role = when if isinstance(when, str) else "internal"
    if role not in _WHEN[structure]:
        raise ValueError(f"when={when!r} is not a vertex type of a "
                         f"{structure}: {', '.join(_WHEN[structure])} "
                         "(or {'labels': [...]} for a tree)")
    if names is None:
        names = _param_names(None, [(name, module)])
    cell = _Cell(name, module, structure, role, int(state), names,
                 int(arity), embed_name, embed_dim)
    if shared is not None:  # one model's cells: one orientation per weight
        cell.transposed, cell.direct = shared

    def x_in(hint):
        if embed_name is None:
            cell.fail("the cell reads x but no embedding was given "
                      "(save_cells(..., embed=...))")
        return cell.emit("embed", embed_dim, hint, tensor=embed_name)

    def edge(k):
        return lambda hint: cell.emit("input", state, hint, edge=k,
                                      cols=[0, state])

    def kids(hint):
        return _Kids([0, state])

    if structure == "tree" and role == "leaf":
        phs = [x_in]
    elif structure == "tree":
        phs = [kids] if arity == 0 else [edge(k) for k in range(arity)]
    elif structure in ("sequence", "bisequence"):
        phs = [x_in, edge(0)]
    else:
        phs = [x_in, kids]
    # x is materialised only where the cell reads it: a lazy placeholder
    graph = _trace(module, name)
    used_ph = [n for n in graph.nodes if n.op == "placeholder"]
    lazy = []
    for ph, node in zip(phs, used_ph):
        if ph is x_in and not node.users:
            lazy.append(lambda hint: None)
        else:
            lazy.append(ph)
    lazy += phs[len(used_ph):]
    out = cell.convert(graph, lazy)
    ops, st, tensors = _finish(cell, out, int(state))
    entry = {"name": name, "when": when, "ops": ops, "state": st}
    return entry, sorted(tensors), dict(cell.transposed)


def _output(module, structure, state, names, shared):
    """The output layer: (json, tensor names, transposed)."""
    if isinstance(module, nn.Linear):
        w = names.get(id(module.weight))
        if w in shared[0]:
            raise CellTraceError(f"output: parameter '{w}' is used both as "
                                 "x @ W and as x @ W.t()")
        entry = {"weight": w}
        if module.bias is not None:
            entry["bias"] = names.get(id(module.bias))
        K = module.in_features
        if structure == "bisequence":
            if K % 2:
                raise CellTraceError(f"output: a bisequence's output layer "
                                     f"reads 2·width columns; in_features={K}")
            K //= 2
        if K > state:
            raise CellTraceError(f"output: nn.Linear in_features {K} > state "
                                 f"{state}")
        entry = {"from": [0, K], **entry}
        return entry, {n for n in (entry.get("weight"), entry.get("bias")) if n}, {}
    # a module: trace it as a cell whose state is the logits
    nph = 2 if structure == "bisequence" else 1
    cell = _Cell("output", module, structure, "output", state, names, 1,
                 None, None)
    cell.transposed, cell.direct = shared
    graph = _trace(module, "output")
    phs = [lambda hint, k=k: cell.emit("input", state, hint, edge=k,
                                       cols=[0, state]) for k in range(nph)]
    out = cell.convert(graph, phs)
    cell.where = None
    v = cell.vec(out, "logits")
    op = cell.ops[v.op]
    if op["op"] != "linear":
        cell.fail("the output must be one linear layer over a slice of the "
                  "state (logits = W · s[a:b] + b)")
    xs = op["x"] if isinstance(op["x"], list) else [op["x"]]
    if len(xs) == 1 and cell.ops[xs[0]]["op"] == "concat":
        xs = cell.ops[xs[0]]["x"]
    cols = []
    for r in xs:
        src = cell.ops[r]
        if src["op"] != "input":
            cell.fail("the output layer may only read the state's columns")
        cols.append((src["edge"], tuple(src["cols"])))
    if [c[0] for c in cols] != list(range(nph)) or len({c[1] for c in cols}) != 1:
        cell.fail("the output layer must read one column range of the state"
                  + (" (the same of both directions, forward then backward)"
                     if nph == 2 else ""))
    entry = {"from": list(cols[0][1]), "weight": op["weight"]}
    if "bias" in op:
        entry["bias"] = op["bias"]
    return entry, {n for n in (entry["weight"], entry.get("bias")) if n}, \
        dict(cell.transposed)


def _types_list(cells, structure):
    if isinstance(cells, dict):
        items = []
        for k, v in cells.items():
            if isinstance(v, tuple):
                items.append((k, v[1], v[0]))
            else:
                items.append((k, k, v))
        return items
    return [tuple(t) for t in cells]


def cells_json(structure, cells, *, state, output, embed=None, arity=2,
               hidden=None, model=None):
    """The ``"cells"`` object of model.json and the tensors it names:
    ``(cells, {name: float tensor})``. Arguments as ``save_cells``."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {', '.join(STRUCTURES)}")
    state = int(state)
    types = _types_list(cells, structure)
    extra = [(nm, m) for nm, _, m in types] + [("output", output)]
    emb_t = None
    if embed is not None:
        emb_t = embed.weight if isinstance(embed, nn.Embedding) else embed
        extra.append(("embed", emb_t))
    names = _param_names(model, extra)
    tensors = {}
    params = {}
    for mod in [m for _, _, m in types] + [output]:
        if isinstance(mod, nn.Module):
            for p in list(mod.parameters()) + list(mod.buffers()):
                params[names[id(p)]] = p
    embed_name = embed_dim = None
    if emb_t is not None:
        embed_name = names[id(emb_t)]
        embed_dim = int(emb_t.shape[1])
        params[embed_name] = emb_t
    out_types = []
    transposed = {}
    shared = ({}, set())
    for nm, when, mod in types:
        entry, tens, tr = trace_cell(mod, name=nm, structure=structure,
                                     when=when, state=state, arity=arity,
                                     names=names, embed_name=embed_name,
                                     embed_dim=embed_dim, shared=shared)
        out_types.append(entry)
        transposed.update(tr)
        for t in tens:
            tensors[t] = None
    out_entry, out_tens, tr = _output(output, structure, state, names, shared)
    transposed.update(tr)
    for t in out_tens:
        tensors[t] = None
    for t in tensors:
        p = params.get(t)
        if p is None:
            raise CellTraceError(f"tensor '{t}' is not a parameter of the cells")
        tensors[t] = p.detach().float().cpu().contiguous()
    for t, v in transposed.items():  # x @ W: stored [N, K] under W's name
        tensors[t] = v.detach().float().cpu().t().contiguous()
    if len(tensors) > MAX_TENSORS:
        raise CellTraceError(f"the cells read {len(tensors)} tensors; a cells "
                             f"model may have at most {MAX_TENSORS}")
    obj = {"structure": structure}
    if structure == "tree":
        obj["arity"] = int(arity)
    obj["state"] = state
    if hidden is not None:
        obj["hidden"] = [int(hidden[0]), int(hidden[1])]
    obj["types"] = out_types
    obj["output"] = out_entry
    return obj, tensors


def save_cells(out_dir, structure, cells, *, state, output, vocab, embed=None,
               arity=2, hidden=None, labels=None, model=None, lowercase=None,
               version=None):
    """Writes a Canopy model directory (model.json with ``"family":
    "cells"``, weights.safetensors, vocab.txt) for a model described by its
    cells. Returns the directory's path.

    - ``structure``: "tree", "sequence", "bisequence" or "dag".
    - ``cells``: ``{when: module}`` (the vertex type's name is its
      ``when``), ``{name: (module, {"labels": [...]})}`` for a tree's label
      types, or a list of ``(name, when, module)``. Each module's
      ``forward`` has its structure's signature (module docstring).
    - ``state``: floats of a vertex's state (every type returns this width).
    - ``output``: the output layer, an ``nn.Linear`` over the state's first
      ``in_features`` columns, or a module (see the docstring).
    - ``vocab``: tokens, id 0 = ``<unk>``; ``embed``: the ``nn.Embedding``
      (or [V, D] parameter) whose row of the vertex's token is ``x``.
    - ``arity``: a tree's most children (0: any, reduced by sum/mean).
    - ``hidden``: the [start, end) state columns returned as ``"h"``.
    - ``labels``: class names; ``model``: the module that owns the cells,
      so tensors are named after its ``named_parameters()`` (default:
      ``<cell name>.<parameter>``, ``output.weight``, ``embed``).
    """
    obj, tensors = cells_json(structure, cells, state=state, output=output,
                              embed=embed, arity=arity, hidden=hidden,
                              model=model)
    C = int(tensors[obj["output"]["weight"]].shape[0])
    vocab = [str(t) for t in vocab]
    if embed is not None:
        V = int((embed.weight if isinstance(embed, nn.Embedding)
                 else embed).shape[0])
        if V != len(vocab):
            raise ValueError(f"the embedding has {V} rows but the vocabulary "
                             f"{len(vocab)} tokens")
    return write_model_dir(out_dir, "cells", tensors, vocab=vocab, classes=C,
                           labels=labels, cells=obj, lowercase=lowercase,
                           version=version)
