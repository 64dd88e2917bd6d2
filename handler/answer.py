"""The model's answer, declared once: what a served image gets back, its JSON and its typed v2 columns.

Every protocol writes an answer from these classes (REST and KServe v1 as :meth:`Answer.to_json`, Open Inference
v2 as JSON text or as the typed outputs of :data:`COLUMNS`), and the client, the queue bridge and training read
answers through them (:meth:`Answer.from_json`). Adding a field is one line in :class:`Answer` (and a column in
:data:`COLUMNS` when v2's typed outputs should carry it), plus the code that computes it.

Standard library only: it is packed in the model archive and imported by the client without numpy.

An answer reads like its JSON object (``answer["pred"]``, ``"error" in answer``, ``answer == {...}``): a
read-only view kept so that code written against the JSON dict keeps working; new code reads attributes.
The classes are not frozen (one answer and k neighbours are built per served image, and a frozen dataclass costs
about four times as much to build): treat them as values, and make changed copies with ``dataclasses.replace``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable, Iterator


#: Why an answer is ``unknown`` (its ``reason``): no ink in the image; several digits side by side in it; unlike
#: every class of the gallery (the open-set score above the threshold); no neighbour found (an approximate index).
NO_INK = "no_ink"
SEVERAL_DIGITS = "several_digits"
UNLIKE_ANY_CLASS = "unlike_any_class"
NO_NEIGHBOURS = "no_neighbours"
REASONS = (NO_INK, SEVERAL_DIGITS, UNLIKE_ANY_CLASS, NO_NEIGHBOURS)


class AnswerError(ValueError):
    """A JSON object that is not an answer; the message names what is missing or wrong."""


class _JsonView(Mapping):
    """Read-only mapping over :meth:`to_json` (equality with a dict compares the JSON)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(slots=True)
class Neighbour:
    """One of the k nearest gallery items: its label and Euclidean distance (rounded to 6 places); with the
    embedding option also its gallery ``id`` and, where training recorded it, its source (``file`` or
    ``dataset_index``)."""

    label: str
    dist: float
    id: int | None = None
    file: str | None = None
    dataset_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "dist": self.dist}
        if self.id is not None:
            out["id"] = self.id
        if self.file is not None:
            out["file"] = self.file
        if self.dataset_index is not None:
            out["dataset_index"] = self.dataset_index
        return out

    @classmethod
    def from_json(cls, item: Any) -> "Neighbour":
        if not isinstance(item, Mapping):
            raise AnswerError(f"a neighbour is not an object: {str(item)[:80]!r}")
        return cls(**_read(cls, item, " in a neighbour"))


@dataclass(slots=True, eq=False, kw_only=True)
class Answer(_JsonView):
    """The answer for one image. ``pred``: the label answered, None when ``unknown``; ``dist``: distance to the
    nearest gallery item; ``confidence``: ``pred``'s share of the k-NN vote's weight, 0 when ``unknown``;
    ``unknown``: no label is answered, ``reason`` says why (:data:`REASONS`; None when answered);
    ``nearest_label``: the label the neighbours vote for, answered or not; ``neighbours``: the k nearest gallery
    items. With the embedding option the answer carries the ``embedding`` vector; ``model_version`` is the
    archive's, ``model_digest`` the SHA-256 of the model's metadata.json (which records every artifact's digest:
    it names the build that answered, whatever version label it was given). Build one with :meth:`of_vote`, so that an unknown answer never carries a label or a confidence."""

    pred: str | None
    dist: float | None
    confidence: float
    unknown: bool
    reason: str | None = None
    nearest_label: str | None = None
    neighbours: tuple[Neighbour, ...]
    embedding: tuple[float, ...] | None = field(default=None, metadata={"omit_none": True, "table": False})
    model_version: str | None = field(default=None, metadata={"omit_none": True, "table": False})
    model_digest: str | None = field(default=None, metadata={"omit_none": True, "table": False})

    @classmethod
    def of_vote(cls, label: str | None, share: float, dist: float | None, neighbours: tuple[Neighbour, ...],
                reason: str | None = None) -> "Answer":
        """The answer for the vote's ``label`` and its ``share`` of the weight; with a ``reason`` it is unknown."""
        if reason is not None:
            return cls(pred=None, dist=dist, confidence=0.0, unknown=True, reason=reason, nearest_label=label,
                       neighbours=neighbours)
        return cls(pred=label, dist=dist, confidence=share, unknown=False, nearest_label=label, neighbours=neighbours)

    def as_unknown(self, reason: str) -> "Answer":
        """This answer made unknown for ``reason`` (it replaces an earlier one: the image's own fault comes first)."""
        return replace(self, pred=None, confidence=0.0, unknown=True, reason=reason)

    def to_json(self) -> dict[str, Any]:
        """The JSON object served, keys in declaration order (absent options left out)."""
        out: dict[str, Any] = {}
        for name, omit_none in _ANSWER_KEYS:
            value = getattr(self, name)
            if value is None:
                if omit_none:
                    continue
            elif name in _TO_JSON:
                value = _TO_JSON[name](value)
            out[name] = value
        return out

    @classmethod
    def from_json(cls, item: Any) -> "Answer":
        """The answer in a decoded JSON object; keys it does not know are ignored (a newer server's fields) and
        fields with a default may be absent (an older server's answer). AnswerError names missing keys."""
        if not isinstance(item, Mapping):
            raise AnswerError(f"not an object: {str(item)[:120]!r}")
        values = _read(cls, item)
        if not isinstance(values["neighbours"], list):
            raise AnswerError(f"neighbours is not a list: {str(values['neighbours'])[:80]!r}")
        values["neighbours"] = tuple(Neighbour.from_json(n) for n in values["neighbours"])
        values.setdefault("nearest_label", values["pred"])  # a server from before nearest_label: pred was the vote
        if values.get("embedding") is not None:
            values["embedding"] = tuple(values["embedding"])
        return cls(**values)


