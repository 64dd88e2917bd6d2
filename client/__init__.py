"""Client for the served embedding model: TorchServe REST and gRPC, KServe v1/v2, model versions.

    from client import EmbeddingClient
    with EmbeddingClient(token="...") as c:          # REST on the config.properties address
        answer = c.predict("samples/digit_7.png")     # handler.answer.Answer's JSON: pred, dist, ...

See client/README.md for the CLI (python -m client), exit codes and the lifecycle commands.
"""

from .api import EmbeddingClient
from .errors import (
                     AuthError,
                     BadImageError,
                     ClientError,
                     ConnectionFailed,
                     LifecycleError,
                     ModelNotFoundError,
                     RequestTimeout,
                     ServerError,
                     UsageError,
)
from .lifecycle import ManagementClient

__all__ = ["EmbeddingClient", "ManagementClient", "ClientError", "AuthError", "BadImageError", "ConnectionFailed",
           "LifecycleError", "ModelNotFoundError", "RequestTimeout", "ServerError", "UsageError"]
