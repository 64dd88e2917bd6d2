"""What `python -m training` hands to the build, without building."""

from __future__ import annotations

import pytest


def config_from_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]):
    """The TrainConfig that `python -m training ARGV` passes to build_artifacts; the build is stopped at once
    (a ValueError, which the CLI reports with exit 1)."""
    from training import build
    from training.__main__ import main

    seen = []

    def fake_build(data, out, config, *args, **kwargs):
        seen.append(config)
        raise ValueError("stop here")

    monkeypatch.setattr(build, "build_artifacts", fake_build)
    assert main(argv) == 1
    (config,) = seen
    return config
