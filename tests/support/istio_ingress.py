"""A stand-in for Kubeflow's Istio ingress gateway, on loopback, in front of a real serving container.

It applies what kubeflow/manifests v1.9.1 (and 1.10.x, unchanged there) installs on ``istio-ingressgateway``, as
Envoy's jwt_authn and RBAC filters apply it:

- RequestAuthentication ``dex-jwt`` (``common/oauth2-proxy/components/istio-external-auth/
  requestauthentication.dex-jwt.yaml``) and ``m2m-token-issuer`` (``components/istio-m2m/requestauthentication.yaml``,
  its issuer patched to the cluster's service-account issuer): a JWT is read from ``Authorization`` with the prefix
  ``Bearer `` only (``fromHeaders``). A request that carries one must verify against its issuer's JWKS, fetched
  over HTTP from the ``jwksUri`` (here a loopback server publishing real RSA keys, :class:`Issuer`), else 401 with
  the message of google/jwt_verify_lib ``src/status.cc`` ``getStatusString`` (what Envoy answers). A verified token
  is forwarded unchanged (``forwardOriginalToken: true``), makes the request principal ``<iss>/<sub>``, and sets
  ``outputClaimToHeaders`` (``kubeflow-userid`` from ``email`` for dex, ``sub`` for m2m; ``kubeflow-groups``),
  replacing what the client sent under those names.
- AuthorizationPolicy ``istio-ingressgateway-require-jwt`` (DENY ``notRequestPrincipals: ["*"]`` outside
  ``/dex/*`` and ``/oauth2/*``): a request without a verified JWT gets 403 ``RBAC: access denied``.

gRPC (HTTP/2) gets the same checks on its ``authorization`` metadata (:func:`kubeflow_grpc_ingress`, a grpcio
proxy that passes each unary call on as bytes). Envoy answers a refused gRPC request with a gRPC status instead of
an HTTP one, mapped by ``Grpc::Utility::httpToGrpcStatus`` (envoyproxy/envoy source/common/grpc/status.cc): 401
UNAUTHENTICATED, 403 PERMISSION_DENIED, the message as grpc-message.

Not emulated: the ``istio-ingressgateway-oauth2-proxy`` CUSTOM policy, which sends a browser without an
``Authorization`` header to oauth2-proxy's login (such a request ends in the 403 here), Dex itself, and the
VirtualService routing by host (every path goes to the one upstream).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

DEX_ISSUER = "http://dex.auth.svc.cluster.local:5556/dex"
#: What Kubeflow's m2m overlays patch PATCH_ME to on most clusters (the service-account token issuer).
M2M_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: outputClaimToHeaders of each RequestAuthentication: (header, claim).
CLAIM_HEADERS = {DEX_ISSUER: (("kubeflow-userid", "email"), ("kubeflow-groups", "groups")),
                 M2M_ISSUER: (("kubeflow-userid", "sub"), ("kubeflow-groups", "groups"))}
OPEN_PREFIXES = ("/dex/", "/oauth2/")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailers", "transfer-encoding", "upgrade",
              "host", "content-length"}
# google/jwt_verify_lib src/status.cc
BAD_FORMAT = "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
UNKNOWN_ISSUER = "Jwt issuer is not configured"
NO_MATCHING_KEY = "Jwks doesn't have key to match kid or alg from Jwt"
VERIFICATION_FAILS = "Jwt verification fails"
EXPIRED = "Jwt is expired"
MULTIPLE = "Found multiple Jwt tokens"
DENIED = "RBAC: access denied"


@dataclass
class Issuer:
    """An OIDC issuer's signing key and the JWKS it publishes."""

    name: str
    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(public_exponent=65537,
                                                                                     key_size=2048))

    def jwks(self) -> dict:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def token(self, sub: str, lifetime_s: float = 600, **claims: object) -> str:
        now = int(time.time())
        payload = {"iss": self.name, "sub": sub, "aud": "kubeflow-oidc-authservice", "iat": now,
                   "exp": now + int(lifetime_s), **claims}
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": self.kid})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *_: object) -> None:
        pass

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.jwks is not None:  # the issuers' JWKS endpoint
            issuer = self.server.jwks.get(self.path)
            if issuer is None:
                self._reply(404, b"", [])
            else:
                self._reply(200, json.dumps(issuer.jwks()).encode(), [("Content-Type", "application/json")])
            return
        ingress = self.server.ingress
        assert ingress is not None
        refusal, principal_headers = ingress.authenticate(self.headers.get_all("Authorization") or [])
        if refusal is not None:
            realm = f"http://{self.headers.get('Host', '')}{self.path}"
            challenge = f'Bearer realm="{realm}", error="invalid_token"'
            self._reply(401, refusal.encode(), [("Content-Type", "text/plain"), ("www-authenticate", challenge)])
            return
        if principal_headers is None and not self.path.startswith(OPEN_PREFIXES):
            self._reply(403, DENIED.encode(), [("Content-Type", "text/plain")])
            return
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP
                   and k.lower() not in ("kubeflow-userid", "kubeflow-groups")]
        headers += list((principal_headers or {}).items())
        status, answer, answer_headers = ingress.forward(self.command, self.path, body, headers)
        self._reply(status, answer, answer_headers)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ingress: "IstioIngress | None", jwks: dict[str, Issuer] | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ingress, self.jwks = ingress, jwks


