"""Embedding CNN and its metric-learning head."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


#: How the last 7x7 feature map becomes a vector: ``avg`` pools it (where a stroke is does not matter once the
#: digit is centred), ``flatten`` keeps the layout (where a garment has sleeves, a collar or a heel does).
POOLING = ("avg", "flatten")


def _check_pool(pool: str) -> None:
    if pool not in POOLING:
        raise ValueError(f"pool must be one of {', '.join(POOLING)}, got {pool!r}")


class EmbeddingNet(nn.Module):
    """(N, 1, 28, 28) normalised images -> (N, dim) L2-normalised embeddings."""

    def __init__(self, embedding_dim: int = 64, width: int = 32, pool: str = "avg") -> None:
        super().__init__()
        _check_pool(pool)
        self.features = nn.Sequential(
            _block(1, width),
            _block(width, width),
            nn.MaxPool2d(2),  # 14x14
            _block(width, 2 * width),
            _block(2 * width, 2 * width),
            nn.MaxPool2d(2),  # 7x7
            _block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1) if pool == "avg" else nn.Identity(),
            nn.Flatten(),
        )
        flat = 4 * width * (1 if pool == "avg" else 7 * 7)
        self.project = nn.Sequential(nn.Dropout(0.1), nn.Linear(flat, embedding_dim))
        self.embedding_dim = embedding_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.project(self.features(x)), dim=1)


class ArcFaceHead(nn.Module):
    """Additive angular margin loss (ArcFace, Deng et al. 2019).

    Chosen over triplet loss because it needs no pair/triplet mining (stable with small batches
    on a CPU) and, over plain normalised softmax, because the margin pulls each class into a tight
    cone on the unit sphere: exactly what cosine / L2 nearest-neighbour search and an open-set
    distance threshold rely on. The head is discarded after training; only the embeddings ship.
    """

    def __init__(self, embedding_dim: int, n_classes: int, scale: float = 16.0, margin: float = 0.3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_classes, embedding_dim))
        nn.init.xavier_uniform_(self.weight)
        self.scale = scale
        self.cos_m, self.sin_m = math.cos(margin), math.sin(margin)
        # Past this angle cos(theta + m) is no longer monotonic; fall back to a linear penalty.
        self.threshold = math.cos(math.pi - margin)
        self.mm = math.sin(math.pi - margin) * margin

    def cosines(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Cosine of each embedding to each class centre, (N, n_classes)."""
        return F.linear(embeddings, F.normalize(self.weight, dim=1)).clamp(-1 + 1e-7, 1 - 1e-7)

    def outlier_loss(self, embeddings: torch.Tensor, kind: str = "uniform", margin: float = 0.0) -> torch.Tensor:
        """Outlier exposure on embeddings of non-digits (Hendrycks et al. 2019).

        ``uniform``: cross-entropy of the scaled cosine logits to the uniform distribution (the paper's loss).
        ``hinge``: squared excess of the largest cosine over ``margin``, pushing every non-digit out of every
        class cone, which is what a distance threshold to the classes measures.
        """
        cosine = self.cosines(embeddings)
        if kind == "hinge":
            return F.relu(cosine.max(dim=1).values - margin).pow(2).mean()
        logits = self.scale * cosine
        return (torch.logsumexp(logits, dim=1) - logits.mean(dim=1)).mean()

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = self.cosines(embeddings)
        sine = torch.sqrt(1.0 - cosine * cosine)
        with_margin = cosine * self.cos_m - sine * self.sin_m
        with_margin = torch.where(cosine > self.threshold, with_margin, cosine - self.mm)
        one_hot = F.one_hot(labels, cosine.shape[1]).to(cosine.dtype)
        logits = self.scale * (one_hot * with_margin + (1 - one_hot) * cosine)
        return F.cross_entropy(logits, labels)
