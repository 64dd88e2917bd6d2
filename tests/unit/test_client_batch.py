"""The batch client without TorchServe: the folder walk, the output formats, the summary, going on past bad files,
and the fallback to one image per request, against a small scripted server that answers like the handler."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from client import UsageError
from client.__main__ import build_parser, sidecar_path
from client.batch import CSV_COLUMNS, Outcome, RowWriter, Summary, answer_files, chunk_sizes, walk
from settings import REPO
from support.http import send_json

#: The scripted server's image bytes: b"digit:<label>", b"unknown", or anything else (refused like a non-image).
REFUSED = "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)"


def answer_for(image: bytes, embedding: bool) -> dict[str, Any]:
    if image.startswith(b"digit:"):
        label = image.split(b":", 1)[1].decode()
        answer = {"pred": label, "dist": 0.25, "confidence": 1.0, "unknown": False,
                  "neighbours": [{"label": label, "dist": 0.25}]}
    elif image == b"unknown":
        answer = {"pred": "1", "dist": 3.5, "confidence": 0.6, "unknown": True, "neighbours": []}
    else:
        return {"error": REFUSED, "status": 400}
    return {**answer, "embedding": [float(len(image)), 0.5]} if embedding else answer


@contextmanager
def handler_like_server(refuse_whole: bool = False, fail_with: int | None = None
                        ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Answers /predictions/<model> as the handler does: raw image bytes, a multipart form (embedding option) or a
    KServe v1 body. `refuse_whole`: a v1 body with a bad image is refused as a whole (400), as some servers do.
    `fail_with`: every request gets this status. Records each request's number of images and form."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            kind = self.headers.get("Content-Type", "")
            if fail_with is not None:
                send_json(self, fail_with, {"code": fail_with, "type": "InternalServerException", "message": "boom"})
                return
            if kind.startswith("application/json"):
                payload = json.loads(body)
                images = [base64.b64decode(item["data"]) for item in payload["instances"]]
                embedding = bool(payload.get("parameters", {}).get("embedding"))
                with lock:
                    seen.append({"form": "v1", "images": images})
                answers = [answer_for(image, embedding) for image in images]
                bad = [a for a in answers if "error" in a]
                if refuse_whole and bad:
                    send_json(self, 400, bad[0])
                else:
                    send_json(self, 200, {"predictions": answers})
                return
            if kind.startswith("multipart/form-data"):
                image = body.split(b"\r\n\r\n", 1)[1].split(b"\r\n--", 1)[0]
                embedding = True
            else:
                image, embedding = body, False
            with lock:
                seen.append({"form": "raw" if not embedding else "form", "images": [image]})
            answer = answer_for(image, embedding)
            send_json(self, answer.get("status", 200) if "error" in answer else 200, answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/<label>/... in the training layout: 7 images, a refused one, an unreadable one, files to skip."""
    root = tmp_path / "images"
    for rel, content in {"3/a.png": b"digit:3", "3/b.JPG": b"digit:3", "7/x.png": b"digit:7", "7/deep/y.pgm": b"digit:7",
                         "10/z.webp": b"digit:1", "7/q.ppm": b"unknown", "3/broken.png": b"garbage",
                         "3/notes.txt": b"skip", "7/.hidden.png": b"skip", ".cache/c.png": b"skip"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    (root / "7" / "gone.png").symlink_to(root / "nowhere.png")  # listed, cannot be read
    return root


EXPECTED_ORDER = ["10/z.webp", "3/a.png", "3/b.JPG", "3/broken.png", "7/deep/y.pgm", "7/gone.png", "7/q.ppm",
                  "7/x.png"]


def relative(rows: list[dict[str, Any]], root: Path) -> list[str]:
    return [Path(row["image"]).relative_to(root).as_posix() for row in rows]


def test_walk_recurses_in_sorted_order_and_keeps_only_image_files(tree):
    found = walk([tree])
    assert [p.relative_to(tree).as_posix() for p in found] == EXPECTED_ORDER
    assert walk([tree / "3" / "notes.txt", tree / "7"])[0] == tree / "3" / "notes.txt"  # a file named is sent as is
    assert walk([str(tree / "7")]) == walk([tree / "7"])


@pytest.mark.parametrize("case,message", [("missing", "no such file or folder"), ("imageless", "no image files")])
def test_walk_refuses_a_missing_path_or_a_folder_without_images(tmp_path, case, message):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match=message):
        walk([tmp_path / ("nope" if case == "missing" else "empty")])


