"""`python -m training report`: one self-contained HTML page that shows what built artifacts do on their
held-out split: the confusion matrix, the worst errors and the rejected digits (each with its k nearest gallery
images) and the open-set score histogram with the threshold.

Every answer comes from the served code path (handler.service.EmbeddingService: its profile, model and
searcher) over the held-out split of the data source the artifacts were trained on, as
training.evaluate.evaluate_open_set measures it. Images are inline PNG data: URIs and the page runs no script;
its Content-Security-Policy allows nothing else to load.

Gallery item i of a build is training image i of its source (training.steps.build_gallery); the report checks
that against labels.json and sources.json before it shows a training image as a neighbour. Items that
``training enroll`` appended after them came from a folder the artifacts do not keep: they are named (their
sources.json file) but not drawn.
"""

from __future__ import annotations

import base64
import io
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from settings import DEFAULT_DATA_SOURCE

from .evaluate import FASHION_DIR, evaluate, load_ood_set, open_set_scores
from .report_page import (NEIGHBOUR_SCALE, Case, cases_section, confusion_table, escape, facts_table, number, page,
                          png_data_uri)

if TYPE_CHECKING:
    from handler.metadata import ModelMetadata
    from handler.service import EmbeddingService

    from .data import Dataset

#: Cases shown per section (worst errors, rejected digits): enough to see a pattern, small enough to read.
MAX_CASES = 24
#: Unknown sets drawn in the histogram by default (training.evaluate.OOD_SETS); a missing one is noted, not fatal.
DEFAULT_OOD = ("fashion", "synthetic")
#: Images per unknown set in the histogram: the first N of each.
DEFAULT_OOD_IMAGES = 1000
CONFUSION_NOTE = ("Rows: the true class; columns: the k-NN vote, whether or not the answer was flagged unknown (as "
                  "the recorded accuracy counts it). unknown: images of that class the open-set threshold answered as "
                  "unknown.")


class ReportError(Exception):
    """The report cannot be made from these inputs; the message is one line."""


def recorded_source(metadata: ModelMetadata) -> str:
    """The data source to take the held-out split from: the one metadata.json records (``dataset.source``, or
    the calibration source enrollment recorded), else settings.DEFAULT_DATA_SOURCE."""
    for value in (metadata.dataset.get("source"), (metadata.open_set.get("calibration") or {}).get("source")):
        if isinstance(value, str) and value:
            return value
    return DEFAULT_DATA_SOURCE


class Gallery:
    """The canvases behind gallery ids: item i < len(training images) is the source's training image i,
    prepared as training prepared it, once labels.json (and sources.json when both sides name sources) agree;
    later items were enrolled from a folder the artifacts do not keep."""

    def __init__(self, service: "EmbeddingService", dataset: "Dataset | None", problem: str | None = None) -> None:
        """`dataset` None (the training source could not be loaded, `problem` says why): items are named only."""
        self.profile = service.profile
        self.sources = service.sources
        self.problem = problem
        if dataset is None:
            self.images = np.zeros((0, 28, 28), np.uint8)
            self.trained = int(service.metadata.dataset.get("train", service.searcher.index.ntotal))
            self.drawable, self._cache = 0, {}
            return
        self.images = dataset.train_images
        labels = [str(label) for label in service.searcher.labels]
        n = self.trained = len(dataset.train_images)
        expected = [dataset.classes[int(y)] for y in dataset.train_labels]
        if n > len(labels) or labels[:n] != expected:
            self.problem = (f"the gallery's labels are not those of {dataset.name}'s {n} training images in order, "
                            "so no gallery image can be drawn")
        elif self.sources is not None and dataset.train_sources is not None:
            kind, ids = self.sources
            own = dataset.train_sources.tolist()
            if kind == "file" and dataset.source_kind == "dataset_index":  # enroll rewrote dataset indexes
                own = [f"{dataset.name}#{s}" for s in own]
            if list(ids[:n]) != own:
                self.problem = (f"sources.json does not name {dataset.name}'s training images in order, so no "
                                "gallery image can be drawn")
        self.drawable = 0 if self.problem else n
        self._cache: dict[int, str] = {}

    def uri(self, item: int) -> str | None:
        """PNG data: URI of gallery item `item`, None where it cannot be drawn."""
        if not 0 <= item < self.drawable:
            return None
        if item not in self._cache:
            canvas = self.profile.canvases_from_arrays(self.images[item : item + 1])[0]
            self._cache[item] = png_data_uri(canvas, NEIGHBOUR_SCALE)
        return self._cache[item]

    def name(self, item: int) -> str:
        """What a gallery item that cannot be drawn is: its sources.json id, or why not."""
        if self.sources is not None and 0 <= item < len(self.sources[1]):
            return f"{'enrolled' if item >= self.trained else 'gallery'}: {self.sources[1][item]}"
        return "enrolled image" if item >= self.trained else "gallery image"


