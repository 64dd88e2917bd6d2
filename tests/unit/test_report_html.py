"""python -m training report: one self-contained page whose figures are evaluate's, every text escaped, every
image an inline PNG of the canvas the model saw, and one error line for bad input."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from support.idx_fixtures import make_idx_dir
from support.image_tree import digit_folder

from handler.artifacts import METADATA_FILE
from handler.metadata import Metrics, ModelMetadata
from handler.service import EmbeddingService
from settings import DEFAULT_DATA_SOURCE
from training.__main__ import main as training_main
from training.data import Dataset, load_dataset
from training.evaluate import evaluate
from training.report import MAX_CASES, Gallery, recorded_source
from training.report_page import NEIGHBOUR_SCALE, PAGE_HEADER, QUERY_SCALE

HOSTILE_NAME = '<script>alert("x")</script>&amp;'


class Page(HTMLParser):
    """The parts of a report page the tests read: every element with its attributes, and the confusion table."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        if tag == "table":
            self._table = attributes.get("id")
        elif tag == "tr" and self._table == "confusion":
            self.rows.append([])
        elif tag in ("td", "th") and self._table == "confusion":
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def find(self, tag: str, **wanted: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in wanted.items())]


def png_pixels(uri: str) -> np.ndarray:
    assert uri.startswith("data:image/png;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1], validate=True)))
    assert image.format == "PNG"
    return np.asarray(image.convert("L"))


@pytest.fixture(scope="module")
def hostile_artifacts(tiny_artifacts, tmp_path_factory) -> Path:
    """tiny_artifacts whose metadata.json (not checksummed) names the dataset with markup."""
    copy = tmp_path_factory.mktemp("report-artifacts") / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    metadata = json.loads((copy / METADATA_FILE).read_text())
    metadata["dataset"]["name"] = HOSTILE_NAME
    (copy / METADATA_FILE).write_text(json.dumps(metadata))
    return copy


@pytest.fixture(scope="module")
def report(hostile_artifacts, tmp_path_factory):
    """The page for the tiny model, made with the default --out (./report.html) from another directory."""
    cwd = tmp_path_factory.mktemp("report-cwd")
    (cwd / "report.html").write_text(PAGE_HEADER + "an older report")  # a page of ours: replaced
    before = os.getcwd()
    os.chdir(cwd)
    try:
        rc = training_main(["report", str(hostile_artifacts), "--ood", "synthetic", "--ood-images", "100",
                            "--threads", "1"])
    finally:
        os.chdir(before)
    assert rc == 0
    text = (cwd / "report.html").read_text(encoding="utf-8")
    return SimpleNamespace(text=text, page=Page(text), folder=cwd)


@pytest.fixture(scope="module")
def served(tiny_artifacts):
    """What evaluate sees: the service, the held-out split and its embeddings."""
    service = EmbeddingService.from_dir(tiny_artifacts)
    dataset = load_dataset(DEFAULT_DATA_SOURCE, profile=service.profile.name)
    canvases = service.profile.canvases_from_arrays(dataset.test_images)
    embeddings = service.embed(service.profile.normalize(canvases))
    return SimpleNamespace(service=service, dataset=dataset, canvases=canvases, embeddings=embeddings)


def test_page_is_one_small_file_with_inline_pngs_and_no_script(report):
    assert len(report.text.encode()) < 1_000_000
    assert sorted(p.name for p in report.folder.iterdir()) == ["report.html"]  # replaced, no temporary left
    assert (report.folder / "report.html").stat().st_mode & 0o044  # readable by others, not mkstemp's 0600
    page = report.page
    assert not page.find("script") and not page.find("link") and not page.find("iframe")
    csp = page.find("meta", **{"http-equiv": "Content-Security-Policy"})
    assert csp and "default-src 'none'" in csp[0]["content"] and "img-src data:" in csp[0]["content"]
    images = page.find("img")
    assert images
    for attributes in images:
        pixels = png_pixels(attributes["src"])
        if attributes.get("class") == "q":
            assert pixels.shape == (28 * QUERY_SCALE,) * 2
        elif attributes.get("class") == "nb":
            assert pixels.shape == (28 * NEIGHBOUR_SCALE,) * 2
        else:
            assert attributes.get("id") == "histogram" and pixels.shape[1] > 300
    assert "http://" not in report.text and "https://" not in report.text


def test_text_is_escaped(report):
    assert "<script>" not in report.text
    assert html_escaped(HOSTILE_NAME) in report.text
    assert any(HOSTILE_NAME in chunk for chunk in report.page.text)  # shown to the reader as written


def html_escaped(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_confusion_table_holds_evaluates_counts_and_recall(report, served, tiny_artifacts):
    classes = list(served.dataset.classes)
    figures = evaluate(served.service.searcher, served.embeddings, served.dataset.test_labels, classes)
    header, *rows = report.page.rows
    assert header[1 : 1 + len(classes)] == classes and header[-3:] == ["n", "recall", "unknown"]
    assert [row[0] for row in rows] == classes
    table = np.array([[int(v) for v in row[1 : 1 + len(classes)]] for row in rows])
    assert table.tolist() == figures["confusion_matrix"]
    assert [int(row[-3]) for row in rows] == [figures["per_class"][c]["support"] for c in classes]
    assert [float(row[-2]) for row in rows] == pytest.approx(
        [figures["per_class"][c]["recall"] for c in classes], abs=5e-4)
    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())  # evaluate_and_finalize's figures
    assert np.trace(table) / table.sum() == pytest.approx(metadata["metrics"]["accuracy"])
    rejected = round(metadata["drift_baseline"]["unknown_rate"] * table.sum())  # scores above the threshold
    assert sum(int(row[-1]) for row in rows) == rejected
    sections = {s["id"]: s for s in report.page.find("section")}
    assert int(sections["errors"]["data-total"]) == table.sum() - np.trace(table)
    assert int(sections["rejected"]["data-total"]) == rejected
    for name in ("errors", "rejected"):
        assert int(sections[name]["data-cases"]) == min(MAX_CASES, int(sections[name]["data-total"]))


def test_each_case_shows_the_query_canvas_and_its_k_nearest_gallery_canvases(report, served):
    """The thumbnails are the canvases the model saw: the held-out image's, and training image i for gallery id i;
    their labels and distances are the searcher's."""
    searcher, dataset = served.service.searcher, served.dataset
    training = served.service.profile.canvases_from_arrays(dataset.train_images)
    distances, ids = searcher.neighbours(served.embeddings)
    elements = report.page.elements
    starts = [i for i, (tag, a) in enumerate(elements) if tag == "div" and a.get("class") == "case"]
    assert len(starts) == sum(int(s["data-cases"]) for s in report.page.find("section"))
    for start, end in zip(starts, [*starts[1:], len(elements)]):
        position = int(elements[start][1]["data-position"])
        inside = elements[start:end]
        queries = [a for t, a in inside if t == "img" and a.get("class") == "q"]
        assert len(queries) == 1
        assert np.array_equal(png_pixels(queries[0]["src"])[::QUERY_SCALE, ::QUERY_SCALE], served.canvases[position])
        shown = [int(a["data-gallery-id"]) for t, a in inside if t == "figure"]
        assert shown == ids[position].tolist() and len(shown) == searcher.k
        thumbs = [a for t, a in inside if t == "img" and a.get("class") == "nb"]
        assert len(thumbs) == searcher.k  # a trained gallery: every neighbour is drawn
        for item, thumb in zip(shown, thumbs):
            pixels = png_pixels(thumb["src"])[::NEIGHBOUR_SCALE, ::NEIGHBOUR_SCALE]
            assert np.array_equal(pixels, training[item]) and thumb["alt"] == str(searcher.labels[item])
    # The first error shown is a wrong vote; its neighbours' captions carry the searcher's distances.
    errors = [a for t, a in elements if t == "section" and a.get("id") == "errors"]
    if int(errors[0]["data-cases"]):
        position = int(elements[starts[0]][1]["data-position"])
        assert searcher.classify(served.embeddings[position : position + 1])[0]["pred"] != \
            dataset.classes[dataset.test_labels[position]]
        captions = [c for c in report.page.text if " · " in c][: searcher.k]
        assert [float(c.split(" · ")[1]) for c in captions] == pytest.approx(distances[position].tolist(), abs=5e-4)


def test_header_names_the_model_and_the_command(report, hostile_artifacts, tiny_artifacts):
    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())
    text = " ".join(report.page.text)
    for fact in (f"k{metadata['k']}", f"threshold{metadata['open_set']['threshold']:.4f}",
                 f"open-set score{metadata['open_set']['score']}",
                 f"preprocessing{metadata['preprocessing']['profile']} version {metadata['preprocessing']['version']}",
                 f"held-out split from{DEFAULT_DATA_SOURCE}"):
        assert fact in "".join(report.page.text)
    assert f"python -m training report {hostile_artifacts}" in text
    assert metadata["created"] in text


