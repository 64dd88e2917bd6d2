"""The build's parameters, defined once: ``python -m training`` makes its options from this table and the pipeline
(pipeline.params) its run parameters, so the same words build the same model from either.

Pool sizes take AUTO (-1) for "decided by the classes" (a pipeline parameter cannot be None); TrainConfig keeps
None for it.
"""

from __future__ import annotations

from typing import Any, Mapping

from cli_common import Param, finite, non_negative_number, positive, positive_number
from handler.search import DEFAULT_K, OPEN_SET_SCORES

from .config import (DEFAULT_KTH, DEFAULT_OPEN_SET_SCORE, DIGIT_NEGATIVES, DIGIT_PRINTED, INDEX_TYPES, PRECISION,
                     PRECISION_HELP, PROFILE_CHOICES, QUANTIZE_CHOICES, TrainConfig)

AUTO = -1


def _pool(value: int) -> str | None:
    return None if value >= AUTO else f"must be {AUTO} (auto), 0 (off) or a size"


_D = TrainConfig()
#: What TrainConfig takes from the table (the rest: the profile, the index, the open-set score and k).
CONFIG_FIELDS = ("epochs", "embedding_dim", "width", "batch_size", "lr", "seed", "negatives", "printed", "oe_weight",
                 "oe_loss", "oe_margin", "quantize", "precision")
TRAINING_PARAMS: tuple[Param, ...] = (
    Param("preprocessing", str, "auto", "preprocessing profile: digits (crop to the strokes, 20x20 box, as MNIST), "
          "full-frame (whole 28x28 frame, for centred pictures such as Fashion-MNIST) or auto (full-frame for "
          "Fashion-MNIST, else digits); recorded in metadata.json and applied by the handler",
          choices=PROFILE_CHOICES),
    Param("epochs", int, _D.epochs, "training epochs", check=positive),
    Param("embedding_dim", int, _D.embedding_dim, "embedding size", check=positive),
    Param("width", int, _D.width, "channels of the first conv blocks (later ones 2x, 4x)", check=positive),
    Param("batch_size", int, _D.batch_size, "images per training step", check=positive),
    Param("lr", float, _D.lr, "learning rate", check=positive_number),
    Param("seed", int, _D.seed, "training and index seed"),
    Param("index_type", str, "auto", "FAISS gallery index: auto (exact below 30k images, IVF above), flat, hnsw or "
          "ivf", choices=("auto", *INDEX_TYPES)),
    Param("k", int, DEFAULT_K, "neighbours in the k-NN vote", check=positive),
    Param("open_set_score", str, DEFAULT_OPEN_SET_SCORE, "what the unknown threshold is calibrated on and served "
          "with", choices=OPEN_SET_SCORES),
    Param("kth", int, DEFAULT_KTH, "neighbour rank of kth_distance (Sun et al. 2022)", check=positive),
    Param("negatives", int, AUTO, f"synthetic non-digits for outlier exposure ({AUTO}: {DIGIT_NEGATIVES} when the "
          "classes are the ten digits, else 0; 0: off)", check=_pool),
    Param("printed", int, AUTO, f"printed digits (DejaVu fonts) mixed into training with their labels ({AUTO}: "
          f"{DIGIT_PRINTED} when the classes are the ten digits, else 0; 0: off)", check=_pool),
    Param("oe_weight", float, _D.oe_weight, "weight of the outlier-exposure loss", check=non_negative_number),
    Param("oe_loss", str, _D.oe_loss, "outlier-exposure loss (training/model.py ArcFaceHead.outlier_loss)",
          choices=("hinge", "uniform")),
    Param("oe_margin", float, _D.oe_margin, "hinge: largest cosine a non-digit may keep to any class centre",
          check=finite),
    Param("quantize", str, _D.quantize, "int8: quantize the convolutions after training (faster on CPU, CPU only, "
          "no model.onnx; the gallery and threshold are built with the int8 model); none: the float model (GPU "
          "serving, model.onnx); auto: int8 for the digits profile, none for full-frame", choices=QUANTIZE_CHOICES),
    Param("precision", str, _D.precision, PRECISION_HELP, choices=PRECISION),
)
NAMES = tuple(p.name for p in TRAINING_PARAMS)


def train_config(values: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of parameter values (a command line's or a pipeline task's; AUTO pool sizes become None)."""
    fields = {name: values[name] for name in CONFIG_FIELDS}
    for pool in ("negatives", "printed"):
        fields[pool] = None if fields[pool] == AUTO else fields[pool]
    return TrainConfig(**fields)
