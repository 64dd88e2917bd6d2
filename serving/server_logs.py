"""What TorchServe's logs under an instance's workdir say about a start: why it failed, in one line.

TorchServe's launcher returns before the model loads, and a load failure is only logged; `serving.server.start`
reads these to end its wait at once with the cause.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol


class Instance(Protocol):
    """What is read of a serving.server.Instance: where its logs are."""

    @property
    def workdir(self) -> Path: ...

    @property
    def log_file(self) -> Path: ...

#: The start of a log4j record in TorchServe's logs; other lines continue the record above (a stack trace).
LOG_RECORD = re.compile(r"^\d{4}-\d{2}-\d{2}T")


def _log_tail(instance: Instance, lines: int = 400) -> str:
    texts = []
    for path in (instance.log_file, _ts_log(instance), _model_log(instance)):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join("\n".join(t.splitlines()[-lines:]) for t in texts)


def diagnose(instance: Instance) -> str:
    tail = _log_tail(instance)
    if "Address already in use" in tail or "BindException" in tail:
        return "a port in the config is already in use (see logs/ts_log.log)"
    for marker in ("refusing to load model", "ArtifactError", "ModuleNotFoundError", "Load model failed"):
        for line in tail.splitlines():
            # faiss's loader logs a harmless ModuleNotFoundError while it probes for AVX512/AVX2 builds.
            if marker in line and "Could not load library with" not in line:
                return line.strip()[-300:]
    return f"see {instance.log_file} and {instance.workdir / 'logs'}"


def _model_log(instance: Instance) -> Path:
    return instance.workdir / "logs" / "model_log.log"


def _ts_log(instance: Instance) -> Path:
    return instance.workdir / "logs" / "ts_log.log"


def log_offsets(instance: Instance) -> tuple[int, int]:
    """Current sizes of model_log.log and ts_log.log: where this start's lines begin."""
    return tuple(path.stat().st_size if path.exists() else 0  # type: ignore[return-value]
                 for path in (_model_log(instance), _ts_log(instance)))


def _lines_after(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def load_failure(instance: Instance, offsets: tuple[int, int]) -> str | None:
    """One line naming why a model failed to load, from the log lines written after `offsets`; None if none did.

    Two failures are final: the handler's refusal (tampered or mismatched artifacts) in model_log.log, and the
    frontend's "Failed to load model: <archive>" in ts_log.log (an archive it cannot unpack or read), after which
    TorchServe runs on without that model and never tries it again.
    """
    for line in _lines_after(_model_log(instance), offsets[0]):
        if "refusing to load model" in line:
            return line[line.index("refusing to load model"):].strip()
    lines = _lines_after(_ts_log(instance), offsets[1])
    for i, line in enumerate(lines):
        if "Failed to load model:" in line:
            archive, _, cause = line.split("Failed to load model:", 1)[1].strip().partition(" ")
            cause = cause.strip().removeprefix("(").removesuffix(")")  # the exception, when logged on one line
            if not cause and i + 1 < len(lines) and not LOG_RECORD.match(lines[i + 1]):
                cause = lines[i + 1].strip()  # else the stack trace's first line
            return f"TorchServe failed to load model {archive}" + (f": {cause[:300]}" if cause else "")
    return None
