"""The build's steps as plain functions over files: `python -m training` and the KFP pipeline both call them.

prepare_data -> train_and_export -> build_gallery -> evaluate_and_finalize
Each step reads what the previous one wrote, so a pipeline can run them as separate tasks.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import faiss
import numpy as np
import torch

from handler import preprocessing
from handler.artifacts import (
    CHECKSUMMED,
    INDEX_FILE,
    LABELS_FILE,
    ONNX_FILE,
    OPTIONAL_CHECKSUMMED,
    SOURCES_FILE,
    sha256_file,
)
from handler.metadata import DEFAULT_MODEL_FORMAT, MODEL_FILES, Metrics, ModelMetadata
from handler.network import AotiModel, load_network
from handler.search import DEFAULT_K, GallerySearcher, class_prototypes, gallery_vectors

from .config import DEFAULT_KTH, DEFAULT_OPEN_SET_SCORE, resolve_profile, resolve_quantize
from .data import Dataset, load_dataset
from .evaluate import (
    ACCEPT_QUANTILE,
    calibrate_threshold,
    cross_fitted_acceptance,
    drift_baseline,
    evaluate,
    open_set_rejection,
    write_plots,
)
from .export import ONNX_OPSET, export_onnx, export_torchscript
from .index import build_index, default_search_params, recall_at_1, resolve_index_type
from .outputs import INDEX_INFO_FILE, METRICS_FILE, TRAIN_FILE
from .quantize import CALIBRATION_IMAGES, QuantizationError, int8_unavailable, quantize_int8
from .train import TrainConfig, embed, resolve_negatives, train_model


def prepare_data(source: str, cache_dir: Path | None = None, dataset: Dataset | None = None,
                 profile: str = "auto") -> Dataset:
    """Load a source (or take raw ``dataset``) and apply the serving preprocessing's array path (``profile``,
    auto: the dataset's) to every image: the Dataset of canvases the other steps read, its ``profile`` set."""
    if profile != "auto":
        resolve_profile(profile, "")  # an unknown name fails before any data is read
    ds = dataset or load_dataset(source, cache_dir, profile=None if profile == "auto" else profile)
    chosen = preprocessing.PROFILES[resolve_profile(profile, ds.name)]
    return Dataset(
        ds.name,
        chosen.canvases_from_arrays(ds.train_images),
        ds.train_labels.astype(np.int64),
        chosen.canvases_from_arrays(ds.test_images),
        ds.test_labels.astype(np.int64),
        tuple(ds.classes),
        ds.train_sources,
        ds.source_kind,
        chosen.name,
    )


def resolve_build_quantize(choice: str, profile: str, log: Callable[[str], None] = print) -> str:
    """The quantization this build makes: resolve_quantize's, except that auto builds the float model where int8
    cannot be built (no C++ compiler, not x86-64: quantize.int8_unavailable), saying so. An explicit int8 that
    cannot be built is a QuantizationError here, before any training."""
    quantize = resolve_quantize(choice, profile)
    why = int8_unavailable() if quantize == "int8" else None
    if why is not None and choice != "auto":
        raise QuantizationError(f"{why} (--quantize none builds the float model)")
    if choice == "auto":
        if why is not None:
            quantize = "none"
            log(f"quantize auto: none for the {profile} profile, because {why}; the float model is as accurate and "
                "serves about 20% fewer requests per second (docs/decisions.md)")
        else:
            log(f"quantize auto: {quantize} for the {profile} profile"
                + (" (--quantize none builds the float model: GPU serving, model.onnx)" if quantize != "none" else ""))
    return quantize


