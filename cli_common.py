"""What every command-line entry point of the project shares: one-line usage errors, help that shows each
option's default, and checks of input and output paths made before any slow work starts.

Exit status of every command: 0 done, 1 failed (one line on stderr says why), 2 usage error (a bad flag or
value, a missing or unusable path), 130 interrupted. python -m client adds its own codes (client/errors.py).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CODES = "exit status: 0 done, 1 failed, 2 usage error, 130 interrupted"
# Options whose value may start with "-": argparse would take `--token -ACLndlw` for a missing value followed by an
# unknown flag. TorchServe's keys are URL-safe base64, so one in 64 starts with "-".
DASH_VALUE_OPTIONS = ("--token",)


class UsageError(Exception):
    """An argument the command cannot run with (exit status 2); the message is one line. The project's one usage
    error: every command line catches it, and the client library's refusals of an argument
    (torchserve_api.errors.ClientUsageError) are of this class too."""

    exit_code = EXIT_USAGE


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's help ends with its default unless it already names one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False or default == argparse.SUPPRESS
                or default in ("", [], ()) or action.nargs == 0 or "default" in text.lower()):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


class Parser(argparse.ArgumentParser):
    """argparse with the project's conventions: a usage error is one line on stderr with exit status 2 (no
    usage block), and help shows defaults (HelpFormatter). Subcommand parsers are of this class too."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("allow_abbrev", False)  # one spelling per option: an old or shortened flag is refused
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        args = glue_dash_values(sys.argv[1:] if args is None else list(args), self._flags())
        self._share_options_with_subcommands()
        return super().parse_known_args(args, namespace)

    def _flags(self) -> set[str]:
        """Every option string of this parser and its subcommands'."""
        flags = set(self._option_string_actions)
        for group in self._actions:
            if isinstance(group, argparse._SubParsersAction):
                for sub in group.choices.values():
                    flags |= sub._flags() if isinstance(sub, Parser) else set(sub._option_string_actions)
        return flags

    def _share_options_with_subcommands(self) -> None:
        """An option of the command is also accepted after its subcommand (`serving start --config X`), where it
        wins over the same option given before; each subcommand's own options of the same name stay its own."""
        shared = [action for action in self._actions if action.option_strings
                  and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))]
        for group in self._actions:
            if not isinstance(group, argparse._SubParsersAction):
                continue
            for sub in {id(p): p for p in group.choices.values()}.values():
                if getattr(sub, "_shared_options", False):
                    continue
                for action in shared:
                    if not set(action.option_strings) & set(sub._option_string_actions):
                        clone = copy.copy(action)
                        clone.default = argparse.SUPPRESS
                        clone.required = False
                        sub._add_action(clone)
                sub._shared_options = True  # type: ignore[attr-defined]


def glue_dash_values(argv: list[str], flags: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """`argv` with each `OPTION VALUE` of DASH_VALUE_OPTIONS whose value starts with "-" (and is none of `flags`,
    the parser's own options: `--token --config X` stays a missing token) written `OPTION=VALUE`."""
    glued: list[str] = []
    for item in argv:
        if glued and glued[-1] in DASH_VALUE_OPTIONS and item.startswith("-") and item.split("=")[0] not in flags \
                and item != "--" and "--" not in glued:
            glued[-1] = f"{glued[-1]}={item}"
        else:
            glued.append(item)
    return glued


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(text).split())


def fail(prog: str, message: object, code: int = EXIT_FAILED) -> int:
    """Print `prog: error: message` on one line on stderr; returns `code` for the caller to exit with."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return code


def os_error(exc: OSError) -> str:
    """An OSError as `path: reason`, without the errno prefix."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, flag: str) -> None:
    """Whatever of `path` is missing can be created: its nearest existing ancestor is a writable folder."""
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        raise UsageError(f"{flag} {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {ancestor} is not writable")


def input_file(path: Path, flag: str) -> Path:
    """`path` if it is a readable file; UsageError naming `flag` otherwise."""
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such file")
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} {path}: not readable")
    return path


def input_dir(path: Path, flag: str) -> Path:
    """`path` if it is a folder; UsageError naming `flag` otherwise."""
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder")
    return path


def output_file(path: Path, flag: str) -> Path:
    """`path` if a file can be written there (it is not a folder; its folder exists or can be created)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: not writable")
    _check_creatable(path, flag)
    return path


def output_dir(path: Path, flag: str) -> Path:
    """`path` if it is a folder or one can be created there."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: not writable")
        return path
    _check_creatable(path, flag)
    return path


def _int_at_least(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "non-negative")


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


@dataclass(frozen=True)
class Param:
    """One parameter defined once for every command line and pipeline that takes it: its name (the flag is
    ``--name-with-dashes``), type, default, help, choices and a check returning the problem with a value, if any."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], str | None] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        """The command-line spellings: a one-letter name also has its short form (-k and --k)."""
        return ("-" + self.name, self.flag) if len(self.name) == 1 else (self.flag,)

    def parse(self, text: str) -> Any:
        """argparse type: the value of `text`, checked (ArgumentTypeError naming the problem)."""
        try:
            value = self.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.type.__name__}, got {text!r}") from None
        problem = self.check(value) if self.check else None
        if problem:
            raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
        return value


def add_params(parser: argparse.ArgumentParser | argparse._ArgumentGroup, params: tuple[Param, ...]) -> None:
    """One checked option per parameter (a bool is a switch)."""
    for p in params:
        if p.type is bool:
            parser.add_argument(*p.flags, dest=p.name, action="store_true", default=p.default, help=p.help)
        else:
            parser.add_argument(*p.flags, dest=p.name, type=p.parse, choices=p.choices, default=p.default,
                                help=p.help, metavar=None if p.choices else p.type.__name__.upper())


def positive(value: int) -> str | None:
    return None if value >= 1 else "must be a positive integer"


def finite(value: float) -> str | None:
    return None if math.isfinite(value) else "must be a finite number"


def positive_number(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a number > 0"


def non_negative_number(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else "must be a number >= 0"
