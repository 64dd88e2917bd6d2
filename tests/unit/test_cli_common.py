"""cli_common.Parser: options of a command are accepted before and after its subcommand, and a token that starts
with "-" is a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_common import Parser


def _parser() -> Parser:
    p = Parser(prog="tool")
    p.add_argument("--config", type=Path, default=Path("config.properties"))
    p.add_argument("--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start")
    start.add_argument("--timeout", type=float, default=5.0)
    start.add_argument("--token")
    own = sub.add_parser("own")
    own.add_argument("--config", default="own-default")
    return p


@pytest.mark.parametrize("argv", [["start", "--token", "-ACLndlw"], ["start", "--token=-ACLndlw"],
                                  ["start", "--token", "-ACLndlw", "--timeout", "2"]])
def test_a_token_that_starts_with_a_dash_is_taken_as_the_token(argv):
    """TorchServe's keys are URL-safe base64: one in 64 starts with "-" (a CI run drew one)."""
    assert _parser().parse_args(argv).token == "-ACLndlw"


@pytest.mark.parametrize("argv", [["start", "--token", "--timeout", "2"], ["start", "--token"]])
def test_a_missing_token_is_still_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2 and "--token: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--config", "x.properties", "start"], ["start", "--config", "x.properties"]])
def test_an_option_is_accepted_before_or_after_the_subcommand(argv):
    args = _parser().parse_args(argv)
    assert args.config == Path("x.properties") and args.command == "start" and args.timeout == 5.0


def test_defaults_hold_when_the_option_is_not_given():
    args = _parser().parse_args(["start"])
    assert args.config == Path("config.properties") and args.verbose is False


def test_after_the_subcommand_wins_and_flags_work_there():
    args = _parser().parse_args(["--config", "a", "start", "--config", "b", "--verbose"])
    assert args.config == Path("b") and args.verbose is True


def test_a_subcommand_keeps_its_own_option_of_the_same_name():
    assert _parser().parse_args(["own"]).config == "own-default"


def test_an_unknown_option_after_the_subcommand_is_still_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["start", "--nope"])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_serving_and_queue_bridge_take_their_options_after_the_subcommand():
    from queue_bridge.__main__ import _parser as queue_parser
    from serving.__main__ import _parser as serving_parser

    args = serving_parser().parse_args(["stop", "--config", "x.properties", "--workdir", "w"])
    assert (args.config, args.workdir) == (Path("x.properties"), Path("w"))
    assert queue_parser().parse_args(["purge", "--queue", "q"]).queue == "q"
