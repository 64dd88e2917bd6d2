"""``python -m client drift``: live inputs against the served model's drift baseline, version by version.

Reads either TorchServe's metrics endpoint (counters since the server started, or the difference of two
scrapes ``--interval`` seconds apart) or a Prometheus server (increase over ``--window``), and judges with the
thresholds of deploy/prometheus/rules/alerts.yml:

- unknown-answer ratio above max(UNKNOWN_FACTOR x baseline unknown rate, UNKNOWN_FLOOR);
- mean top-1 distance above the baseline's 90th percentile.

The handler labels every metric with the answering ``ModelVersion``, so each loaded version's traffic is judged
against that version's own baseline (from its metadata.json), whichever source is read: counters are summed and
baseline gauges maximised over the other labels (hosts), per version.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .errors import (ClientError, ConnectionFailed, DriftDetected, NoBaselineError, TooFewRequestsError,
                     UsageError)
from .metrics_text import values_by_label
from .rest import is_loopback

#: Same figures as the alerts EmbeddingUnknownRatioDrift / EmbeddingTop1DistanceDrift / their traffic floor.
UNKNOWN_FACTOR = 10
UNKNOWN_FLOOR = 0.05
MIN_IMAGES = 50
#: The label carrying the answering version (handler.ts_metrics.DIMENSIONS).
VERSION_LABEL = "ModelVersion"

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


#: Per version (None: samples without a version label): its live counters and its baseline.
Measures = dict[str | None, tuple[Live, dict[str, float]]]


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
    model_version: str | None = None

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


def parse_metrics(text: str, model: str) -> dict[str | None, dict[str, float]]:
    """{version: {Embedding* metric: value}} of ``model`` from Prometheus text exposition: counters summed and
    baseline gauges maximised over the other labels."""
    out: dict[str | None, dict[str, float]] = {}
    for version, metrics in values_by_label(text, VERSION_LABEL, ModelName=model).items():
        out[version] = {name: (sum(values) if name in COUNTERS.values() else max(values))
                        for name, values in metrics.items() if name.startswith("Embedding")}
    return {version: metrics for version, metrics in out.items() if metrics}


def _baseline(metrics: dict[str, float]) -> dict[str, float]:
    return {key: metrics[name] for key, name in BASELINE.items() if name in metrics}


def scrape_metrics(url: str, model: str, timeout: float, interval: float = 0.0,
                   sleep: Callable[[float], None] | None = None) -> tuple[Measures, str]:
    """Each version's live counters (since the server started, or over `interval` seconds) and baseline."""
    url = metrics_url(url)
    first = parse_metrics(_open(url, timeout).decode(errors="replace"), model)
    if interval > 0:
        import time

        (sleep or time.sleep)(interval)
        second = parse_metrics(_open(url, timeout).decode(errors="replace"), model)
        span = f"last {interval:g} s"
    else:
        second, first = first, {}
        span = "since the server started"
    measures: Measures = {}
    for version, now in second.items():
        before = first.get(version, {})
        live = Live(*(now.get(n, 0.0) - before.get(n, 0.0) for n in COUNTERS.values()))
        measures[version] = (live, _baseline(now))
    return measures, span


def _vector(url: str, expr: str, timeout: float) -> dict[str | None, float]:
    """An instant query's answer, {ModelVersion label (None without one): value}."""
    query = urllib.parse.urlencode({"query": expr})
    raw = _open(f"{url.rstrip('/')}/api/v1/query?{query}", timeout, shown=url)
    try:
        result = json.loads(raw)["data"]["result"]
        return {item["metric"].get(VERSION_LABEL): float(item["value"][1]) for item in result}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ClientError(f"{url}: not a Prometheus query API answer") from None


def scrape_prometheus(url: str, model: str, timeout: float, window: str) -> tuple[Measures, str]:
    """Each version's counter increase over `window` and its baseline gauges, from a Prometheus."""
    if not re.fullmatch(r"\d+[smhdw]", window):
        raise ClientError(f"--window {window!r}: use a Prometheus duration such as 30m, 1h, 1d")
    sel = f'{{ModelName="{model}"}}'
    counters = {key: _vector(url, f"sum by ({VERSION_LABEL}) (increase({name}{sel}[{window}]))", timeout)
                for key, name in COUNTERS.items()}
    gauges = {key: _vector(url, f"max by ({VERSION_LABEL}) ({name}{sel})", timeout) for key, name in BASELINE.items()}
    versions = {v for answer in (*counters.values(), *gauges.values()) for v in answer}
    measures: Measures = {}
    for version in versions:
        live = Live(*(counters[key].get(version, 0.0) for key in COUNTERS))
        measures[version] = (live, {key: g[version] for key, g in gauges.items() if version in g})
    return measures, f"Prometheus, last {window}"


