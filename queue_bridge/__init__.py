"""Queue-based inference: RPC over RabbitMQ in front of the TorchServe embedding model.

A client publishes an image to a durable request queue with `reply_to` and `correlation_id`; one of
any number of bridge workers (`python -m queue_bridge serve`) calls TorchServe and publishes the JSON
answer to `reply_to`, acking the request only once the broker has confirmed the reply.
"""

from .client import QueueClient, ReplyFuture
from .broker import DEFAULT_QUEUE, DEFAULT_URL, Topology

__all__ = ["DEFAULT_QUEUE", "DEFAULT_URL", "QueueClient", "ReplyFuture", "Topology"]
