"""serving.prometheus_rules: the shipped rules for another model change exactly the spots that name the model and
its InferenceService, the default model gets the shipped files back, and --out never replaces a user's folder."""

from __future__ import annotations

import difflib
import re

import yaml

from pipeline.networkpolicy import network_policy
from serving.prometheus import rule_documents
from serving.prometheus_rules import RULES_DIR, for_model, main, render_rules


def test_the_default_model_gets_the_shipped_files_back_byte_for_byte(tmp_path):
    for path in render_rules(tmp_path, "embedding"):
        assert path.read_bytes() == (RULES_DIR / path.name).read_bytes()


def test_every_model_selector_and_runbook_names_the_other_model_and_nothing_else_changes(tmp_path):
    render_rules(tmp_path, "digits_v2")
    model_labels = set()
    for rules in rule_documents(tmp_path).values():
        for rule in rules:
            text = rule["expr"]
            model_labels |= {v for k, v in _label_values(text) if k in ("model_name", "ModelName")}
            assert not {v for k, v in _label_values(text) if v == "embedding"}, rule
            for line in rule.get("annotations", {}).values():
                assert "inferenceservice embedding" not in line and "inferenceservice=embedding" not in line
    assert model_labels == {"digits_v2"}
    policy = network_policy(inference_service="digits-v2")["metadata"]["name"]
    alerts = (tmp_path / "alerts.yml").read_text()
    assert f"networkpolicy {policy} " in alerts and "inferenceservice=digits-v2 " in alerts
    for path in sorted(RULES_DIR.glob("*.yml")):
        shipped, rendered = path.read_text().splitlines(), (tmp_path / path.name).read_text().splitlines()
        changed = [line for line in difflib.ndiff(shipped, rendered) if line.startswith("- ")]
        spots = [line for line in shipped if '="embedding"' in line or "inferenceservice" in line]
        assert len(changed) == len(spots) > 0, path.name
        assert yaml.safe_load("\n".join(rendered))["groups"]


def _label_values(expr: str) -> set[tuple[str, str]]:
    return set(re.findall(r'\b(\w+)\s*=~?\s*"([^"]*)"', expr))


def test_an_explicit_service_name_is_used_in_the_runbooks():
    text = for_model((RULES_DIR / "alerts.yml").read_text(), "digits_v2", "mnist-digits")
    assert "inferenceservice mnist-digits;" in text and "networkpolicy mnist-digits-predictor " in text
    assert "python -m pipeline rollback --to <previous version> --namespace $NS --service-name mnist-digits" in text


def test_out_refuses_a_folder_of_the_users_files_and_replaces_its_own(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["--model-name", "digits_v2", "--out", str(mine)]) == 2
    assert "holds files this command did not make" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    out = tmp_path / "rules"
    assert main(["--model-name", "digits_v2", "--out", str(out)]) == 0
    assert main(["--model-name", "digits_v3", "--out", str(out)]) == 0
    assert 'model_name="digits_v3"' in (out / "recording.yml").read_text()
    assert main(["--model-name", "bad name", "--out", str(tmp_path / "x")]) == 2
