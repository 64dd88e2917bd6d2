"""The build's settings without the libraries that use them: TrainConfig and the choices of ``python -m training``
and ``python -m pipeline`` (index types, quantization, precision, preprocessing profiles), so that parsing a
command line imports neither torch nor faiss."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from handler.profiles import DATASET_PROFILES, DEFAULT_PROFILE, ENTRIES, PROFILES, QUANTIZATION

#: Gallery indexes (training.index): exact, HNSW graph, IVF lists.
INDEX_TYPES = ("flat", "hnsw", "ivf")
#: What ``--quantize auto`` (the default) builds per preprocessing profile, read from the profile registry
#: (handler/profiles.py): int8 for digits, float for full-frame. Post-training schemes: QUANTIZATION.
PROFILE_QUANTIZATION = {name: entry.quantize for name, entry in ENTRIES.items()}
#: ``--quantize`` values: a QUANTIZATION scheme, or auto (the preprocessing profile's, PROFILE_QUANTIZATION).
QUANTIZE_CHOICES = ("auto", *QUANTIZATION)
#: fp32, or bf16 autocast of the network's forward pass during training; float32 master weights, loss and
#: optimiser, so what is exported and served is an ordinary float32 model.
PRECISION = ("fp32", "bf16")
PRECISION_HELP = ("bf16: autocast the training forward pass, in channels-last layout (faster epochs on CPUs with "
                  "native bf16, AVX512-BF16 or AMX); the exported model is float32 either way")
#: ``--preprocessing`` values: a profile's name, or auto (from the dataset: DATASET_PROFILES, the datasets the
#: registry's entries claim by Dataset.name; every other dataset gets DEFAULT_PROFILE, digits).
PROFILE_CHOICES = ("auto", *PROFILES)


def resolve_profile(choice: str, dataset_name: str) -> str:
    """The profile a build uses: ``choice`` unless it is auto, then the dataset's (DATASET_PROFILES, else
    DEFAULT_PROFILE)."""
    if choice == "auto":
        return DATASET_PROFILES.get(dataset_name, DEFAULT_PROFILE)
    if choice not in PROFILES:
        raise ValueError(f"unknown preprocessing profile {choice!r}: use {', '.join(PROFILE_CHOICES)}")
    return choice


def resolve_quantize(choice: str, profile: str) -> str:
    """The quantization a build uses: ``choice`` unless it is auto, then the profile's (PROFILE_QUANTIZATION; none
    for a name the registry does not hold). What train.json and metadata.json record is this resolved value, never
    auto."""
    if choice == "auto":
        return PROFILE_QUANTIZATION.get(profile, "none")
    if choice not in QUANTIZATION:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {choice!r}")
    return choice


#: The open-set score new artifacts record and serve (handler.search.open_set_score) and its neighbour rank.
#: prototype_distance: with outlier exposure the non-digits gather in a region where a few training digits also
#: land, so small-k neighbour distances fail there while class means stay clear (docs/model-quality.md, "Open-set rejection").
DEFAULT_OPEN_SET_SCORE = "prototype_distance"
DEFAULT_KTH = 50
#: Synthetic non-digits made for outlier exposure when the classes are the ten digits
#: (training.train.resolve_negatives).
#: 8,000 since the 24-epoch default; at 24 epochs 4,000 did as well within the seed spread (docs/non-digits.md).
DIGIT_NEGATIVES = 8000
#: Printed digits mixed into training when the classes are the ten digits.
DIGIT_PRINTED = 2000


@dataclass
class TrainConfig:
    #: 24, not 12: on the bundled 4,000-image sample 12 epochs left the outlier exposure underfit (docs/non-digits.md).
    epochs: int = 24
    embedding_dim: int = 64
    width: int = 32
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 5e-4
    seed: int = 0
    max_shift: float = 2.0  # pixels
    #: Augmentation that depends on what the images show; None: the preprocessing profile's
    #: (its registry entry's TrainingDefaults, handler/profiles.py).
    max_rotation: float | None = None  # degrees
    hflip: bool | None = None  # mirror half of each batch left-right
    erase: float | None = None  # share of images with a random rectangle erased (Zhong et al. 2020)
    #: How the last feature map becomes a vector (training.model.POOLING; None: the profile's).
    pool: str | None = None
    arcface_scale: float = 16.0
    arcface_margin: float = 0.3
    #: Outlier exposure (training/negatives.py): size of the synthetic non-digit pool (0: off; None: decided by
    #: training.steps.train_and_export, DIGIT_NEGATIVES for a digit dataset, else 0), negatives
    #: per batch as a share of batch_size, the loss's weight, kind and margin (ArcFaceHead.outlier_loss).
    negatives: int | None = None
    negative_share: float = 0.5
    oe_weight: float = 1.0
    oe_loss: str = "hinge"
    oe_margin: float = 0.0
    #: Printed digits (training/printed.py) in every batch with their labels: pool size (0: off; None: decided
    #: like ``negatives``, DIGIT_PRINTED for the classes "0".."9" in that order) and share of
    #: batch_size.
    printed: int | None = None
    printed_share: float = 0.125
    #: Post-training quantization of the exported model.pt (training.quantize): none, int8, or auto (resolved by
    #: training.steps.train_and_export from the preprocessing profile, resolve_quantize: int8 for digits).
    quantize: str = "auto"
    #: Arithmetic of the training forward pass (PRECISION): bf16 autocasts it (the weights, the loss and the
    #: exported model stay float32).
    precision: str = "fp32"

    def to_dict(self) -> dict:
        return asdict(self)
