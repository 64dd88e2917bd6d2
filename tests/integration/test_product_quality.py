"""The shipped model (what ./quickstart.sh trains) behind a real TorchServe, on inputs it was never trained on:
pytorch/serve-style MNIST example images, printed digits in Debian font families that training
never sees (tests/support/printed_fonts.py), and the photo exam: held-out digits
photographed and scanned on paper (tests/support/photo_set.py).

The photo exam's size and a file for its figures can be set: PHOTO_EXAM_N=1000 PHOTO_EXAM_OUT=photo.json
(docs/photos.md reports the whole held-out split that way); so can the phone exam's (sheets that do not fill the
frame, shadow boundaries, handwritten and printed digits): PHONE_EXAM_N=1000 PHONE_EXAM_OUT=phone.json."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from handler.answer import Answer
from serving.samples import held_out_digits, user_digit_png
from support.photo_set import conditions
from support.printed_fonts import printed_digits
from support.torchserve import serving_client

pytestmark = pytest.mark.serving

PRINTED_TARGET = 0.98
#: The photo exam through the served endpoint: the floor of the share answered correctly and the ceiling of the
#: share flagged unknown that the shipped model holds today (about 96% and 3-4%). The goal, 97% and 2%, is not met
#: yet: docs/photos.md has the figures and what fails.
PHOTO_CORRECT_FLOOR = 0.94
PHOTO_UNKNOWN_CEILING = 0.06
#: The phone exam's 200 uploads through the served endpoint: floors of the share read right and ceilings of the
#: share flagged unknown, overall and in each scene, a margin below what version 4 reaches there (96.0% and 4.0%
#: overall; its weakest scene, edge+shadow, 92.9% and 9.5%) and above version 3 (91.5% and 7.0%; shadow 82.5%
#: and 15.0%). The issue's target (97% and 2% in each scene) is missed: docs/photos.md has the figures.
PHONE_CORRECT_FLOOR = 0.94
PHONE_UNKNOWN_CEILING = 0.06
PHONE_SCENE_CORRECT_FLOOR = 0.90
PHONE_SCENE_UNKNOWN_CEILING = 0.12


@pytest.fixture(scope="module")
def product_client(product_artifacts, tmp_path_factory):
    with serving_client(product_artifacts, tmp_path_factory.mktemp("product")) as client:
        yield client


def test_mnist_example_style_images_are_all_classified_correctly(product_client):
    """Our own equivalents of pytorch/serve's examples/image_classifier/mnist/test_data/0-9.png: the first held-out
    digit of each class as a raw 28x28 light-on-black PNG (no inversion, no enlarging), sent as curl -T sends it."""
    answers = [product_client.predict(user_digit_png(255 - canvas, scale=1))  # undo the generator's inversion
               for canvas in held_out_digits()]
    assert [Answer.from_json(a).nearest_label for a in answers] == [str(d) for d in range(10)], answers
    # The open-set threshold accepts 99.5% of held-out digits by design; the first held-out 9 of the bundled sample
    # is one of the 0.5% it rejects (flagged unknown, still classified 9). More than that would be a regression.
    assert sum(a["unknown"] for a in answers) <= 1, answers


def test_printed_digits_through_the_served_endpoint(product_client, record_property):
    samples = printed_digits()
    answers = product_client.predict_batch([png for png, _ in samples])
    correct = np.mean([not isinstance(a, Exception) and Answer.from_json(a).nearest_label == label
                       for a, (_, label) in zip(answers, samples)])
    record_property("printed_accuracy", float(correct))
    assert correct >= PRINTED_TARGET, f"{correct:.3f} of {len(samples)} printed digits correct"


def served_exam(client, items: list) -> tuple[list, list[dict]]:
    """The exam's items (photo_set's photo or phone exam of held-out digits spread over the split, seed 0: the
    exam_items fixture) and the served answer to each; no request may fail."""
    n = len(items)
    answers: list = [None] * n
    for index, answer in client.predict_many([item.body for item in items], concurrency=4):
        answers[index] = answer
    failed = [a for a in answers if isinstance(a, Exception)]
    assert not failed, failed[:3]
    return items, answers


def test_photographed_and_scanned_digits_through_the_served_endpoint(product_client, exam_items, record_property):
    """Held-out digits printed on paper, photographed (light, shadow, table, perspective, blur, noise, JPEG) or
    scanned, posted as the phone or scanner wrote them: the digits preprocessing's photo path must read them."""
    items, answers = served_exam(product_client, exam_items("photo_exam"))
    n = len(items)
    correct = np.array([Answer.from_json(a).nearest_label == str(item.label) for a, item in zip(answers, items)])
    unknown = np.array([bool(a["unknown"]) for a in answers])
    by_condition: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for item, ok, flagged in zip(items, correct, unknown):
        for key in (f"kind={item.kind}", f"ink={item.ink}", f"table={item.table}", f"shadow={item.shadow}",
                    f"digit_height<0.15={item.digit_height < 0.15}"):
            by_condition[key].append((bool(ok), bool(flagged)))
    figures = {"n": n, "correct": float(correct.mean()), "unknown": float(unknown.mean()),
               "by_condition": {k: {"n": len(v), "correct": float(np.mean([c for c, _ in v])),
                                    "unknown": float(np.mean([u for _, u in v]))} for k, v in sorted(by_condition.items())}}
    if os.environ.get("PHOTO_EXAM_OUT"):
        with open(os.environ["PHOTO_EXAM_OUT"], "w") as f:
            json.dump(figures, f, indent=2)
    record_property("photo_exam", figures)
    assert correct.mean() >= PHOTO_CORRECT_FLOOR and unknown.mean() <= PHOTO_UNKNOWN_CEILING, json.dumps(figures)


