"""The bridge worker: request queue -> TorchServe -> reply_to, acking only after a confirmed reply.

Threads: the connection thread owns the AMQP connection (pika is not thread-safe) and does every
publish, ack and nack; a pool of `prefetch` threads calls TorchServe, so up to `prefetch` requests
are in flight per bridge and TorchServe can batch them. Results travel back to the connection thread
with `add_callback_threadsafe`.

Delivery guarantees: a request is acked only after its reply is confirmed by the broker (publisher
confirms), so a bridge that dies loses nothing: the broker redelivers its unacked requests to another
bridge, and the caller may then get a second answer for the same correlation id, which QueueClient
ignores. Transient failures are nacked back onto the queue after a backoff; the attempt number is
the quorum queue's own `x-delivery-count`, and at `max_attempts` the bridge answers 503 and rejects the
request into the dead-letter queue.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from handler.requests import RequestError

from .model_backend import Outcome
from .protocol import encode_answer, error_answer, image_from_message
from .broker import DEFAULT_QUEUE, DEFAULT_URL, Topology, connect

log = logging.getLogger(__name__)

Backend = Callable[[bytes], Outcome]


@dataclass(frozen=True)
class BridgeSettings:
    url: str = DEFAULT_URL
    queue: str = DEFAULT_QUEUE
    prefetch: int = 8
    max_attempts: int = 5
    retry_delay: float = 0.5  # seconds before the 2nd attempt; doubles per attempt, capped
    max_retry_delay: float = 10.0
    shutdown_timeout: float = 30.0
    reconnect_delay: float = 1.0  # doubles while the broker stays unreachable, up to 30 s

    def __post_init__(self) -> None:
        if self.prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if not 1 <= self.max_attempts <= Topology().delivery_limit:
            raise ValueError(f"max_attempts must be between 1 and {Topology().delivery_limit}")

    def backoff(self, attempt: int) -> float:
        return min(self.retry_delay * 2 ** (attempt - 1), self.max_retry_delay)


@dataclass
class _Delivery:
    channel: BlockingChannel
    tag: int
    properties: BasicProperties
    attempt: int


class BridgeError(Exception):
    """A setup problem that retrying cannot fix (the queue exists with other arguments, no access)."""


class Bridge:
    """Consumes the request queue until `request_stop()`; reconnects when the broker goes away."""

    def __init__(self, settings: BridgeSettings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self.topology = Topology(settings.queue)
        self.name = f"bridge-{socket.gethostname()}-{os.getpid()}"
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(settings.prefetch, thread_name_prefix="torchserve")
        self._in_flight = 0
        self._consumed = False  # whether the last connection got as far as consuming
        self.answered = 0

    def request_stop(self) -> None:
        """Stop taking requests, finish the ones in flight, then return from `run` (signal-safe)."""
        self._stop.set()

    def run(self) -> None:
        delay = self.settings.reconnect_delay
        try:
            while not self._stop.is_set():
                try:
                    self._serve_connection()
                except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError,
                        pika.exceptions.AuthenticationError) as exc:
                    raise BridgeError(f"broker refused the login: {exc!r}") from None
                except pika.exceptions.AMQPError as exc:
                    if self._stop.is_set():
                        break
                    delay = self.settings.reconnect_delay if self._consumed else min(2 * delay, 30.0)
                    log.warning("no broker connection (%.200r); retrying in %.0fs", exc, delay)
                    self._stop.wait(delay)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _serve_connection(self) -> None:
        self._consumed = False
        connection = connect(self.settings.url, self.name)
        self._in_flight = 0
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=self.settings.prefetch)
            try:
                self.topology.declare(channel)
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise BridgeError(f"cannot declare {self.settings.queue}: {exc.reply_text}") from None
            tag = channel.basic_consume(self.settings.queue, self._on_request)
            self._consumed = True
            log.info("%s consuming %s (prefetch %d, max %d attempts)", self.name, self.settings.queue,
                     self.settings.prefetch, self.settings.max_attempts)
            while not self._stop.is_set():
                connection.process_data_events(time_limit=0.25)
            channel.basic_cancel(tag)
            deadline = time.monotonic() + self.settings.shutdown_timeout
            while self._in_flight and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.1)
            if self._in_flight:
                log.warning("%d requests still in flight after %.0fs; the broker will redeliver them",
                            self._in_flight, self.settings.shutdown_timeout)
            log.info("%s stopped after %d answers", self.name, self.answered)
        finally:
            if connection.is_open:
                connection.close()

    def _on_request(self, channel: BlockingChannel, method: Basic.Deliver, properties: BasicProperties,
                    body: bytes) -> None:
        headers = properties.headers or {}
        delivery = _Delivery(channel, method.delivery_tag, properties, int(headers.get("x-delivery-count", 0)) + 1)
        self._in_flight += 1
        try:
            image = image_from_message(body, properties.content_type)
        except RequestError as exc:
            self._finish(delivery, Outcome(answer=error_answer(str(exc), exc.status)))
            return
        future = self._pool.submit(self._call, image, delivery.attempt)
        future.add_done_callback(partial(self._hand_back, channel.connection, delivery))

    def _call(self, image: bytes, attempt: int) -> Outcome:
        outcome = self.backend(image)
        if outcome.retry is not None and attempt < self.settings.max_attempts:
            self._stop.wait(self.settings.backoff(attempt))  # cut short by a shutdown
        return outcome

    def _hand_back(self, connection: pika.BlockingConnection, delivery: _Delivery,
                   future: Future[Outcome]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        outcome = Outcome(retry=f"bridge error: {exc!r}") if exc else future.result()
        try:
            connection.add_callback_threadsafe(partial(self._finish, delivery, outcome))
        except pika.exceptions.AMQPError as err:
            # That connection is gone; the broker redelivers the request, so dropping the result is safe.
            log.info("result for a closed connection dropped (%r)", err)

    def _finish(self, delivery: _Delivery, outcome: Outcome) -> None:
        """On the connection thread: reply and ack, or requeue, or dead-letter."""
        self._in_flight -= 1
        channel = delivery.channel
        if not channel.is_open:
            return
        if outcome.answer is not None:
            if self._reply(delivery, outcome.answer):
                channel.basic_ack(delivery.tag)
                self.answered += 1
            else:
                channel.basic_nack(delivery.tag, requeue=True)
            return
        if delivery.attempt < self.settings.max_attempts:
            log.info("request %s attempt %d failed (%s); requeued", delivery.properties.correlation_id,
                     delivery.attempt, outcome.retry)
            channel.basic_nack(delivery.tag, requeue=True)
            return
        log.warning("request %s failed %d times (%s); moved to %s", delivery.properties.correlation_id,
                    delivery.attempt, outcome.retry, self.topology.dead_letter_queue)
        answer = error_answer(f"gave up after {delivery.attempt} attempts: {outcome.retry}; the request is "
                              f"kept in the dead-letter queue {self.topology.dead_letter_queue}", 503)
        self._reply(delivery, answer)
        channel.basic_reject(delivery.tag, requeue=False)

    def _reply(self, delivery: _Delivery, answer: dict[str, Any]) -> bool:
        """Publish the answer to reply_to and wait for the broker's confirm; False if it refused it."""
        reply_to = delivery.properties.reply_to
        if not reply_to:
            log.warning("request %s has no reply_to; answer dropped", delivery.properties.correlation_id)
            return True
        properties = BasicProperties(content_type="application/json", correlation_id=delivery.properties.correlation_id,
                                     headers={"attempt": delivery.attempt, "bridge": self.name})
        try:
            delivery.channel.basic_publish("", reply_to, encode_answer(answer), properties, mandatory=True)
        except pika.exceptions.UnroutableError:
            log.info("reply queue %s is gone (caller left); answer dropped", reply_to)
        except pika.exceptions.NackError:
            log.warning("broker refused the reply to %s; request requeued", reply_to)
            return False
        return True
