"""The pipeline's quality gate: a model deploys only when every figure evaluate measured reaches its minimum.

Accuracy alone let a 2-epoch model through that answered 29% of non-digits with a digit: the gate also holds the
open-set figures evaluate writes into metadata.json, the share of synthetic non-digits answered `unknown`
(metrics.open_set_rejection) and the share of held-out digits the calibrated threshold accepts, cross-fitted
(open_set.calibration.accepted_cross_fitted). A minimum of 0 turns a figure's check off; a figure the metadata
lacks fails it.
"""

from __future__ import annotations

from dataclasses import dataclass

from handler.metadata import ModelMetadata

#: (figure, what it is, the run parameter holding its minimum), in the order reports list them.
FIGURES = (
    ("accuracy", "held-out accuracy", "min_accuracy"),
    ("open_set_rejection", "non-digits answered unknown", "min_open_set_rejection"),
    ("digits_accepted", "held-out digits accepted (cross-fitted)", "min_digits_accepted"),
)


def figures(metadata: ModelMetadata) -> dict[str, float | None]:
    """The gated figures of an evaluated model's metadata.json (None where it has none)."""
    calibration = metadata.open_set.get("calibration") or {}
    found = {"accuracy": metadata.metrics.accuracy, "open_set_rejection": metadata.metrics.open_set_rejection,
             "digits_accepted": calibration.get("accepted_cross_fitted")}
    return {name: float(value) if isinstance(value, (int, float)) else None for name, value in found.items()}


@dataclass(frozen=True)
class Check:
    figure: str
    what: str
    value: float | None
    minimum: float

    @property
    def passed(self) -> bool:
        return self.minimum <= 0 or (self.value is not None and self.value >= self.minimum)

    def __str__(self) -> str:
        shown = "missing" if self.value is None else f"{self.value:.4f}"
        return f"{self.what} {shown} {'>=' if self.passed else '<'} {self.minimum:g}"


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def summary(self) -> str:
        """One line: every figure against its minimum."""
        return "; ".join(map(str, self.checks))

    def markdown(self) -> str:
        rows = "\n".join(f"| {c.what} | {'missing' if c.value is None else f'{c.value:.4f}'} | {c.minimum:g} | "
                         f"{'ok' if c.passed else 'below'} |" for c in self.checks)
        verdict = "pass" if self.passed else "fail: not deployed"
        return f"## Quality gate: {verdict}\n\n| figure | model | minimum | |\n|---|---|---|---|\n{rows}\n"


def judge(metadata: ModelMetadata, minimums: dict[str, float]) -> Verdict:
    """Each figure of `metadata` against `minimums` (run parameter name -> minimum)."""
    found = figures(metadata)
    return Verdict(tuple(Check(name, what, found[name], float(minimums[param])) for name, what, param in FIGURES))