def pick(measures: Measures, version: str | None, source: str) -> tuple[Live, dict[str, float]]:
    """One version's measures: `version`, or the only version there is when it is None."""
    if version is not None:
        if version not in measures:
            seen = ", ".join(sorted(str(v) for v in measures)) or "none"
            raise NoBaselineError(f"{source}: no metrics of version {version!r} (versions seen: {seen})")
        return measures[version]
    if len(measures) > 1:
        raise UsageError(f"{source}: versions {', '.join(sorted(str(v) for v in measures))} are loaded; "
                         "name one with --model-version")
    return next(iter(measures.values()), (Live(0.0, 0.0, 0.0), {}))


def from_metrics(url: str, model: str, timeout: float, interval: float = 0.0,
                 sleep: Callable[[float], None] | None = None,
                 version: str | None = None) -> tuple[Live, dict[str, float], str]:
    """One version's live counters, baseline and span from TorchServe's metrics endpoint (see :func:`pick`)."""
    measures, span = scrape_metrics(url, model, timeout, interval, sleep)
    return (*pick(measures, version, metrics_url(url)), span)


def from_prometheus(url: str, model: str, timeout: float, window: str,
                    version: str | None = None) -> tuple[Live, dict[str, float], str]:
    """One version's increase over `window`, baseline and span from a Prometheus (see :func:`pick`)."""
    measures, span = scrape_prometheus(url, model, timeout, window)
    return (*pick(measures, version, url), span)


def judge(live: Live, baseline: dict[str, float], source: str, span: str, min_images: int = MIN_IMAGES,
          version: str | None = None) -> Report:
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
                  unknown_ratio > limit, top1_mean > baseline["p90"], version)


def _verdicts(measures: Measures, model: str, where: str, span: str,
              min_images: int) -> list[tuple[str | None, Report | ClientError]]:
    """Each version judged against its own baseline (or why it could not be), in version order."""
    out: list[tuple[str | None, Report | ClientError]] = []
    for version in sorted(measures, key=lambda v: (v is not None, str(v))):
        source = f"model {model}" + (f" version {version}" if version is not None else "") + f" {where}"
        live, baseline = measures[version]
        try:
            out.append((version, judge(live, baseline, source, span, min_images, version)))
        except (NoBaselineError, TooFewRequestsError) as exc:
            out.append((version, exc))
    return out


def _shown(verdicts: list[tuple[str | None, Report | ClientError]], as_json: bool) -> str:
    if as_json:
        return "\n".join(json.dumps(v.to_json() if isinstance(v, Report) else
                                    {"model_version": version, "not_judged": str(v), "exit_code": v.exit_code})
                         for version, v in verdicts)
    return "\n\n".join(v.text() if isinstance(v, Report) else f"not judged: {v}" for _, v in verdicts)


def run(url: str | None, prometheus: str | None, model: str, timeout: float, interval: float, window: str,
        min_images: int, as_json: bool, version: str | None = None) -> int:
    """Judge each version (or `version` alone); print the reports; raise when one drifted or none could be
    judged."""
    if prometheus:
        measures, span = scrape_prometheus(prometheus, model, timeout, window)
        where = f"via {prometheus}"
    else:
        assert url is not None
        measures, span = scrape_metrics(url, model, timeout, interval)
        where = f"at {metrics_url(url)}"
    if version is not None:
        measures = {version: pick(measures, version, f"model {model} {where}")}
    verdicts = _verdicts(measures, model, where, span, min_images)
    reports = [v for _, v in verdicts if isinstance(v, Report)]
    if not reports:
        unjudged = [v for _, v in verdicts if isinstance(v, ClientError)]
        if not unjudged:
            raise NoBaselineError(f"model {model} {where} exposes no drift-baseline metrics (EmbeddingBaseline*): "
                                  "no such model, or it has answered nothing yet")
        raise type(unjudged[0])("; ".join(str(e) for e in unjudged))
    print(_shown(verdicts, as_json))
    drifted = [r for r in reports if r.drifted]
    if drifted:
        raise DriftDetected("; ".join(f"{r.source}: inputs drifted from the model's baseline" for r in drifted))
    return 0
