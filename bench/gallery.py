"""Gallery scaling: exact vs HNSW vs IVF (the project's `training.index.build_index`) at 5k, 60k and 1M.

Per index: build time (2 threads, offline), index size (serialized bytes) and the RSS delta of
building it, recall@1 against exact search (same definition as `training.index.recall_at_1`: share
of queries whose top hit is exact search's top hit), and search latency with 1 thread (what one
TorchServe worker has) at batch 1 (per query) and batch 64 (per batch).

The 1M gallery is synthetic: jittered copies of the real gallery embeddings, re-normalised. The
jitter has the length of the real gallery's median nearest-neighbour distance, so the copies fill
the space between real neighbours (a denser gallery of the same classes) instead of stacking as
near-duplicates. Queries are real held-out embeddings. Search-time knobs (HNSW efSearch, IVF
nprobe) are swept on the largest gallery to find the cheapest setting that meets the target; a
setting meets the recall target only if recall@1 minus two standard errors (over the queries) does,
so a lucky draw of queries cannot pick a setting that sits right at the edge.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import psutil

from training import index as project_index

from .stats import summarize

Log = Callable[[str], None]
KINDS = ("flat", "hnsw", "ivf")
TARGET_LATENCY_MS = 1.0
TARGET_RECALL = 0.98
APPROX_MIN_SAVING_MS = 0.1
SWEEPS = {"hnsw": ("efSearch", (16, 32, 64, 128, 256, 512)), "ivf": ("nprobe", (4, 8, 16, 32, 64, 128))}
MB = 1e6


@dataclass
class GallerySet:
    name: str
    description: str
    vectors: np.ndarray
    queries: np.ndarray


def normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def nn_distance(gallery: np.ndarray, sample: int = 2000, seed: int = 0) -> float:
    """Median distance from a gallery vector to its nearest other gallery vector."""
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(gallery), min(sample, len(gallery)), replace=False)
    index = faiss.IndexFlatL2(gallery.shape[1])
    index.add(gallery)
    squared, _ = index.search(gallery[pick], 2)
    return float(np.median(np.sqrt(np.maximum(squared[:, 1], 0.0))))


def synthetic(gallery: np.ndarray, size: int, seed: int = 0, chunk: int = 200_000) -> tuple[np.ndarray, float]:
    """`size` jittered copies of real gallery vectors, re-normalised; returns them and the jitter length."""
    rng = np.random.default_rng(seed)
    jitter = nn_distance(gallery, seed=seed)
    sigma = jitter / np.sqrt(gallery.shape[1])
    out = np.empty((size, gallery.shape[1]), dtype=np.float32)
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        base = gallery[np.arange(lo, hi) % len(gallery)]
        out[lo:hi] = normalise(base + rng.standard_normal(base.shape, dtype=np.float32) * np.float32(sigma))
    return out, jitter


def _rss() -> float:
    return psutil.Process().memory_info().rss / MB


def _top1(index: faiss.Index, queries: np.ndarray) -> np.ndarray:
    return index.search(queries, 1)[1][:, 0]


def latency_b1(index: faiss.Index, queries: np.ndarray, trials: int, max_queries: int, budget_s: float) -> dict:
    """Per-query milliseconds at batch 1: the median of each trial's queries, summarised over trials."""
    medians = []
    for trial in range(trials):
        times = []
        began = time.perf_counter()
        for i in range(max_queries):
            q = queries[(trial * max_queries + i) % len(queries)][None]
            started = time.perf_counter()
            index.search(q, 5)
            times.append(time.perf_counter() - started)
            if time.perf_counter() - began > budget_s and len(times) >= 5:
                break
        medians.append(1e3 * float(np.median(times)))
    return summarize(medians)


def latency_batch(index: faiss.Index, queries: np.ndarray, batch: int, trials: int, reps: int,
                  budget_s: float) -> dict:
    """Milliseconds per batch of `batch` queries: per-trial medians over `reps` batches."""
    medians = []
    for trial in range(trials):
        times = []
        began = time.perf_counter()
        for r in range(reps):
            lo = ((trial * reps + r) * batch) % max(1, len(queries) - batch)
            started = time.perf_counter()
            index.search(queries[lo:lo + batch], 5)
            times.append(time.perf_counter() - started)
            if time.perf_counter() - began > budget_s and len(times) >= 2:
                break
        medians.append(1e3 * float(np.median(times)))
    return summarize(medians)


def _set_param(index: faiss.Index, name: str, value: int) -> None:
    faiss.ParameterSpace().set_index_parameter(index, name, value)


