"""The pipeline's quality gate (pipeline.quality) on real trained artifacts: a model trained for 2 epochs has the
accuracy to pass an accuracy-only gate but lets non-digits through, and the gate's defaults stop it; the shipped
model passing them is tests/integration/test_gate.py's."""

from __future__ import annotations

import pytest

from handler.metadata import Metrics, ModelMetadata, read_metadata
from pipeline import params as P
from pipeline.quality import judge

DEFAULTS = {name: P.DEFAULTS[name] for name in ("min_accuracy", "min_open_set_rejection", "min_digits_accepted")}


def test_a_two_epoch_model_fails_the_default_gate_on_its_open_set_figure(tiny_artifacts):
    metadata = read_metadata(tiny_artifacts)
    rejection = metadata.metrics.open_set_rejection
    assert metadata.metrics.accuracy >= DEFAULTS["min_accuracy"]  # accuracy alone would deploy it
    verdict = judge(metadata, DEFAULTS)
    print(f"tiny model: {verdict.summary}")
    assert not verdict.passed
    failed = [check.figure for check in verdict.checks if not check.passed]
    assert failed == ["open_set_rejection"], verdict.summary
    assert f"non-digits answered unknown {rejection:.4f} < {DEFAULTS['min_open_set_rejection']:g}" in verdict.summary
    assert "| non-digits answered unknown |" in verdict.markdown() and "fail: not deployed" in verdict.markdown()
    assert judge(metadata, {**DEFAULTS, "min_open_set_rejection": rejection}).passed


def test_a_minimum_of_zero_is_off_and_a_missing_figure_fails():
    metadata = ModelMetadata(k=5, metrics=Metrics(0.99, 0.2))  # no open_set calibration recorded
    verdict = judge(metadata, {**DEFAULTS, "min_open_set_rejection": 0})
    assert [c.passed for c in verdict.checks] == [True, True, False]
    assert "held-out digits accepted (cross-fitted) missing < " in verdict.summary
    assert judge(metadata, {"min_accuracy": 0, "min_open_set_rejection": 0, "min_digits_accepted": 0}).passed


@pytest.mark.parametrize("name", ["min_open_set_rejection", "min_digits_accepted"])
@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_open_set_minimums_are_shares(name, value):
    with pytest.raises(P.ParamError, match=f"{name}=.*share between 0 and 1"):
        P.validate({name: value})
