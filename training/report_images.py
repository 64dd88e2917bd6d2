"""`python -m training report ARTIFACTS --images DIR`: the report page for the user's own images.

Every image file of DIR (and of its ``<label>/`` folders) is answered as the server answers its bytes
(handler.service.EmbeddingService.prepare and predict: the recorded preprocessing, the several-digits and no-ink
rules, the k-NN vote, the open-set threshold, the enrolled-class switch). The page shows, per image, the canvas the
model received, the answer and its score, and the k nearest gallery images; with ``<label>/`` folders also the
confusion matrix of the served answers against those labels and the accuracy. A file the server would refuse is
listed with the server's message. The page is made of training/report_page.py's parts, like the held-out report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .data import DataError
from .data.folder import is_image_name, is_label_name
from .report import Gallery, ReportError, gallery_notes, load_held_out, model_facts, recorded_source
from .report_page import Case, cases_section, confusion_table, escape, facts_table, page

if TYPE_CHECKING:
    from handler.answer import Answer
    from handler.service import EmbeddingService

#: Images answered per forward pass (the client's batch size).
BATCH = 64
#: Cases drawn on the page (about 4 KB each); the figures count every image.
MAX_SHOWN = 500
UNKNOWN = "unknown"


@dataclass
class ImagesAnalysis:
    """The user's images as served: one Case per answered image (position: its row in ``canvases``), the files the
    server refuses, and, for labelled images, the confusion matrix of served answers against the folder labels."""

    root: Path
    threshold: float
    canvases: np.ndarray
    cases: list[Case]
    refused: list[tuple[str, str]]
    rows: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @property
    def labelled(self) -> list[Case]:
        return [case for case in self.cases if case.truth is not None]

    def accuracy(self, vote: bool = False) -> float:
        """Share of labelled images answered with their folder's label (unknown is wrong); ``vote``: the k-NN
        vote's label instead, whether or not the answer was unknown."""
        cases = self.labelled
        return float(np.mean([(c.vote if vote else c.pred) == c.truth for c in cases])) if cases else 0.0


