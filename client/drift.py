"""``python -m client drift``: live inputs against the served model's drift baseline.

Reads either TorchServe's metrics endpoint (counters since the server started, or the difference of two
scrapes ``--interval`` seconds apart) or a Prometheus server (increase over ``--window``), and judges with the
thresholds of deploy/prometheus/rules/alerts.yml:

- unknown-answer ratio above max(UNKNOWN_FACTOR x baseline unknown rate, UNKNOWN_FLOOR);
- mean top-1 distance above the baseline's 90th percentile.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ClientError, ConnectionFailed, DriftDetected, NoBaselineError, TooFewRequestsError
from .metrics_text import sum_by_name
from .rest import is_loopback

#: Same figures as the alerts EmbeddingUnknownRatioDrift / EmbeddingTop1DistanceDrift / their traffic floor.
UNKNOWN_FACTOR = 10
UNKNOWN_FLOOR = 0.05
MIN_IMAGES = 50

BASELINE = {"mean": "EmbeddingBaselineTop1DistanceMean", "p50": "EmbeddingBaselineTop1DistanceP50",
            "p90": "EmbeddingBaselineTop1DistanceP90", "p99": "EmbeddingBaselineTop1DistanceP99",
            "unknown_rate": "EmbeddingBaselineUnknownRate"}
COUNTERS = {"answered": "EmbeddingAnsweredImages", "unknown": "EmbeddingUnknownAnswers",
            "distance_sum": "EmbeddingTop1DistanceSum"}



@dataclass
class Live:
    answered: float
    unknown: float
    distance_sum: float


@dataclass
class Report:
    source: str
    span: str
    answered: int
    unknown_ratio: float
    top1_mean: float
    baseline: dict[str, float]
    unknown_limit: float
    unknown_drift: bool
    distance_drift: bool

    @property
    def drifted(self) -> bool:
        return self.unknown_drift or self.distance_drift

    def text(self) -> str:
        b = self.baseline
        lines = [
            f"{self.source} ({self.span}): {self.answered} images answered",
            f"{'':22}{'live':>9}  {'baseline':>9}",
            f"{'unknown ratio':22}{self.unknown_ratio:9.3f}  {b['unknown_rate']:9.3f}  "
            + (f"DRIFT (> {self.unknown_limit:.3f})" if self.unknown_drift else f"ok (limit {self.unknown_limit:.3f})"),
            f"{'mean top-1 distance':22}{self.top1_mean:9.3f}  {b['mean']:9.3f}  "
            + (f"DRIFT (> baseline p90 {b['p90']:.3f})" if self.distance_drift else f"ok (limit: baseline p90 {b['p90']:.3f})"),
            f"{'':22}baseline quantiles p50 {b['p50']:.3f}  p90 {b['p90']:.3f}  p99 {b['p99']:.3f}",
            "verdict: " + ("DRIFT: live inputs no longer look like the data the model was validated on"
                           if self.drifted else "ok: live inputs look like the baseline"),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "drifted": self.drifted}


def _open(url: str, timeout: float, shown: str | None = None) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if is_loopback(url) \
        else urllib.request.build_opener()
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise ClientError(f"{shown or url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionFailed(f"cannot reach {shown or url}: {reason}") from None


def metrics_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def parse_metrics(text: str, model: str) -> dict[str, float]:
    """Embedding* samples of ``model`` (summed over label sets) from Prometheus text exposition."""
    return {name: value for name, value in sum_by_name(text, ModelName=model).items() if name.startswith("Embedding")}


def from_metrics(url: str, model: str, timeout: float, interval: float = 0.0,
                 sleep=None) -> tuple[Live, dict[str, float], str]:
    url = metrics_url(url)
    first = parse_metrics(_open(url, timeout).decode(errors="replace"), model)
    if interval > 0:
        import time

        (sleep or time.sleep)(interval)
        second = parse_metrics(_open(url, timeout).decode(errors="replace"), model)
        live = Live(*(second.get(n, 0.0) - first.get(n, 0.0) for n in COUNTERS.values()))
        span = f"last {interval:g} s"
    else:
        second = first
        live = Live(*(first.get(n, 0.0) for n in COUNTERS.values()))
        span = "since the server started"
    baseline = {key: second[name] for key, name in BASELINE.items() if name in second}
    return live, baseline, span


def _query(url: str, expr: str, timeout: float) -> float | None:
    query = urllib.parse.urlencode({"query": expr})
    raw = _open(f"{url.rstrip('/')}/api/v1/query?{query}", timeout, shown=url)
    try:
        body = json.loads(raw)
        result = body["data"]["result"]
    except (ValueError, KeyError, TypeError):
        raise ClientError(f"{url}: not a Prometheus query API answer") from None
    return float(result[0]["value"][1]) if result else None


def from_prometheus(url: str, model: str, timeout: float, window: str) -> tuple[Live, dict[str, float], str]:
    if not re.fullmatch(r"\d+[smhdw]", window):
        raise ClientError(f"--window {window!r}: use a Prometheus duration such as 30m, 1h, 1d")
    sel = f'{{ModelName="{model}"}}'
    counters = [_query(url, f"sum(increase({name}{sel}[{window}]))", timeout) or 0.0 for name in COUNTERS.values()]
    baseline = {}
    for key, name in BASELINE.items():
        value = _query(url, f"max({name}{sel})", timeout)
        if value is not None:
            baseline[key] = value
    return Live(*counters), baseline, f"Prometheus, last {window}"


def judge(live: Live, baseline: dict[str, float], source: str, span: str, min_images: int = MIN_IMAGES) -> Report:
    if set(baseline) != set(BASELINE):
        raise NoBaselineError(f"{source} exposes no drift-baseline metrics (EmbeddingBaseline*) for this model: "
                              "it serves artifacts trained before metadata.json recorded a drift baseline, or no model")
    if live.answered < min_images:
        raise TooFewRequestsError(f"{source}: {live.answered:.0f} images answered ({span}), fewer than the "
                                  f"{min_images} needed to judge")
    unknown_ratio = live.unknown / live.answered
    top1_mean = live.distance_sum / live.answered
    limit = max(UNKNOWN_FACTOR * baseline["unknown_rate"], UNKNOWN_FLOOR)
    return Report(source, span, round(live.answered), unknown_ratio, top1_mean, baseline, limit,
                  unknown_ratio > limit, top1_mean > baseline["p90"])


def run(url: str | None, prometheus: str | None, model: str, timeout: float, interval: float, window: str,
        min_images: int, as_json: bool) -> int:
    if prometheus:
        live, baseline, span = from_prometheus(prometheus, model, timeout, window)
        source = f"model {model} via {prometheus}"
    else:
        assert url is not None
        live, baseline, span = from_metrics(url, model, timeout, interval)
        source = f"model {model} at {metrics_url(url)}"
    report = judge(live, baseline, source, span, min_images)
    print(json.dumps(report.to_json()) if as_json else report.text())
    if report.drifted:
        raise DriftDetected(f"{source}: inputs drifted from the model's baseline")
    return 0
