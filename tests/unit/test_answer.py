"""The one declaration of the answer (handler/answer.py): the served JSON and typed v2 columns it writes, and the
answers it reads from servers old and new."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from client.batch import CSV_COLUMNS
from handler.answer import TABLE_KEYS, Answer, AnswerError, Neighbour, Refusal
from handler.protocols import ProtocolRequest, encode
from handler.search import GallerySearcher
from handler.v2_schema import V2_EMBEDDING_OUTPUTS, V2_OUTPUTS


def circle_searcher() -> GallerySearcher:
    """Three gallery items on the unit circle (angles 0.1 and 0.5: "7", 3.0: "1"), k=2, threshold 1.0."""
    angles = np.array([0.1, 0.5, 3.0])
    index = faiss.IndexFlatL2(2)
    index.add(np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32))
    return GallerySearcher(index, ["7", "7", "1"], k=2, threshold=1.0)


def answers_at(*angles: float) -> list[Answer]:
    a = np.array(angles)
    return circle_searcher().classify(np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32))


#: The served JSON for a query at angle 0 (near the two "7"s) and at -1.2 (far from all: unknown, so no label and
#: no confidence; the vote's label is kept apart as nearest_label).
NEAR = ('{"pred": "7", "dist": 0.099958, "confidence": 1.0, "unknown": false, "reason": null, "nearest_label": "7", '
        '"neighbours": [{"label": "7", "dist": 0.099958}, {"label": "7", "dist": 0.494808}]}')
FAR = ('{"pred": null, "dist": 1.210373, "confidence": 0.0, "unknown": true, "reason": "unlike_any_class", '
       '"nearest_label": "7", "neighbours": [{"label": "7", "dist": 1.210373}, {"label": "7", "dist": 1.502561}]}')
#: What a server from before reason and nearest_label sent for the unknown query.
OLD_FAR = ('{"pred": "7", "dist": 1.210373, "confidence": 1.0, "unknown": true, "neighbours": '
           '[{"label": "7", "dist": 1.210373}, {"label": "7", "dist": 1.502561}]}')


def test_served_json_is_the_contract_clients_read():
    """Key order, rounding and names are what clients parse: a change here is a change of the served contract."""
    near, far = answers_at(0.0, -1.2)
    assert json.dumps(encode(ProtocolRequest("plain", []), [near], "embedding", None)[1]) == NEAR
    assert json.dumps(encode(ProtocolRequest("v1", []), [far, Refusal("not an image")], "m", None)[1]) == \
        '{"predictions": [' + FAR + ', {"error": "not an image", "status": 400}]}'


def test_typed_v2_outputs_are_the_answer_columns():
    near, far = answers_at(0.0, -1.2)
    status, body = encode(ProtocolRequest("v2", [], [("x", 3)]), [near, far, Refusal("not an image")], "m", "1.0")
    assert status == 200
    assert [(o["name"], o["datatype"]) for o in body["outputs"]] == \
        [(name, datatype) for name, datatype, _ in V2_OUTPUTS] + [("error", "BYTES")]
    data = {o["name"]: (o["shape"], o["data"]) for o in body["outputs"]}
    assert data["label"] == ([3], ["7", "", ""])
    assert data["distance"] == ([3], [0.099958, 1.210373, None])
    assert data["confidence"] == ([3], [1.0, 0.0, None])
    assert data["unknown"] == ([3], [False, True, True])
    assert data["reason"] == ([3], ["", "unlike_any_class", ""])
    assert data["nearest_label"] == ([3], ["7", "7", ""])
    assert data["neighbour_labels"] == ([3, 2], ["7", "7", "7", "7", "", ""])
    assert data["neighbour_distances"] == ([3, 2], [0.099958, 0.494808, 1.210373, 1.502561, None, None])
    assert data["error"] == ([3], ["", "", "not an image"])


def test_embedding_outputs_pad_missing_rows():
    (near,) = answers_at(0.0)
    with_ids = Answer.from_json({**near.to_json(), "embedding": [1.0, 0.0],
                                 "neighbours": [{"label": "7", "dist": 0.1, "id": 0, "dataset_index": 12}]})
    _, body = encode(ProtocolRequest("v2", [], [("x", 2)], embedding=True), [with_ids, Refusal("bad", 415)], "m", None)
    data = {o["name"]: (o["shape"], o["data"]) for o in body["outputs"]}
    assert [name for name, _, _ in V2_EMBEDDING_OUTPUTS] == ["embedding", "neighbour_ids"]
    assert data["embedding"] == ([2, 2], [1.0, 0.0, None, None])
    assert data["neighbour_ids"] == ([2, 1], [0, -1])


def test_json_round_trip_keeps_options_and_sources():
    answer = Answer(pred="3", dist=0.2, confidence=0.8, unknown=False, nearest_label="3", model_version="2.0",
                    model_digest="sha256:ab", embedding=(0.5, -0.5), neighbours=(Neighbour("3", 0.2, id=4, file="a/3.png"),
                                                       Neighbour("5", 0.3, id=9, dataset_index=17)))
    text = json.dumps(answer.to_json())
    assert text == ('{"pred": "3", "dist": 0.2, "confidence": 0.8, "unknown": false, "reason": null, "nearest_label": '
                    '"3", "neighbours": [{"label": "3", "dist": 0.2, "id": 4, "file": "a/3.png"}, {"label": "5", '
                    '"dist": 0.3, "id": 9, "dataset_index": 17}], "embedding": [0.5, -0.5], "model_version": "2.0", '
                    '"model_digest": "sha256:ab"}')
    assert Answer.from_json(json.loads(text)) == answer
    assert answer["neighbours"][0]["file"] == "a/3.png" and "error" not in answer  # the JSON view


def test_reading_refuses_what_is_not_an_answer_and_ignores_fields_it_does_not_know():
    with pytest.raises(AnswerError, match="no dist, confidence, neighbours"):
        Answer.from_json({"pred": "3", "unknown": False})
    with pytest.raises(AnswerError, match="no dist in a neighbour"):
        Answer.from_json({"pred": "3", "dist": 0.1, "confidence": 1.0, "unknown": False,
                          "neighbours": [{"label": "3"}]})
    newer = {**json.loads(NEAR), "calibrated_probability": 0.93}
    assert Answer.from_json(newer) == json.loads(NEAR)


def test_an_unknown_answer_names_no_label_and_no_confidence():
    """#36: an unknown answer carried the vote's label at confidence 1.0 ("1", 1.0 for a blank image)."""
    near, far = answers_at(0.0, -1.2)
    assert (far.pred, far.confidence, far.unknown, far.reason, far.nearest_label) == \
        (None, 0.0, True, "unlike_any_class", "7")
    assert (near.pred, near.confidence, near.reason, near.nearest_label) == ("7", 1.0, None, "7")
    blank = near.as_unknown("no_ink")
    assert (blank.pred, blank.confidence, blank.reason, blank.nearest_label, blank.dist) == \
        (None, 0.0, "no_ink", "7", near.dist)


def test_answers_of_a_server_from_before_reason_and_nearest_label_are_read():
    old = Answer.from_json(json.loads(OLD_FAR))
    assert (old.pred, old.unknown, old.reason, old.nearest_label) == ("7", True, None, "7")
    assert old.to_json()["pred"] == "7"  # read as it was sent, not rewritten


def test_tables_show_the_answer_fields_and_not_the_options():
    assert CSV_COLUMNS == ("image", *TABLE_KEYS, "error", "status")
    assert not {"embedding", "model_version", "model_digest"} & set(TABLE_KEYS)
    assert set(TABLE_KEYS) <= set(json.loads(NEAR)) and {"reason", "nearest_label"} <= set(TABLE_KEYS)
