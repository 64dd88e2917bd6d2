"""serving.gateway.auth: the key in its own header beside a gateway's JWT, or as the bearer value."""

from __future__ import annotations

import pytest

from serving.gateway.auth import key_matches, presented_key

KEY = "k" * 32


def headers(*pairs: tuple[str, str]):
    return lambda name: [value for key, value in pairs if key.lower() == name]


@pytest.mark.parametrize("pairs, presented", [
    ((("X-API-Key", KEY),), KEY),
    ((("x-api-key", f"  {KEY} "),), KEY),
    ((("X-API-Key", KEY), ("Authorization", "Bearer eyJ.kubeflow.jwt")), KEY),  # behind Kubeflow's ingress
    ((("Authorization", f"Bearer {KEY}"),), KEY),
    ((("Authorization", f"bearer {KEY}"),), KEY),
    ((("X-API-Key", "wrong"), ("Authorization", f"Bearer {KEY}")), "wrong"),  # the own header wins
    ((("Authorization", KEY),), None),
    ((("Authorization", f"Basic {KEY}"),), None),
    ((("X-API-Key", KEY), ("X-API-Key", KEY)), None),
    ((("Authorization", f"Bearer {KEY}"), ("Authorization", f"Bearer {KEY}")), None),
    ((), None),
])
def test_the_presented_key(pairs, presented):
    assert presented_key(headers(*pairs)) == presented


@pytest.mark.parametrize("presented, matches", [(KEY, True), ("wrong", False), ("", False), (None, False)])
def test_the_key_matches_only_itself(presented, matches):
    assert key_matches(presented, KEY.encode()) is matches


def test_the_client_sends_what_the_gateway_reads():
    """torchserve_api.tokens.Token (the client's) and presented_key (the server's) agree, with and without a
    gateway's JWT, for REST headers and gRPC metadata."""
    from torchserve_api.tokens import Token

    for token in (Token(KEY), Token(KEY, gateway="eyJ.kubeflow.jwt")):
        assert presented_key(headers(*token.header().items())) == KEY
        assert presented_key(lambda name: [v for k, v in token.metadata() if k == name]) == KEY
    assert Token(KEY, gateway="eyJ.kubeflow.jwt").header()["Authorization"] == "Bearer eyJ.kubeflow.jwt"


def test_the_cli_takes_the_gateway_token_from_its_flag_or_the_environment(monkeypatch):
    from client import tokens

    assert tokens.resolve(token=KEY, gateway="jwt").header() == {"Authorization": "Bearer jwt", "X-API-Key": KEY}
    assert tokens.resolve(token=KEY, env={tokens.GATEWAY_ENV: "jwt"}).gateway == "jwt"
    assert tokens.resolve(token=KEY, env={}).header() == {"Authorization": f"Bearer {KEY}"}
