"""The HTML report as a person sees it: opened in a real headless Chromium (Debian's /usr/bin/chromium), every
image decodes and renders, the page's own styles apply, and the expected cases and table rows are there."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from support.image_tree import digit_folder

from handler.artifacts import METADATA_FILE
from training.__main__ import main as training_main
from training.report import MAX_CASES

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)

#: Runs after load in a copy of the page (whose policy otherwise forbids scripts) and writes what it found into
#: <body data-*>, which --dump-dom prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const diag = document.querySelector("#confusion td.diag");
  const body = document.body;
  body.dataset.images = images.length;
  const shown = i => i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0;
  body.dataset.rendered = images.filter(shown).length;
  body.dataset.cases = document.querySelectorAll(".case").length;
  body.dataset.rows = document.querySelectorAll("#confusion tbody tr").length;
  body.dataset.styled = diag ? getComputedStyle(diag).backgroundColor : "none";
  body.dataset.probe = "done";
});
</script>"""


def chromium_dom(page, tmp_path) -> str:
    """The DOM Chromium holds after loading `page` (virtual time lets the load handler run), in at most 60 s."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", "--dump-dom",
               page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def need_chromium() -> None:
    if CHROMIUM is None:
        if os.geteuid() == 0:
            pytest.fail("chromium is missing; scripts/system-deps.sh installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed and installing it needs root (apt-get install chromium)")


def probe(out, tmp_path) -> dict[str, str]:
    """What the probe found in Chromium's DOM of the page at `out`."""
    text = out.read_text(encoding="utf-8")
    assert "script-src 'none'" in text and text.count("</body>") == 1
    probed = tmp_path / "probed.html"
    # Scripts allowed for the probe only; images stay restricted to data: URIs, so one that is not would fail.
    probed.write_text(text.replace("script-src 'none'", "script-src 'unsafe-inline'").replace("</body>",
                                                                                              PROBE + "</body>"))
    dom = chromium_dom(probed, tmp_path)
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    found = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert found.get("probe") == "done", f"the load handler did not run: {body.group(0)[:300]}"
    return found


def test_every_image_of_the_report_renders_in_chromium(tiny_artifacts, tmp_path):
    need_chromium()
    out = tmp_path / "report.html"
    assert training_main(["report", str(tiny_artifacts), "--out", str(out), "--ood", "synthetic",
                          "--ood-images", "100", "--threads", "1"]) == 0
    found = probe(out, tmp_path)

    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())
    n = metadata["dataset"]["test"]
    errors = round((1 - metadata["metrics"]["accuracy"]) * n)
    rejected = round(metadata["drift_baseline"]["unknown_rate"] * n)
    cases = min(MAX_CASES, errors) + min(MAX_CASES, rejected)
    assert int(found["cases"]) == cases
    assert int(found["rows"]) == len(metadata["dataset"]["classes"])
    expected_images = 1 + cases * (1 + metadata["k"])  # histogram; each case's query and its k neighbours
    assert int(found["images"]) == expected_images
    assert int(found["rendered"]) == expected_images
    assert found["styled"] == "rgb(207, 232, 207)"  # the page's inline style sheet applied


def test_the_report_on_the_users_own_images_renders_in_chromium(tiny_artifacts, tmp_path):
    """#36 part 6: a folder of the user's <label>/ images gets the same page: every image's canvas and its k
    neighbours render, and the confusion matrix against the folder labels is styled."""
    need_chromium()
    root = digit_folder(tmp_path / "mine")
    out = tmp_path / "mine.html"
    assert training_main(["report", str(tiny_artifacts), "--images", str(root), "--out", str(out),
                          "--threads", "1"]) == 0
    found = probe(out, tmp_path)
    k = json.loads((tiny_artifacts / METADATA_FILE).read_text())["k"]
    answered = len([p for p in root.rglob("*.png") if p.name != "broken.png"])
    assert int(found["cases"]) == answered
    assert int(found["rows"]) == 3  # 3/, 7/ and cat/
    assert int(found["images"]) == answered * (1 + k)  # each image's canvas and its k neighbours; no histogram
    assert int(found["rendered"]) == int(found["images"])
    assert found["styled"] == "rgb(207, 232, 207)"
