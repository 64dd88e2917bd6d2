"""Summarise the served A/B (ab.sh): per artifact set, the median over its rounds of each figure, and C/Q, C/F
ratios of the per-pair medians (rounds paired in order: Q C F F C Q -> pairs (1,2,3) and (6,5,4))."""
import json, os, statistics, sys
from pathlib import Path
AB = Path(os.environ.get("AB_WORK", "/tmp/quant")) / "ab"
rounds = sorted((p for p in AB.iterdir() if p.is_dir()), key=lambda p: int(p.name.split("-")[0]))
fig = {}
for r in rounds:
    name = r.name.split("-")[1]
    s = json.loads((r / "results.summary.json").read_text())
    row = {}
    for c in s["ceiling"]["rows"]:
        if c.get("layout", c.get("label", "")).startswith("2x1") or c.get("processes") == 2:
            row[f"ceiling b{c['batch']}"] = c["images_per_s"]["median"]
    for ts in s["torchserve"]:
        if ts.get("name", ts.get("config")) != "shipped":
            continue
        for run in ts["runs"]:
            c = run["concurrency"]
            row[f"torchserve c={c} req/s"] = run["throughput"]["median"]
            row[f"torchserve c={c} p99"] = run["p99_ms"]["median"]
            row[f"torchserve c={c} p50"] = run["p50_ms"]["median"]
    for peer in s["peers"]:
        for run in peer["runs"]:
            c = run["concurrency"]
            row[f"python c={c} req/s"] = run["throughput"]["median"]
            row[f"python c={c} p99"] = run["p99_ms"]["median"]
            row[f"python c={c} p50"] = run["p50_ms"]["median"]
    row["load"] = s["load_average"]
    fig.setdefault(name, []).append(row)
keys = [k for k in fig["C"][0] if k != "load"]
print(f"{'figure':28s}" + "".join(f"{n:>18s}" for n in "FQC") + "   C/Q   C/F")
for k in keys:
    med = {n: statistics.median(r[k] for r in fig[n]) for n in "FQC"}
    print(f"{k:28s}" + "".join(f"{med[n]:10.1f} ({'/'.join(f'{r[k]:.0f}' for r in fig[n])})".rjust(18) for n in "FQC")
          + f"  {med['C'] / med['Q']:.2f}  {med['C'] / med['F']:.2f}")
print({n: [r["load"] for r in fig[n]] for n in "FQC"})
