"""PT2E int8 (torchao 0.18, X86InductorQuantizer) of the trained EmbeddingNet, compiled ahead of time with
AOTInductor into a .pt2 package; and a loader that needs only torch (no torchao) to run it."""


from __future__ import annotations

import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn


class Runner(nn.Module):
    """An AOTI package's callable, shaped like the network (eval(), embedding_dim, tensor in, tensor out)."""

    def __init__(self, fn, embedding_dim: int = 64) -> None:
        super().__init__()
        self.__dict__["fn"] = fn  # not a submodule: train()/eval() must not reach an unlifted export module
        self.embedding_dim = embedding_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fn(x.contiguous())
        return out[0] if isinstance(out, (list, tuple)) else out


def load(path, embedding_dim: int = 64) -> Runner:
    """Load an AOTI package (any file name: copied to a .pt2 name first)."""
    path = Path(path)
    if path.suffix != ".pt2":
        tmp = Path(tempfile.mkdtemp(prefix="aoti-")) / "model.pt2"
        shutil.copyfile(path, tmp)
        path = tmp
    return Runner(torch._inductor.aoti_load_package(str(path)), embedding_dim).eval()


def quantize(model: nn.Module, calibration: torch.Tensor, linear_float: bool = False,
             reduce_range: bool = False, first_float: bool = True) -> torch.fx.GraphModule:
    """export (dynamic batch) -> prepare_pt2e -> calibrate -> convert_pt2e. Returns the converted graph module
    (quantize/dequantize pairs of quantized_decomposed ops around float ops: the reference representation)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    example = (calibration[:8].contiguous(),)
    batch = torch.export.Dim("batch", min=1, max=4096)
    exported = torch.export.export(model.eval(), example, dynamic_shapes=({0: batch},)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(reduce_range=reduce_range))
    if linear_float:
        quantizer.set_module_type_qconfig(torch.nn.Linear, None)
    if first_float:  # the 1-channel first conv: Inductor's dynamic-batch AOTI build mislays its int8 output
        quantizer.set_module_name_qconfig("features.0.0", None)
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for start in range(0, len(calibration), 256):
            prepared(calibration[start : start + 256])
    return convert_pt2e(prepared)


def compile_package(converted: torch.fx.GraphModule, example: torch.Tensor, package: Path) -> dict:
    """AOTInductor: export the converted module again and compile it to a .pt2 package (C++ compiler needed
    here). Freezing makes Inductor fold weights and fuse dq->conv->q into oneDNN int8 kernels."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    started = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(converted, (example,), dynamic_shapes=({0: batch},))
        exported_s = time.perf_counter() - started
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(package),
                                                        inductor_configs={"freezing": True})
    return {"export_seconds": exported_s, "compile_seconds": time.perf_counter() - started,
            "package": path, "package_bytes": os.path.getsize(path)}


def lower_x86(model: nn.Module, example: tuple) -> torch.fx.GraphModule:
    """torchao.quantization.pt2e.lowering.lower_pt2e_quantized_to_x86, with a dynamic batch in its export: the
    PT2E reference graph -> oneDNN int8 ops (qconv_pointwise, prepacked weights) run eagerly. torch only: no
    torchao, no C compiler."""
    from torch._inductor.constant_folding import constant_fold
    from torch._inductor.fx_passes.freezing_patterns import freezing_passes

    decomp = torch.export.default_decompositions()
    for k in list(decomp.keys()):
        if not torch._export.utils._is_cia_op(k):
            del decomp[k]
    low = torch.export.export(model, example, strict=True,
                              dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},)
                              ).run_decompositions(decomp).module()
    g = low.graph
    for node in list(g.nodes):
        if node.target == torch.ops.aten.t.default:
            with g.inserting_before(node):
                p = g.call_function(torch.ops.aten.permute.default, args=(node.args[0], [1, 0]))
                node.replace_all_uses_with(p)
                g.erase_node(node)
    low.recompile()
    with torch.no_grad():
        freezing_passes(low, example)
        constant_fold(low)
    return low


def load_lowered(path, embedding_dim: int = 64) -> Runner:
    """A saved ExportedProgram of the PT2E converted model (torch.export.save), lowered at load time."""
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401 (registers the ops)

    ep = torch.export.load(str(path))
    return Runner(lower_x86(ep.module(), (torch.zeros(8, 1, 28, 28),)), embedding_dim).eval()
