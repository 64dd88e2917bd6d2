"""The broker: connection settings, the connection itself and the queue topology shared by the bridge, the client
and the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pika
from pika.adapters.blocking_connection import BlockingChannel

from settings import max_request_size

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_QUEUE = "embedding.requests"
#: Broker-side cap on deliveries of one request. The bridge gives up earlier (`--max-attempts`) on
#: failures it sees; this limit catches what it cannot see: a request that kills the bridge each time.
DELIVERY_LIMIT = 20
#: Largest request body accepted: TorchServe's max_request_size, from config.properties.
MAX_BODY_BYTES = max_request_size()


def amqp_url(value: str | None = None) -> str:
    """`value`, else $EMBEDDING_AMQP_URL, else the local default broker."""
    return value or os.environ.get("EMBEDDING_AMQP_URL") or DEFAULT_URL


def queue_name(value: str | None = None) -> str:
    """`value`, else $EMBEDDING_QUEUE, else embedding.requests."""
    return value or os.environ.get("EMBEDDING_QUEUE") or DEFAULT_QUEUE


def connect(url: str, name: str) -> pika.BlockingConnection:
    """A blocking AMQP connection labelled `name` in the broker's connection list."""
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


@dataclass(frozen=True)
class Topology:
    """The request queue, its dead-letter exchange and the dead-letter queue behind it.

    The request queue is a quorum queue: replicated and durable, and it counts deliveries itself
    (`x-delivery-count`, including redeliveries after a consumer died), so the retry count survives
    bridge crashes and `x-delivery-limit` dead-letters a request that crashes every bridge. Dead
    lettering is at-least-once, so a request is never dropped between the two queues.
    """

    queue: str = DEFAULT_QUEUE
    delivery_limit: int = DELIVERY_LIMIT

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.queue}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dead"

    def request_queue_arguments(self) -> dict[str, object]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # required by at-least-once dead lettering
        }

    def declare(self, channel: BlockingChannel) -> int:
        """Declare everything (idempotent); returns the number of requests waiting."""
        channel.exchange_declare(self.dead_letter_exchange, "fanout", durable=True)
        channel.queue_declare(self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(self.dead_letter_queue, self.dead_letter_exchange)
        ok = channel.queue_declare(self.queue, durable=True, arguments=self.request_queue_arguments())
        return ok.method.message_count
