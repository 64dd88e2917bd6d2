"""Prometheus text exposition (TorchServe's /metrics) read with prometheus_client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sum_by_name(text: str, **labels: str) -> dict[str, float]:
    """Each metric's value summed over its label sets, keeping only samples carrying all of `labels`.

    Counters are keyed by their family name, which the parser gives without the ``_total`` suffix whether or not
    the exposition had one (TorchServe's ``ts_inference_requests_total`` is ``ts_inference_requests``, the
    handler's ``EmbeddingAnsweredImages`` stays as it is); other samples by their own name.
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter":
                if sample.name != family.name + "_total":
                    continue
                name = family.name
            else:
                name = sample.name
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                out[name] = out.get(name, 0.0) + sample.value
    return out
