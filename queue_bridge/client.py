"""RPC client: publish a request with reply_to/correlation_id, wait for the bridge's answer.

One background thread owns the connection (pika is not thread-safe) and the client's exclusive reply
queue; callers on any thread submit requests through it, so many requests can be in flight at once.

Requests are published without publisher confirms: pika's blocking channel waits for each confirm in
turn (a quorum queue confirms after an fsync, about 3 ms here), which would cap one client at a few
hundred requests/s. The answer is the end-to-end confirmation instead: a request the broker returns
(no such queue) fails its future at once, and if the connection drops every waiting future fails with
ConnectionError, so a request is never lost silently. The bridge, which acks requests, does confirm.
Replies are matched to requests by correlation id; a reply nobody waits for any more (a timed-out
request, or a second answer after a bridge crashed between replying and acking) is counted in
`unmatched_replies` and dropped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Self

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from .protocol import decode_answer
from .broker import Topology, amqp_url, connect, queue_name

log = logging.getLogger(__name__)


class ReplyFuture(concurrent.futures.Future):
    """The answer dict for one request; `headers` holds the reply's headers (attempt, bridge)."""

    def __init__(self, correlation_id: str) -> None:
        super().__init__()
        self.correlation_id = correlation_id
        self.headers: dict[str, Any] = {}


class QueueClient:
    """`client(image_bytes, timeout=30) -> answer dict`, or `client.submit(...)` for a future.

    The request queue is declared on connect (idempotent), so requests wait in it while no bridge
    runs; `__call__` raises TimeoutError when no answer comes in time.
    """

    def __init__(self, url: str | None = None, queue: str | None = None, connect_timeout: float = 10.0) -> None:
        self.url = amqp_url(url)
        self.topology = Topology(queue_name(queue))
        self.unmatched_replies = 0
        self._pending: dict[str, ReplyFuture] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._ready: concurrent.futures.Future[tuple[pika.BlockingConnection, BlockingChannel, str]] = \
            concurrent.futures.Future()
        self._thread = threading.Thread(target=self._io_loop, name="queue-client", daemon=True)
        self._thread.start()
        try:
            self._connection, self._channel, self._reply_queue = self._ready.result(connect_timeout)
        except concurrent.futures.TimeoutError:
            self._closing.set()
            raise TimeoutError(f"no connection to {self._safe_url()} within {connect_timeout:.0f}s") from None
        except pika.exceptions.AMQPError as exc:
            raise ConnectionError(f"cannot use queue {self.queue!r} on {self._safe_url()}: {exc!r}") from None

    @property
    def queue(self) -> str:
        return self.topology.queue

    def submit(self, image: bytes, content_type: str = "application/octet-stream") -> ReplyFuture:
        """Queue one request for publishing and return at once; the future holds the answer."""
        future = ReplyFuture(uuid.uuid4().hex)
        with self._lock:
            self._pending[future.correlation_id] = future
        try:
            self._on_io_thread(partial(self._publish, future, image, content_type))
        except ConnectionError:
            self._forget(future.correlation_id)
            raise
        return future

    def __call__(self, image: bytes, timeout: float = 30.0, content_type: str = "application/octet-stream") -> dict:
        """Answer for one image (the model's JSON, or its error JSON); TimeoutError if none comes in time."""
        return self.result(self.submit(image, content_type), timeout)

    def result(self, future: ReplyFuture, timeout: float) -> dict:
        """Wait for a submitted request; on timeout, stop waiting for it and raise TimeoutError."""
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            self._forget(future.correlation_id)
            raise TimeoutError(f"no answer on queue {self.queue!r} within {timeout:g}s: is a bridge running? "
                               f"(python -m queue_bridge serve)") from None

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Close the connection; requests still waiting fail with ConnectionError."""
        if self._closing.is_set():
            return
        self._closing.set()
        with contextlib.suppress(pika.exceptions.AMQPError):  # already closed: nothing to wake
            self._connection.add_callback_threadsafe(lambda: None)  # wake the I/O loop
        self._thread.join(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _safe_url(self) -> str:
        params = pika.URLParameters(self.url)
        return f"amqp://{params.host}:{params.port}"

    def _forget(self, correlation_id: str) -> None:
        with self._lock:
            self._pending.pop(correlation_id, None)

    def _on_io_thread(self, callback: Callable[[], None]) -> None:
        if self._closing.is_set():
            raise ConnectionError("client is closed")
        try:
            self._connection.add_callback_threadsafe(callback)
        except pika.exceptions.AMQPError as exc:
            raise ConnectionError(f"broker connection closed: {exc!r}") from None

    def _io_loop(self) -> None:
        try:
            connection = connect(self.url, f"queue-client-{uuid.uuid4().hex[:8]}")
            channel = connection.channel()
            channel.add_on_return_callback(self._on_return)
            self.topology.declare(channel)
            reply_queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            channel.basic_consume(reply_queue, self._on_reply, auto_ack=True, exclusive=True)
        except (pika.exceptions.AMQPError, OSError, ValueError) as exc:  # handed to the constructor
            self._ready.set_exception(exc)
            return
        self._ready.set_result((connection, channel, reply_queue))
        error: BaseException | None = None
        try:
            while not self._closing.is_set():
                connection.process_data_events(time_limit=0.5)
        except pika.exceptions.AMQPError as exc:
            error = exc
            log.warning("queue client lost its broker connection: %r", exc)
        finally:
            self._closing.set()
            with self._lock:
                stranded, self._pending = list(self._pending.values()), {}
            for future in stranded:
                future.set_exception(ConnectionError(f"broker connection closed before the answer came ({error!r})"
                                                     if error else "client closed before the answer came"))
            if connection.is_open:
                connection.close()

    def _publish(self, future: ReplyFuture, image: bytes, content_type: str) -> None:
        properties = BasicProperties(content_type=content_type, correlation_id=future.correlation_id,
                                     reply_to=self._reply_queue, delivery_mode=pika.DeliveryMode.Persistent)
        try:
            self._channel.basic_publish("", self.queue, image, properties, mandatory=True)
        except pika.exceptions.AMQPError as exc:
            self._forget(future.correlation_id)
            future.set_exception(ConnectionError(f"publish failed: {exc!r}"))
            raise

    def _on_return(self, channel: BlockingChannel, method: Basic.Return, properties: BasicProperties,
                   body: bytes) -> None:
        with self._lock:
            future = self._pending.pop(properties.correlation_id or "", None)
        if future is not None:
            future.set_exception(ConnectionError(f"request returned by the broker: {method.reply_text} "
                                                 f"(queue {self.queue!r} deleted?)"))

    def _on_reply(self, channel: BlockingChannel, method: Basic.Deliver, properties: BasicProperties,
                  body: bytes) -> None:
        with self._lock:
            future = self._pending.pop(properties.correlation_id or "", None)
            if future is None:
                self.unmatched_replies += 1
                return
        future.headers = dict(properties.headers or {})
        future.set_result(decode_answer(body))
