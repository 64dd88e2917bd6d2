"""TorchScript export with a parity check against the eager model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

PARITY_TOLERANCE = 1e-5


class ExportError(Exception):
    pass


def export_torchscript(model: torch.nn.Module, path: Path, sample: np.ndarray) -> float:
    """Script, freeze, save, reload and compare on `sample`; returns the max abs difference.

    Raises ExportError (and leaves no file) when the reloaded model disagrees with the eager one.
    """
    model.eval()
    # Frozen: weights inlined and batch norm folded into the convolutions; still device-neutral, so
    # the handler can run it on CUDA or apply CPU-specific optimisation at load time.
    scripted = torch.jit.freeze(torch.jit.script(model))
    scripted.save(str(path))
    reloaded = torch.jit.load(str(path), map_location="cpu")
    x = torch.as_tensor(sample)
    with torch.no_grad():
        diff = float((reloaded(x) - model(x)).abs().max())
    if not diff <= PARITY_TOLERANCE:
        Path(path).unlink(missing_ok=True)
        raise ExportError(f"TorchScript output differs from eager by {diff:.3g} (> {PARITY_TOLERANCE})")
    return diff