@dataclass
class Analysis:
    """The held-out split as served: figures and the cases the page shows."""

    classes: list[str]
    matrix: np.ndarray
    recall: list[float]
    unknown_per_class: list[int]
    accuracy: float
    scores: np.ndarray
    threshold: float
    canvases: np.ndarray
    errors: list[Case]
    n_errors: int
    rejected: list[Case]
    n_rejected: int
    unknown_sets: dict[str, np.ndarray] = field(default_factory=dict)
    unknown_notes: list[str] = field(default_factory=list)


def _case(searcher, position: int, truth: str, distances, ids, score: float, blank: bool,
          switch_to: str | None = None) -> Case:
    answer = searcher.answer(distances, ids, score, switch_to)
    neighbours = [(int(i), str(searcher.labels[i]), float(d)) for i, d in zip(ids, distances) if i >= 0]
    return Case(position, truth, str(answer.nearest_label), float(answer.confidence), float(score),
                bool(answer.unknown or blank), neighbours)


def analyse(service: "EmbeddingService", dataset: "Dataset", ood: Sequence[str] = DEFAULT_OOD,
            fashion_dir: Path = FASHION_DIR, n_ood: int = DEFAULT_OOD_IMAGES, max_cases: int = MAX_CASES) -> Analysis:
    """Answer every held-out image as served (the same canvases, model, search and blank rule as
    evaluate_open_set), and pick the worst errors and the rejected digits."""
    from handler.preprocessing import is_blank

    searcher = service.searcher
    if searcher.threshold is None:
        raise ReportError("metadata.json records no open-set threshold")
    classes = [str(c) for c in dataset.classes]
    canvases = service.profile.canvases_from_arrays(dataset.test_images)
    tensors = service.profile.normalize(canvases)
    embeddings = service.embed(tensors)
    figures = evaluate(searcher, embeddings, dataset.test_labels, classes)
    matrix = np.asarray(figures["confusion_matrix"], dtype=np.int64)
    distances, ids, raw_scores = searcher.search(embeddings)
    blank = np.array([is_blank(t) for t in tensors], dtype=bool)
    scores = np.where(blank, np.inf, raw_scores)
    truth = [classes[int(y)] for y in dataset.test_labels]
    switched = searcher.switched(embeddings) or [None] * len(truth)  # enrolled galleries answer as served
    cases = [_case(searcher, i, truth[i], distances[i], ids[i], scores[i], blank[i], switched[i])
             for i in range(len(truth))]
    wrong = [c for c in cases if c.pred != c.truth]
    # Worst first: wrong answers that were served (accepted) before those flagged unknown, most confident first.
    wrong.sort(key=lambda c: (c.unknown, -c.confidence, c.neighbours[0][2] if c.neighbours else np.inf))
    rejected = sorted((c for c in cases if c.unknown), key=lambda c: -c.score)
    unknown_per_class = [sum(c.unknown for c in cases if c.truth == name) for name in classes]
    analysis = Analysis(classes, matrix, [figures["per_class"][name]["recall"] for name in classes],
                        unknown_per_class, figures["accuracy"], scores, float(searcher.threshold), canvases,
                        wrong[:max_cases], len(wrong), rejected[:max_cases], len(rejected))
    for name in ood:
        try:
            images = load_ood_set(name, fashion_dir, n_ood)[:n_ood]
        except ValueError as exc:
            analysis.unknown_notes.append(f"{name}: not drawn ({exc})")
            continue
        analysis.unknown_sets[name] = open_set_scores(service, images)
    return analysis


