"""LitServe serving `EmbeddingService` (``python -m bench.litserve_app``), launched by `bench.peers`.

The process layout is LitServe's own, set through its documented options: ``workers_per_device``
inference processes on the one CPU "device" (LitServe's docstring: for CPU, one per core), each
loading the model with ``--threads`` torch threads, and ``num_api_servers`` uvicorn HTTP processes
(``LitServer.run``; its default and recommendation is one per inference worker, passed explicitly
here). Requests reach the inference workers through LitServe's request queue, so the model work is
shared by both inference workers whichever API server accepted the connection.

No ``from __future__ import annotations`` here: LitServe reads `decode_request`'s annotation at
runtime, and ``Annotated[bytes, Body(...)]`` makes FastAPI hand over the raw request body.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import litserve as ls
from fastapi import Body

from bench.peers import PATH, load_service


class EmbeddingAPI(ls.LitAPI):
    """Raw PNG bytes in, the service's JSON answer out; batches are lists of bodies."""

    def __init__(self, artifacts: Path, threads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.artifacts = artifacts
        self.threads = threads

    def setup(self, device: str) -> None:
        self.service = load_service(self.artifacts, self.threads)

    def decode_request(self, request: Annotated[bytes, Body(media_type="application/octet-stream")]) -> bytes:
        return request

    def batch(self, inputs: Sequence[bytes]) -> list[bytes]:
        return list(inputs)

    def predict(self, x: Any) -> Any:
        single = isinstance(x, (bytes, bytearray))
        answers, _ = self.service.answer([x] if single else x)
        return answers[0] if single else answers

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: dict) -> dict:
        return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.litserve_app", description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=2, help="inference processes (workers_per_device)")
    p.add_argument("--api-servers", type=int, default=None,
                   help="HTTP processes (num_api_servers; default: one per inference worker, as LitServe's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per inference process")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--batch-delay-ms", type=float, default=5.0)
    args = p.parse_args(argv)
    api = EmbeddingAPI(args.artifacts, args.threads, max_batch_size=args.max_batch,
                       batch_timeout=args.batch_delay_ms / 1e3, api_path=PATH)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=args.workers, fast_queue=True,
                          timeout=30)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=args.api_servers or args.workers,
               api_server_worker_type="process", generate_client_file=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
