"""Where a benchmark writes its results: a report and a compact summary (committed), the full record (not).

Into --out: NAME.md (the report) and NAME.summary.json (every figure the report shows: the median, min, max and
count of each one, with the settings, machine, command and dates). Into --out/raw/: NAME.json, the full record
with the per-trial and per-request dumps and the values behind each median. bench/results/raw/ is not committed
(.gitignore); the report is written from the full record, and the summary alone renders the same report (the
bench tests check it). Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RAW_DIR = "raw"
#: Keys holding raw records (lists or mappings of per-trial or per-request entries): left out of the summary.
RAW_RECORDS = frozenset({"trials", "samples"})
#: In a {"median", "min", "max", "n", "values"} summary, the values the median was taken over.
SUMMARY_VALUES = "values"


def compact(value: Any) -> Any:
    """`value` without its raw records and without the values behind each median; scalars are kept as they are."""
    if isinstance(value, dict):
        is_summary = "median" in value
        return {key: compact(item) for key, item in value.items()
                if not (isinstance(item, (list, dict))
                        and (key in RAW_RECORDS or (is_summary and key == SUMMARY_VALUES)))}
    if isinstance(value, list):
        return [compact(item) for item in value]
    return value


def dumps(value: Any, width: int = 116, indent: str = "") -> str:
    """JSON with one entry per line, except that a list or mapping that fits in `width` stays on one line."""
    flat = json.dumps(value)
    if not isinstance(value, (dict, list)) or not value or len(indent) + len(flat) <= width:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(key)}: {dumps(item, width, inner).lstrip()}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [f"{inner}{dumps(item, width, inner).lstrip()}" for item in value]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


def raw_path(out: Path, name: str) -> Path:
    """The full record of benchmark `name` written into `out`."""
    return out / RAW_DIR / f"{name}.json"


def summary_path(out: Path, name: str) -> Path:
    """The compact summary of benchmark `name` written into `out`."""
    return out / f"{name}.summary.json"


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    """`result` as it reads back from JSON (paths and other objects as strings)."""
    return json.loads(json.dumps(result, default=str))


def write(out: Path, name: str, result: dict[str, Any], report: str | None = None) -> Path:
    """raw/NAME.json (full), NAME.summary.json (compact) and, if given, NAME.md into `out`; the full record's path."""
    raw = raw_path(out, name)
    raw.parent.mkdir(parents=True, exist_ok=True)
    full = as_json(result)
    raw.write_text(json.dumps(full, indent=1) + "\n")
    summary_path(out, name).write_text(dumps(compact(full)) + "\n")
    if report is not None:
        (out / f"{name}.md").write_text(report)
    return raw
