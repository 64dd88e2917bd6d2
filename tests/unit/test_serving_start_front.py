"""`python -m serving start` puts serving/front.py before TorchServe unless --no-front says otherwise."""

from __future__ import annotations

import pytest

import serving.__main__ as cli
from serving.server import Instance


@pytest.mark.parametrize("argv, front", [([], True), (["--no-front"], False)])
def test_the_front_is_on_unless_told_not_to(monkeypatch, capsys, argv, front):
    seen = {}
    monkeypatch.setattr(cli, "start", lambda instance, store, models, timeout, front: seen.update(front=front) or 1.0)
    args = cli._parser().parse_args(["start", *argv])
    args.mar = []
    assert cli._start(args, Instance()) == 0 and seen == {"front": front}
    assert "READY in 1.0s" in capsys.readouterr().out