def test_csv_has_a_header_and_quotes_what_needs_quoting():
    out = io.StringIO()
    writer = RowWriter(out, "csv")
    answer = {"pred": "3", "dist": 0.25, "confidence": 1.0, "unknown": False,
              "neighbours": [{"label": "3", "dist": 0.25}, {"label": "8", "dist": 0.5}]}
    writer.write(Outcome(Path('odd, "name".png'), answer=answer).row())
    writer.write(Outcome(Path("bad.png"), error=REFUSED, status=400, kind="BadImageError").row())
    writer.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS)
    # An answer of a server from before reason and nearest_label leaves those cells empty.
    assert lines[1].startswith('"odd, ""name"".png",3,0.25,1.0,false,,,"[{""label"":""3""')
    assert lines[2] == "bad.png" + "," * (len(CSV_COLUMNS) - 2) + f'"{REFUSED}",400'
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert rows[0]["image"] == 'odd, "name".png' and json.loads(rows[0]["neighbours"])[1]["label"] == "8"
    assert rows[1]["error"] == REFUSED and rows[1]["pred"] == ""


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_json_array_and_json_lines(fmt):
    rows = [{"image": "a.png", "pred": "1"}, {"image": "b.png", "error": "x", "status": 400, "kind": "BadImageError"}]
    out = io.StringIO()
    writer = RowWriter(out, fmt)
    for row in rows:
        writer.write(row)
    writer.close()
    parsed = json.loads(out.getvalue()) if fmt == "json" else [json.loads(line) for line in out.getvalue().splitlines()]
    assert parsed == rows
    empty = io.StringIO()
    RowWriter(empty, fmt).close()
    assert empty.getvalue() == ("[]\n" if fmt == "json" else "")


def test_summary_counts_labels_unknown_and_failures():
    summary = Summary()
    for outcome in [Outcome(Path("a"), answer=answer_for(b"digit:3", False)),
                    Outcome(Path("b"), answer=answer_for(b"digit:3", False)),
                    Outcome(Path("c"), answer=answer_for(b"digit:10", False)),
                    Outcome(Path("d"), answer=answer_for(b"unknown", False)),
                    Outcome(Path("e"), error="cannot read", kind="ReadError")]:
        summary.add(outcome)
    assert summary.lines() == ["summary: 5 images, 3 with a label, 1 unknown (open-set rejects), 1 failed",
                               "by label: 10: 1, 3: 2"]


def check_rows(rows: list[dict[str, Any]], root: Path) -> None:
    assert relative(rows, root) == EXPECTED_ORDER
    by_name = dict(zip(EXPECTED_ORDER, rows))
    assert [by_name[n]["pred"] for n in ("10/z.webp", "3/a.png", "3/b.JPG", "7/deep/y.pgm", "7/x.png")] == \
        ["1", "3", "3", "7", "7"]
    assert by_name["3/broken.png"]["error"] == REFUSED and str(by_name["3/broken.png"]["status"]) == "400"
    assert by_name["7/gone.png"]["error"] == "cannot read (No such file or directory)"
    assert by_name["7/q.ppm"]["unknown"] in (True, "true")


def check_stderr(stderr: str, root: Path) -> None:
    lines = stderr.splitlines()
    assert f"client: failed: {root / '3' / 'broken.png'}: {REFUSED} (HTTP 400)" in lines
    assert f"client: failed: {root / '7' / 'gone.png'}: cannot read (No such file or directory)" in lines
    assert lines[-2:] == ["summary: 8 images, 5 with a label, 1 unknown (open-set rejects), 2 failed",
                          "by label: 1: 1, 3: 2, 7: 2"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "json"])
