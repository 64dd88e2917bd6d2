"""Training loop: ArcFace on augmented canvases, k-NN accuracy on the held-out split each epoch."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from handler.preprocessing import DIGITS, Profile
from handler.profiles import ENTRIES, RegistryError, training_defaults
from handler.search import GallerySearcher

from .config import DIGIT_NEGATIVES, DIGIT_PRINTED, PRECISION, TrainConfig
from .index import build_index
from .model import POOLING, ArcFaceHead, EmbeddingNet
from .negatives import synthetic_negatives
from .printed import printed_digits


#: Training defaults per preprocessing profile, read from the profile registry (handler/profiles.py, each entry's
#: TrainingDefaults): digits turn a little, are never mirrored and are pooled; full-frame pictures mirror, are
#: erased at random and keep their feature map's layout.
PROFILE_DEFAULTS = {name: training_defaults(name) for name in ENTRIES}
_unknown_pools = {name: d["pool"] for name, d in PROFILE_DEFAULTS.items() if d["pool"] not in POOLING}
_unknown_fields = {key for d in PROFILE_DEFAULTS.values() for key in d} - {f.name for f in fields(TrainConfig)}
if _unknown_pools or _unknown_fields:  # checked at import, not at the first training of that profile
    raise RegistryError(f"preprocessing registry: pool must be one of {POOLING} (got {_unknown_pools}), and "
                        f"training defaults must be TrainConfig fields (not {sorted(_unknown_fields)})")


def native_bf16() -> bool:
    """Whether this CPU does bf16 arithmetic in hardware (AVX512-BF16 or AMX); without it bf16 is emulated."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except Exception:  # private helpers: a torch without them cannot tell, so say it may be slow
        return False


def check_precision(precision: str, log: Callable[[str], None] = print) -> None:
    """Refuse an unknown precision; say when bf16 has no native support here (it then runs slower than fp32)."""
    if precision not in PRECISION:
        raise ValueError(f"precision must be one of {', '.join(PRECISION)}, got {precision!r}")
    if precision == "bf16" and not native_bf16():
        log("note: this CPU has no native bf16 arithmetic (AVX512-BF16 or AMX); --precision bf16 may train slower "
            "than fp32")


def resolve_profile_defaults(config: TrainConfig, profile: str = DIGITS.name) -> TrainConfig:
    """`config` with every field left None set to the profile's (PROFILE_DEFAULTS, from its registry entry)."""
    chosen = {key: value for key, value in PROFILE_DEFAULTS[profile].items() if getattr(config, key) is None}
    return replace(config, **chosen) if chosen else config


#: Training images in the gallery of the per-epoch held-out curve (the last epoch uses all of them).
CURVE_GALLERY = 10_000


def resolve_negatives(config: TrainConfig, classes: Sequence[str], profile: str = DIGITS.name) -> TrainConfig:
    """`config` with ``negatives`` decided: kept when set, else DIGIT_NEGATIVES for the classes "0".."9" (the
    negatives are non-digits; for other data, such as garments, they could be in-distribution) and 0 otherwise;
    ``printed`` likewise, and the augmentation from the preprocessing profile (:func:`resolve_profile_defaults`)."""
    config = resolve_profile_defaults(config, profile)
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
            hflip: bool = False, profile: Profile = DIGITS, erase: float = 0.0) -> torch.Tensor:
    """Random small rotation and shift per image, a left-right mirror of half the images when ``hflip`` (one
    affine grid for the batch), then a random rectangle (2-25% of the frame) set to the background in a share
    ``erase`` of them."""
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
    out = F.grid_sample(x - background, grid, padding_mode="zeros", align_corners=False) + background
    if erase > 0:
        out = _erase(out, generator, erase, background)
    return out


def _erase(x: torch.Tensor, generator: torch.Generator, share: float, background: float) -> torch.Tensor:
    """Random erasing, vectorised: per image a rectangle of 2-25% of the area, aspect 1/3..3, in a share of them."""
    n, _, h, w = x.shape
    area = (0.02 + 0.23 * torch.rand(n, generator=generator)) * h * w
    aspect = torch.exp((torch.rand(n, generator=generator) * 2 - 1) * math.log(3.0))
    eh = (area * aspect).sqrt().round().clamp(1, h)
    ew = (area / aspect).sqrt().round().clamp(1, w)
    top = (torch.rand(n, generator=generator) * (h - eh + 1)).floor()
    left = (torch.rand(n, generator=generator) * (w - ew + 1)).floor()
    chosen = torch.rand(n, generator=generator) < share
    rows, cols = torch.arange(h).view(1, h, 1), torch.arange(w).view(1, 1, w)
    inside = ((rows >= top.view(n, 1, 1)) & (rows < (top + eh).view(n, 1, 1))
              & (cols >= left.view(n, 1, 1)) & (cols < (left + ew).view(n, 1, 1)) & chosen.view(n, 1, 1))
    return torch.where(inside.unsqueeze(1), torch.full_like(x, background), x)


