"""A canary rollout as KServe runs one (serverless mode), promoted or taken back on the candidate's live signals.

KServe's own sequence (kserve/kserve v0.15.2, createKnativeService in pkg/controller/v1beta1/inferenceservice/
reconcilers/knative/ksvc_reconciler.go; the same in v0.13.1): with `canaryTrafficPercent: P` the Knative Service
routes P% to the latest revision (tag `latest` under the `serving.kserve.io/enable-tag-routing` annotation) and the
rest to the revision rolled out last (tag `prev`); without it, all traffic goes to the latest ready revision. So:

1. patch the new spec with `canaryTrafficPercent: P`: KServe makes the candidate revision and gives it P%;
2. wait until the candidate is Ready and takes its share;
3. watch it for the window: it must stay Ready and keep its share, and with a Prometheus its own answers (the
   handler and gateway label every series with the answering model version) must pass `judge` against the stable
   version's over the same window;
4. promote by removing canaryTrafficPercent (KServe then routes all traffic to the candidate), or take it back:
   the previous spec with `canaryTrafficPercent: 0`, so the candidate gets no traffic while KServe makes the old
   spec's revision again (without the 0, "latest" would resolve to the candidate, the latest *ready* revision),
   then remove it.

Raw deployment mode has no revisions to split: deploy rolls out whole there.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import KServeError

CANARY_KEY = "canaryTrafficPercent"
#: Share of traffic a candidate gets while it is watched. A revision runs at least minReplicas pods: at the default
#: four stable pods, each answering 310-400 req/s at 2 CPUs (docs/performance.md), 10% of what they carry fits one
#: candidate pod at a third of its capacity.
CANARY_PERCENT = 10
#: How long the candidate is watched before the verdict (five scrapes at the shipped 60 s interval).
CANARY_WINDOW_S = 300.0
#: The verdict, candidate against the stable version over the same window: at most 1% 5xx answers (the
#: EmbeddingHighErrorRate alert pages at 5%), an unknown-answer share at most 5 points above the stable model's
#: (client.drift's UNKNOWN_FLOOR), a p99 at most 1.5x the stable one plus 5 ms, and at least 20 requests seen.
MAX_ERROR_RATIO = 0.01
UNKNOWN_SLACK = 0.05
P99_FACTOR, P99_SLACK_S = 1.5, 0.005
MIN_REQUESTS = 20


@dataclass(frozen=True)
class Canary:
    """How a new model version is rolled out: `percent` 0 = all at once."""

    percent: int = CANARY_PERCENT
    window_s: float = CANARY_WINDOW_S
    #: Prometheus that scrapes the predictor pods ("" = judge on readiness alone).
    prometheus_url: str = ""

    def problem(self) -> str | None:
        if not 0 <= self.percent <= 99:
            return f"the canary share must be 0-99 percent (0: no canary), not {self.percent}"
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            return f"the canary window must be > 0 seconds, not {self.window_s}"
        if self.prometheus_url and not self.prometheus_url.startswith(("http://", "https://")):
            return f"the Prometheus URL must be http:// or https://, not {self.prometheus_url!r}"
        return None


@dataclass(frozen=True)
class Signals:
    """One model version's answers over the window, as Prometheus counts them."""

    requests: float
    errors: float
    #: p99 of the 2xx answers' latency in seconds; None without 2xx answers.
    p99_s: float | None
    answered: float
    unknown: float

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def unknown_ratio(self) -> float:
        return self.unknown / self.answered if self.answered else 0.0


def queries(model: str, version: str, window_s: float) -> dict[str, str]:
    """The PromQL of each Signals field for `version` of `model` over the last `window_s` seconds (series of
    serving.gateway_metrics and handler.metric_names)."""
    rng = f"[{max(1, round(window_s))}s]"
    req = f'embedding_request_duration_seconds_count{{model_name="{model}",model_version="{version}"'
    handler = f'{{ModelName="{model}",ModelVersion="{version}"}}'
    return {
        "requests": f"sum(increase({req}}}{rng}))",
        "errors": f'sum(increase({req},code=~"5.."}}{rng}))',
        "p99_s": ("histogram_quantile(0.99, sum by (le) (rate(embedding_request_duration_seconds_bucket"
                  f'{{model_name="{model}",model_version="{version}",code=~"2.."}}{rng})))'),
        "answered": f"sum(increase(EmbeddingAnsweredImages{handler}{rng}))",
        "unknown": f"sum(increase(EmbeddingUnknownAnswers{handler}{rng}))",
    }


