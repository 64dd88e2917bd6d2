"""bench/pyproject.toml and requirements/bench.lock agree: the lock pins what the package names, and nothing else
than those packages and what they need."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.requirements import Requirement

from settings import REPO


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[canonical(name)] = version
    return out


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "bench" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "mnist-embedding-bench"
    return [Requirement(spec) for spec in project["dependencies"]]


def needed_by(roots: list[Requirement]) -> set[str]:
    """The installed distributions `roots` need, themselves included (from their installed metadata)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        req = todo.pop()
        if canonical(req.name) in seen:
            continue
        seen.add(canonical(req.name))
        for spec in importlib.metadata.distribution(req.name).requires or []:
            dep = Requirement(spec)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}) or any(
                    dep.marker.evaluate({"extra": extra}) for extra in req.extras):
                todo.append(dep)
    return seen


def test_each_declared_dependency_is_pinned_alike_in_the_lock():
    lock = pins(REPO / "requirements/bench.lock")
    for req in declared():
        (spec,) = req.specifier
        assert spec.operator == "==", f"{req}: bench/pyproject.toml pins exactly"
        assert lock.get(canonical(req.name)) == spec.version, f"{req} vs requirements/bench.lock"


def test_the_lock_holds_only_what_the_declared_dependencies_need():
    lock = pins(REPO / "requirements/bench.lock")
    product = pins(REPO / "requirements/product.lock")
    assert set(lock) <= needed_by(declared())
    assert needed_by(declared()) <= set(lock) | set(product)
    for name, version in lock.items():
        assert importlib.metadata.version(name) == version, f"{name}: installed is not the lock's"
