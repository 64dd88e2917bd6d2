"""Prometheus text exposition (TorchServe's /metrics) read with prometheus_client's parser."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, **labels: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample carrying all of `labels`.

    Counters are named by their family name, which the parser gives without the ``_total`` suffix whether or not
    the exposition had one (TorchServe's ``ts_inference_requests_total`` is ``ts_inference_requests``, the
    handler's ``EmbeddingAnsweredImages`` stays as it is); other samples by their own name.
    """
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter":
                if sample.name != family.name + "_total":
                    continue
                name = family.name
            else:
                name = sample.name
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                yield name, sample.labels, sample.value


def sum_by_name(text: str, **labels: str) -> dict[str, float]:
    """Each metric's value summed over its label sets, keeping only samples carrying all of `labels`."""
    out: dict[str, float] = {}
    for name, _, value in samples(text, **labels):
        out[name] = out.get(name, 0.0) + value
    return out


def values_by_label(text: str, label: str, **labels: str) -> dict[str | None, dict[str, list[float]]]:
    """{value of `label` (None where a sample has none): {metric name: its samples' values}}, for the samples
    carrying all of `labels`; the caller sums counters and takes the maximum of gauges."""
    out: dict[str | None, dict[str, list[float]]] = {}
    for name, sample_labels, value in samples(text, **labels):
        out.setdefault(sample_labels.get(label), {}).setdefault(name, []).append(value)
    return out
