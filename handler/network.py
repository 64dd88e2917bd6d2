"""What runs the embedding network, in each form training writes: TorchScript (model.pt, the float model), an
AOTInductor package (model.pt2, the int8 model: training.quantize) or ONNX (model.onnx, optional, for ONNX Runtime).
Every form is called the same way: (N, 1, 28, 28) float32 inputs -> (N, D) float32 embeddings.

model.pt2 is compiled code for one instruction set (the build pins x86-64-v3: AVX2 and FMA, every x86 server CPU
since about 2015), so it is checked against this CPU before it is loaded, and a package the loader cannot open (an
older C library than the build's, another machine type) is refused in one line instead of crashing a worker.
"""

from __future__ import annotations

import logging
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from .artifacts import ONNX_FILE, ArtifactError, quantization
from .metadata import ModelMetadata

#: handler.runtime: ``torch`` runs the model file training wrote (model.pt or model.pt2); ``onnxruntime`` runs
#: model.onnx (optional: needs onnxruntime installed and a float build trained with it; CPU only). ``torchscript``,
#: the name of ``torch`` before int8 models were AOTInductor packages, is still read.
RUNTIMES = ("torch", "onnxruntime")
DEFAULT_RUNTIME = "torch"
RUNTIME_ALIASES = {"torchscript": "torch"}
#: The CPU capabilities (torch.backends.cpu.get_cpu_capability) that run a package built for each instruction set.
ISA_CAPABLE = {"AVX2": ("AVX2", "AVX512")}
#: torch's logger that warns on every load of a package built for another ISA than this CPU's best (an AVX2
#: package on an AVX-512 CPU runs as built; ISA_CAPABLE is the check that matters).
_PACKAGE_LOGGER = "torch.export.pt2_archive._package"


def runtime_of(value: str) -> str:
    """The runtime a handler.runtime setting names (aliases resolved); ValueError for an unknown one."""
    runtime = RUNTIME_ALIASES.get(value, value)
    if runtime not in RUNTIMES:
        raise ValueError(f"handler.runtime must be {' or '.join(RUNTIMES)}, got {value!r}")
    return runtime


class OnnxModel:
    """model.onnx in an onnxruntime InferenceSession on the CPU, called like the torch models but on numpy."""

    def __init__(self, path: Path, threads: int) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ArtifactError("handler.runtime=onnxruntime but onnxruntime is not installed on this worker "
                                "(install it, or serve with runtime torch)") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # as torch's threads setting: one per worker on the shipped 2 x 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only: no per-session info lines in the worker log
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.threads = threads

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: np.ascontiguousarray(batch, dtype=np.float32)})[0]


class AotiModel:
    """model.pt2, an AOTInductor package: its compiled network called like a TorchScript module (tensor in, tensor
    out, ``eval()``), so training's embed() and the service take either."""

    def __init__(self, run: Callable[[torch.Tensor], object], embedding_dim: int | None) -> None:
        self._run = run
        self.embedding_dim = embedding_dim

    def eval(self) -> AotiModel:
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self._run(x.contiguous())
        return out[0] if isinstance(out, (list, tuple)) else out