def train_and_export(data: Dataset, config: TrainConfig, out: Path, k: int = DEFAULT_K,
                     log: Callable[[str], None] = print) -> dict:
    """Train and export the network: model.pt (TorchScript, parity-checked) and model.onnx (ONNX, parity-checked
    with onnxruntime; skipped when onnx/onnxruntime are not installed) for the float model, model.pt2 (an
    AOTInductor package, training.quantize) when ``config.quantize`` resolves to int8 (auto does for the digits
    profile where it can be built: resolve_build_quantize); write train.json with the resolved settings and the
    network's ``model_format``."""
    quantize = resolve_build_quantize(config.quantize, data.preprocessing.name, log)
    config = resolve_negatives(replace(config, quantize=quantize), data.classes, data.profile)
    model, history = train_model(data.inputs("train"), data.train_labels, data.inputs("test"), data.test_labels,
                                 len(data.classes), config, k, log, data.preprocessing)
    check = data.inputs("test")[:256]
    quantization, parity, onnx_parity = None, None, None
    (out / ONNX_FILE).unlink(missing_ok=True)
    for name in MODEL_FILES.values():
        (out / name).unlink(missing_ok=True)  # never a stale network of an earlier build of this directory
    if config.quantize == "int8":
        model_format = "aotinductor"
        pick = np.random.default_rng(config.seed).permutation(len(data.train_labels))[:CALIBRATION_IMAGES]
        try:
            quantization = quantize_int8(model, data.inputs("train")[np.sort(pick)], data.inputs("test")[:1024],
                                         out / MODEL_FILES[model_format])
        except QuantizationError as exc:
            raise QuantizationError(f"{exc} (--quantize none builds the float model)") from exc
        log(f"int8 model ({MODEL_FILES[model_format]}, compiled for {quantization['march']} in "
            f"{quantization['build_seconds']:.0f} s, calibrated on {quantization['calibration_images']} training "
            f"images): embeddings within {quantization['max_abs_diff_vs_float']:.3f} of the float model's")
        log(f"ONNX export skipped: the int8 {MODEL_FILES[model_format]} serves, a float {ONNX_FILE} would be "
            "another model (--quantize none builds a float model with one)")
    else:
        model_format = "torchscript"
        parity = export_torchscript(model, out / MODEL_FILES[model_format], check)
        log(f"TorchScript export: max abs difference vs eager {parity:.2e}")
        onnx_parity = export_onnx(model, out / ONNX_FILE, check)
        if onnx_parity is None:
            log(f"ONNX export skipped: onnx/onnxruntime not installed, no {ONNX_FILE} (the TorchScript model serves)")
        else:
            log(f"ONNX export (opset {ONNX_OPSET}): onnxruntime max abs difference vs eager {onnx_parity:.2e}")
    info = {"config": config.to_dict(), "history": history.epochs, "train_seconds": history.seconds,
            "model_format": model_format, "torchscript_max_abs_diff": parity, "onnx_max_abs_diff": onnx_parity,
            "onnx_opset": None if onnx_parity is None else ONNX_OPSET, "quantization": quantization}
    (out / TRAIN_FILE).write_text(json.dumps(info, indent=2))
    return info


def load_model(out: Path) -> "torch.jit.ScriptModule | AotiModel":
    """The network train_and_export wrote into `out` (in the format its train.json records), on the CPU."""
    train_info = json.loads((out / TRAIN_FILE).read_text())
    model_format = train_info.get("model_format", DEFAULT_MODEL_FORMAT)
    return load_network(out / MODEL_FILES[model_format], model_format, train_info.get("quantization") or {},
                        embedding_dim=train_info["config"]["embedding_dim"])


def build_gallery(data: Dataset, out: Path, index_type: str = "auto", seed: int = 0,
                  log: Callable[[str], None] = print) -> dict:
    """Embed the training split with the exported network and write index.faiss, labels.json, index.json, and
    sources.json when the data names each image's source (gallery item i is training image i)."""
    model = load_model(out)
    gallery = embed(model, data.inputs("train"))
    index_type = resolve_index_type(index_type, len(gallery))
    started = time.perf_counter()
    index = build_index(gallery, index_type, seed)
    build_seconds = time.perf_counter() - started
    info = {"type": index_type, "size": int(index.ntotal), "dim": int(index.d),
            "search_params": default_search_params(index_type), "build_seconds": build_seconds}
    if index_type != "flat":
        info["recall_at_1"] = recall_at_1(index, gallery, embed(model, data.inputs("test")))
        log(f"{index_type} index: recall@1 against exact search {info['recall_at_1']:.4f}")
    faiss.write_index(index, str(out / INDEX_FILE))
    (out / LABELS_FILE).write_text(json.dumps([data.classes[y] for y in data.train_labels]))
    sources = out / SOURCES_FILE
    if data.train_sources is not None and len(data.train_sources) == len(data.train_labels):
        sources.write_text(json.dumps({"kind": data.source_kind, "ids": data.train_sources.tolist()}))
    else:
        sources.unlink(missing_ok=True)  # never a stale one from an earlier build of this directory
    (out / INDEX_INFO_FILE).write_text(json.dumps(info, indent=2))
    return info