def list_images(root: Path) -> list[tuple[Path, str | None]]:
    """(file, label) of every image in `root` (label None) and in its ``<label>/`` folders, in name order."""
    if not root.is_dir():
        raise ReportError(f"--images {root}: not a folder")
    found: list[tuple[Path, str | None]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_file() and is_image_name(entry.name):
            found.append((entry, None))
    for folder in sorted(d for d in root.iterdir() if d.is_dir() and is_label_name(d.name)):
        found += [(p, folder.name) for p in sorted(folder.iterdir()) if p.is_file() and is_image_name(p.name)]
    if not found:
        raise ReportError(f"--images {root}: no images (png, jpg, ...) in it or in its <label>/ folders")
    return found


def _canvas(tensor: np.ndarray, service: "EmbeddingService") -> np.ndarray:
    """The uint8 canvas behind a model input (the inverse of Profile.normalize, exact for 8-bit canvases)."""
    profile = service.profile
    return np.clip(np.rint((tensor[0].astype(np.float64) * profile.std + profile.mean) * 255), 0, 255).astype(np.uint8)


def _case(position: int, name: str, label: str | None, answer: "Answer", score: float) -> Case:
    return Case(position, label, UNKNOWN if answer.unknown else str(answer.pred), float(answer.confidence), score,
                bool(answer.unknown), [(int(n.id), n.label, float(n.dist)) for n in answer.neighbours],
                title=name, reason=answer.reason, vote=answer.nearest_label)


def _read(root: Path, files: Sequence[tuple[Path, str | None]], refused: list[tuple[str, str]]
          ) -> list[tuple[str, str | None, bytes]]:
    """(name, label, bytes) of the files that can be read; the others go to `refused`."""
    readable = []
    for path, label in files:
        name = path.relative_to(root).as_posix()
        try:
            readable.append((name, label, path.read_bytes()))
        except OSError as exc:
            refused.append((name, exc.strerror or str(exc)))
    return readable


def answer_images(service: "EmbeddingService", root: Path, files: Sequence[tuple[Path, str | None]]
                  ) -> tuple[np.ndarray, list[Case], list[tuple[str, str]]]:
    """Each file's bytes answered as served, BATCH at a time: canvases, cases and (name, message) of refusals."""
    canvases: list[np.ndarray] = []
    cases: list[Case] = []
    refused: list[tuple[str, str]] = []
    for start in range(0, len(files), BATCH):
        readable = _read(root, files[start : start + BATCH], refused)
        prepared = service.prepare([data for _, _, data in readable])
        tensors = dict(zip(prepared.good, prepared.tensors))
        answers, _ = service.predict(prepared, embedding=[True] * len(readable))
        good = [i for i in range(len(readable)) if i in tensors]
        embeddings = np.asarray([answers[i].embedding for i in good], np.float32).reshape(len(good), -1)
        scores = service.searcher.scores(embeddings) if good else []
        for i, (name, label, _) in enumerate(readable):
            if i not in tensors:
                refused.append((name, str(answers[i].error)))
        for i, score in zip(good, scores):
            name, label, _ = readable[i]
            cases.append(_case(len(canvases), name, label, answers[i], float(score)))
            canvases.append(_canvas(tensors[i], service))
    return np.asarray(canvases, np.uint8).reshape(-1, 28, 28), cases, refused


def analyse_images(service: "EmbeddingService", root: Path) -> ImagesAnalysis:
    """Answer every image of `root`; labelled ones also fill the confusion matrix (rows: folder labels; columns:
    the gallery's classes, then unknown)."""
    if service.searcher.threshold is None:
        raise ReportError("metadata.json records no open-set threshold")
    canvases, cases, refused = answer_images(service, root, list_images(root))
    analysis = ImagesAnalysis(root, float(service.searcher.threshold), canvases, cases, refused)
    labelled = analysis.labelled
    if labelled:
        analysis.rows = list(dict.fromkeys(c.truth for c in labelled))  # type: ignore[misc]
        analysis.columns = [*sorted({str(label) for label in service.searcher.labels}), UNKNOWN]
        analysis.matrix = np.zeros((len(analysis.rows), len(analysis.columns)), np.int64)
        for case in labelled:
            analysis.matrix[analysis.rows.index(case.truth), analysis.columns.index(case.pred)] += 1
    return analysis


def shown_cases(analysis: ImagesAnalysis) -> list[Case]:
    """Labelled images: wrong answers first (most confident first), then unknown ones, then right ones; unlabelled
    images in name order after them. At most MAX_SHOWN."""
    def order(case: Case) -> tuple:
        if case.truth is None:
            return (3, 0.0)
        right = case.pred == case.truth
        return (2 if right else 1 if case.unknown else 0, -case.confidence)

    return sorted(analysis.cases, key=order)[:MAX_SHOWN]


def _facts(analysis: ImagesAnalysis, service: "EmbeddingService", artifacts: Path, source: str, command: str,
           made: str) -> list[tuple[str, object]]:
    cases, labelled = analysis.cases, analysis.labelled
    facts = model_facts(service, artifacts, analysis.threshold)
    facts += [("images", f"{analysis.root}: {len(cases) + len(analysis.refused)} image files, {len(labelled)} in "
                         f"<label>/ folders"),
              ("gallery images drawn from", source)]
    if labelled:
        facts.append(("accuracy against the folder labels",
                      f"{analysis.accuracy():.4f} of {len(labelled)} labelled images (an unknown answer counts as "
                      f"wrong); k-NN vote, unknown or not: {analysis.accuracy(vote=True):.4f}"))
    facts += [("answered unknown", f"{sum(c.unknown for c in cases)} of {len(cases)} answered images"),
              ("refused", f"{len(analysis.refused)} file(s) the server would refuse"),
              ("report made", f"{made} by {command}")]
    return facts


def _confusion(analysis: ImagesAnalysis) -> str:
    if not analysis.rows:
        return ('<p class="note">No <code>&lt;label&gt;/</code> folders, so no labels to score against: put images in '
                "DIR/&lt;label&gt;/ for a confusion matrix and the accuracy.</p>")
    diag = [analysis.matrix[i, analysis.columns.index(r)] if r in analysis.columns else 0
            for i, r in enumerate(analysis.rows)]
    recall = [d / max(int(analysis.matrix[i].sum()), 1) for i, d in enumerate(diag)]
    return "<h2>Confusion matrix (your labels)</h2>" + confusion_table(
        analysis.rows, analysis.columns, analysis.matrix, recall, None, corner="folder \\ answered",
        note="Rows: the label folder; columns: the answer the server gives (unknown: flagged by the open-set "
             "threshold, no ink, or several digits).")


def render_images(analysis: ImagesAnalysis, service: "EmbeddingService", gallery: Gallery, artifacts: Path,
                  source: str, command: str) -> str:
    """The page for the user's images."""
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    shown = shown_cases(analysis)
    refused = "".join(f"<li><code>{escape(name)}</code>: {escape(message)}</li>" for name, message in analysis.refused)
    return page(f"What the model answers for {analysis.root.name or analysis.root}", [
        facts_table(_facts(analysis, service, artifacts, source, command, made)),
        _confusion(analysis),
        gallery_notes(gallery, service),
        cases_section("images", "Your images", "Each image as the model received it (the canvas after the served "
                      "preprocessing), the answer and its open-set score; labelled images wrong first, then unknown, "
                      "then right. Right: the k nearest gallery images (green: the folder's label, else the answer) "
                      "and distances.", shown, len(analysis.cases), analysis.canvases, analysis.threshold, gallery,
                      answered="answered"),
        (f'<h2>Files the server refuses</h2><ul id="refused" class="note">{refused}</ul>' if refused else ""),
    ])


def build_images_report(artifacts: Path, images: Path, data_source: str | None = None, command: str = "",
                        cache_dir: Path | None = None, log: Callable[[str], None] = lambda _: None) -> str:
    """The HTML page for the images of `images` answered by `artifacts` (verified and loaded as served); the
    gallery's images are drawn from the training source (as the held-out report does), else only named."""
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(Path(artifacts))
    analysis = analyse_images(service, Path(images))
    source = data_source or recorded_source(service.metadata)
    try:
        gallery = Gallery(service, load_held_out(service, source, cache_dir))
    except (DataError, ReportError) as exc:
        log(f"gallery images not drawn: {exc}")
        gallery = Gallery(service, None, f"gallery images not drawn: {exc}")
    return render_images(analysis, service, gallery, Path(artifacts), source,
                         command or "python -m training report --images")
