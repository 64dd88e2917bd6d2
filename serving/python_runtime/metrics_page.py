"""The python runtime's metrics port: the workers' metrics (prometheus_client multiprocess files) summed, written
in TorchServe's text format.

TorchServe exposes its counters under their own names (``Requests2XX``, ``ts_inference_latency_microseconds``,
``EmbeddingAnsweredImages``), where prometheus_client would add ``_total``; the rules select those names, so the
page is written here rather than by prometheus_client's exposition. Each scrape counts as a 2xx answer, as on
TorchServe, where the rules read a restart from that counter's reset.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Iterable

from aiohttp import web
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample

from serving.gateway_metrics import serve_metrics_page


#: Counters whose exposed name keeps prometheus_client's ``_total`` (as TorchServe names them).
TOTAL_NAMED = frozenset({"ts_inference_requests"})
SCRAPES = "Requests2XX"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "NaN" if math.isnan(value) else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, sample: Sample) -> str:
    labels = ",".join(f'{key}="{_escape(str(value))}"' for key, value in sample.labels.items())
    return f"{name}{{{labels}}} {_value(sample.value)}\n" if labels else f"{name} {_value(sample.value)}\n"


def render(families: Iterable, scrapes: int, host: str) -> bytes:
    """The text page of `families` (prometheus_client Metric objects), counters under TorchServe's names, with
    `scrapes` added to the 2xx counter."""
    out: list[str] = []
    seen_scrapes = False
    for family in sorted(families, key=lambda f: f.name):
        name = f"{family.name}_total" if family.type == "counter" and family.name in TOTAL_NAMED else family.name
        out.append(f"# HELP {name} {_escape(family.documentation)}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            if family.type == "counter":
                if not sample.name.endswith("_total"):
                    continue  # _created: TorchServe has none
                value = sample.value
                if family.name == SCRAPES and sample.labels.get("Hostname") == host:
                    value, seen_scrapes = value + scrapes, True
                sample = Sample(name, sample.labels, value)
            out.append(_line(sample.name, sample))
    if not seen_scrapes:
        out.append(f"# HELP {SCRAPES} answers 2xx\n# TYPE {SCRAPES} counter\n")
        out.append(_line(SCRAPES, Sample(SCRAPES, {"Level": "Host", "Hostname": host}, float(scrapes))))
    return "".join(out).encode()


class MetricsPage:
    """Serves /metrics on `host`:`port` from the multiprocess files in `directory`."""

    def __init__(self, directory: Path, host: str, port: int) -> None:
        self.directory, self.host, self.port = directory, host, port
        self.hostname = socket.gethostname()
        self.scrapes = 0
        self._runner: web.AppRunner | None = None

    async def page(self, _: web.Request) -> web.Response:
        self.scrapes += 1
        body = render(MultiProcessCollector(None, str(self.directory)).collect(), self.scrapes, self.hostname)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        self._runner = await serve_metrics_page(self.page, self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