def read_signals(prometheus_url: str, model: str, version: str, window_s: float) -> Signals:
    """`version`'s Signals from the Prometheus at `prometheus_url`; KServeError when it cannot be read."""
    from serving.prometheus import api

    values: dict[str, float | None] = {}
    for field, expr in queries(model, version, window_s).items():
        try:
            result = api(prometheus_url, "query", query=expr)["result"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KServeError(f"cannot read the canary's signals from Prometheus at {prometheus_url}: {exc}") from None
        value = float(result[0]["value"][1]) if result else None
        values[field] = value if value is not None and math.isfinite(value) else None
    p99 = values.pop("p99_s")
    return Signals(**{k: v or 0.0 for k, v in values.items()}, p99_s=p99)


def judge(candidate: Signals, stable: Signals, window_s: float) -> list[str]:
    """Why the candidate must not be promoted (empty: promote)."""
    span = f"in {window_s:.0f} s"
    if candidate.requests < MIN_REQUESTS:
        return [f"it answered {candidate.requests:.0f} requests {span}, fewer than the {MIN_REQUESTS} a verdict "
                "needs (raise kserve_canary_percent or kserve_canary_window)"]
    problems = []
    if candidate.error_ratio > MAX_ERROR_RATIO:
        problems.append(f"{candidate.error_ratio:.1%} of its answers were 5xx (at most {MAX_ERROR_RATIO:.0%})")
    limit = stable.unknown_ratio + UNKNOWN_SLACK
    if candidate.unknown_ratio > limit:
        problems.append(f"it answered unknown for {candidate.unknown_ratio:.1%} of images, the stable model for "
                        f"{stable.unknown_ratio:.1%} (at most {UNKNOWN_SLACK:.0%} points more)")
    if candidate.p99_s is None:
        problems.append(f"it gave no successful answer {span}")
    elif stable.p99_s is not None and candidate.p99_s > stable.p99_s * P99_FACTOR + P99_SLACK_S:
        problems.append(f"its p99 was {candidate.p99_s * 1000:.0f} ms, the stable model's "
                        f"{stable.p99_s * 1000:.0f} ms (at most {P99_FACTOR}x + {P99_SLACK_S * 1000:.0f} ms)")
    return problems


def _predictor(obj: dict) -> dict:
    return ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}


def split_state(percent: int, obj: dict, before: dict | None) -> tuple[str, str]:
    """("served" | "failed" | "pending", why) of a revision made since `before` that is to take `percent`% of the
    traffic beside the revision rolled out last: served once it is Ready and routed its share."""
    status, predictor = obj.get("status") or {}, _predictor(obj)
    created = predictor.get("latestCreatedRevision")
    if before is not None and created in (None, _predictor(before).get("latestCreatedRevision")):
        return "pending", f"KServe has not created a revision for the new spec yet (latest {created})"
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    if ready.get("status") == "False" and ready.get("reason") == "RevisionFailed":
        return "failed", ready.get("message") or "RevisionFailed"
    if predictor.get("latestReadyRevision") != created:
        return "pending", f"revision {created} is not ready yet"
    share = next((t for t in predictor.get("traffic") or [] if t.get("latestRevision")), {})
    if share.get("revisionName") != created or share.get("percent") != percent:
        return "pending", f"revision {created} does not have {percent}% of the traffic yet"
    if ready.get("status") != "True":
        return "pending", ready.get("message") or ready.get("reason") or "not Ready yet"
    return "served", created


def candidate_url(obj: dict) -> str:
    """The candidate's own URL (tag routing), "" without tag routing."""
    return next((t.get("url", "") for t in _predictor(obj).get("traffic") or [] if t.get("tag") == "latest"), "")


def watch(read: Callable[[], dict], candidate: str, percent: int, window_s: float, poll_s: float) -> str:
    """Follow the InferenceService (`read`) for `window_s`: "" when the candidate stayed Ready with its share,
    else why not."""
    end = time.monotonic() + window_s
    while True:
        state, why = split_state(percent, read(), None)
        if state != "served" or why != candidate:
            return f"revision {candidate} stopped serving its share during the window: {why}"
        left = end - time.monotonic()
        if left <= 0:
            return ""
        time.sleep(min(poll_s, left))


def verdict(canary: Canary, model: str, version: str, stable_version: str, window_s: float,
            signals: Callable[[str, str, str, float], Signals] | None = None) -> tuple[list[str], str]:
    """(problems, what was judged) for the candidate `version` after its window (`signals`: read_signals)."""
    signals = signals or read_signals
    if not canary.prometheus_url:
        return [], "on readiness alone (no kserve_prometheus_url: errors, unknown share and p99 unread)"
    candidate = signals(canary.prometheus_url, model, version, window_s)
    stable = signals(canary.prometheus_url, model, stable_version, window_s)
    judged = (f"{candidate.requests:.0f} requests, {candidate.error_ratio:.1%} 5xx, {candidate.unknown_ratio:.1%} "
              f"unknown, p99 {'-' if candidate.p99_s is None else f'{candidate.p99_s * 1000:.0f} ms'}")
    return judge(candidate, stable, window_s), judged


