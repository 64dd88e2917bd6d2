"""``client drift`` on a metrics page with two versions: each version's counters against its own gauges."""

from __future__ import annotations

import json

import pytest

from client import drift
from client.errors import DriftDetected, NoBaselineError, UsageError
from handler.ts_metrics import BASELINE_METRICS, DIMENSIONS


def version_lines(version: str, answered: float, dist_sum: float, p90: float) -> list[str]:
    labels = f'{{ModelName="embedding",Level="Model",ModelVersion="{version}",Hostname="h",}}'
    gauges = {"EmbeddingBaselineTop1DistanceMean": p90 * 0.6, "EmbeddingBaselineTop1DistanceP50": p90 * 0.55,
              "EmbeddingBaselineTop1DistanceP90": p90, "EmbeddingBaselineTop1DistanceP99": p90 * 1.5,
              "EmbeddingBaselineUnknownRate": 0.005}
    return [f"EmbeddingAnsweredImages{labels} {answered}", f"EmbeddingUnknownAnswers{labels} 0.0",
            f"EmbeddingTop1DistanceSum{labels} {dist_sum}", *(f"{name}{labels} {v}" for name, v in gauges.items())]


#: 1.0: mean 0.2 against p90 0.3 (ok); 2.0: mean 0.2 against p90 0.15 (drift). Summed, p90 would be 0.45.
PAGE = "\n".join(version_lines("1.0", 100, 20.0, 0.3) + version_lines("2.0", 300, 60.0, 0.15)) + "\n"


@pytest.fixture
def page(monkeypatch):
    monkeypatch.setattr(drift, "_open", lambda url, timeout, shown=None: PAGE.encode())


def test_the_version_label_and_metric_names_are_the_handlers():
    assert drift.VERSION_LABEL in DIMENSIONS
    assert set(drift.BASELINE.values()) == set(BASELINE_METRICS)


def test_each_version_is_judged_against_its_own_baseline(page, capsys):
    with pytest.raises(DriftDetected, match="version 2.0") as caught:
        drift.run("http://127.0.0.1:1", None, "embedding", 1.0, 0.0, "1h", 50, as_json=True)
    assert "version 1.0" not in str(caught.value)
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["model_version"], r["answered"], r["baseline"]["p90"], r["drifted"]) for r in reports] == [
        ("1.0", 100, 0.3, False), ("2.0", 300, 0.15, True)]


def test_one_version_alone_and_versions_that_are_not_there(page, capsys):
    assert drift.run("http://127.0.0.1:1", None, "embedding", 1.0, 0.0, "1h", 50, False, version="1.0") == 0
    out = capsys.readouterr().out
    assert out.startswith("model embedding version 1.0 at http://127.0.0.1:1/metrics") and "2.0" not in out
    with pytest.raises(NoBaselineError, match=r"no metrics of version '3.0' \(versions seen: 1.0, 2.0\)"):
        drift.run("http://127.0.0.1:1", None, "embedding", 1.0, 0.0, "1h", 50, False, version="3.0")
    with pytest.raises(UsageError, match="versions 1.0, 2.0 are loaded; name one with --model-version"):
        drift.from_metrics("http://127.0.0.1:1", "embedding", 1.0)
    live, baseline, _ = drift.from_metrics("http://127.0.0.1:1", "embedding", 1.0, version="2.0")
    assert (live.answered, baseline["p90"]) == (300, 0.15)


def test_a_version_with_too_few_images_is_listed_not_judged(page, capsys):
    with pytest.raises(DriftDetected):
        drift.run("http://127.0.0.1:1", None, "embedding", 1.0, 0.0, "1h", 200, False)
    out = capsys.readouterr().out.split("\n\n")
    assert out[0].startswith("not judged: model embedding version 1.0") and "fewer than the 200" in out[0]
    assert out[1].startswith("model embedding version 2.0") and "verdict: DRIFT" in out[1]
