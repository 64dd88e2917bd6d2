"""Where a caller puts the serving key, for REST (the gateway, nginx's front.lua mirrors it) and gRPC.

Behind Kubeflow's Istio ingress the ``Authorization`` header is not the caller's to use: Kubeflow's
RequestAuthentications (``dex-jwt`` and ``m2m-token-issuer``, kubeflow/manifests v1.9.1
``common/oauth2-proxy/components/istio-external-auth/requestauthentication.dex-jwt.yaml`` and
``components/istio-m2m/requestauthentication.yaml``, ``fromHeaders: Authorization``, prefix ``Bearer ``) reject any
bearer value that is not one of their JWTs, and forward a valid one (``forwardOriginalToken: true``). So the key has
a header of its own, :data:`API_KEY_HEADER`, which wins when present; ``Authorization: Bearer <key>`` still works
where no gateway reads that header (in-cluster, port-forward, the local runtimes).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

#: The header (REST) and metadata key (gRPC, lower case) that carry the serving key beside a gateway's JWT. The
#: serving image holds no client code, so the client's torchserve_api.tokens names it too;
#: tests/unit/test_gateway_auth.py checks that what the client sends is what this module reads.
API_KEY_HEADER = "X-API-Key"
REST_REFUSAL = "missing or wrong API key: send X-API-Key: <key>, or Authorization: Bearer <key> without a gateway"
GRPC_REFUSAL = ("missing or wrong API key: send the metadata x-api-key: <key>, or authorization: Bearer <key> "
                "without a gateway")


def presented_key(values: Callable[[str], list[str]]) -> str | None:
    """The key a request presents: its one X-API-Key value if it sends that header, else the Bearer value of its
    one Authorization header; None when neither holds exactly one usable value. `values(name)` lists a header's
    (or metadata key's) values, its name lower case."""
    own = values(API_KEY_HEADER.lower())
    if own:
        return own[0].strip() if len(own) == 1 else None
    authorization = values("authorization")
    if len(authorization) != 1:
        return None
    scheme, _, key = authorization[0].partition(" ")
    return key.strip() if scheme.lower() == "bearer" else None


def key_matches(presented: str | None, expected: bytes) -> bool:
    """Compared without an early exit."""
    return presented is not None and hmac.compare_digest(presented.encode(), expected)