def with_percent(patch: dict, percent: int | None) -> dict:
    """`patch` with the predictor's canaryTrafficPercent set (None: removed)."""
    patch.setdefault("spec", {}).setdefault("predictor", {})[CANARY_KEY] = percent
    return patch


def promote_patch(_: Any) -> dict:
    return with_percent({}, None)


def roll_out_canary(api: Any, namespace: str, name: str, manifest: dict, canary: Canary, model: str, version: str,
                    timeout_s: float, poll_s: float,
                    signals: Callable[[str, str, str, float], Signals] | None = None,
                    check: Callable[[str], tuple[str, str]] | None = None) -> tuple[dict, str]:
    """Steps 1-4 of the module's docstring for `manifest` on the existing serverless InferenceService; (the object
    once the candidate serves all traffic, what happened on one line). KServeError when the candidate is taken
    back, with why and where the traffic is. `check(the candidate's tag URL)` -> (problem or "", what it
    checked) runs before the window (pipeline.kserve_deploy.candidate: the model its pods loaded)."""
    from kubernetes.client.exceptions import ApiException

    from .api import api_error, read_inference_service
    from .rollout import deploy_patch, patch_isvc, revert_patch, wait_ready

    where = f"InferenceService {namespace}/{name}"
    try:
        before, _ = patch_isvc(api, namespace, name,
                               lambda existing: with_percent(deploy_patch(manifest, existing), canary.percent))
    except ApiException as exc:
        raise KServeError(f"{where}: {api_error(exc)}") from None
    stable_version = (before["metadata"].get("labels") or {}).get("app.kubernetes.io/version", "")
    stable = _predictor(before).get("latestRolledoutRevision") or _predictor(before).get("latestReadyRevision", "?")
    interrupted = False
    try:
        obj = wait_ready(api, namespace, name, before, timeout_s, poll_s,
                         state_of=lambda o, b: split_state(canary.percent, o, b))
        candidate = _predictor(obj)["latestReadyRevision"]
        problem, checked = check(candidate_url(obj)) if check is not None else ("", "")
        problem = problem or watch(lambda: read_inference_service(api, namespace, name) or {}, candidate,
                                   canary.percent, canary.window_s, poll_s)
        problems, judged = ([problem], "") if problem else verdict(canary, model, version, stable_version,
                                                                    canary.window_s, signals)
        judged = "; ".join(filter(None, (checked, judged)))
    except (KServeError, ApiException) as exc:
        problems, judged = [api_error(exc) if isinstance(exc, ApiException) else str(exc).removeprefix(f"{where}: ")], ""
    except KeyboardInterrupt:
        problems, judged, interrupted = ["interrupted"], "", True
    try:
        if not problems:
            patch_isvc(api, namespace, name, promote_patch)
            served = wait_ready(api, namespace, name, None, timeout_s, poll_s)
            return served, (f"canary: revision {candidate} took {canary.percent}% for {canary.window_s:.0f} s "
                            f"({judged}), then all traffic")
        at = read_inference_service(api, namespace, name)
        patch_isvc(api, namespace, name, lambda current: with_percent(revert_patch(before)(current), 0))
        wait_ready(api, namespace, name, at, timeout_s, poll_s, state_of=lambda o, b: split_state(0, o, b))
        patch_isvc(api, namespace, name, promote_patch)
        wait_ready(api, namespace, name, None, timeout_s, poll_s)
    except (KServeError, ApiException) as exc:
        detail = api_error(exc) if isinstance(exc, ApiException) else str(exc).removeprefix(f"{where}: ")
        step = "promoting it" if not problems else "taking it back"
        raise KServeError(f"{where}: canary of version {version}: {'; '.join(problems) or 'passed'}; {step} failed "
                          f"({detail}): check its traffic with kubectl get isvc {name} -n {namespace}") from None
    if interrupted:
        raise KeyboardInterrupt
    raise KServeError(f"{where}: canary of version {version} not promoted: {'; '.join(problems)}; the spec and all "
                      f"traffic are back on version {stable_version or '?'} (revision {stable} before it)")


def canary_reason(canary: Canary, existing: dict | None, storage_uri: str) -> str:
    """Why this rollout goes all at once ("" = as a canary)."""
    from .rollout import is_raw, served_storage_uri

    if not canary.percent:
        return "all at once (kserve_canary_percent 0)"
    if existing is None or not _predictor(existing).get("latestRolledoutRevision"):
        return "all at once (no revision rolled out before: nothing to measure a canary against)"
    if is_raw(existing):
        return "all at once (raw deployment mode has no revisions to split traffic between)"
    if served_storage_uri(existing) == storage_uri:
        return "all at once (the same model: a canary measures a new one)"
    return ""