def onnx_versions(out: Path) -> dict[str, str]:
    """onnx and onnxruntime versions when this build exported model.onnx (they made and checked it)."""
    if not (out / ONNX_FILE).is_file():
        return {}
    try:
        import onnx
        import onnxruntime
    except ImportError:  # a pipeline's evaluate task may run where the train task's packages are not
        return {}
    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def present_optional(out: Path) -> list[str]:
    """The optional checksummed artifacts this build wrote (sources.json, model.onnx)."""
    return [name for name in OPTIONAL_CHECKSUMMED if (out / name).is_file()]


def evaluate_and_finalize(data: Dataset, out: Path, k: int = DEFAULT_K, plots: bool = True,
                          log: Callable[[str], None] = print, score: str = DEFAULT_OPEN_SET_SCORE,
                          kth: int = DEFAULT_KTH) -> ModelMetadata:
    """Evaluate with the serving searcher, calibrate the open-set threshold of `score` on held-out digits only
    only, write metadata.json."""
    model = load_model(out)
    index_info = json.loads((out / INDEX_INFO_FILE).read_text())
    train_info = json.loads((out / TRAIN_FILE).read_text())
    model_format = train_info.get("model_format", DEFAULT_MODEL_FORMAT)
    index = faiss.read_index(str(out / INDEX_FILE))
    labels = json.loads((out / LABELS_FILE).read_text())
    prototypes = None
    if score == "prototype_distance":
        # build_gallery added the network's embeddings of the training split: the index holds exact copies, so the
        # prototypes need no second pass of the network over the training images.
        names, prototypes = class_prototypes(gallery_vectors(index), labels)
    searcher = GallerySearcher(index, labels, k=k, score=score, kth=kth, prototypes=prototypes,
                               search_params=index_info["search_params"])
    test_emb = embed(model, data.inputs("test"))
    result = evaluate(searcher, test_emb, data.test_labels, data.classes)
    top1 = result.pop("top1_distances")
    scores = searcher.scores(test_emb)
    searcher.threshold = calibrate_threshold(scores)
    result["threshold"] = searcher.threshold
    accepted = cross_fitted_acceptance(scores)
    result["digits_accepted_cross_fitted"] = accepted
    open_set = {"score": score, "kth": searcher.kth, "threshold": searcher.threshold,
                "calibration": {"split": "test", "n": int(len(scores)), "accept_quantile": ACCEPT_QUANTILE,
                                "accepted_cross_fitted": accepted}}
    if prototypes is not None:
        open_set["prototypes"] = {"labels": names, "vectors": prototypes.tolist()}
    baseline = drift_baseline(top1, searcher.threshold)
    baseline["unknown_rate"] = float(np.mean(scores > searcher.threshold))  # what the served rule answers
    result["open_set_rejection"] = open_set_rejection(searcher, lambda x: embed(model, x), profile=data.preprocessing)
    log(f"held-out k-NN accuracy {result['accuracy']:.4f}; {score} threshold {searcher.threshold:.4f} accepts "
        f"{accepted if accepted is not None else float('nan'):.1%} of held-out images (cross-fitted) "
        f"and rejects {result['open_set_rejection']:.1%} of synthetic non-digits")
    if plots:
        result["plots"] = write_plots(out, train_info["history"], np.array(result["confusion_matrix"]),
                                      data.classes, test_emb, data.test_labels)
    (out / METRICS_FILE).write_text(json.dumps(result, indent=2))
    metadata = ModelMetadata(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        dataset=data.summary(),
        embedding_dim=int(searcher.dim),
        preprocessing=data.preprocessing.record(),
        index=index_info,
        k=k,
        open_set=open_set,
        metrics=Metrics(result["accuracy"], result["open_set_rejection"]),
        drift_baseline=baseline,
        training={key: train_info.get(key) for key in ("config", "train_seconds", "torchscript_max_abs_diff",
                                                       "onnx_max_abs_diff", "onnx_opset", "quantization")},
        versions={"python": platform.python_version(), "torch": torch.__version__,
                  "faiss": faiss.__version__, "numpy": np.__version__, **onnx_versions(out)},
        sha256={name: sha256_file(out / name)
                for name in (MODEL_FILES[model_format], *CHECKSUMMED, *present_optional(out))},
        model_format=model_format,
    )
    metadata.write(out)
    return metadata
