"""Post-training int8 quantization of the embedding network (``python -m training --quantize int8``), written as an
AOTInductor package, model.pt2.

The PT2E flow torch points to since it deprecated torch.ao's quantized tensors: torch.export captures the network
with a dynamic batch, torchao's X86InductorQuantizer inserts observers, calibration on training inputs sets the
activation ranges, convert_pt2e turns them into quantize/dequantize pairs, and AOTInductor compiles the result ahead
of time: freezing fuses each dequantize -> convolution -> batch norm -> ReLU -> quantize into one oneDNN int8
convolution. The package runs on torch alone (no torchao, no compiler where it is served: handler.network).

Two layers stay float: the projection to the embedding (a small share of the time, and it carries the geometry the
gallery is searched in) and the first convolution (one input channel, a small share too; an int8 one came out of
Inductor's dynamic-batch build with embeddings 0.64 off the float ones on a trained network, 2026-11-29). The
result is another model than the float one (distances move by about 1e-2), so training embeds the gallery, the
prototypes and the calibration set with it. Building needs a C++ compiler (g++) and an x86-64 machine;
:func:`int8_unavailable` says why not before any training starts.

The package is compiled for x86-64-v3 (AVX2 and FMA) whatever CPU builds it, so a build on an AVX-512 machine
serves on any AVX2 one, and its kernels take the thread count of the process that runs them (the handler's threads
setting), not the build's. Measured against the float model and torch.ao's eager int8 on two seeds:
docs/decisions.md, "int8 off torch.ao's deprecated path".
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from handler.network import load_package, quiet_loggers

from .export import ExportError
from .model import EmbeddingNet

#: Calibration inputs drawn from the training set (more changes the activation ranges by well under 1%).
CALIBRATION_IMAGES = 2048
#: Largest accepted difference between the quantized and the float embeddings (unit vectors) on held-out inputs:
#: a broken calibration or build shows as differences of 0.5 and more; a sound one stays under about 0.1.
MAX_EMBEDDING_DIFF = 0.25
#: Largest accepted difference between one input's embedding in a batch of one and in a larger batch: the package
#: takes any batch size, and an answer must not depend on what it was batched with.
MAX_BATCH_DIFF = 1e-4
#: What the package is compiled for: gcc's x86-64-v3 level and AOTInductor's name of its vector ISA (256-bit).
MARCH, ISA, SIMD_BITS = "x86-64-v3", "AVX2", 256
#: The batch sizes the package is checked at (the example it is exported with is the third).
CHECK_BATCHES = (1, 7, 8, 37)
#: The modules left float, by name in EmbeddingNet.
FLOAT_MODULES = ("features.0.0",)
#: The largest batch the package accepts (the export's dynamic batch range).
MAX_BATCH = 4096
#: Loggers that report, at every import of torchao, its CUDA extensions missing and an API of torch it still uses.
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


class QuantizationError(ExportError):
    """The int8 model could not be made, or strays from the float one (the CLI reports it in one line)."""


def compiler() -> str:
    """The C++ compiler AOTInductor calls: $CXX, else g++."""
    return os.environ.get("CXX") or "g++"


def int8_unavailable() -> str | None:
    """Why an int8 build cannot be made on this machine (one line), or None when it can."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"the int8 model is compiled for x86-64 CPUs and this machine is {machine}"
    if shutil.which(compiler()) is None:
        return (f"the int8 model is compiled ahead of time and no C++ compiler ({compiler()}) is on PATH "
                "(apt-get install g++)")
    try:
        importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return "the int8 model is made with torchao, which is not installed (pip install the training extra)"
    return None


