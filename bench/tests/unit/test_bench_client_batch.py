"""bench.client_batch and the batched-requests figures of bench run: the v1 bodies are what the handler reads as
several images, images/s is req/s x images per request, shares are against the ceiling, the report renders."""

from __future__ import annotations

import base64
import json

import pytest

from bench import client_batch, output, report
from bench.stats import summarize
from handler.protocols import read_row
from settings import REPO

RESULTS = REPO / "bench" / "results"


def s(*values: float) -> dict:
    return summarize(values)


@pytest.mark.parametrize("count,batch,bodies", [(5, 2, 3), (32, 64, 1), (128, 64, 2), (1, 1, 1)])
def test_v1_bodies_are_full_hold_every_image_and_parse_as_several_images(count, batch, bodies):
    images = [f"image {i}".encode() for i in range(count)]
    made = client_batch.v1_bodies(images, batch)
    assert len(made) == bodies
    sent = []
    for body in made:
        request = read_row({"body": json.loads(body)})
        assert request.protocol == "v1" and request.error is None and len(request.items) == batch
        sent += request.items
        assert [base64.b64decode(i["data"]) for i in json.loads(body)["instances"]] == request.items
    assert set(sent) == set(images)


def test_v1_bodies_refuse_nothing_to_send():
    with pytest.raises(ValueError):
        client_batch.v1_bodies([], 64)


def batched_results(images_per_s: list[float], ceiling: float) -> dict:
    runs = [{"concurrency": c, "throughput": s(v / 64), "images_per_s": s(v), "p50_ms": s(80.0), "p90_ms": s(90.0),
             "p99_ms": s(120.0), "errors": 0, "loadgen_cpu_pct": s(2.0), "server_cpu_pct": s(190.0)}
            for c, v in zip((4, 8), images_per_s)]
    return {"ceiling": {"rows": [{"layout": "2x1", "processes": 2, "threads": 1, "batch": 8,
                                  "images_per_s": s(ceiling), "batch_ms_p50": s(4.0)}]},
            "torchserve": [{"name": "shipped", "shipped": True, "label": "2x1, batch 8/1 ms",
                            "batched": {"batch": 64, "label": "2x1, batch 8/1 ms", "runs": runs}}]}


@pytest.mark.parametrize("rates,met,share", [([2000.0, 2400.0], True, "80%"), ([1500.0, 1200.0], False, "50%")])
def test_the_bulk_target_takes_the_best_concurrency_against_the_best_ceiling(rates, met, share):
    target = report._bulk_target(batched_results(rates, 3000.0), batched_results(rates, 3000.0)["torchserve"][0],
                                 {"images_per_s": s(3000.0)})
    assert target["met"] is met and f"= {share} of 3000 images/s" in target["measured"]
    best = max(rates)
    assert target["measured"].startswith(f"{best:.0f} images/s ({best / 64:.0f} req/s x 64, c=")


def test_the_batched_table_shows_images_per_second_beside_requests_per_second():
    lines = "\n".join(report._batched_section(batched_results([2000.0, 2400.0], 3000.0))).splitlines()
    table = [line for line in lines if line.startswith("| 4 ") or line.startswith("| 8 ")]
    assert table[0].startswith("| 4 | 31.2 | 2000 | 67% |") and table[1].startswith("| 8 | 37.5 | 2400 | 80% |")
    assert report._batched_section({"torchserve": [{"shipped": True, "name": "shipped"}]}) == []
    unmeasured = report._bulk_target({}, None, None)
    assert unmeasured["met"] is None and unmeasured["measured"] == "not measured"


def a_round(ceiling: float, client: float, cpu_ms: float = 2.0) -> dict:
    entry = {"ceiling": {"images_per_s": ceiling, "batch": 64, "layout": "2x1", "rows": {}},
             "inprocess_cpu_ms": cpu_ms, "runs": [], "fixed_s": 0.1}
    used = {"frontend": 0.2, "workers": 2.0}  # CPU seconds over 1,000 images
    entry["runs"].append(client_batch._run("client predict", 64, client, 1000, used, 0.3, entry,
                                           seconds=1000 / client))
    return entry


def test_rounds_are_summarised_per_row_with_the_share_of_their_own_ceiling():
    rounds = [a_round(1000.0, 900.0), a_round(500.0, 400.0), a_round(800.0, 720.0)]
    ceiling, client = client_batch.summarize_rounds(rounds)
    assert ceiling["images_per_s"]["median"] == 800.0
    assert client["images_per_s"]["median"] == 720.0
    assert client["share"]["values"] == pytest.approx([0.9, 0.8, 0.9]) and client["share"]["median"] == 0.9
    assert client["cpu_ms"]["client"]["median"] == pytest.approx(0.3)
    assert client["cpu_share"]["median"] == pytest.approx(2.0 / 2.5)
    # without the fixed cost: 1,000 images over the run's time less the one-file run's 0.1 s, against the ceiling
    assert client["steady_share"]["values"] == pytest.approx(
        [1000 / (1000 / rate - 0.1) / ceiling for rate, ceiling in ((900, 1000), (400, 500), (720, 800))])


def test_the_report_says_whether_the_best_client_row_met_the_target():
    result = {"command": "python -m bench client-batch", "started": "2026-11-27 07:00 UTC",
              "finished": "2026-11-27 07:05 UTC", "load_average": {"start": [0.1, 0.1, 0.1], "end": [1.0, 1, 1]},
              "machine": {"cpu_model": "x", "logical_cores": 2},
              "settings": {"images": 1000, "concurrency": 4, "repeats": 3, "ceiling_s": 3.0, "artifacts": "a",
                           "mean_file_bytes": 1480}}
    result["rows"] = client_batch.summarize_rounds([a_round(1000.0, 900.0), a_round(1000.0, 850.0)])
    text = client_batch.markdown(result)
    assert "| client predict | 64 | 875 (850-900) | 88% (85-90%) | 96% (93-99%) | 0.300 (0.300-0.300) |" in text
    assert "at the client's default --batch-size 64: client predict 88% (85-90%) — **met**" in text
    assert "treat the figures as indicative" not in text
    assert "wall-clock shares here are unreliable" not in text
    result["rows"] = client_batch.summarize_rounds([a_round(1000.0, 500.0)])
    assert "**missed**" in client_batch.markdown(result)
    result["rows"] = client_batch.summarize_rounds([a_round(1000.0, 900.0), a_round(500.0, 600.0)])
    assert "1 row(s) reached more than 100%" in client_batch.markdown(result)


@pytest.mark.skipif(not output.summary_path(RESULTS, client_batch.NAME).exists(), reason="no committed results")
def test_the_committed_summary_renders_its_report():
    summary = json.loads(output.summary_path(RESULTS, client_batch.NAME).read_text())
    assert output.compact(summary) == summary
    assert client_batch.markdown(summary).startswith("# Batch client")
    assert (RESULTS / f"{client_batch.NAME}.md").is_file()
