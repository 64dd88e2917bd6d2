"""bench.ab's arithmetic on results shaped like `python -m bench`'s results.json (the runs themselves are
`python -m bench`, which bench/tests/integration/test_bench_run.py runs for real)."""

from __future__ import annotations

import pytest

from bench import ab
from bench.ab import ABError, compare, figures, main, markdown


def result(scale: float) -> dict:
    run = lambda c: {"concurrency": c, "throughput": {"median": 100.0 * c * scale}, "p50_ms": {"median": 2.0 / scale},
                     "p99_ms": {"median": 9.0 / scale},
                     "trials": [{"split": {"embed": 1.0 / scale, "preprocess": 1.5}}] if c == 16 else []}
    return {"ceiling": {"rows": [{"layout": "2x1", "batch": b, "images_per_s": {"median": 1000.0 * scale * b}}
                                 for b in (1, 8, 128)] + [{"layout": "1x2", "batch": 8, "images_per_s": {"median": 1.0}}]},
            "torchserve": [{"runs": [run(c) for c in (1, 16, 64)]}], "data": {"accuracy": 0.99, "artifacts": "D"}}


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


def test_a_side_torchserve_refused_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    refused = result(1.0)
    refused["torchserve"] = [{"name": "shipped", "error": "worker died: ArtifactError: runs on the CPU only"}]
    with pytest.raises(ABError, match="D: TorchServe did not serve it: worker died"):
        figures(refused)
    partial = result(1.0)
    partial["torchserve"][0]["runs"] = partial["torchserve"][0]["runs"][:2]
    with pytest.raises(ABError, match="no REST figure at c=64"):
        figures(partial)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "metadata.json").write_text("{}")
    monkeypatch.setattr(ab, "run_bench", lambda artifacts, out, trials: refused)
    assert main(["--a", str(tmp_path / "a"), "--b", str(tmp_path / "b"), "--name", "x", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench.ab: error: D: TorchServe did not serve it")


def test_rounds_alternate_which_side_goes_first(tmp_path, monkeypatch):
    order = []
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "metadata.json").write_text("{}")

    def fake(artifacts, out, trials):
        order.append(artifacts.name)
        return result(2.0 if artifacts.name == "b" else 1.0)

    monkeypatch.setattr(ab, "run_bench", fake)
    assert main(["--a", str(tmp_path / "a"), "--b", str(tmp_path / "b"), "--name", "x", "--rounds", "3",
                 "--out", str(tmp_path / "out")]) == 0
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert "| REST c=16, req/s | 1600 [1600, 1600, 1600] | 3200 [3200, 3200, 3200] | 2.00 |" in (
        tmp_path / "out" / "ab-x.md").read_text()
    with pytest.raises(SystemExit):
        main(["--a", "a", "--b", "b", "--name", "x", "--rounds", "0"])
