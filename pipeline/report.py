"""The evaluation report the KFP UI shows (Markdown), rendered from what training wrote."""

from __future__ import annotations

from typing import Any, Sequence

from handler.artifacts import quantization
from handler.metadata import ModelMetadata


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def render_report(metadata: ModelMetadata, metrics: dict, history: Sequence[dict]) -> str:
    """Markdown from metadata.json, metrics.json and train.json's per-epoch history."""
    dataset, index, training = metadata.dataset, metadata.index, metadata.training
    lines = [f"# Embedding model on {dataset['name']}", ""]
    lines += _table(("metric", "value"), [
        ("held-out k-NN accuracy", f"{metadata.metrics.accuracy:.4f}"),
        ("open-set rejection (synthetic non-digits)", f"{metadata.metrics.open_set_rejection:.3f}"),
        (f"unknown threshold ({metadata.open_set.get('score', 'top1_distance')})", f"{metadata.threshold:.4f}"),
        ("train / test images", f"{dataset['train']} / {dataset['test']}"),
        ("embedding dim, k", f"{metadata.embedding_dim}, {metadata.k}"),
        ("gallery index", f"{index['type']} ({index['size']} vectors)"),
        ("training time", f"{training['train_seconds']:.1f} s"),
        ("model", "int8 convolutions (--quantize int8), CPU serving only"
         if quantization(metadata) == "int8" else "float32"),
    ])
    lines += ["## Per class", ""]
    lines += _table(("class", "precision", "recall", "support"), [
        (name, f"{c['precision']:.3f}", f"{c['recall']:.3f}", c["support"]) for name, c in metrics["per_class"].items()
    ])
    lines += ["## Training", ""]
    if quantization(metadata) == "int8":
        lines += ["Per-epoch accuracies are the float network's, before quantization; the table above is the int8 "
                  "model's.", ""]
    lines += _table(("epoch", "loss", "held-out k-NN accuracy"), [
        (h["epoch"], f"{h['loss']:.4f}", f"{h['knn_accuracy']:.4f}") for h in history
    ])
    return "\n".join(lines)
