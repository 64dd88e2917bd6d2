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
from typing import Any, Mapping, Sequence

import yaml

from settings import GATEWAY_METRICS_KEY, REPO

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES_DIR = PROMETHEUS_DIR / "rules"
JOB = "embedding-torchserve"
#: Labels Prometheus gives every scraped series: the target's, and those of the shipped scrape config.
TARGET_LABELS = frozenset({"job", "instance", "deployment"})
#: Series Prometheus itself writes per target.
PROMETHEUS_SERIES = {"up": frozenset()}

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


def _metric_kinds(section: Mapping[str, Any] | None, extra_dims: tuple[str, ...]) -> dict[str, frozenset[str]]:
    series: dict[str, frozenset[str]] = {}
    for kind, specs in (section or {}).items():
        for spec in specs or []:
            dims = frozenset((*spec.get("dimensions", []), *extra_dims))
            if kind == "histogram":
                series.update({f"{spec['name']}_bucket": dims | {"le"}, f"{spec['name']}_sum": dims,
                               f"{spec['name']}_count": dims})
            else:
                series[spec["name"]] = dims
    return series


def produced_series(props: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """{series name: its label names} that a TorchServe started with config.properties `props` (and, where
    `props` names gateway_metrics_address, the KServe gateway) exposes to Prometheus, with ``up``.

    Read from the code that declares them: TorchServe's metrics_config (its own ts/configs/metrics.yaml by
    default; frontend metrics as declared, model metrics plus the Hostname TorchServe adds), the handler's
    metrics (handler.ts_metrics, registered only with model_metrics_auto_detect=true, since the metrics
    config does not list them) and the gateway's histogram (serving.gateway_metrics). TorchServe's metrics
    port serves nothing unless metrics_mode=prometheus.
    """
    series: dict[str, frozenset[str]] = dict(PROMETHEUS_SERIES)
    if props.get(GATEWAY_METRICS_KEY):
        from serving.gateway_metrics import LABELS, REQUEST_SECONDS, histogram_series

        bucket, total, count = histogram_series(REQUEST_SECONDS)
        series.update({bucket: frozenset((*LABELS, "le")), total: frozenset(LABELS), count: frozenset(LABELS)})
    if props.get("metrics_mode", "log").strip().lower() != "prometheus":
        return series
    import ts

    config_path = props.get("metrics_config") or str(Path(ts.__file__).parent / "configs" / "metrics.yaml")
    declared = yaml.safe_load(Path(config_path).read_text()) or {}
    series.update(_metric_kinds(declared.get("ts_metrics"), ()))
    series.update(_metric_kinds(declared.get("model_metrics"), ("Hostname",)))
    if props.get("model_metrics_auto_detect", "false").strip().lower() == "true":
        from handler.ts_metrics import BASELINE_METRICS, DIMENSIONS, METRIC_NAMES

        for name in (*METRIC_NAMES, *BASELINE_METRICS):
            series.setdefault(name, frozenset((*DIMENSIONS, "Hostname")))
    return series


_TOKEN = re.compile(r"""\s+|(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)|(?P<range>\[[^\]]*\])"""
                    r"|(?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)(?:ms|[smhdwy])?)"
                    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},])")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                 "topk", "quantile", "limitk", "limit_ratio"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if not match:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r}")
        if match.lastgroup:
            out.append((match.lastgroup, match.group()))
        pos = match.end()
    return out


def rule_selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """(series name, label names it matches on) of every vector selector in a PromQL expression.

    Function and aggregation names (followed by '(', or by/without), keywords, label lists of by/without/on/ignoring/
    group_left/group_right, strings, numbers and durations are not selectors; selectors by __name__ alone
    are refused rather than guessed, and so is an expression whose braces or parentheses do not close."""
    try:
        return _selectors(_tokens(expr), expr)
    except IndexError:
        raise ValueError(f"unbalanced braces or parentheses in {expr!r}") from None


def _selectors(tokens: list[tuple[str, str]], expr: str) -> list[tuple[str, frozenset[str]]]:
    found: list[tuple[str, frozenset[str]]] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "name" and text.lower() in _LABEL_LISTS:
            i += 1
            if following == "(":
                while tokens[i][1] != ")":
                    i += 1
        elif kind == "name" and text.lower() in _AGGREGATIONS and following.lower() in ("by", "without"):
            pass  # an aggregation with its grouping first: `sum by (job) (...)`
        elif kind == "name" and text.lower() not in _KEYWORDS and following != "(":
            labels: set[str] = set()
            i += 1
            if following == "{":
                i += 1
                while tokens[i][1] != "}":
                    if tokens[i][0] == "name" and tokens[i + 1][1] in ("=", "!=", "=~", "!~"):
                        labels.add(tokens[i][1])
                    i += 1
            found.append((text, frozenset(labels)))
            continue
        elif text == "{":
            raise ValueError(f"selector without a metric name in {expr!r}")
        i += 1
    return found


def rule_documents(rules_dir: Path = RULES_DIR) -> dict[str, list[dict]]:
    """{rule file name: its rules} of the shipped rule files."""
    return {path.name: [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
            for path in sorted(rules_dir.glob("*.yml"))}


def unproduced_selectors(props: Mapping[str, str], rules_dir: Path = RULES_DIR) -> list[str]:
    """What the rules select that a server with config.properties `props` does not produce: a missing series,
    or a label it does not carry. Recorded series count as produced (with the labels their rules keep)."""
    documents = rule_documents(rules_dir)
    recorded = {rule["record"] for rules in documents.values() for rule in rules if "record" in rule}
    produced = produced_series(props)
    problems = []
    for file, rules in documents.items():
        for rule in rules:
            what = rule.get("record") or rule.get("alert")
            for name, labels in rule_selectors(rule["expr"]):
                if name in recorded:
                    continue
                if name not in produced:
                    problems.append(f"{file} {what}: no series {name}")
                elif labels - produced[name] - TARGET_LABELS:
                    problems.append(f"{file} {what}: {name} has no label {', '.join(sorted(labels - produced[name]))}")
    return problems


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
        (axes[0], "milliseconds", [("1000 * embedding:latency_mean_seconds:rate5m",
                                    "mean request latency (TorchServe)"),
                                   ("1000 * embedding:batch_seconds:p99_5m", "p99 of sampled batch handler time")]),
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
