"""bench.latency: paired per-round ratios, the A/A noise band and the verdict, on made-up trials (no server)."""

from __future__ import annotations

import pytest

from bench import latency
from bench.torchserve import NETTY_ONE, TSConfig, all_configurations, configurations, shipped_config


def trial(p50: float, throughput: float, mean: float | None = None) -> dict:
    return {"p50_ms": p50, "p99_ms": p50 * 3, "mean_ms": mean or p50, "throughput": throughput, "errors": 0,
            "cpu": {"frontend (java)": 20.0, "worker": 80.0, "total": 100.0}, "split": {"mean_batch": 1.0}}


def rounds(c1: list[float], c16: list[float]) -> dict[int, list[dict]]:
    return {1: [trial(p, 100.0) for p in c1], 16: [trial(10.0, t) for t in c16]}


@pytest.fixture
def trials():
    return {
        "shipped": rounds([8.0, 8.0, 8.0], [1000.0, 1200.0, 1000.0]),
        "shipped-copy": rounds([8.0, 8.0, 8.0], [1050.0, 1140.0, 980.0]),  # deviations 5%, 5%, 2%
        "no-batching": rounds([2.0, 3.0, 2.0], [500.0, 600.0, 500.0]),
        "fast": rounds([2.4, 3.6, 2.6], [960.0, 1150.0, 1000.0]),  # p50 1.2/1.2/1.3x; req/s 0.96/0.958/1.0
        "slow-c16": rounds([2.2, 3.3, 2.2], [900.0, 1000.0, 850.0]),  # req/s 0.9/0.833/0.85
    }


def test_ratios_are_paired_per_round(trials):
    rows = latency.analyse(trials, [1, 16])
    ratio = rows["fast"]["1"]["vs_no_batching"]["p50_ms"]
    assert ratio["values"] == pytest.approx([1.2, 1.2, 1.3])
    assert ratio["median"] == pytest.approx(1.2)
    assert rows["fast"]["16"]["vs_shipped"]["throughput"]["median"] == pytest.approx(0.96)
    assert rows["shipped"]["16"]["vs_shipped"]["throughput"]["values"] == [1.0, 1.0, 1.0]


def test_noise_band_and_verdicts(trials):
    rows = latency.analyse(trials, [1, 16])
    noise = latency.noise_band(rows)
    assert noise["median"] == pytest.approx(0.05) and noise["max"] == pytest.approx(0.05)
    ver = latency.verdicts(rows, noise)
    assert ver["fast"]["meets"] and ver["fast"]["throughput_floor"] == pytest.approx(0.95)
    assert ver["slow-c16"]["low_load_ok"] and not ver["slow-c16"]["throughput_ok"] and not ver["slow-c16"]["meets"]
    assert not ver["shipped"]["meets"] and ver["shipped"]["c1_p50_over_no_batching"] == pytest.approx(4.0)
    assert latency.noise_band(latency.analyse({k: v for k, v in trials.items() if k != "shipped-copy"}, [1])) is None


def test_markdown_states_the_verdict(trials):
    rows = latency.analyse(trials, [1, 16])
    noise = latency.noise_band(rows)
    names = list(trials)
    result = {
        "rows": rows, "noise_band": noise, "verdicts": latency.verdicts(rows, noise),
        "labels": {n: n for n in names}, "command": "python -m bench.latency", "started": "s", "finished": "f",
        "duration_s": 1.0, "machine": {"cpu_model": "cpu", "logical_cores": 2, "memory_gib": 1},
        "data": {"description": "d"}, "load": {"start": "1", "after_warmup": "2", "end": "3"},
        "rounds": [{"loadavg": "1"}], "warmup": {}, "settings": {
            "concurrencies": [1, 16], "warmup_window_s": 3, "steady": 0.05, "warmup_min_s": 15, "warmup_max_s": 40,
            "trials": 3, "duration_s": 4},
        "configs": {n: {"max_batch_delay_ms": 5, "batch_size": 8} for n in names},
    }
    text = latency.markdown(result)
    assert "Meet the target: `fast`" in text and "`slow-c16`" in text and "| **yes** |" in text


def test_candidates_keep_the_report_names_and_frontend_overrides():
    names = [c.name for c in all_configurations()]
    assert names[:len(configurations(quick=False))] == [c.name for c in configurations(quick=False)]
    assert len(names) == len(set(names))
    assert set(latency.DEFAULT_CONFIGS) <= set(names)
    shipped = shipped_config()
    copy = next(c for c in all_configurations() if c.name == "shipped-copy")
    assert (copy.workers, copy.batch_size, copy.max_batch_delay_ms) == (shipped.workers, shipped.batch_size,
                                                                        shipped.max_batch_delay_ms)
    netty = TSConfig("n", 2, 1, 8, 5, properties=NETTY_ONE)
    assert "number_of_netty_threads=1" in netty.label