class IstioIngress:
    """The gateway: `upstream` is the predictor's URL; `issuers` those its RequestAuthentications trust."""

    def __init__(self, upstream: str, issuers: list[Issuer], jwks_base: str) -> None:
        self.upstream = urlsplit(upstream)
        self.issuers = {issuer.name: issuer for issuer in issuers}
        self.clients = {issuer.name: jwt.PyJWKClient(f"{jwks_base}/{uuid.uuid5(uuid.NAMESPACE_URL, issuer.name)}")
                        for issuer in issuers}

    def authenticate(self, authorization: list[str]) -> tuple[str | None, dict[str, str] | None]:
        """(refusal, None) for a bad token; (None, the claim headers) for a verified one; (None, None) for none."""
        tokens = [value[len("Bearer "):] for value in authorization if value.startswith("Bearer ")]
        if not tokens:
            return None, None
        if len(tokens) > 1:
            return MULTIPLE, None
        token = tokens[0]
        if token.count(".") != 2:
            return BAD_FORMAT, None
        try:
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.DecodeError:
            return BAD_FORMAT, None
        if issuer not in self.issuers:
            return UNKNOWN_ISSUER, None
        try:
            key = self.clients[issuer].get_signing_key_from_jwt(token)
        except jwt.PyJWKClientError:
            return NO_MATCHING_KEY, None
        try:
            claims = jwt.decode(token, key.key, algorithms=["RS256"], issuer=issuer, options={"verify_aud": False})
        except jwt.ExpiredSignatureError:
            return EXPIRED, None
        except jwt.InvalidTokenError:
            return VERIFICATION_FAILS, None
        out = {}
        for header, claim in CLAIM_HEADERS[issuer]:
            value = claims.get(claim)
            if value is not None:
                out[header] = ",".join(value) if isinstance(value, list) else str(value)
        return None, out

    def forward(self, method: str, path: str, body: bytes,
                headers: list[tuple[str, str]]) -> tuple[int, bytes, list[tuple[str, str]]]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            connection.putrequest(method, path, skip_accept_encoding=True)
            for name, value in headers:
                connection.putheader(name, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            answer = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            return response.status, answer, kept
        finally:
            connection.close()


@contextmanager
def _issuers() -> Iterator[tuple[Issuer, Issuer, str]]:
    """The dex and service-account issuers and the base URL of their JWKS, served until the block ends."""
    dex, m2m = Issuer(DEX_ISSUER), Issuer(M2M_ISSUER)
    jwks = _Server(None, {f"/{uuid.uuid5(uuid.NAMESPACE_URL, i.name)}": i for i in (dex, m2m)})
    threading.Thread(target=jwks.serve_forever, daemon=True).start()
    try:
        yield dex, m2m, f"http://127.0.0.1:{jwks.server_address[1]}"
    finally:
        jwks.shutdown()
        jwks.server_close()


@contextmanager
def kubeflow_ingress(upstream: str) -> Iterator[tuple[str, Issuer, Issuer]]:
    """(the ingress URL, the dex issuer, the cluster's service-account issuer), served until the block ends."""
    with _issuers() as (dex, m2m, jwks_base):
        ingress = _Server(IstioIngress(upstream, [dex, m2m], jwks_base), None)
        threading.Thread(target=ingress.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{ingress.server_address[1]}", dex, m2m
        finally:
            ingress.shutdown()
            ingress.server_close()


class _GrpcIngress(grpc.GenericRpcHandler):
    """Every unary call: the gateway's checks on `authorization`, then the call as bytes to the upstream channel."""

    def __init__(self, ingress: IstioIngress, channel: grpc.Channel) -> None:
        self.ingress, self.channel = ingress, channel

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        metadata = list(details.invocation_metadata or ())

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            refusal, claims = self.ingress.authenticate([v for k, v in metadata if k == "authorization"])
            if refusal is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
            if claims is None:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, DENIED)
            passed = [(k, v) for k, v in metadata if k not in ("kubeflow-userid", "kubeflow-groups", "user-agent")
                      and not k.startswith(("grpc-", ":"))]
            try:
                return self.channel.unary_unary(details.method)(request, metadata=passed + list(claims.items()),
                                                                timeout=120)
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details())

        return grpc.unary_unary_rpc_method_handler(handle)


@contextmanager
def kubeflow_grpc_ingress(upstream: str) -> Iterator[tuple[str, Issuer, Issuer]]:
    """The gRPC side of :func:`kubeflow_ingress` in front of `upstream` (host:port): (its host:port, dex, m2m)."""
    with _issuers() as (dex, m2m, jwks_base), grpc.insecure_channel(upstream) as channel:
        server = grpc.server(ThreadPoolExecutor(8), options=[("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers((_GrpcIngress(IstioIngress(f"http://{upstream}", [dex, m2m], jwks_base),
                                                      channel),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}", dex, m2m
        finally:
            server.stop(grace=None)
