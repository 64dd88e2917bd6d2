"""python -m bench preprocess end to end on a few images (well-formed outputs, no timing assertions)."""

from __future__ import annotations

from bench import preprocess


def test_preprocess_bench_writes_json_and_markdown(tmp_path, tiny_artifacts, written):
    assert preprocess.main(["--out", str(tmp_path), "--png", "6", "--jpeg", "3", "--reps", "2",
                            "--artifacts", str(tiny_artifacts), "--accuracy-images", "20"]) == 0
    result = written(tmp_path, "preprocess", preprocess.markdown)
    rows = {row["corpus"]: row for row in result["rows"]}
    assert set(rows) == set(preprocess.CORPORA)
    assert rows["png"]["images"] == 6 and rows["jpeg-photo"]["images"] == 3
    for row in rows.values():
        for key in ("v1_cpu_us", "current_cpu_us", "decode_only_cpu_us", "v1_wall_us", "ratio_cpu"):
            assert row[key]["n"] == 2 and row[key]["median"] > 0
    assert rows["png"]["parity"] == {"images": 6, "identical_tensors": 6, "max_canvas_diff": 0}
    accuracy = {row["corpus"]: row for row in result["accuracy"]}
    assert accuracy["png"]["changed_predictions"] == 0
    assert accuracy["png"]["v1_accuracy"] == accuracy["png"]["current_accuracy"]
    assert len(result["load_before"]) == 3 and result["artifacts_model"]["sha256"]
    text = (tmp_path / "preprocess.md").read_text()
    assert "| png | 6 |" in text and "| jpeg-photo | 3 |" in text and "Held-out accuracy" in text