@torch.no_grad()
def embed(model: torch.nn.Module, inputs: np.ndarray | torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Embeddings of normalised inputs (N, 1, 28, 28) in eval mode, float32 (N, D)."""
    model.eval()
    x = torch.as_tensor(inputs)
    out = [model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy().astype(np.float32) if out else np.zeros((0, model.embedding_dim), np.float32)


def knn_accuracy(train_emb: np.ndarray, train_labels: np.ndarray, test_emb: np.ndarray, test_labels: np.ndarray, k: int) -> float:
    searcher = GallerySearcher(build_index(train_emb), [str(v) for v in train_labels], k=k)
    # The vote's label: this searcher has no open-set threshold, and closed-set accuracy counts every vote.
    preds = np.array([-1 if a.nearest_label is None else int(a.nearest_label) for a in searcher.classify(test_emb)])
    return float((preds == test_labels).mean())


def train_model(
    train_inputs: np.ndarray,
    train_labels: np.ndarray,
    test_inputs: np.ndarray,
    test_labels: np.ndarray,
    n_classes: int,
    config: TrainConfig,
    k: int,
    log: Callable[[str], None] = print,
    profile: Profile = DIGITS,
) -> tuple[EmbeddingNet, History]:
    """Train on normalised inputs (N, 1, 28, 28) of ``profile``; returns the eval-mode model and per-epoch
    history. One function on purpose: the epoch loop reads top to bottom as one training step is taken."""
    config = resolve_profile_defaults(config, profile.name)
    check_precision(config.precision, log)
    seed_everything(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = EmbeddingNet(config.embedding_dim, config.width, config.pool)
    # bf16 also trains in channels-last layout: oneDNN's bf16 convolutions then skip a reorder per layer (a training
    # step about 1.3x faster again on this CPU). The weights go back to the standard layout before export.
    layout = torch.channels_last if config.precision == "bf16" else torch.contiguous_format
    model = model.to(memory_format=layout)
    head = ArcFaceHead(config.embedding_dim, n_classes, config.arcface_scale, config.arcface_margin)
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(train_inputs) / config.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=max(1, config.epochs * steps_per_epoch), pct_start=0.2
    )
    x_all, y_all = torch.from_numpy(train_inputs), torch.from_numpy(train_labels)
    negatives = torch.from_numpy(profile.normalize(synthetic_negatives(config.negatives or 0, seed=config.seed + 1)))
    per_batch = round(config.batch_size * config.negative_share) if len(negatives) else 0
    printed_x, printed_y = printed_digits(config.printed or 0, seed=config.seed + 2)
    printed_x, printed_y = torch.from_numpy(profile.normalize(printed_x)), torch.from_numpy(printed_y)
    printed_per_batch = round(config.batch_size * config.printed_share) if len(printed_x) else 0
    history = History()
    # The per-epoch curve embeds a fixed sample of the training images as its gallery (all of them in the last
    # epoch): embedding 60,000 images every epoch cost about a third of a Fashion-MNIST epoch on two cores. Its own
    # RNG, so the training draws stay the same.
    n_train = len(train_inputs)
    probe_gallery = (np.sort(np.random.default_rng(config.seed).choice(n_train, CURVE_GALLERY, replace=False))
                     if n_train > CURVE_GALLERY else slice(None))
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
            x = augment(x, generator, config.max_shift, config.max_rotation, config.hflip, profile,
                        config.erase).contiguous(memory_format=layout)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bf16"):
                out = model(x).float()
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
        gallery = probe_gallery if epoch < config.epochs else slice(None)
        accuracy = knn_accuracy(embed(model, train_inputs[gallery]), train_labels[gallery], embed(model, test_inputs),
                                test_labels, k)
        elapsed = time.perf_counter() - started
        history.epochs.append({"epoch": epoch, "loss": total / seen, "knn_accuracy": accuracy, "seconds": elapsed,
                               "gallery": int(len(train_labels[gallery]))})
        log(f"epoch {epoch:3d}/{config.epochs}  loss {total / seen:.4f}  held-out kNN accuracy {accuracy:.4f}  ({elapsed:.1f}s)")
    history.seconds = time.perf_counter() - started
    model = model.to(memory_format=torch.contiguous_format)
    model.eval()
    return model, history
