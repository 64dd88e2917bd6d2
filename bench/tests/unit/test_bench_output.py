"""bench.output: the summary leaves out the raw records and nothing else; the committed results are summaries."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench import client_batch, container, latency, output, report
from settings import REPO

RESULTS = REPO / "bench" / "results"
#: The committed reference report of each benchmark and its renderer: the summary beside it renders it exactly.
RENDERERS = {"shipped-digits/results": report.markdown, "latency": latency.markdown,
             "container": container.markdown, "container-python": container.markdown,
             "client-batch": client_batch.markdown}


def test_compact_drops_raw_records_and_the_values_behind_medians_only():
    full = {"settings": {"trials": 3, "samples": 10},
            "runs": [{"throughput": {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "values": [1.0, 2.0, 3.0]},
                      "trials": [{"throughput": 1.0}, {"throughput": 2.0}, {"throughput": 3.0}]}],
            "rss": {"samples": [{"t": 0.5}], "growth_pct": 1.5},
            "rows": {"a_values": [1.0, 2.0], "values": ["kept: not a median's values"]}}
    assert output.compact(full) == {
        "settings": {"trials": 3, "samples": 10},
        "runs": [{"throughput": {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}}],
        "rss": {"growth_pct": 1.5},
        "rows": {"a_values": [1.0, 2.0], "values": ["kept: not a median's values"]}}


def test_dumps_is_json_with_short_containers_on_one_line():
    value = {"machine": {"cores": 2}, "rows": [{"name": f"row {i}", "x": list(range(30))} for i in range(3)]}
    text = output.dumps(value, width=80)
    assert json.loads(text) == value
    assert '"machine": {"cores": 2}' in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_write_puts_the_full_record_in_raw_and_the_summary_beside_the_report(tmp_path):
    result = {"command": "python -m bench x", "where": tmp_path, "trials": [{"ms": 1.0}],
              "ms": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1, "values": [1.0]}}
    raw = output.write(tmp_path, "x", result, "# x\n")
    assert raw == tmp_path / "raw" / "x.json"
    assert json.loads(raw.read_text()) == {**result, "where": str(tmp_path)}
    assert json.loads((tmp_path / "x.summary.json").read_text()) == {
        "command": "python -m bench x", "where": str(tmp_path), "ms": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}}
    assert (tmp_path / "x.md").read_text() == "# x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "x.md", "x.summary.json"]


def committed(pattern: str) -> list[str]:
    return subprocess.run(["git", "ls-files", "--", f"bench/results/{pattern}"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_only_summaries_are_committed_and_raw_is_ignored():
    assert committed("*.json") == committed("*.summary.json") != []
    assert committed("raw/*") == []
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/results/raw/results.json"], cwd=REPO)
    assert ignored.returncode == 0


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_each_committed_summary_has_no_raw_records_and_renders_its_report(name):
    summary = json.loads(output.summary_path(RESULTS, name).read_text())
    assert output.compact(summary) == summary
    assert RENDERERS[name](summary) == (RESULTS / f"{name}.md").read_text()


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_only_the_reference_reports_are_committed():
    assert sorted(committed("*.md")) == sorted(f"bench/results/{name}.md" for name in RENDERERS)
