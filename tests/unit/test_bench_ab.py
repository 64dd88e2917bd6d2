"""bench.ab's arithmetic on results shaped like `python -m bench`'s results.json (the runs themselves are
`python -m bench`, which tests/integration/test_bench.py runs for real)."""

from __future__ import annotations

import pytest

from bench.ab import compare, figures, main, markdown


def result(scale: float) -> dict:
    run = lambda c: {"concurrency": c, "throughput": {"median": 100.0 * c * scale}, "p50_ms": {"median": 2.0 / scale},
                     "p99_ms": {"median": 9.0 / scale},
                     "trials": [{"split": {"embed": 1.0 / scale, "preprocess": 1.5}}] if c == 16 else []}
    return {"ceiling": {"rows": [{"layout": "2x1", "batch": b, "images_per_s": {"median": 1000.0 * scale * b}}
                                 for b in (1, 8, 128)] + [{"layout": "1x2", "batch": 8, "images_per_s": {"median": 1.0}}]},
            "torchserve": [{"runs": [run(c) for c in (1, 16, 64)]}], "data": {"accuracy": 0.99}}


def test_ratios_are_per_round_medians():
    rounds = [(figures(result(1.0)), figures(result(2.0))), (figures(result(1.0)), figures(result(4.0))),
              (figures(result(2.0)), figures(result(2.0)))]
    rows = {row["figure"]: row for row in compare(rounds)}
    assert set(rows) >= {"ceiling 2x1 batch 8, images/s", "REST c=16, req/s", "c=16 embed ms per batch",
                         "accuracy (held-out, as served)"}
    assert "ceiling 2x1 batch 1, images/s" not in rows
    assert rows["REST c=16, req/s"]["ratio_b_over_a"] == pytest.approx(2.0)  # ratios 2, 4, 1
    assert rows["REST c=16, req/s"]["a"] == pytest.approx(1600.0) and rows["REST c=16, req/s"]["b"] == pytest.approx(3200.0)
    assert rows["c=16 embed ms per batch"]["ratio_b_over_a"] == pytest.approx(0.5)
    text = markdown({"name": "x", "a": "A", "b": "B", "rounds": 3, "trials": 1, "command": "c", "cpu": "cpu",
                     "started": "s", "finished": "f", "load_start": 1.0, "load_end": 1.0, "rows": list(rows.values())})
    assert "| REST c=16, req/s | 1600 [1600, 1600, 3200] | 3200 [3200, 6400, 3200] | 2.00 |" in text


def test_a_directory_without_metadata_is_refused_in_one_line(tmp_path, capsys):
    assert main(["--a", str(tmp_path), "--b", str(tmp_path), "--name", "x", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an artifact directory" in err[0]
