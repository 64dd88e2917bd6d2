"""The shipped model (what ./quickstart.sh trains) on the uploads exam: real non-digit images as encoded files
(training/uploads.py), answered offline by handler.service.EmbeddingService, the served code path without the server
(decoding, the model's preprocessing profile, the network and the recorded open-set rule). Figures and history:
docs/non-digits.md."""

from __future__ import annotations

import json

import pytest

from training.evaluate import evaluate_open_set

#: The targets: flagged unknown at the served threshold, which accepts 99.5% of the held-out digits it was
#: calibrated on.
UPLOADS_FLAGGED = 0.95
FASHION_FLAGGED = 0.95
DIGITS_ACCEPTED = 0.99
#: What the shipped model reaches (uploads 92.0%, Fashion-MNIST 97.2% with 24 epochs and 8,000 training negatives;
#: 90.9-92.1% over three training seeds), less a margin: below it is a regression. Fashion-MNIST's floor is its target.
UPLOADS_FLOOR = 0.86
FASHION_FLOOR = FASHION_FLAGGED


@pytest.fixture(scope="module")
def exam(product_artifacts) -> dict:
    return evaluate_open_set(product_artifacts, ("uploads", "fashion"))


def _per_category(result: dict) -> dict:
    return {name: round(f["flagged"], 3) for name, f in result["unknown"]["uploads"]["categories"].items()}


def test_shipped_model_keeps_digits_and_its_measured_rejection(exam, record_property):
    record_property("uploads_flagged", exam["unknown"]["uploads"]["flagged"])
    record_property("uploads_flagged_per_category", json.dumps(_per_category(exam)))
    record_property("fashion_flagged", exam["unknown"]["fashion"]["flagged"])
    record_property("digits_accepted_cross_fitted", exam["digits"]["accepted_cross_fitted"])
    assert exam["digits"]["accepted"] >= DIGITS_ACCEPTED, exam["digits"]
    assert exam["unknown"]["uploads"]["flagged"] >= UPLOADS_FLOOR, _per_category(exam)
    assert exam["unknown"]["fashion"]["flagged"] >= FASHION_FLOOR, exam["unknown"]["fashion"]


@pytest.mark.xfail(strict=True, reason="target missed: docs/non-digits.md has the figures and what is left")
def test_shipped_model_meets_the_upload_target(exam):
    assert exam["unknown"]["fashion"]["flagged"] >= FASHION_FLAGGED, exam["unknown"]["fashion"]
    flagged = exam["unknown"]["uploads"]["flagged"]
    assert flagged >= UPLOADS_FLAGGED, f"{flagged:.3f} flagged; per category {_per_category(exam)}"
