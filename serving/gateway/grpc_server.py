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


def _reuse_port_server(gateway: Any, address: str, max_message_bytes: int) -> Any:
    """grpc_v2.server with SO_REUSEPORT on: several processes serve one port, the kernel spreads connections."""
    import grpc

    from serving import grpc_v2

    interceptors = [grpc_v2.BearerKeyInterceptor(gateway.api_key)] if gateway.api_key is not None else []
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.so_reuseport", 1),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
    ])
    grpc_v2.pb_grpc.add_GRPCInferenceServiceServicer_to_server(grpc_v2.InferenceServicer(gateway), server)
    server.add_insecure_port(address)
    return server


async def start_grpc(gateway: Any, host: str, port: int, required: bool, reuse_port: bool = False) -> Any:
    """The started grpc.aio server, or None when it cannot start and `required` is false (REST is served alone).

    Without `reuse_port` a port another process holds is an error (grpc_v2.server turns SO_REUSEPORT off).
    """
    try:
        from serving import grpc_v2

        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        size = gateway.backend.max_request_size
        grpc_server = (_reuse_port_server(gateway, address, size) if reuse_port
                       else grpc_v2.server(gateway, address, size)[0])
        await grpc_server.start()
        return grpc_server
    except Exception as exc:  # missing stubs (StubError), a taken port (RuntimeError), ...
        reason = f"Open Inference gRPC cannot be served on port {port}: {exc}"
        if required:
            raise GrpcStartError(reason) from None
        logger.error("%s; serving REST only", reason)
        return None