def _pt2e() -> tuple[Any, Any, Any]:
    """(prepare_pt2e, convert_pt2e, the x86 Inductor quantizer module) from torchao, without loading its CUDA
    and kernel extensions (PT2E needs none of them)."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    with quiet_loggers(*_NOISY_LOGGERS):
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    return prepare_pt2e, convert_pt2e, xiq


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def convert(model: nn.Module, calibration: torch.Tensor) -> torch.fx.GraphModule:
    """The PT2E reference int8 graph of `model` (float ops between quantize/dequantize pairs): exported with a
    dynamic batch, observed on `calibration`, converted."""
    prepare_pt2e, convert_pt2e, xiq = _pt2e()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    example = (calibration[:CHECK_BATCHES[2]].contiguous(),)
    with quiet_loggers(*_NOISY_LOGGERS):
        exported = torch.export.export(model, example, dynamic_shapes=({0: batch},)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    quantizer.set_module_type_qconfig(nn.Linear, None)
    for name in FLOAT_MODULES:
        quantizer.set_module_name_qconfig(name, None)
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for start in range(0, len(calibration), 256):
            prepared(calibration[start : start + 256])
    return convert_pt2e(prepared)


def compile_package(converted: torch.fx.GraphModule, example: torch.Tensor, path: Path) -> None:
    """AOTInductor: export the converted graph again (dynamic batch) and compile it into the package `path`."""
    from torch._inductor import aoti_compile_and_package

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad(), quiet_loggers(*_NOISY_LOGGERS):
        program = torch.export.export(converted, (example,), dynamic_shapes=({0: batch},))
        aoti_compile_and_package(program, package_path=str(path), inductor_configs={
            "freezing": True, "cpp.march": MARCH, "cpp.simdlen": SIMD_BITS, "cpp.dynamic_threads": True})


def quantize_int8(model: EmbeddingNet, calibration: np.ndarray, check: np.ndarray, path: Path) -> dict[str, Any]:
    """Write an int8 copy of the eval-mode ``model`` (left unchanged) to `path` (an AOTInductor package), and
    return what was measured on the way. ``calibration``: normalised training inputs (N, 1, 28, 28); ``check``:
    held-out inputs the package's embeddings are compared on, whole and in batches of CHECK_BATCHES. Raises
    QuantizationError (and leaves no file) when it cannot be built here or the result strays."""
    why = int8_unavailable()
    if why is not None:
        raise QuantizationError(why)
    missing = sorted(set(FLOAT_MODULES) - {name for name, _ in model.named_modules()})
    if missing:
        raise QuantizationError(f"the network has no module {missing[0]} to keep float: training/model.py changed, "
                                "update training/quantize.py's FLOAT_MODULES")
    path = Path(path)
    path.unlink(missing_ok=True)
    partial = path.with_name(f".{path.stem}.partial.pt2")
    x_cal = torch.as_tensor(np.ascontiguousarray(calibration))
    x_check = torch.as_tensor(np.ascontiguousarray(check))
    started = time.perf_counter()
    try:
        float_model = copy.deepcopy(model).eval()
        converted = convert(float_model, x_cal)
        compile_package(converted, x_check[:CHECK_BATCHES[2]].contiguous(), partial)
        seconds = time.perf_counter() - started
        package = load_package(partial, ISA, model.embedding_dim)
        with torch.inference_mode():
            reference, out = float_model(x_check), package(x_check)
            batch_diff = max(float((package(x_check[:b]) - out[:b]).abs().max()) for b in CHECK_BATCHES)
    except QuantizationError:
        partial.unlink(missing_ok=True)
        raise
    except Exception as exc:  # torch.export, torchao and Inductor raise many kinds on a network they cannot take
        partial.unlink(missing_ok=True)
        raise QuantizationError(f"int8 quantization failed: {_first_line(exc)}") from exc
    diff = float((out - reference).abs().max())
    cosine = float((out * reference).sum(dim=1).min())
    problem = (f"int8 embeddings differ from the float model's by up to {diff:.3g} (> {MAX_EMBEDDING_DIFF}): "
               "calibration failed" if not diff <= MAX_EMBEDDING_DIFF else
               f"int8 embeddings depend on the batch size (by up to {batch_diff:.3g} > {MAX_BATCH_DIFF})"
               if not batch_diff <= MAX_BATCH_DIFF else None)
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise QuantizationError(problem)
    partial.replace(path)
    return {"scheme": "int8", "method": "pt2e-x86-inductor-aoti", "isa": ISA, "march": MARCH,
            "calibration_images": int(len(x_cal)), "float_layers": f"{', '.join(FLOAT_MODULES)} (first convolution), "
            "projection (Linear) and L2 normalisation", "max_abs_diff_vs_float": diff, "min_cosine_vs_float": cosine,
            "batch_max_abs_diff": batch_diff, "build_seconds": round(seconds, 1),
            "torchao": importlib.metadata.version("torchao"), "package_bytes": path.stat().st_size}
