"""Open Inference gRPC (KServe's ``grpc-v2``) beside the gateway's REST, in the same event loop: the servicer of
:mod:`serving.grpc_v2` answering through the same :class:`~serving.gateway.app.Gateway` (key, checks, backend).

grpcio and the generated stubs are imported only here, once gRPC starts: a missing stub is a reason not to
serve gRPC, never one not to serve REST.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("kserve_runtime")


class GrpcStartError(Exception):
    """The gRPC server could not be started (one-line reason)."""


async def start_grpc(gateway: Any, host: str, port: int, required: bool, reuse_port: bool = False) -> Any:
    """The started grpc.aio server, or None when it cannot start and `required` is false (REST is served alone).

    Without `reuse_port` a port another process holds is an error (grpc_v2.server turns SO_REUSEPORT off); with it
    the python runtime's workers share the port.
    """
    try:
        from serving import grpc_v2

        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        size = gateway.backend.max_request_size
        grpc_server, _ = grpc_v2.server(gateway, address, size, reuse_port)
        await grpc_server.start()
        return grpc_server
    except Exception as exc:  # missing stubs (StubError), a taken port (RuntimeError), ...
        reason = f"Open Inference gRPC cannot be served on port {port}: {exc}"
        if required:
            raise GrpcStartError(reason) from None
        logger.error("%s; serving REST only", reason)
        return None