def test_predict_goes_on_past_bad_files_in_every_format(tree, tmp_path, fmt):
    with handler_like_server() as (url, seen):
        result = run_cli("predict", str(tree), "--url", url, "--token", "t", "--format", fmt, "--batch-size", "3",
                         "--concurrency", "2", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    text = result.stdout
    rows = (list(csv.DictReader(io.StringIO(text))) if fmt == "csv" else json.loads(text) if fmt == "json"
            else [json.loads(line) for line in text.splitlines()])
    check_rows(rows, tree)
    check_stderr(result.stderr, tree)
    # 8 files in chunks of 3, 3, 2; the second loses its unreadable file: v1 bodies of 3, 2 and 2 images
    assert sorted(len(r["images"]) for r in seen) == [2, 2, 3] and {r["form"] for r in seen} == {"v1"}


def test_a_batch_refused_as_a_whole_is_sent_again_one_image_per_request(tree, tmp_path):
    out = tmp_path / "out" / "rows.jsonl"
    with handler_like_server(refuse_whole=True) as (url, seen):
        result = run_cli("predict", str(tree), "--url", url, "--token", "t", "--batch-size", "8", "--out", str(out),
                         "--no-progress", cwd=tmp_path)
    assert result.returncode == 5 and result.stdout == "", result.stderr
    check_rows([json.loads(line) for line in out.read_text().splitlines()], tree)
    check_stderr(result.stderr, tree)
    assert [len(r["images"]) for r in seen] == [7] + [1] * 7 and [r["form"] for r in seen[1:]] == ["raw"] * 7
    assert sorted(p.name for p in out.parent.iterdir()) == ["rows.jsonl"]


def test_batch_size_one_sends_each_image_alone(tree, tmp_path):
    with handler_like_server() as (url, seen):
        result = run_cli("predict", str(tree / "3"), str(tree / "7" / "x.png"), "--url", url, "--token", "t",
                         "--batch-size", "1", cwd=tmp_path)
    assert result.returncode == 5
    assert [json.loads(line).get("pred") for line in result.stdout.splitlines()] == ["3", "3", None, "7"]
    assert [r["form"] for r in seen] == ["raw"] * 4


def test_a_failure_that_is_not_one_images_stops_the_run_and_leaves_no_output(tree, tmp_path):
    out = tmp_path / "new" / "folder" / "rows.csv"
    with handler_like_server(fail_with=500) as (url, _):
        result = run_cli("predict", str(tree), "--url", url, "--token", "t", "--format", "csv", "--out", str(out),
                         "--retries", "0", cwd=tmp_path)
    assert result.returncode == 8, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("client: error: ") and "answered 500: boom" in line
    assert list(tmp_path.iterdir()) == [tree]


def test_embed_writes_the_answered_images_and_lists_the_failed_ones(tree, tmp_path):
    out = tmp_path / "emb" / "vectors.npy"
    with handler_like_server() as (url, seen):
        result = run_cli("embed", str(tree), "--out", str(out), "--url", url, "--token", "t", "--batch-size", "4",
                         cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    check_stderr(result.stderr, tree)
    sidecar = json.loads(sidecar_path(out).read_text())
    answered = [n for n in EXPECTED_ORDER if n not in ("3/broken.png", "7/gone.png")]
    assert sidecar["files"] == [str(tree / n) for n in answered] and sidecar["count"] == 6 and sidecar["dim"] == 2
    assert [(Path(f["image"]).name, f["kind"]) for f in sidecar["failed"]] == [("broken.png", "BadImageError"),
                                                                              ("gone.png", "ReadError")]
    matrix = np.load(out, allow_pickle=False)
    assert matrix.dtype == np.float32 and matrix.shape == (6, 2)
    assert matrix[:, 0].tolist() == [float(len((tree / n).read_bytes())) for n in answered]
    assert all(r["form"] in ("v1", "form") for r in seen)


@pytest.mark.parametrize("args,message", [
    (["predict", "img.png", "--bogus"], "python -m client: error: unrecognized arguments: --bogus"),
    (["predict", "img.png", "--model", "x"], "python -m client: error: unrecognized arguments: --model x"),
    (["drift", "--model", "x"], "python -m client: error: unrecognized arguments: --model x"),
    (["predict", "nope.png", "--token", "t", "--url", "http://127.0.0.1:9"], "client: error: nope.png: no such file"),
    (["predict", "img.png", "--token", "t", "--url", "127.0.0.1:8080"], "client: error: --url '127.0.0.1:8080': not an"),
    (["predict", "img.png", "--token", "t", "--url", "notaurl"], "client: error: --url 'notaurl': not an http"),
    (["predict", "img.png", "--token", "t", "--grpc", "--url", "notaurl"], "a gRPC address is host:port"),
    (["predict", "img.png", "--token", "t", "--url", "http://h:x"], "client: error: --url 'http://h:x': not an"),
    (["predict", "img.png", "--url", "http://[bad"], "client: error: --url 'http://[bad': not an http"),
    (["predict", "img.png", "--grpc", "--url", "[bad:7070"], "client: error: --url '[bad:7070': a gRPC address"),
    (["predict", "img.png", "--token", "t", "--out", "."], "client: error: --out .: is a folder"),
    (["predict", "img.png", "--token", "t", "--out", "img.png/rows.csv"], "img.png is not a folder"),
    (["embed", "img.png", "--token", "t", "--out", "sub"], "client: error: --out sub: is a folder"),
    (["predict", "img.png", "--key-file", "sub", "--url", "http://127.0.0.1:9"], "cannot read the key file"),
    (["predict", "img.png", "--batch-size", "0"], "argument --batch-size: expected a positive integer"),
    (["predict", "img.png", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["status", "--json"], "unrecognized arguments: --json"),
    (["status", "--url", "localhost:8081", "--token", "t"], "client: error: --url 'localhost:8081': not an http"),
    (["drift", "--prometheus", "notaurl"], "client: error: --prometheus 'notaurl': not an http"),
    (["register", "--mar", "x.mar", "--model-version", "2", "--version", "2"], "unrecognized arguments: --version"),
    (["lifecycle-config", "--out", "sub"], "client: error: --out sub: is a folder"),
])
def test_usage_errors_are_one_line_with_exit_2(tmp_path, args, message):
    (tmp_path / "img.png").write_bytes(b"digit:3")
    (tmp_path / "sub").mkdir()
    result = run_cli(*args, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    (line,) = result.stderr.splitlines()
    assert message in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img.png", "sub"]


def test_every_option_shows_its_default_and_the_help_has_no_rest_markup():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert "``" not in parser.description and ":mod:" not in parser.description
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.dest == "help" or action.nargs == 0:
                continue
            shown = sub.formatter_class("x")._get_help_string(action) or ""
            assert "(default" in shown or "(required)" in shown, (name, action.option_strings, shown)
            assert "``" not in shown
    help_text = commands.choices["status"].format_help()
    assert "--format {table,json}" in help_text and "(default: table)" in help_text


def test_the_client_imports_without_torch():
    code = ("import sys; import client, client.__main__, client.batch; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("total,batch,concurrency", [(1, 64, 4), (8, 3, 2), (100, 64, 4), (2000, 64, 4),
                                                      (5000, 256, 2), (777, 16, 8), (50, 1, 4)])
def test_chunks_are_full_while_plenty_remain_then_shrink_to_the_floor(total, batch, concurrency):
    sizes = list(chunk_sizes(total, batch, concurrency))
    assert sum(sizes) == total and max(sizes) <= batch and min(sizes) >= 1
    assert sizes == sorted(sizes, reverse=True)
    floor = min(batch, 8)
    assert all(size >= floor for size in sizes[:-1])
    left = total
    for size in sizes:  # a full request whenever at least 2 x concurrency full ones remain
        if left >= 2 * concurrency * batch:
            assert size == batch
        left -= size


def test_the_tail_of_a_run_is_split_so_the_last_requests_are_small():
    sizes = list(chunk_sizes(2000, 64, 4))
    assert sizes[:24] == [64] * 24 and sizes[-8:] == [8] * 7 + [4]
    assert list(chunk_sizes(8, 8, 4)) == [8] and list(chunk_sizes(8, 3, 2)) == [3, 3, 2]


def test_answer_files_keeps_every_files_outcome_in_order_and_each_failure_its_own(tmp_path):
    from client import EmbeddingClient

    paths = []
    for i in range(70):
        path = tmp_path / f"{i:03d}.png"
        path.write_bytes(b"garbage" if i in (5, 41) else f"digit:{i % 10}".encode())
        paths.append(path)
    paths[60].unlink()  # listed, then gone before it is read
    with handler_like_server() as (url, seen), EmbeddingClient(url, token="t") as client:
        done: list[int] = []
        outcomes = list(answer_files(client, paths, batch_size=16, concurrency=2, on_done=done.append))
    assert [o.path for o in outcomes] == paths and sum(done) == 70
    failed = {o.path.name: (o.kind, o.status) for o in outcomes if o.failed}
    assert failed == {"005.png": ("BadImageError", 400), "041.png": ("BadImageError", 400),
                      "060.png": ("ReadError", None)}
    assert all(o.answer["pred"] == str(int(o.path.stem) % 10) for o in outcomes if not o.failed)
    sizes = list(chunk_sizes(70, 16, 2))
    assert sorted(len(r["images"]) for r in seen) == sorted(s - (1 if sum(sizes[:k]) <= 60 < sum(sizes[:k + 1])
                                                                 else 0) for k, s in enumerate(sizes))
    assert {r["form"] for r in seen} == {"v1"}


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_rows_are_flushed_now_and_then_and_on_close_not_one_by_one():
    rarely, always = CountingStream(), CountingStream()
    for stream, every in ((rarely, 3600.0), (always, 0.0)):
        writer = RowWriter(stream, "jsonl", flush_s=every)
        for i in range(50):
            writer.write({"image": f"{i}.png", "pred": "1"})
        writer.close()
    assert rarely.flushes == 1 and len(rarely.getvalue().splitlines()) == 50
    assert always.flushes == 51


def test_no_progress_bar_means_tqdm_is_not_imported():
    code = ("import sys, client.__main__ as m; bar = m._progress(3, disabled=False); bar.update(2); "
            "bar.write('x'); assert 'tqdm' not in sys.modules, 'tqdm imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stderr == "x\n", done.stderr