def test_gallery_refuses_to_draw_items_it_cannot_tie_to_training_images():
    profile = SimpleNamespace(canvases_from_arrays=lambda images: images)
    images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    dataset = Dataset("toy", images, np.array([0, 1, 0]), images[:1], np.array([0]), ("a", "b"),
                      np.array([7, 8, 9]), "dataset_index")

    def gallery(labels, sources):
        service = SimpleNamespace(profile=profile, sources=sources, searcher=SimpleNamespace(labels=labels))
        return Gallery(service, dataset)

    good = gallery(["a", "b", "a", "c"], ("file", ["toy#7", "toy#8", "toy#9", "c/new.png"]))  # after enroll
    assert good.problem is None and good.drawable == 3
    assert np.array_equal(png_pixels(good.uri(1))[::NEIGHBOUR_SCALE, ::NEIGHBOUR_SCALE], images[1])
    assert good.uri(3) is None and good.name(3) == "enrolled: c/new.png"
    assert gallery(["a", "b", "a"], None).drawable == 3
    for labels, sources in ((["b", "a", "a"], None), (["a", "b", "a"], ("dataset_index", [9, 8, 7]))):
        refused = gallery(labels, sources)
        assert refused.problem and refused.uri(0) is None


def test_the_recorded_source_is_the_default():
    recorded = ModelMetadata(k=5, metrics=Metrics(0.9))
    assert recorded_source(recorded.replace(dataset={"name": "x", "source": "idx:/data/x"})) == "idx:/data/x"
    assert recorded_source(recorded.replace(open_set={"calibration": {"source": "idx:/data/y"}})) == "idx:/data/y"
    assert recorded_source(recorded.replace(dataset={"name": "fashion-mnist"})) == DEFAULT_DATA_SOURCE


