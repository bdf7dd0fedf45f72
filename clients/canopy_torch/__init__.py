"""canopy_torch: PyTorch modules for Canopy's model families, and export.

Every family of docs/models.md has an ``nn.Module`` here whose
``state_dict()`` keys are exactly the family's tensor names, so a model
trained with it is served by Canopy unchanged: ``canopy_torch.save(module,
out_dir, vocab=..., labels=...)`` writes the model directory.

Needs only Debian's ``python3-torch`` (the safetensors writer is the
standard library's).
"""
from .safetensors import load_file, save_file
from .modeldir import FAMILIES, write_model_dir

__all__ = ["load_file", "save_file", "FAMILIES", "write_model_dir"]
