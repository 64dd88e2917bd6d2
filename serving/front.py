"""The local TorchServe's inference port: a small reverse proxy that keeps a caller's form mistakes from its 500s.

TorchServe's frontend parses every body labelled a URL-encoded form (what ``curl -d`` and ``--data-binary`` send)
before the handler runs, and answers 500 with the body's bytes in the message to much of it. The container puts
nginx and the gateway in front; a laptop has neither. So ``python -m serving start`` runs TorchServe's inference
API on a private loopback port and this process on the config's ``inference_address``. Every request goes on
unchanged (its key too: TorchServe checks it) but for the two rules of :mod:`serving.forms`: image bytes labelled
as a form go on as ``application/octet-stream``, and a form that cannot be decoded is answered 400 here, when the
request carries the valid inference key (else TorchServe answers it, with its 401). A body over
``max_request_size`` is answered 413 from its Content-Length, with a JSON reason, before it is read.

The management, metrics and gRPC ports stay TorchServe's own. The benchmark measures TorchServe without this front
(docs/performance.md); docs/serving.md gives its cost.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import signal
import sys
from pathlib import Path

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from handler.log_lines import refusal_log_line
from serving.forms import FormError, checked, refusal
from torchserve_api.errors import UsageError
from torchserve_api.tokens import from_key_file

logger = logging.getLogger("front")

#: Request headers that describe this hop, not the request (aiohttp's client sets its own).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length"})
#: Headers aiohttp's client would add: TorchServe's handler sees only what the caller sent.
NO_AUTO_HEADERS = ("Content-Type", "User-Agent", "Accept", "Accept-Encoding")
#: Seconds an answer may take beyond TorchServe's own default_response_timeout.
TIMEOUT_MARGIN_S = 10.0


def json_response(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message}).encode(), content_type="application/json")


class Front:
    """The proxy's state: TorchServe's private address, its key file (None when token auth is off), its limits."""

    def __init__(self, upstream: str, key_file: Path | None, max_request_size: int, timeout_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.key_file = key_file
        self.max_request_size = max_request_size
        self.timeout_s = timeout_s
        self.session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_request_size)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        self.session = ClientSession(connector=TCPConnector(limit=0, force_close=False), auto_decompress=False,
                                     timeout=ClientTimeout(total=self.timeout_s))

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def carries_the_key(self, request: web.Request) -> bool:
        """Whether the request would pass TorchServe's token check (always, with token auth off)."""
        if self.key_file is None:
            return True
        try:
            token = from_key_file(self.key_file, "inference")
        except UsageError:
            return False
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        return (scheme.lower() == "bearer" and token.value is not None and not token.expired()
                and hmac.compare_digest(key.strip().encode(), token.value.encode()))

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if (request.content_length or 0) > self.max_request_size:
            return self._too_large()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # a chunked body, or one longer than its Content-Length said
            return self._too_large()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            relabel = checked(request.headers.get("Content-Type", ""), body)
        except FormError as exc:
            if self.carries_the_key(request):
                logger.info("%s", refusal_log_line(f"{request.method} {ascii(request.path)[1:-1][:120]}", 400,
                                                   refusal(exc)))
                return web.Response(status=400, body=refusal(exc), content_type="application/json")
            relabel = None  # TorchServe refuses the key before it reads the body
        if relabel is not None:
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            headers["Content-Type"] = relabel
        assert self.session is not None
        try:
            async with self.session.request(request.method, self.upstream + request.rel_url.raw_path_qs,
                                            data=body, headers=headers, allow_redirects=False,
                                            skip_auto_headers=NO_AUTO_HEADERS) as reply:
                payload = await reply.read()
                kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_BY_HOP}
                return web.Response(status=reply.status, body=payload, headers=kept)
        except (ClientError, asyncio.TimeoutError) as exc:
            logger.warning("TorchServe at %s did not answer %s %s: %s", self.upstream, request.method,
                           ascii(request.path)[1:-1][:120], type(exc).__name__)
            return json_response(503, "TorchServe is not answering; retry shortly, or see logs/torchserve.out")

    def _too_large(self) -> web.Response:
        response = json_response(413, f"request body larger than {self.max_request_size} bytes")
        response.force_close()  # the rest of the body is never read
        return response


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


async def serve(front: Front, host: str, port: int) -> None:
    runner = web.AppRunner(front.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    logger.info("listening on %s:%d for TorchServe at %s", host, port, front.upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.front", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, help="host:port of the config's inference_address")
    parser.add_argument("--upstream", required=True, help="TorchServe's private inference URL")
    parser.add_argument("--key-file", type=Path, help="TorchServe's key_file.json (omit when token auth is off)")
    parser.add_argument("--max-request-size", type=int, required=True)
    parser.add_argument("--response-timeout", type=float, required=True, help="default_response_timeout (s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    front = Front(args.upstream, args.key_file, args.max_request_size, args.response_timeout + TIMEOUT_MARGIN_S)
    host, port = _address(args.listen)
    try:
        asyncio.run(serve(front, host, port))
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