def cpu_runs(isa: str) -> str | None:
    """Why this machine cannot run code built for `isa` (an AOTI_CPU_ISA value), or None when it can."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"it was compiled for x86-64 CPUs and this machine is {machine}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ISA_CAPABLE.get(isa, ()):
        return (f"it was compiled for {isa} and this CPU offers {capability} (or ATEN_CPU_CAPABILITY lowers it)"
                if isa in ISA_CAPABLE else f"it was compiled for {isa!r}, which this handler does not know")
    return None


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The named loggers at ERROR for the block (warnings torch and torchao print on every call of an API)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def load_package(path: Path, isa: str, embedding_dim: int | None = None) -> AotiModel:
    """An AOTInductor package as an AotiModel, after checking this CPU runs `isa`; ArtifactError (one line) when it
    cannot, or when the loader refuses the package. Needs torch only: no compiler, no torchao."""
    why = cpu_runs(isa)
    if why is not None:
        raise ArtifactError(f"{path}: cannot run here: {why} (build the float model with --quantize none, which "
                            "runs anywhere torch does)")
    from torch._inductor import aoti_load_package, config, cpu_vec_isa

    try:
        # The loader compares the package's ISA with this CPU's, which it finds by compiling probe programs where a
        # C++ compiler is on PATH: 7.5 s per worker start (measured), for a warning only; cpu_runs checked it.
        with quiet_loggers(_PACKAGE_LOGGER), config.patch({"cpp.vec_isa_ok": False}):
            run = aoti_load_package(str(path))
    except (RuntimeError, OSError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArtifactError(f"{path}: the AOTInductor package does not load here ({first}); rebuild it where it "
                            "is served, or build the float model with --quantize none") from None
    finally:
        cpu_vec_isa.valid_vec_isa_list.cache_clear()  # else a later build in this process would compile unvectorized
    return AotiModel(run, embedding_dim)


def load_network(path: Path, model_format: str, quantized: Mapping[str, Any], device: str = "cpu",
                 embedding_dim: int | None = None) -> "torch.jit.ScriptModule | AotiModel":
    """The network file at `path`, stored as `model_format` (metadata.MODEL_FILES) and quantized as `quantized`
    records (ModelMetadata.quantization; {} for float), on `device` and unoptimised: what training embeds its
    gallery with. An int8 TorchScript model, from a build before model.pt2, runs on the quantized engine it was
    built for, while this torch still has torch.ao's quantized tensors."""
    if model_format == "aotinductor":
        return load_package(path, str(quantized.get("isa", "")), embedding_dim)
    if quantized.get("scheme", "none") != "none":
        engine = str(quantized.get("engine", ""))
        if engine not in torch.backends.quantized.supported_engines:
            raise ArtifactError(f"{path}: quantized for the {engine!r} engine, which this torch build lacks (it has "
                                f"{', '.join(torch.backends.quantized.supported_engines)})")
        torch.backends.quantized.engine = engine
    return torch.jit.load(str(path), map_location=device).eval()


def load_model(model_dir: Path, metadata: ModelMetadata, device: str = "cpu", runtime: str = DEFAULT_RUNTIME,
               threads: int | None = None) -> "torch.jit.ScriptModule | AotiModel | OnnxModel":
    """The network of verified artifacts as served, in `runtime` (runtime_of). An int8 model runs on the CPU only;
    onnxruntime is refused (ArtifactError, one line) on CUDA, for int8 artifacts and for artifacts without
    model.onnx; ``threads``: onnxruntime's intra-op threads (None or 0: torch's current setting, which the handler
    sets from its own threads setting)."""
    runtime = runtime_of(runtime)
    model_dir = Path(model_dir)
    scheme = quantization(metadata)
    if scheme != "none" and torch.device(device).type != "cpu":
        raise ArtifactError(f"{model_dir / metadata.model_file}: an {scheme} model (training --quantize {scheme}) runs "
                            f"on the CPU only, not on {device} (set handler.device: cpu or auto, or train the float "
                            "model with --quantize none)")
    if runtime == "onnxruntime":
        if torch.device(device).type != "cpu":
            raise ArtifactError(f"handler.runtime=onnxruntime runs on the CPU only, not on {device} "
                                "(set handler.device: cpu, or use runtime torch)")
        if scheme != "none":
            raise ArtifactError(f"{model_dir / ONNX_FILE}: an {scheme} model has none (its {metadata.model_file} "
                                "serves; use runtime torch, or train the float model with --quantize none)")
        if ONNX_FILE not in metadata.sha256:
            raise ArtifactError(f"{model_dir / ONNX_FILE}: missing, these artifacts were trained without "
                                "onnx/onnxruntime (handler.runtime=onnxruntime needs it; use runtime torch)")
        return OnnxModel(model_dir / ONNX_FILE, threads or torch.get_num_threads())
    model = load_network(model_dir / metadata.model_file, metadata.model_format, metadata.quantization, device,
                         metadata.embedding_dim)
    if isinstance(model, torch.jit.ScriptModule) and torch.device(device).type == "cpu":
        # oneDNN kernels for the frozen graph: about 2x faster on CPU (measured: 7.0 -> 3.5 ms for a
        # batch of 8 on one thread), same outputs within 1e-7.
        model = torch.jit.optimize_for_inference(model)
    return model
