"""python -m queue_bridge serve|call|purge: queue-based inference over RabbitMQ.

Settings come from flags, else the environment (EMBEDDING_AMQP_URL, EMBEDDING_QUEUE; for serve also
EMBEDDING_PROTOCOL, EMBEDDING_INFERENCE_URL, EMBEDDING_MODEL, EMBEDDING_TOKEN, EMBEDDING_KEY_FILE,
EMBEDDING_PREFETCH, EMBEDDING_MAX_ATTEMPTS), else local defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import pika.exceptions

from cli_common import (EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError, fail, input_file, positive_int,
                        positive_seconds)
from settings import MODEL_NAME, SettingsError, check_model_name

from .broker import DEFAULT_QUEUE, DEFAULT_URL, Topology, amqp_url, connect, queue_name

PROG = "python -m queue_bridge"
BODIES = ("raw", "json")


def _env_int(name: str, default: int) -> int:
    """$name as an integer, else `default`; a value that is not one is a usage error."""
    text = os.environ.get(name)
    try:
        return int(text) if text else default
    except ValueError:
        raise UsageError(f"${name}={text!r} is not an integer") from None


def _amqp(text: str) -> str:
    """argparse type: an amqp:// or amqps:// URL with a host."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected amqp://USER:PASSWORD@HOST:PORT/VHOST, got {text!r}")
    return text


def _model_name(text: str) -> str:
    try:
        return check_model_name(text)
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    shown_url = DEFAULT_URL.replace("%", "%%")
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--url", type=_amqp, help=f"AMQP URL (default: $EMBEDDING_AMQP_URL, else {shown_url})")
    p.add_argument("--queue", help=f"request queue (default: $EMBEDDING_QUEUE, else {DEFAULT_QUEUE})")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a bridge worker: request queue -> TorchServe -> reply_to")
    s.add_argument("--protocol", choices=("rest", "grpc"), default=os.environ.get("EMBEDDING_PROTOCOL", "rest"),
                   help="how to call TorchServe (default: $EMBEDDING_PROTOCOL, else rest)")
    s.add_argument("--inference-url", help="TorchServe inference address, host:port for gRPC "
                                           "(default: $EMBEDDING_INFERENCE_URL, else config.properties)")
    s.add_argument("--model-name", type=_model_name,
                   help=f"TorchServe model name (default: $EMBEDDING_MODEL, else {MODEL_NAME})")
    s.add_argument("--key-file", type=Path,
                   help="TorchServe key_file.json (default: $EMBEDDING_KEY_FILE, else key_file.json of the repo)")
    s.add_argument("--prefetch", type=positive_int, default=None,
                   help="requests in flight per bridge (basic_qos), also the number of TorchServe calls at once "
                        "(default: $EMBEDDING_PREFETCH, else 8)")
    s.add_argument("--max-attempts", type=positive_int, default=None,
                   help="tries on transient failures before the request goes to the dead-letter queue "
                        "(default: $EMBEDDING_MAX_ATTEMPTS, else 5)")
    s.add_argument("--retry-delay", type=positive_seconds, default=0.5,
                   help="seconds before the 2nd try; doubles each try")
    s.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds per TorchServe call")
    c = sub.add_parser("call", help="classify images through the queue (prints one JSON line per image)")
    c.add_argument("images", nargs="+", type=Path, metavar="IMAGE", help="image file")
    c.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds to wait for all the answers")
    c.add_argument("--body", choices=BODIES, default="raw",
                   help='request body: raw (the image bytes) or json ({"data": base64 of the bytes})')
    pg = sub.add_parser("purge", help="drop every request waiting in the queue; prints how many")
    pg.add_argument("--dead-letter", action="store_true", help="purge the dead-letter queue instead")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            args.prefetch = args.prefetch or _env_int("EMBEDDING_PREFETCH", 8)
            args.max_attempts = args.max_attempts or _env_int("EMBEDDING_MAX_ATTEMPTS", 5)
            if args.key_file is not None:
                input_file(args.key_file, "--key-file")
        if args.command == "call":
            args.bodies = [input_file(image, "image").read_bytes() for image in args.images]
    except UsageError as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except OSError as exc:
        return fail(PROG, f"{exc.filename}: {exc.strerror}", EXIT_USAGE)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its connection errors are reported by the bridge
    url, queue = amqp_url(args.url), queue_name(args.queue)
    try:
        if args.command == "serve":
            return _serve(args, url, queue)
        if args.command == "call":
            return _call(args, url, queue)
        return _purge(args, url, queue)
    except pika.exceptions.AMQPConnectionError as exc:
        return fail("queue_bridge", f"cannot reach the broker at {url.rsplit('@', 1)[-1]}: {exc!r} "
                                    "(start one with scripts/rabbitmq.sh start)")
    except (ConnectionError, TimeoutError) as exc:
        return fail("queue_bridge", f"{exc} (start a broker with scripts/rabbitmq.sh start)")
    except pika.exceptions.ChannelClosedByBroker as exc:  # e.g. the queue exists with other arguments
        return fail("queue_bridge", f"the broker refused: {exc.reply_text}")
    except KeyboardInterrupt:
        return fail("queue_bridge", "interrupted", EXIT_INTERRUPTED)


def _serve(args: argparse.Namespace, url: str, queue: str) -> int:
    from client import ClientError

    from .model_backend import ModelBackend, TokenSource, default_inference_url, default_model
    from .bridge import Bridge, BridgeError, BridgeSettings

    try:
        settings = BridgeSettings(url=url, queue=queue, prefetch=args.prefetch, max_attempts=args.max_attempts,
                                  retry_delay=args.retry_delay)
        backend = ModelBackend(args.inference_url or default_inference_url(args.protocol),
                               args.model_name or default_model(), TokenSource(key_file=args.key_file), args.protocol,
                               timeout=args.timeout)
    except (ValueError, ClientError) as exc:
        return fail("queue_bridge", exc, EXIT_USAGE)
    bridge = Bridge(settings, backend)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("%s: finishing requests in flight, then stopping (again to abort)",
                                         signal.Signals(signum).name)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        bridge.request_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        bridge.run()
    except BridgeError as exc:
        return fail("queue_bridge", exc)
    finally:
        backend.close()
    return 0


def _call(args: argparse.Namespace, url: str, queue: str) -> int:
    import base64

    from .client import QueueClient
    from .protocol import error_answer

    failed = 0
    with QueueClient(url, queue) as client:
        futures = []
        for data in args.bodies:
            if args.body == "json":
                body = json.dumps({"data": base64.b64encode(data).decode()}).encode()
                futures.append(client.submit(body, "application/json"))
            else:
                futures.append(client.submit(data))
        deadline = time.monotonic() + args.timeout
        for image, future in zip(args.images, futures, strict=True):
            try:
                answer = client.result(future, max(0.0, deadline - time.monotonic()))
            except TimeoutError as exc:
                answer = error_answer(str(exc), 504)
            failed += "error" in answer
            print(json.dumps({"image": str(image), **answer}), flush=True)
    return 1 if failed else 0


def _purge(args: argparse.Namespace, url: str, queue: str) -> int:
    topology = Topology(queue)
    target = topology.dead_letter_queue if args.dead_letter else topology.queue
    connection = connect(url, "queue-bridge-purge")
    try:
        channel = connection.channel()
        topology.declare(channel)
        dropped = channel.queue_purge(target).method.message_count
    finally:
        connection.close()
    print(f"{dropped} messages purged from {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
