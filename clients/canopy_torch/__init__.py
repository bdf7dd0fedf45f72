"""canopy_torch: PyTorch modules for Canopy's model families, and export.

Every family of docs/models.md has an ``nn.Module`` here whose
``state_dict()`` keys are exactly the family's tensor names, so a model
trained with it is served by Canopy unchanged: ``canopy_torch.save(module,
out_dir, vocab=..., labels=...)`` writes the model directory, and
``canopy_torch.load(dir)`` reads one back.

    import canopy_torch as ct
    m = ct.TreeLSTM(vocab, hidden=150, embed=300, classes=5)
    out = m(ct.parse_tree("(3 (2 It) (4 (2 's) (2 fine)))"))   # logits [n_nodes, 5]
    ct.save(m, "models/sst")
    m2 = ct.load("models/sst")
    m2(*ct.instance_to_input(m2.family, {"tree": "(2 (2 a) (2 b))"}, m2))

A cell of your own (docs/cells.md): write it as an ``nn.Module`` with the
signature of its structure, and ``canopy_torch.save_cells(out_dir, "tree",
{"leaf": leaf, "internal": internal}, state=..., output=..., embed=...,
vocab=...)`` traces it with torch.fx into a ``"family": "cells"`` model
directory.

Needs only Debian's ``python3-torch`` (the safetensors reader/writer is the
standard library's).
"""
from .safetensors import load_file, save_file
from .modeldir import FAMILIES, write_model_dir
from .data import (Vocab, Tree, Node, load_vocab, ascii_lower, parse_tree,
                   tree_from_json, parse_tree_instance, find_spans,
                   instance_to_input)
from .trees import TreeLSTM, TreeLSTM2Type, TreeGRU, ChildSumTreeLSTM, MVRNN
from .sequences import BiLSTMTagger, LSTMNMT, LatticeLSTM, LatticeGRU
from .export import (MODULES, expected_shapes, check_state_dict,
                     from_state_dict, load, save)
from .cells import CellTraceError, trace_cell, cells_json, save_cells

__all__ = ["load_file", "save_file", "FAMILIES", "write_model_dir",
           "Vocab", "Tree", "Node", "load_vocab", "ascii_lower", "parse_tree",
           "tree_from_json", "parse_tree_instance", "find_spans",
           "instance_to_input",
           "TreeLSTM", "TreeLSTM2Type", "TreeGRU", "ChildSumTreeLSTM", "MVRNN",
           "BiLSTMTagger", "LSTMNMT", "LatticeLSTM", "LatticeGRU",
           "MODULES", "expected_shapes", "check_state_dict", "from_state_dict",
           "load", "save",
           "CellTraceError", "trace_cell", "cells_json", "save_cells"]
