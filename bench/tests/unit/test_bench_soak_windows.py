"""bench.soak's windows and RSS growth on made-up samples (no server)."""

from __future__ import annotations

import numpy as np

from bench.soak import RssSample, Sample, rss_growth, windows


def test_soak_windows_and_rss_growth_leave_out_the_warm_up():
    samples = [Sample(float(t), 0.010, 200) for t in np.arange(0.0, 4.0, 0.5)] + [Sample(1.2, 0.5, None, "reset")]
    rss = [RssSample(t, 300.0 if t < 1 else 100.0, {7: 200.0 + t}) for t in np.arange(0.25, 4.0, 0.5)]
    rows = windows(samples, rss, duration_s=4.0, window_s=1.0)
    assert [(w["requests"], w["errors"]) for w in rows] == [(2, 0), (3, 1), (2, 0), (2, 0)]
    assert rows[1]["p50_ms"] == rows[1]["p99_ms"] == 10.0  # failed requests are not latencies
    assert [w["frontend_mb"] for w in rows] == [300.0, 100.0, 100.0, 100.0]
    growth = rss_growth(rows, warmup_windows=1)  # the 300 MB warm-up window does not count
    assert growth["frontend"] == 0.0
    assert growth["workers"] == round(100 * (203.5 - 201.5) / 201.5, 2)
    assert rss_growth(rows, warmup_windows=3) == {"frontend": None, "workers": None, "total": None}