def test_phone_photos_with_a_sheet_edge_or_a_shadow_boundary_through_the_served_endpoint(product_client, exam_items,
                                                                                         record_property):
    """The phone exam (tests/support/photo_set.py): sheets that do not fill the frame, shadow boundaries across the
    sheet, both, and the classic photos and scans, with held-out handwriting and unseen printed faces. Figures per
    condition, so a regression shows where it is."""
    items, answers = served_exam(product_client, exam_items("phone_exam"))
    by_condition: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for item, answer in zip(items, answers):
        for key in conditions(item):
            by_condition[key].append((Answer.from_json(answer).nearest_label == str(item.label), bool(answer["unknown"])))
    figures = {k: {"n": len(v), "right": float(np.mean([r for r, _ in v])), "unknown": float(np.mean([u for _, u in v]))}
               for k, v in sorted(by_condition.items())}
    misses = [i for i, (item, a) in enumerate(zip(items, answers))
              if a["unknown"] or Answer.from_json(a).nearest_label != str(item.label)]
    if os.environ.get("PHONE_EXAM_OUT"):
        with open(os.environ["PHONE_EXAM_OUT"], "w") as f:
            json.dump({"by_condition": figures, "misses": misses}, f, indent=2)
    if os.environ.get("PHONE_EXAM_MISSES"):  # DIR/<label>/: the misses as `training report --images DIR` reads them
        for i in misses:
            folder = Path(os.environ["PHONE_EXAM_MISSES"]) / str(items[i].label)
            folder.mkdir(parents=True, exist_ok=True)
            kind = "png" if items[i].body.startswith(b"\x89PNG") else "jpg"
            (folder / f"{i:04d}-{items[i].scene.replace('+', '-')}-{items[i].source}.{kind}").write_bytes(items[i].body)
    record_property("phone_exam", figures)
    scenes = {k: (round(v["right"], 3), round(v["unknown"], 3)) for k, v in figures.items()
              if k == "all" or k.startswith("scene=")}
    assert figures["all"]["right"] >= PHONE_CORRECT_FLOOR and figures["all"]["unknown"] <= PHONE_UNKNOWN_CEILING, (
        json.dumps(scenes))
    assert all(v["right"] >= PHONE_SCENE_CORRECT_FLOOR and v["unknown"] <= PHONE_SCENE_UNKNOWN_CEILING
               for k, v in figures.items() if k.startswith("scene=")), json.dumps(scenes)
