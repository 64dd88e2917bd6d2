"""TorchScript and ONNX exports, each with a parity check against the eager model."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

PARITY_TOLERANCE = 1e-5
#: ONNX opset of model.onnx: 17 is the newest the legacy (TorchScript-based) exporter writes without warnings
#: about unsupported operators for this network, and every onnxruntime >= 1.14 runs it.
ONNX_OPSET = 17
#: Input and output names in model.onnx (the handler's onnxruntime path feeds the first by name).
ONNX_INPUT, ONNX_OUTPUT = "images", "embeddings"


class ExportError(Exception):
    pass


def export_torchscript(model: torch.nn.Module, path: Path, sample: np.ndarray) -> float:
    """Script, freeze, save, reload and compare on `sample`; returns the max abs difference.

    Raises ExportError (and leaves no file) when the reloaded model disagrees with the eager one.
    """
    model.eval()
    # Frozen: weights inlined and batch norm folded into the convolutions; still device-neutral, so
    # the handler can run it on CUDA or apply CPU-specific optimisation at load time.
    return save_checked(torch.jit.freeze(torch.jit.script(model)), model, path, sample)


def save_checked(scripted: torch.jit.ScriptModule, reference: torch.nn.Module, path: Path,
                 sample: np.ndarray) -> float:
    """Save `scripted`, reload it and compare with `reference` on `sample`; returns the max abs difference.
    Raises ExportError (and leaves no file) above PARITY_TOLERANCE."""
    scripted.save(str(path))
    reloaded = torch.jit.load(str(path), map_location="cpu")
    x = torch.as_tensor(sample)
    with torch.no_grad():
        diff = float((reloaded(x) - reference(x)).abs().max())
    if not diff <= PARITY_TOLERANCE:
        Path(path).unlink(missing_ok=True)
        raise ExportError(f"TorchScript output differs from eager by {diff:.3g} (> {PARITY_TOLERANCE})")
    return diff


def onnx_modules() -> tuple[ModuleType, ModuleType] | None:
    """(onnx, onnxruntime), or None when either is not installed: the ONNX export is optional."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        return None
    return onnx, onnxruntime


def export_onnx(model: torch.nn.Module, path: Path, sample: np.ndarray) -> float | None:
    """Export `model` to ONNX (dynamic batch axis), check it, and compare onnxruntime's output with the eager
    model's on `sample` and on its first row alone (a batch of one, through the dynamic axis).

    Returns the max abs difference, or None (and leaves no file) when onnx or onnxruntime is not installed.
    Raises ExportError (and leaves no file) when the export fails or disagrees with the eager model by more than
    PARITY_TOLERANCE. The file appears at `path` only once it passed.
    """
    path = Path(path)
    path.unlink(missing_ok=True)  # never a stale one from an earlier build of this directory
    modules = onnx_modules()
    if modules is None:
        return None
    onnx, ort = modules
    partial = path.with_name(f".{path.name}.partial")
    model.eval()
    x = torch.as_tensor(sample)
    try:
        with warnings.catch_warnings():
            # The TorchScript-based exporter (dynamo=False) needs no onnxscript; torch >= 2.9 warns it is legacy.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(model, (x[:2],), str(partial), dynamo=False, opset_version=ONNX_OPSET,
                              input_names=[ONNX_INPUT], output_names=[ONNX_OUTPUT], do_constant_folding=True,
                              dynamic_axes={ONNX_INPUT: {0: "batch"}, ONNX_OUTPUT: {0: "batch"}})
        onnx.checker.check_model(onnx.load(str(partial)))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(partial), options, providers=["CPUExecutionProvider"])
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run([ONNX_OUTPUT], {ONNX_INPUT: x.numpy()})[0]
        one = session.run([ONNX_OUTPUT], {ONNX_INPUT: x[:1].numpy()})[0]
        if got.shape != expected.shape or one.shape != expected[:1].shape:
            raise ExportError(f"ONNX output shape {got.shape} (batch of one: {one.shape}) "
                              f"differs from eager {expected.shape}")
        diff = max(float(np.abs(got - expected).max()), float(np.abs(one - expected[:1]).max()))
        if not diff <= PARITY_TOLERANCE:
            raise ExportError(f"ONNX Runtime output differs from eager by {diff:.3g} (> {PARITY_TOLERANCE})")
        partial.replace(path)
        return diff
    except ExportError:
        partial.unlink(missing_ok=True)
        raise
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise ExportError(f"ONNX export failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                          ) from exc
    finally:
        partial.unlink(missing_ok=True)