def run(sets: Sequence[GallerySet], trials: int, build_threads: int, max_queries: int, budget_s: float,
        log: Log = print) -> dict[str, Any]:
    """Rows per (gallery, index) with the project's current parameters, plus sweeps on the largest gallery."""
    rows, sweeps = [], []
    largest = max(sets, key=lambda s: len(s.vectors)).name
    for gs in sets:
        faiss.omp_set_num_threads(build_threads)
        exact = faiss.IndexFlatL2(gs.vectors.shape[1])
        exact.add(gs.vectors)
        truth = _top1(exact, gs.queries)
        del exact
        for kind in KINDS:
            faiss.omp_set_num_threads(build_threads)
            rss0 = _rss()
            started = time.perf_counter()
            index = project_index.build_index(gs.vectors, kind)
            build_s = time.perf_counter() - started
            rss_delta = _rss() - rss0
            size_mb = faiss.serialize_index(index).nbytes / MB
            recall = float((_top1(index, gs.queries) == truth).mean())
            faiss.omp_set_num_threads(1)
            b1 = latency_b1(index, gs.queries, trials, max_queries, budget_s)
            b64 = latency_batch(index, gs.queries, 64, trials, 10, budget_s)
            params = {"flat": {}, "hnsw": {"M": project_index.HNSW_M, "efConstruction": project_index.HNSW_EF_CONSTRUCTION},
                      "ivf": {"nlist": int(getattr(index, "nlist", 0))}}[kind] | project_index.default_search_params(kind)
            row = {"gallery": gs.name, "size": len(gs.vectors), "queries": len(gs.queries), "index": kind,
                   "params": params,
                   "build_s": build_s, "index_mb": size_mb, "rss_delta_mb": rss_delta, "recall_at_1": recall,
                   "latency_b1_ms": b1, "latency_b64_ms": b64,
                   "meets_target": _meets(recall, len(gs.queries), b1)}
            rows.append(row)
            log(f"  gallery {gs.name:<18s} {kind:<5s} build {build_s:7.2f} s  {size_mb:7.1f} MB  recall@1 {recall:.4f}  "
                f"b1 {b1['median']:.3f} ms  b64 {b64['median']:.2f} ms")
            if gs.name == largest and kind in SWEEPS:
                name, values = SWEEPS[kind]
                for value in values:
                    _set_param(index, name, value)
                    faiss.omp_set_num_threads(build_threads)
                    recall_v = float((_top1(index, gs.queries) == truth).mean())
                    faiss.omp_set_num_threads(1)
                    lat = latency_b1(index, gs.queries, trials, max_queries, budget_s)
                    sweeps.append({"gallery": gs.name, "queries": len(gs.queries), "index": kind, "param": name,
                                   "value": value, "build_params": params, "recall_at_1": recall_v,
                                   "latency_b1_ms": lat, "meets_target": _meets(recall_v, len(gs.queries), lat)})
                    log(f"    sweep {kind} {name}={value:<4d} recall@1 {recall_v:.4f}  b1 {lat['median']:.3f} ms")
            del index
    return {"rows": rows, "sweeps": sweeps, "recommendation": recommend(rows, sweeps),
            "target": {"latency_b1_ms": TARGET_LATENCY_MS, "recall_at_1": TARGET_RECALL}}


def recall_lower_bound(recall: float, queries: int) -> float:
    """recall@1 minus two standard errors over the queries: a setting must clear the target by the noise."""
    return recall - 2.0 * math.sqrt(max(recall * (1.0 - recall), 0.0) / max(queries, 1))


def _meets(recall: float, queries: int, latency: dict) -> bool:
    return (recall_lower_bound(recall, queries) >= TARGET_RECALL and latency["median"] is not None
            and latency["median"] <= TARGET_LATENCY_MS)


def _default_for(rows: list[dict]) -> dict | None:
    """Exact search unless an approximate index with recall@1 >= target is both >= 2x faster at batch 1 and
    saves >= APPROX_MIN_SAVING_MS per query (about a tenth of one image's forward pass)."""
    flat = next((r for r in rows if r["index"] == "flat"), None)
    ok = [r for r in rows if r["index"] != "flat" and r["recall_at_1"] >= TARGET_RECALL]
    fastest = min(ok, key=lambda r: r["latency_b1_ms"]["median"]) if ok else None
    if flat is None or fastest is None:
        return flat or fastest
    exact_ms, approx_ms = flat["latency_b1_ms"]["median"], fastest["latency_b1_ms"]["median"]
    worth_it = approx_ms * 2 <= exact_ms and exact_ms - approx_ms >= APPROX_MIN_SAVING_MS
    return fastest if worth_it else flat


def recommend(rows: list[dict], sweeps: list[dict]) -> dict[str, Any]:
    """Per gallery: the default index by `_default_for`; on the largest gallery, the tuned knobs too."""
    out: dict[str, Any] = {"per_gallery": {}, "rule": (
        f"exact unless an approximate index with recall@1 >= {TARGET_RECALL} is >= 2x faster at batch 1 and saves "
        f">= {APPROX_MIN_SAVING_MS} ms per query")}
    for name in dict.fromkeys(r["gallery"] for r in rows):
        best = _default_for([r for r in rows if r["gallery"] == name])
        out["per_gallery"][name] = {"index": best["index"], "params": best["params"],
                                    "latency_b1_ms": best["latency_b1_ms"]["median"],
                                    "recall_at_1": best["recall_at_1"]} if best else None
    if rows:
        largest = max(rows, key=lambda r: r["size"])["gallery"]
        current = {r["index"]: r["meets_target"] for r in rows
                   if r["gallery"] == largest and r["index"] != "flat"}
        tuned: dict[str, dict | None] = {}
        for kind in SWEEPS:
            passing = [s for s in sweeps if s["index"] == kind and s["meets_target"]]
            if passing:
                pick = min(passing, key=lambda s: s["latency_b1_ms"]["median"])
                tuned[kind] = {**pick["build_params"], pick["param"]: pick["value"],
                               "recall_at_1": pick["recall_at_1"], "latency_b1_ms": pick["latency_b1_ms"]["median"]}
            else:
                tuned[kind] = None
        out["largest"] = {"gallery": largest, "current_params_meet_target": current, "tuned": tuned}
    return out