@pytest.mark.parametrize(("args", "code", "message"), [
    (["/nonexistent/artifacts"], 2, "ARTIFACTS /nonexistent/artifacts: no such folder"),
    (["{artifacts}", "--out", "/tmp"], 2, "--out /tmp: is a folder, not a file"),
    (["{artifacts}", "--out", "{file}/report.html"], 2, "is not a folder"),
    (["{artifacts}", "--ood", "cifar"], 2, "argument --ood"),
    (["{artifacts}", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["{artifacts}", "--data-source", "s3://"], 2, "argument --data-source"),
    (["{artifacts}", "--data-source", "idx:{idx}", "--ood", "none"], 1, "pass --data-source with the training source"),
    (["{tampered}", "--ood", "none"], 1, "labels.json"),
])
def test_bad_input_is_one_line_a_non_zero_exit_and_no_file(tiny_artifacts, tmp_path, args, code, message, capsys):
    tampered = tmp_path / "tampered"
    shutil.copytree(tiny_artifacts, tampered)
    (tampered / "labels.json").write_text("[]")
    make_idx_dir(tmp_path / "idx", 60, 20)
    (tmp_path / "file").write_text("")
    out = tmp_path / "out" / "report.html"
    argv = [a.format(artifacts=tiny_artifacts, tampered=tampered, idx=tmp_path / "idx", file=tmp_path / "file")
            for a in args]
    try:
        rc = training_main(["report", *argv, *([] if "--out" in argv else ["--out", str(out)])])
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == code
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and message in lines[0]
    assert not out.parent.exists()


# --- the report on the user's own images (#36, part 6) ----------------------------------------------------------


@pytest.fixture(scope="module")
def images_report(tiny_artifacts, tmp_path_factory):
    """`training report --images` on a folder of the user's digits in <label>/ folders (see digit_folder)."""
    root = digit_folder(tmp_path_factory.mktemp("user-images") / "digits")
    out = tmp_path_factory.mktemp("images-report") / "mine.html"
    assert training_main(["report", str(tiny_artifacts), "--images", str(root), "--out", str(out),
                          "--threads", "1"]) == 0
    text = out.read_text(encoding="utf-8")
    return SimpleNamespace(root=root, text=text, page=Page(text))


def served_answers(service, root):
    """What the server answers for each image file under `root` (by its relative name), with neighbour ids."""
    files = sorted(p for p in root.rglob("*.png"))
    answers, _ = service.answer([p.read_bytes() for p in files], embedding=[True] * len(files))
    return {p.relative_to(root).as_posix(): (p, a) for p, a in zip(files, answers)}


def cases_of(text: str) -> list["Page"]:
    """Each case of a page, parsed on its own."""
    return [Page('<div class="case" ' + chunk.split("</section>")[0]) for chunk in text.split('<div class="case" ')[1:]]


def test_images_report_shows_each_image_as_the_model_received_it_and_the_served_answer(images_report, served):
    service = served.service
    answers = served_answers(service, images_report.root)
    shown = cases_of(images_report.text)
    assert len(shown) == len(answers) - 1  # every image but the file the server refuses
    for case in shown:
        (query,) = case.find("img", **{"class": "q"})
        path, answer = answers[query["alt"]]
        canvas = png_pixels(query["src"])[::QUERY_SCALE, ::QUERY_SCALE]
        tensor, _ = service.profile.read(path.read_bytes())
        assert np.array_equal(service.profile.normalize(canvas[None])[0], tensor)  # exactly the model's input
        assert [int(a["data-gallery-id"]) for a in case.find("figure")] == [n["id"] for n in answer["neighbours"]]
        said = "unknown" if answer["unknown"] else answer["pred"]
        assert f"{query['alt']}: " in case.text[0] and "".join(case.text).count(f"answered {said} (confidence") == 1
    assert answers["7/blank.png"][1]["reason"] == "no_ink"
    blank = next(c for c in shown if c.find("img", alt="7/blank.png"))
    assert "unknown (no_ink)" in "".join(blank.text)
    assert images_report.page.find("ul", id="refused")
    assert html_escaped(answers["7/broken.png"][1]["error"]) in images_report.text


def test_images_report_scores_the_answers_against_the_folder_labels(images_report, served):
    answers = served_answers(served.service, images_report.root)
    labelled = {name: a for name, (_, a) in answers.items() if "/" in name and "error" not in a}
    header, *rows = images_report.page.rows
    columns = header[1:-2]
    assert columns == [*sorted(set(map(str, served.service.searcher.labels))), "unknown"]
    assert header[-2:] == ["n", "recall"]
    assert [row[0] for row in rows] == ["3", "7", "cat"]
    for row in rows:
        mine = [a for name, a in labelled.items() if name.split("/")[0] == row[0]]
        expected = [sum((("unknown" if a["unknown"] else a["pred"]) == c) for a in mine) for c in columns]
        assert [int(v) for v in row[1:-2]] == expected and int(row[-2]) == len(mine)
        assert float(row[-1]) == pytest.approx(sum(a["pred"] == row[0] for a in mine) / len(mine), abs=5e-4)
    right = sum(a["pred"] == name.split("/")[0] for name, a in labelled.items())
    assert f"{right / len(labelled):.4f} of {len(labelled)} labelled images" in "".join(images_report.page.text)


def test_images_report_without_label_folders_has_no_confusion_matrix(tiny_artifacts, tmp_path):
    root = tmp_path / "loose"
    root.mkdir()
    sample = load_dataset(DEFAULT_DATA_SOURCE)
    for i in range(3):
        Image.fromarray(sample.test_images[i]).save(root / f"{i}.png")
    out = tmp_path / "loose.html"
    assert training_main(["report", str(tiny_artifacts), "--images", str(root), "--out", str(out)]) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert page.rows == [] and len(cases_of(out.read_text(encoding="utf-8"))) == 3
    assert "no labels to score against" in " ".join(page.text)


@pytest.mark.parametrize(("images", "code", "message"), [
    ("{tmp}/missing", 2, "--images {tmp}/missing: no such folder"),
    ("{tmp}/empty", 1, "no images"),
])
def test_images_report_bad_input_is_one_line(tiny_artifacts, tmp_path, images, code, message, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no pictures here")
    out = tmp_path / "out.html"
    rc = training_main(["report", str(tiny_artifacts), "--images", images.format(tmp=tmp_path), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and message.format(tmp=tmp_path) in err[0], err
    assert not out.exists()


def test_a_page_that_is_not_a_report_is_never_replaced(tiny_artifacts, tmp_path, capsys):
    mine = tmp_path / "index.html"
    mine.write_text("<!DOCTYPE html>\n<html><body>my home page</body></html>\n")
    assert training_main(["report", str(tiny_artifacts), "--out", str(mine), "--ood", "none"]) == 2
    assert "exists and was not written by this command" in capsys.readouterr().err
    assert "my home page" in mine.read_text()