def histogram_png(analysis: Analysis, score_name: str) -> str:
    """The open-set score of held-out digits and of each unknown set, with the threshold, as a PNG data: URI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = analysis.threshold
    sets = {"held-out digits": analysis.scores, **analysis.unknown_sets}
    finite = np.concatenate([s[np.isfinite(s)] for s in sets.values()])
    edges = np.histogram_bin_edges(np.append(finite, t), bins=60)
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for i, (name, values) in enumerate(sets.items()):
        shown = values[np.isfinite(values)]
        if not shown.size:
            continue
        share = np.mean(values > t)
        what = f"{1 - share:.1%} accepted" if i == 0 else f"{share:.1%} flagged unknown"
        ax.hist(shown, bins=edges, density=True, alpha=0.55 if i == 0 else 1.0, histtype="stepfilled" if i == 0
                else "step", linewidth=1.5, label=f"{name} (n={len(values)}, {what})")
    ax.axvline(t, color="red", linestyle="--", linewidth=1.5, label=f"threshold {t:.4f}")
    ax.set_xlabel(f"open-set score ({score_name}); above the threshold the answer is unknown")
    ax.set_ylabel("density")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def model_facts(service: "EmbeddingService", artifacts: Path, threshold: float) -> list[tuple[str, object]]:
    """The facts rows about the model itself, from metadata.json and the loaded searcher."""
    metadata, searcher = service.metadata, service.searcher
    dataset, index, enrolled = metadata.dataset, metadata.index, metadata.enrollment
    return [
        ("artifacts", f"{artifacts} (built {metadata.created or 'unknown'})"),
        ("dataset", f"{dataset.get('name', '?')}: {dataset.get('train', '?')} train / {dataset.get('test', '?')} "
                    f"held-out images, classes {', '.join(map(str, dataset.get('classes', [])))}"),
        ("preprocessing", f"{service.profile.name} version {metadata.preprocessing.get('version', service.profile.version)}"),
        ("gallery", f"{searcher.index.ntotal} images, {index.get('type', '?')} index, {searcher.dim}-d embeddings"
                    + (f", {sum(sum(e.get('added', {}).values()) for e in enrolled)} enrolled in {len(enrolled)} "
                       "enrollment(s)" if enrolled else "")),
        ("k", searcher.k),
        ("open-set score", searcher.score + (f" (kth {searcher.kth})" if searcher.score == "kth_distance" else "")),
        ("threshold", number(threshold)),
    ]


def gallery_notes(gallery: Gallery, service: "EmbeddingService") -> str:
    """Why some neighbours are not drawn, when they are not."""
    if gallery.problem:
        return f'<p class="note">{escape(gallery.problem)}.</p>'
    if gallery.drawable and service.searcher.index.ntotal > gallery.drawable:
        return ('<p class="note">Neighbours in grey boxes were enrolled (training enroll) from a folder the artifacts '
                "do not keep: named, not drawn.</p>")
    return ""


def render(analysis: Analysis, service: "EmbeddingService", gallery: Gallery, artifacts: Path, source: str,
           command: str, made: str | None = None) -> str:
    """The whole page, every text escaped, every image inline."""
    metadata = service.metadata
    made = made or datetime.now(timezone.utc).isoformat(timespec="seconds")
    name = metadata.dataset_name or "model"
    recorded = metadata.metrics.accuracy
    facts = model_facts(service, artifacts, analysis.threshold)
    facts[2:2] = [("held-out split from", source)]
    facts += [("accuracy (held-out k-NN vote)", f"{analysis.accuracy:.4f} of {int(analysis.matrix.sum())} images"
               + (f"; metadata.json records {number(recorded)}" if recorded is not None else "")),
              ("answered unknown", f"{analysis.n_rejected} of {len(analysis.scores)} held-out images"),
              ("report made", f"{made} by {command}")]
    notes = "".join(f"<li>{escape(n)}</li>" for n in analysis.unknown_notes)
    blank = int(np.sum(~np.isfinite(analysis.scores)))
    canvases, threshold = analysis.canvases, analysis.threshold
    return page(f"What the {name} model does on its held-out split", [
        facts_table(facts),
        "<h2>Confusion matrix (held-out)</h2>",
        confusion_table(analysis.classes, analysis.classes, analysis.matrix, analysis.recall,
                        analysis.unknown_per_class, CONFUSION_NOTE),
        "<h2>Open-set score</h2>",
        f'<img id="histogram" src="{histogram_png(analysis, service.searcher.score)}" alt="open-set score histogram">',
        f'<p class="note">{blank} blank held-out image(s) score +inf (always unknown) and are not drawn.</p>'
        if blank else "",
        f'<ul class="note">{notes}</ul>' if notes else "",
        gallery_notes(gallery, service),
        cases_section("errors", "Worst errors", "Held-out images the k-NN vote got wrong: those served as an answer "
                      "first, then those flagged unknown; most confident first. Right: the k nearest gallery images "
                      "(green: the true class) and distances.", analysis.errors, analysis.n_errors, canvases,
                      threshold, gallery),
        cases_section("rejected", "Rejected held-out images", "Held-out images answered unknown at the threshold, "
                      "highest score first, with their k nearest gallery images.", analysis.rejected,
                      analysis.n_rejected, canvases, threshold, gallery),
    ])


def load_held_out(service: "EmbeddingService", source: str, cache_dir: Path | None = None) -> "Dataset":
    """The source's dataset, refused (ReportError) unless its classes and held-out size are the trained ones."""
    from .data import load_dataset

    dataset = load_dataset(source, cache_dir, profile=service.profile.name)
    trained = service.metadata.dataset
    classes = [str(c) for c in dataset.classes]
    if classes != [str(c) for c in trained.get("classes", classes)] or len(dataset.test_images) != trained.get(
            "test", len(dataset.test_images)):
        raise ReportError(f"{source}: {len(dataset.test_images)} held-out images of classes {', '.join(classes)}, "
                          f"but the artifacts were trained on {trained.get('name', '?')!r} with {trained.get('test')} "
                          "held-out images: pass --data-source with the training source")
    return dataset


def build_report(artifacts: Path, data_source: str | None = None, ood: Sequence[str] = DEFAULT_OOD,
                 fashion_dir: Path = FASHION_DIR, n_ood: int = DEFAULT_OOD_IMAGES, command: str = "",
                 cache_dir: Path | None = None, log: Callable[[str], None] = lambda _: None) -> str:
    """The HTML page for `artifacts` (verified and loaded as served)."""
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(Path(artifacts))
    source = data_source or recorded_source(service.metadata)
    dataset = load_held_out(service, source, cache_dir)
    analysis = analyse(service, dataset, ood, fashion_dir, n_ood)
    for note in analysis.unknown_notes:
        log(note)
    return render(analysis, service, Gallery(service, dataset), Path(artifacts), source,
                  command or "python -m training report")


def write_atomically(text: str, out: Path) -> None:
    """`text` to `out` through a temporary file beside it and one rename: `out` is the old file or the new one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)  # mkstemp's 0600 would hide the page from other readers
        os.replace(name, out)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
