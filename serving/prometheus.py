"""The shipped Prometheus config (deploy/prometheus/) and fast variants of it for tests and demos.

A variant is derived from the shipped files, never written by hand: other scrape targets, shorter scrape and
evaluation intervals, every range window ``[5m]`` scaled by a factor and every ``for:`` replaced, so the same
rules fire within seconds instead of minutes.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import yaml

from settings import REPO

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
JOB = "embedding-torchserve"

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_RANGE = re.compile(r"\[(\d+)(ms|s|m|h|d)\]")


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", duration.strip())
    if not match:
        raise ValueError(f"not a simple Prometheus duration: {duration!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _duration(secs: float) -> str:
    return f"{max(1, round(secs))}s"


def scale_ranges(expr: str, factor: float, minimum: float = 2.0) -> str:
    """Every ``[N<unit>]`` range in a PromQL expression times ``factor`` (at least ``minimum`` seconds)."""
    return _RANGE.sub(lambda m: f"[{_duration(max(minimum, seconds(m.group(1) + m.group(2)) * factor))}]", expr)


def render_variant(out_dir: Path, targets: Sequence[str], scrape_interval: str = "1s",
                   evaluation_interval: str = "1s", window_factor: float = 0.05, for_duration: str = "2s",
                   min_window: str = "6s") -> Path:
    """Write prometheus.yml + rules into ``out_dir`` for ``targets`` (host:port); returns the config path."""
    out_dir = Path(out_dir)
    (out_dir / "rules").mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(CONFIG.read_text())
    config["global"].update(scrape_interval=scrape_interval, evaluation_interval=evaluation_interval,
                            scrape_timeout=scrape_interval)
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    if len(jobs) != 1:
        raise ValueError(f"{CONFIG}: expected one scrape job named {JOB}")
    jobs[0]["static_configs"][0]["targets"] = list(targets)
    rule_files = []
    for name in config["rule_files"]:
        rules = yaml.safe_load((CONFIG.parent / name).read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule["expr"] = scale_ranges(rule["expr"], window_factor, seconds(min_window))
                if "for" in rule:
                    rule["for"] = for_duration
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text(yaml.safe_dump(rules, sort_keys=False))
        rule_files.append(name)
    config["rule_files"] = rule_files
    path = out_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def api(url: str, path: str, timeout: float = 10.0, **params: Any) -> Any:
    """GET ``url/api/v1/<path>``; returns its ``data`` (raises OSError/ValueError on failure)."""
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/{path}{'?' + query if query else ''}",
                                timeout=timeout) as response:
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise ValueError(f"Prometheus {path}: {body.get('error', body)}")
    return body["data"]


def alerts(url: str) -> dict[str, str]:
    """{alert name: 'firing' | 'pending'} of the alerts Prometheus holds now (firing wins)."""
    states: dict[str, str] = {}
    for alert in api(url, "alerts")["alerts"]:
        name = alert["labels"]["alertname"]
        if states.get(name) != "firing":
            states[name] = alert["state"]
    return states


def query_range(url: str, expr: str, start: float, end: float, step: float = 1.0) -> tuple[list[float], list[float]]:
    """One series of a range query (the first, if several): times in seconds since ``start``, values."""
    result = api(url, "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]
    if not result:
        return [], []
    points = [(float(t) - start, float(v)) for t, v in result[0]["values"] if v not in ("NaN", "+Inf", "-Inf")]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(url: str, start: float, end: float, out: Path, phases: Sequence[tuple[float, float, str]] = (),
             firing: dict[str, float] | None = None) -> Path:
    """PNG of a run from Prometheus's recording rules: latency (mean and sampled batch p99), unknown ratio,
    mean top-1 distance against the baseline p90; phases shaded, alerts' firing times marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    panels = [
        (axes[0], "milliseconds", [("embedding:latency_mean_ms:rate5m", "mean request latency (TorchServe)"),
                                   ("embedding:batch_ms:p99_5m", "p99 of sampled batch handler time")]),
        (axes[1], "ratio", [("embedding:unknown_ratio:rate5m", "unknown-answer ratio"),
                            ("clamp_min(10 * embedding:baseline_unknown_rate, 0.05)", "alert threshold")]),
        (axes[2], "distance", [("embedding:top1_distance_mean:rate5m", "mean top-1 distance"),
                               ("embedding:baseline_top1_distance:p90", "baseline p90 (alert threshold)")]),
    ]
    for ax, unit, series in panels:
        for i, (expr, label) in enumerate(series):
            xs, ys = query_range(url, expr, start, end)
            ax.plot(xs, ys, label=label, linestyle="-" if i == 0 else "--", linewidth=1.6 if i == 0 else 1.2)
        for j, (a, b, name) in enumerate(phases):
            ax.axvspan(a - start, b - start, color=("tab:green", "tab:red")[j % 2], alpha=0.06)
            if ax is axes[0]:
                ax.text((a + b) / 2 - start, 1.02, name, transform=ax.get_xaxis_transform(), ha="center", fontsize=8)
        for name, when in (firing or {}).items():
            ax.axvline(when - start, color="black", linewidth=0.8, linestyle=":")
        ax.set_ylabel(unit)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    for name, when in sorted((firing or {}).items(), key=lambda kv: kv[1]):
        axes[2].annotate(name.replace("Embedding", ""), (when - start, 0.02), xycoords=("data", "axes fraction"),
                         rotation=90, fontsize=7, ha="right", va="bottom")
    axes[2].set_xlabel("seconds since the run started (windows 15 s, scrapes and evaluations every 1 s)")
    fig.suptitle("End-to-end run: TorchServe scraped by Prometheus (tests/integration/test_prometheus.py)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
