"""Printed digits for training (training/printed.py): drawn from DejaVu, labelled, reproducible, digits only."""

from __future__ import annotations

import numpy as np

from training.printed import printed_digits
from training.config import DIGIT_PRINTED, TrainConfig
from training.train import resolve_negatives


def test_printed_digits_are_labelled_inked_canvases_and_reproducible():
    canvases, labels = printed_digits(30, seed=3)
    assert canvases.shape == (30, 28, 28) and canvases.dtype == np.uint8
    assert labels.tolist() == [i % 10 for i in range(30)]
    assert all(c.max() > 128 and c[0].max() == 0 for c in canvases)  # ink, and an empty border like MNIST's
    again, _ = printed_digits(30, seed=3)
    other, _ = printed_digits(30, seed=4)
    assert np.array_equal(canvases, again) and not np.array_equal(canvases, other)


def test_printed_digits_only_join_training_when_the_classes_are_the_digits_in_order():
    digits = [str(d) for d in range(10)]
    assert resolve_negatives(TrainConfig(), digits).printed == DIGIT_PRINTED
    assert resolve_negatives(TrainConfig(), ["T-shirt", "Trouser"]).printed == 0
    assert resolve_negatives(TrainConfig(), digits[::-1]).printed == 0  # label d must be class index d
    assert resolve_negatives(TrainConfig(printed=0), digits).printed == 0
