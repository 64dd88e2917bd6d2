"""Post-training int8 quantization of the embedding network's convolutions (``python -m training --quantize int8``).

Eager static quantization (torch.ao.quantization): each conv block's Conv2d + BatchNorm2d + ReLU is fused into
one int8 convolution with per-channel weights, activations are calibrated on training inputs, the projection to
the embedding stays float (it is a small share of the time and carries the geometry the gallery is searched in).
On the sample model the served forward pass takes 0.42x the float one's time; held-out accuracy stays the same, the
Fashion-MNIST, uploads, photo and printed-digit figures lose 0.3 point or less, and the photo exam flags up to 1
point fewer digits unknown (seeds 0 and 1, docs/model-quality.md, "int8 model"). The result is another model than
the float one (distances move by about 1e-2), so training embeds the gallery, the prototypes and the calibration
set with it: everything in the artifact directory agrees with the network that serves. Quantized kernels run on
the CPU only.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .export import ExportError
from .model import EmbeddingNet

#: Calibration inputs drawn from the training set (more changes the activation ranges by well under 1%).
CALIBRATION_IMAGES = 2048
#: Largest accepted difference between the quantized and the float embeddings (unit vectors) on held-out inputs:
#: a broken calibration shows as differences of 0.5 and more; a sound one stays under about 0.1.
MAX_EMBEDDING_DIFF = 0.25


class QuantizationError(ExportError):
    """The int8 model could not be made, or strays from the float one (the CLI reports it in one line)."""


class _Int8Embedding(nn.Module):
    """The trained network with a quantize/dequantize pair around its convolution trunk."""

    def __init__(self, net: EmbeddingNet) -> None:
        super().__init__()
        from torch.ao.quantization import DeQuantStub, QuantStub

        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.features, self.project = net.features, net.project

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.project(self.dequant(self.features(self.quant(x)))), dim=1)


def _conv_blocks(net: EmbeddingNet) -> list[list[str]]:
    """Names of each (conv, batch norm, ReLU) triple in ``features``, for fusion."""
    blocks = []
    for name, module in net.features.named_children():
        kinds = [type(m) for m in module.children()] if isinstance(module, nn.Sequential) else []
        if kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU]:
            blocks.append([f"features.{name}.{i}" for i in range(3)])
    return blocks


def static_int8(module: nn.Module, fuse: list[list[str]], calibration: torch.Tensor, example: torch.Tensor,
                engine: str = "x86") -> tuple[nn.Module, torch.jit.ScriptModule]:
    """Eager static quantization of `module` between its QuantStub and DeQuantStub, its ``project`` child left
    float: fuse the named module groups, calibrate on `calibration`, convert; then trace on `example` and freeze.
    Returns (the converted eager module, the frozen TorchScript one). torch.ao's own exceptions pass through."""
    from torch.ao import quantization as tq

    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        fused = tq.fuse_modules(module, fuse)
        fused.qconfig = tq.get_default_qconfig(engine)
        fused.project.qconfig = None
        prepared = tq.prepare(fused)
        with torch.inference_mode():
            for start in range(0, len(calibration), 256):
                prepared(calibration[start : start + 256])
        quantized = tq.convert(prepared)
        with torch.inference_mode():
            traced = torch.jit.freeze(torch.jit.trace(quantized, example).eval())
    return quantized, traced


def quantize_int8(model: EmbeddingNet, calibration: np.ndarray, check: np.ndarray,
                  engine: str = "x86") -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """An int8 copy of the eval-mode ``model`` (left unchanged), traced and frozen, and what was measured on the
    way. ``calibration``: normalised training inputs (N, 1, 28, 28); ``check``: held-out inputs the quantized
    embeddings are compared on. Raises QuantizationError when the engine is missing or the result strays."""
    if engine not in torch.backends.quantized.supported_engines:
        raise QuantizationError(f"quantized engine {engine!r} is not available in this torch build "
                                f"(supported: {', '.join(torch.backends.quantized.supported_engines)})")
    blocks = _conv_blocks(model)
    convs = sum(isinstance(m, nn.Conv2d) for m in model.features.modules())
    if len(blocks) != convs:
        raise QuantizationError(f"found {len(blocks)} conv/batch-norm/ReLU blocks for {convs} convolutions: "
                                "training/model.py changed, update training/quantize.py")
    wrapped = _Int8Embedding(copy.deepcopy(model).eval()).eval()
    x_cal = torch.as_tensor(np.ascontiguousarray(calibration))
    x_check = torch.as_tensor(np.ascontiguousarray(check))
    try:
        quantized, traced = static_int8(wrapped, blocks, x_cal, x_check[:8], engine)
        with torch.inference_mode():
            reference, eager, out = model(x_check), quantized(x_check), traced(x_check)
    except (RuntimeError, AssertionError, ValueError) as exc:  # what torch.ao raises on an unsupported network
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise QuantizationError(f"int8 quantization failed: {type(exc).__name__}: {first}") from exc
    trace_diff = float((eager - out).abs().max())
    diff = float((out - reference).abs().max())
    cosine = float((out * reference).sum(dim=1).min())
    if not trace_diff <= 1e-5:
        raise QuantizationError(f"traced int8 model differs from the eager int8 model by {trace_diff:.3g}")
    if not diff <= MAX_EMBEDDING_DIFF:
        raise QuantizationError(f"int8 embeddings differ from the float model's by up to {diff:.3g} "
                                f"(> {MAX_EMBEDDING_DIFF}): calibration failed")
    return traced, {"scheme": "int8", "engine": engine, "calibration_images": int(len(x_cal)),
                    "fused_conv_blocks": len(blocks), "max_abs_diff_vs_float": diff, "min_cosine_vs_float": cosine,
                    "trace_max_abs_diff": trace_diff,
                    "float_layers": "projection (Linear) and L2 normalisation"}

