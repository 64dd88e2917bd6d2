"""How much a running TorchServe's logs grow per request, and whether a refused body reaches them.

`python -m serving.log_growth [--workdir DIR] [--requests N]` POSTs a sample digit N times to the instance whose
working directory is DIR (the project's config and key file there, as `python -m serving start` leaves them),
then one form-encoded body that the frontend's decoder refuses, which carries a marker string. It prints the bytes
and lines each file under DIR/logs gained, per 1,000 requests too, and the files that hold the marker (none
expected: request bytes are never logged).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import re
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from settings import CONFIG_FILE, MODEL_NAME, REPO, SettingsError

from .server import Instance, LocalServerError

#: The frontend's access-log line for a prediction (TorchServe's own format: client, request line, status, ms).
PREDICTION_LINE = re.compile(rb'"POST /predictions/[^ ]+ HTTP/1\.1" \d{3} \d+$')


@dataclass(frozen=True)
class FileSize:
    bytes: int
    lines: int


def _text(path: Path) -> bytes:
    """A log file's content, decompressed when it is a rotated .gz."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def snapshot(logs: Path) -> dict[str, FileSize]:
    """Size on disk and line count of every file under `logs` (rotated .gz files included, their lines counted
    decompressed), by path relative to it."""
    return {str(path.relative_to(logs)): FileSize(path.stat().st_size, _text(path).count(b"\n"))
            for path in sorted(p for p in logs.rglob("*") if p.is_file())}


def growth(before: dict[str, FileSize], after: dict[str, FileSize]) -> dict[str, FileSize]:
    """What each file gained between two snapshots (a file absent before counts from zero)."""
    empty = FileSize(0, 0)
    return {name: FileSize(size.bytes - before.get(name, empty).bytes, size.lines - before.get(name, empty).lines)
            for name, size in after.items()}


def repeated_lines(path: Path) -> list[bytes]:
    """Lines that occur more than once in `path`: with a millisecond timestamp and a thread name on every line,
    a repeat means one event went to the file twice."""
    counts = Counter(path.read_bytes().splitlines())
    return [line for line, n in counts.items() if n > 1 and line.strip()]


def files_holding(logs: Path, needle: bytes) -> list[str]:
    """Files under `logs` (rotated ones decompressed) whose content holds `needle`."""
    return sorted(str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_file() and needle in _text(p))


def refused_body(marker: bytes, image: bytes) -> bytes:
    """A form-encoded body TorchServe's frontend cannot decode: `marker`, a bad %-escape, then the image.

    The decoder fails on the first field, so a frontend that quotes the field in its error quotes the marker."""
    return marker + b"%zz" + image


class Sender:
    """POSTs over one keep-alive connection with the inference token."""

    def __init__(self, url: str, token: str | None, timeout: float = 60.0):
        parts = urlsplit(url)
        self.path = parts.path
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}

    def post(self, body: bytes, content_type: str) -> tuple[int, bytes]:
        self.conn.request("POST", self.path, body=body, headers={**self.auth, "Content-Type": content_type})
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()


def access_lines(logs: Path) -> int:
    """Prediction lines in the access log (0 when there is none)."""
    path = logs / "access_log.log"
    return sum(bool(PREDICTION_LINE.search(line)) for line in path.read_bytes().splitlines()) if path.is_file() else 0


def wait_for_access_lines(logs: Path, count: int, timeout: float = 10.0) -> int:
    """Prediction lines in the access log once `count` are there (the frontend writes them after answering)."""
    deadline = time.monotonic() + timeout
    while (seen := access_lines(logs)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return seen


def sample_digit() -> bytes:
    """A held-out 7 of the bundled MNIST sample, as users send it."""
    from .samples import held_out_digits, user_digit_png

    return user_digit_png(held_out_digits()[7], 4)


def measure(instance: Instance, requests: int, image: bytes) -> tuple[dict[str, FileSize], list[str], int]:
    """Send `requests` predictions and one refused body; (growth per file, files holding the marker, status of
    the refused body)."""
    logs = instance.workdir / "logs"
    url = f"{instance.endpoints.inference}/predictions/{instance.model_name}"
    marker = b"log-growth-marker-" + secrets.token_hex(8).encode()
    expected = access_lines(logs) + requests + 1
    before = snapshot(logs)
    sender = Sender(url, instance.keys().get("inference"))
    try:
        for _ in range(requests):
            status, body = sender.post(image, "application/octet-stream")
            if status != 200:
                raise LocalServerError(f"a sample digit got HTTP {status}: {body[:200]!r}")
        refused, _ = sender.post(refused_body(marker, image), "application/x-www-form-urlencoded")
    except (OSError, http.client.HTTPException) as exc:
        raise LocalServerError(f"{url}: {exc}") from None
    finally:
        sender.close()
    wait_for_access_lines(logs, expected)
    return growth(before, snapshot(logs)), files_holding(logs, marker), refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.log_growth", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=REPO, help="the running instance's working directory")
    parser.add_argument("--config", type=Path, default=None,
                        help="its config.properties (default: WORKDIR/config.properties if present, else the project's)")
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.requests < 1:
        print("log_growth: error: --requests must be at least 1", file=sys.stderr)
        return 2
    workdir = args.workdir.resolve()
    config = args.config or (workdir / "config.properties" if (workdir / "config.properties").is_file() else CONFIG_FILE)
    instance = Instance(workdir, config.resolve(), args.model_name)
    try:
        if instance.pid() is None:
            raise LocalServerError(f"no TorchServe running from {workdir} (start it with python -m serving start)")
        added, holding, refused = measure(instance, args.requests, sample_digit())
    except (OSError, LocalServerError, SettingsError) as exc:
        print(f"log_growth: error: {exc}", file=sys.stderr)
        return 1
    scale = 1000 / args.requests
    print(f"{args.requests} predictions + 1 refused form-encoded body (HTTP {refused}), {workdir / 'logs'}:")
    print(f"{'file':<24}{'bytes':>12}{'lines':>9}{'bytes/1000':>13}{'lines/1000':>12}")
    for name, size in sorted(added.items()):
        print(f"{name:<24}{size.bytes:>12}{size.lines:>9}{size.bytes * scale:>13.0f}{size.lines * scale:>12.0f}")
    print(f"the refused body's marker is in: {', '.join(holding) if holding else 'no file'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
