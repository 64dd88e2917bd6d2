"""The Kubeflow ingress stand-in (support.istio_ingress) against an echo upstream: each RequestAuthentication and
AuthorizationPolicy outcome, with Envoy's own messages (google/jwt_verify_lib src/status.cc)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.istio_ingress import (BAD_FORMAT, DENIED, EXPIRED, M2M_ISSUER, NO_MATCHING_KEY, UNKNOWN_ISSUER,
                                   VERIFICATION_FAILS, Issuer, kubeflow_ingress)


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = json.dumps({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body.decode(),
                             "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture(scope="module")
def ingress():
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with kubeflow_ingress(f"http://127.0.0.1:{upstream.server_address[1]}") as served:
            yield served
    finally:
        upstream.shutdown()
        upstream.server_close()


def send(url: str, headers: dict[str, str], path: str = "/predictions/embedding") -> tuple[int, bytes]:
    request = urllib.request.Request(url + path, data=b"digit", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_a_user_token_reaches_the_pod_with_its_claims_and_the_key_header(ingress):
    url, dex, _ = ingress
    token = dex.token("CgR1c2VyEgVsb2NhbA", email="user@example.com", groups=["team-a", "team-b"])
    status, body = send(url, {"Authorization": f"Bearer {token}", "X-API-Key": "k", "kubeflow-userid": "admin"})
    got = json.loads(body)
    assert status == 200 and got["body"] == "digit" and got["path"] == "/predictions/embedding"
    assert got["headers"]["authorization"] == f"Bearer {token}"  # forwardOriginalToken: true
    assert got["headers"]["x-api-key"] == "k"
    assert got["headers"]["kubeflow-userid"] == "user@example.com"  # the client's own value replaced
    assert got["headers"]["kubeflow-groups"] == "team-a,team-b"


def test_a_service_account_token_passes_as_its_subject(ingress):
    url, _, m2m = ingress
    token = m2m.token("system:serviceaccount:kubeflow-user:default-editor")
    status, body = send(url, {"Authorization": f"Bearer {token}"})
    assert status == 200
    assert json.loads(body)["headers"]["kubeflow-userid"] == "system:serviceaccount:kubeflow-user:default-editor"


@pytest.mark.parametrize("case, message", [
    ("the serving key as bearer", BAD_FORMAT),
    ("an unknown issuer", UNKNOWN_ISSUER),
    ("an unknown key id", NO_MATCHING_KEY),
    ("a forged signature", VERIFICATION_FAILS),
    ("an expired token", EXPIRED),
])
def test_a_bearer_value_that_is_no_valid_jwt_is_refused_before_the_pod(ingress, case, message):
    url, dex, _ = ingress
    forger = Issuer(dex.name, kid=dex.kid)  # same issuer and key id, another private key
    token = {"the serving key as bearer": "k" * 32,
             "an unknown issuer": Issuer("https://accounts.example.com").token("u"),
             "an unknown key id": Issuer(M2M_ISSUER).token("u"),
             "a forged signature": forger.token("u", email="u@example.com"),
             "an expired token": dex.token("u", lifetime_s=-60, email="u@example.com")}[case]
    status, body = send(url, {"Authorization": f"Bearer {token}"})
    assert (status, body.decode()) == (401, message)


def test_without_a_token_the_require_jwt_policy_denies(ingress):
    url, _, _ = ingress
    assert send(url, {"X-API-Key": "k"}) == (403, DENIED.encode())
    assert send(url, {"Authorization": "Basic dXNlcjpwYXNz"}) == (403, DENIED.encode())  # not read as a JWT
    assert send(url, {}, path="/dex/auth")[0] == 200  # the policy's notPaths