@dataclass(slots=True, eq=False)
class Refusal(_JsonView):
    """An image (or a request) the model does not answer: the message and the HTTP status, the one shape of a
    refusal in every protocol."""

    error: str
    status: int = 400

    def to_json(self) -> dict[str, Any]:
        return {"error": self.error, "status": self.status}

    @classmethod
    def of(cls, exc: BaseException) -> "Refusal":
        """The refusal for an exception; its ``status`` attribute, else 400."""
        return cls(str(exc), int(getattr(exc, "status", 400)))


Result = Answer | Refusal


def _read(cls: type, item: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """The values of `cls`'s fields found in `item`; AnswerError for required ones that are absent."""
    missing = [f.name for f in fields(cls) if f.name not in item and f.default is MISSING]
    if missing:
        raise AnswerError(f"no {', '.join(missing)}{where}")
    return {f.name: item[f.name] for f in fields(cls) if f.name in item}


#: Fields whose JSON is not their value.
_TO_JSON: dict[str, Callable[[Any], Any]] = {"neighbours": lambda ns: [n.to_json() for n in ns], "embedding": list}
_ANSWER_KEYS = tuple((f.name, bool(f.metadata.get("omit_none"))) for f in fields(Answer))
#: The keys a table of answers shows (CSV columns): all but the per-request options and the version.
TABLE_KEYS = tuple(f.name for f in fields(Answer) if f.metadata.get("table", True))


@dataclass(frozen=True)
class Column:
    """One typed Open Inference v2 output: its name, datatype and the shape of one image's row (``(-1,)``: one
    value per neighbour, or per embedding dimension), the row's value read from an answer, and what a row without
    an answer holds (for a ``(-1,)`` row, what pads it)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    value: Callable[[Answer], Any]
    missing: Any


#: The typed v2 outputs, in the order they are written.
COLUMNS: tuple[Column, ...] = (
    Column("label", "BYTES", (), lambda a: a.pred or "", ""),
    Column("distance", "FP32", (), lambda a: a.dist, None),
    Column("confidence", "FP32", (), lambda a: a.confidence, None),
    Column("unknown", "BOOL", (), lambda a: a.unknown, True),
    Column("reason", "BYTES", (), lambda a: a.reason or "", ""),
    Column("nearest_label", "BYTES", (), lambda a: a.nearest_label or "", ""),
    Column("neighbour_labels", "BYTES", (-1,), lambda a: [n.label for n in a.neighbours], ""),
    Column("neighbour_distances", "FP32", (-1,), lambda a: [n.dist for n in a.neighbours], None),
)
#: Outputs present with the embedding option.
EMBEDDING_COLUMNS: tuple[Column, ...] = (
    Column("embedding", "FP32", (-1,), lambda a: list(a.embedding or ()), None),
    Column("neighbour_ids", "INT64", (-1,), lambda a: [-1 if n.id is None else n.id for n in a.neighbours], -1),
)
