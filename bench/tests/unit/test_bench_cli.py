"""`python -m bench <subcommand>`: every benchmark module is reachable, the old forms still work."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import types

import pytest

from bench import __main__ as cli
from settings import REPO

#: Modules with a main() that are not benchmarks of their own: the LitServe and FastAPI peer servers bench.run launches.
NOT_SUBCOMMANDS = {"litserve_app", "fastapi_app"}


def modules_with_main() -> set[str]:
    found = set()
    for path in (REPO / "bench").glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.add(path.stem)
    return found - NOT_SUBCOMMANDS - {"__main__"}


def test_every_module_with_a_main_is_a_subcommand():
    assert {module.removeprefix("bench.") for module, _ in cli.SUBCOMMANDS.values()} == modules_with_main()


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ("run", [])),
    (["--quick", "--out", "x"], ("run", ["--quick", "--out", "x"])),
    (["run", "--quick"], ("run", ["--quick"])),
    (["client-batch", "--images", "8"], ("client-batch", ["--images", "8"])),
    (["client_batch"], ("client-batch", [])),
    (["soak", "--duration-s", "3"], ("soak", ["--duration-s", "3"])),
])
def test_arguments_go_to_the_subcommand_they_name_or_to_run(argv, expected):
    assert cli.resolve(argv) == expected


def test_a_subcommand_runs_its_modules_main_with_the_rest_of_the_arguments(monkeypatch):
    seen = []
    module = types.ModuleType("fake_benchmark")
    module.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "fake_benchmark", module)
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", ("fake_benchmark", "a stand-in"))
    assert cli.main(["fake", "--x", "1"]) == 3
    assert seen == [["--x", "1"]]


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_each_subcommand_module_has_a_main(name):
    assert callable(importlib.import_module(cli.SUBCOMMANDS[name][0]).main)


def test_an_unknown_subcommand_lists_the_known_ones(capsys):
    assert cli.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown subcommand 'nope'" in err and all(name in err for name in cli.SUBCOMMANDS)


def test_help_from_the_command_line():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    top = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert top.returncode == 0 and all(name in top.stdout for name in cli.SUBCOMMANDS)
    soak = subprocess.run([sys.executable, "-m", "bench", "soak", "--help"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert soak.returncode == 0 and soak.stdout.startswith("usage: python -m bench soak"), soak.stderr
