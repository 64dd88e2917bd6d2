"""Training loop: ArcFace on augmented canvases, k-NN accuracy on the held-out split each epoch."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from handler.preprocessing import DIGITS, Profile
from handler.search import GallerySearcher

from .index import build_index
from .model import ArcFaceHead, EmbeddingNet
from .negatives import synthetic_negatives
from .printed import printed_digits


@dataclass
class TrainConfig:
    epochs: int = 12
    embedding_dim: int = 64
    width: int = 32
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 5e-4
    seed: int = 0
    max_shift: float = 2.0  # pixels
    max_rotation: float = 10.0  # degrees
    #: Mirror half of each batch left-right (None: decided by the preprocessing profile, PROFILE_HFLIP).
    hflip: bool | None = None
    arcface_scale: float = 16.0
    arcface_margin: float = 0.3
    #: Outlier exposure (training/negatives.py): size of the synthetic non-digit pool (0: off; None: decided by
    #: training.steps.train_and_export, DIGIT_NEGATIVES for a digit dataset, else 0), negatives per batch as a
    #: share of batch_size, the loss's weight, kind and margin (ArcFaceHead.outlier_loss).
    negatives: int | None = None
    negative_share: float = 0.5
    oe_weight: float = 1.0
    oe_loss: str = "hinge"
    oe_margin: float = 0.0
    #: Printed digits (training/printed.py) in every batch with their labels: pool size (0: off; None: decided
    #: like ``negatives``, DIGIT_PRINTED for the classes "0".."9" in that order) and share of batch_size.
    printed: int | None = None
    printed_share: float = 0.125

    def to_dict(self) -> dict:
        return asdict(self)


#: Left-right mirroring per preprocessing profile: a mirrored digit is another symbol, a mirrored garment the same.
PROFILE_HFLIP = {"digits": False, "full-frame": True}
#: Synthetic non-digits made for outlier exposure when the classes are the ten digits.
DIGIT_NEGATIVES = 4000
#: Printed digits mixed into training when the classes are the ten digits.
DIGIT_PRINTED = 2000


def resolve_negatives(config: TrainConfig, classes: Sequence[str], profile: str = DIGITS.name) -> TrainConfig:
    """`config` with ``negatives`` decided: kept when set, else DIGIT_NEGATIVES for the classes "0".."9" (the
    negatives are non-digits; for other data, such as garments, they could be in-distribution) and 0 otherwise;
    ``printed`` likewise, and ``hflip`` from the preprocessing profile."""
    if config.hflip is None:
        config = replace(config, hflip=PROFILE_HFLIP[profile])
    digits = sorted(str(c) for c in classes) == [str(d) for d in range(10)]
    if config.negatives is None:
        config = replace(config, negatives=DIGIT_NEGATIVES if digits else 0)
    if config.printed is None:  # labels are class indices: the printed digit d must be class d
        config = replace(config, printed=DIGIT_PRINTED if [str(c) for c in classes] == [str(d) for d in range(10)]
                         else 0)
    return config


@dataclass
class History:
    epochs: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def augment(x: torch.Tensor, generator: torch.Generator, max_shift: float, max_rotation: float,
            hflip: bool = False, profile: Profile = DIGITS) -> torch.Tensor:
    """Random small rotation and shift per image, and a left-right mirror of half the images when ``hflip``
    (one affine grid for the batch)."""
    n = x.shape[0]
    angle = (torch.rand(n, generator=generator) * 2 - 1) * math.radians(max_rotation)
    shift = (torch.rand(n, 2, generator=generator) * 2 - 1) * (2 * max_shift / x.shape[-1])
    mirror = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0) if hflip else torch.ones(n)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos * mirror, -sin, shift[:, 0]], 1),
                         torch.stack([sin * mirror, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    background = float(profile.normalize(np.zeros((1, 1, 1), np.uint8)).reshape(()))
    # Pad with the normalised background value, not zero, so shifted-in borders look like MNIST.
    return F.grid_sample(x - background, grid, padding_mode="zeros", align_corners=False) + background


@torch.no_grad()
def embed(model: torch.nn.Module, inputs: np.ndarray | torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Embeddings of normalised inputs (N, 1, 28, 28) in eval mode, float32 (N, D)."""
    model.eval()
    x = torch.as_tensor(inputs)
    out = [model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy().astype(np.float32) if out else np.zeros((0, model.embedding_dim), np.float32)


def knn_accuracy(train_emb: np.ndarray, train_labels: np.ndarray, test_emb: np.ndarray, test_labels: np.ndarray, k: int) -> float:
    searcher = GallerySearcher(build_index(train_emb), [str(v) for v in train_labels], k=k)
    preds = np.array([int(a["pred"]) for a in searcher.classify(test_emb)])
    return float((preds == test_labels).mean())


def train_model(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    n_classes: int,
    config: TrainConfig,
    k: int,
    log: Callable[[str], None] = print,
    profile: Profile = DIGITS,
) -> tuple[EmbeddingNet, History]:
    """Train on normalised inputs (N, 1, 28, 28) of ``profile``; returns the eval-mode model and per-epoch
    history."""
    seed_everything(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = EmbeddingNet(config.embedding_dim, config.width)
    head = ArcFaceHead(config.embedding_dim, n_classes, config.arcface_scale, config.arcface_margin)
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(train_x) / config.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=max(1, config.epochs * steps_per_epoch), pct_start=0.2
    )
    x_all, y_all = torch.from_numpy(train_x), torch.from_numpy(train_y)
    negatives = torch.from_numpy(profile.normalize(synthetic_negatives(config.negatives or 0, seed=config.seed + 1)))
    per_batch = round(config.batch_size * config.negative_share) if len(negatives) else 0
    printed_x, printed_y = printed_digits(config.printed or 0, seed=config.seed + 2)
    printed_x, printed_y = torch.from_numpy(profile.normalize(printed_x)), torch.from_numpy(printed_y)
    printed_per_batch = round(config.batch_size * config.printed_share) if len(printed_x) else 0
    history = History()
    started = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        model.train()
        head.train()
        order = torch.randperm(len(x_all), generator=generator)
        total, seen = 0.0, 0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{config.epochs}", leave=False,
                   disable=not sys.stderr.isatty(), file=sys.stderr)
        for step in bar:
            idx = order[step * config.batch_size : (step + 1) * config.batch_size]
            x, y = x_all[idx], y_all[idx]
            if printed_per_batch:
                pick = torch.randint(len(printed_x), (printed_per_batch,), generator=generator)
                x, y = torch.cat([x, printed_x[pick]]), torch.cat([y, printed_y[pick]])
            labelled = len(y)
            if per_batch:
                x = torch.cat([x, negatives[torch.randint(len(negatives), (per_batch,), generator=generator)]])
            out = model(augment(x, generator, config.max_shift, config.max_rotation, bool(config.hflip), profile))
            loss = head(out[:labelled], y)
            if per_batch:
                loss = loss + config.oe_weight * head.outlier_loss(out[labelled:], config.oe_loss, config.oe_margin)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(idx)
            seen += len(idx)
            bar.set_postfix(loss=f"{total / seen:.4f}")
        accuracy = knn_accuracy(embed(model, train_x), train_y, embed(model, test_x), test_y, k)
        elapsed = time.perf_counter() - started
        history.epochs.append({"epoch": epoch, "loss": total / seen, "knn_accuracy": accuracy, "seconds": elapsed})
        log(f"epoch {epoch:3d}/{config.epochs}  loss {total / seen:.4f}  held-out kNN accuracy {accuracy:.4f}  ({elapsed:.1f}s)")
    history.seconds = time.perf_counter() - started
    model.eval()
    return model, history
