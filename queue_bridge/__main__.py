"""`python -m queue_bridge serve|call|purge`: queue-based inference over RabbitMQ.

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

import pika.exceptions

from .settings import Topology, amqp_url, connect, queue_name


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m queue_bridge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="AMQP URL (default: $EMBEDDING_AMQP_URL or amqp://guest:guest@127.0.0.1:5672/%%2F)")
    p.add_argument("--queue", help="request queue (default: $EMBEDDING_QUEUE or embedding.requests)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a bridge worker: request queue -> TorchServe -> reply_to")
    s.add_argument("--protocol", choices=("rest", "grpc"), default=os.environ.get("EMBEDDING_PROTOCOL", "rest"),
                   help="how to call TorchServe (default: rest)")
    s.add_argument("--inference-url", help="TorchServe inference address, host:port for gRPC "
                                           "(default: $EMBEDDING_INFERENCE_URL or config.properties)")
    s.add_argument("--model", help="model name (default: embedding)")
    s.add_argument("--key-file", type=Path, help="TorchServe key_file.json (default: ./key_file.json of the repo)")
    s.add_argument("--prefetch", type=int, default=_env_int("EMBEDDING_PREFETCH", 8),
                   help="requests in flight per bridge (basic_qos), also the number of TorchServe calls at once")
    s.add_argument("--max-attempts", type=int, default=_env_int("EMBEDDING_MAX_ATTEMPTS", 5),
                   help="tries on transient failures before the request goes to the dead-letter queue")
    s.add_argument("--retry-delay", type=float, default=0.5, help="seconds before the 2nd try; doubles each try")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds per TorchServe call")
    c = sub.add_parser("call", help="classify images through the queue (prints one JSON line per image)")
    c.add_argument("images", nargs="+", type=Path)
    c.add_argument("--timeout", type=float, default=30.0)
    c.add_argument("--json", action="store_true", help='send JSON {"data": base64} instead of raw bytes')
    pg = sub.add_parser("purge", help="drop every request waiting in the queue; prints how many")
    pg.add_argument("--dead-letter", action="store_true", help="purge the dead-letter queue instead")
    args = p.parse_args(argv)
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
        print(f"queue_bridge: error: cannot reach the broker at {url.rsplit('@', 1)[-1]}: {exc!r} "
              "(start one with scripts/rabbitmq.sh start)", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(f"queue_bridge: error: {exc} (start a broker with scripts/rabbitmq.sh start)", file=sys.stderr)
        return 1
    except pika.exceptions.ChannelClosedByBroker as exc:  # e.g. the queue exists with other arguments
        print(f"queue_bridge: error: the broker refused: {exc.reply_text}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace, url: str, queue: str) -> int:
    from client import ClientError

    from .backend import ModelBackend, TokenSource, default_inference_url, default_model
    from .bridge import Bridge, BridgeError, BridgeSettings

    try:
        settings = BridgeSettings(url=url, queue=queue, prefetch=args.prefetch, max_attempts=args.max_attempts,
                                  retry_delay=args.retry_delay)
        backend = ModelBackend(args.inference_url or default_inference_url(args.protocol),
                               args.model or default_model(), TokenSource(key_file=args.key_file), args.protocol,
                               timeout=args.timeout)
    except (ValueError, ClientError) as exc:
        print(f"queue_bridge: error: {exc}", file=sys.stderr)
        return 2
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
        print(f"queue_bridge: error: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    return 0


def _call(args: argparse.Namespace, url: str, queue: str) -> int:
    import base64

    from .client import QueueClient

    failed = 0
    with QueueClient(url, queue) as client:
        futures = []
        for image in args.images:
            try:
                data = image.read_bytes()
            except OSError as exc:
                print(f"queue_bridge: error: {image}: {exc.strerror}", file=sys.stderr)
                return 1
            if args.json:
                body = json.dumps({"data": base64.b64encode(data).decode()}).encode()
                futures.append(client.submit(body, "application/json"))
            else:
                futures.append(client.submit(data))
        deadline = time.monotonic() + args.timeout
        for image, future in zip(args.images, futures, strict=True):
            try:
                answer = client.result(future, max(0.0, deadline - time.monotonic()))
            except TimeoutError as exc:
                answer = {"error": str(exc), "status": 504}
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
