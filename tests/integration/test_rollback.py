"""`rollback --to VERSION` against the Kubernetes stand-in: the storageUri and the record's entry come back
together once the revision serves; an unknown version, a failing revision or no record end on one line and
leave the service as it was."""

from __future__ import annotations

import argparse
import json
import shlex
import time

import pytest
import yaml
from support.rollout import archive, cluster, deploy_version, entry, pvc, record  # noqa: F401 (fixtures)

from pipeline import rollback
from pipeline.kserve_deploy import LOCK_KEY, REVISION_KEY
from pipeline.gate import decide
from settings import REPO


def run(argv: list[str], capsys) -> tuple[int, list[str], list[str]]:
    parser = argparse.ArgumentParser(prog="rollback")
    rollback.add_arguments(parser)
    rc = rollback.run(parser.parse_args([*argv, "--namespace", "models", "--poll", "0.01", "--timeout", "5"]))
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


@pytest.fixture()
def two_versions(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.90)
    deploy_version(archive, "2.0", 0.80)  # deployed with allow_unknown_current, say: worse, and now regretted
    return cluster


def storage_uri(cluster) -> str:
    return cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]["storageUri"]


def test_rollback_restores_the_storage_uri_and_the_record_entry(two_versions, capsys):
    cluster = two_versions
    cluster.ready_delay_s = 0.2
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (0, [])
    assert out == ["rolled InferenceService models/embedding back from version 2.0 to 1.0 "
                   "(pvc://models/embedding/1.0; its whole predictor): revision embedding-predictor-00003 serves"]
    assert storage_uri(cluster) == "pvc://models/embedding/1.0"
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/1.0"
    assert cluster.isvc("models", "embedding")["metadata"]["labels"]["app.kubernetes.io/version"] == "1.0"
    assert record(cluster)["current"] == entry("1.0", 0.90)
    assert record(cluster)["previous"] == entry("2.0", 0.80)
    decision = decide(0.85, "models", "embedding", allow_unknown_current=False)
    assert not decision.deploy and decision.reason.endswith("< deployed 0.9000 (version 1.0): not deploying")
    rc, out, _ = run(["--to", "1.0"], capsys)
    assert rc == 0 and out == ["InferenceService models/embedding already serves version 1.0 "
                               "(pvc://models/embedding/1.0): nothing to do"]
    rc, out, _ = run(["--to", "2.0"], capsys)  # and forward again: the record keeps both
    assert rc == 0 and record(cluster)["current"] == entry("2.0", 0.80)


def test_an_unknown_version_is_refused_on_one_line_without_a_write(two_versions, capsys):
    writes = len([r for r in two_versions.requests if r["method"] != "GET"])
    rc, out, err = run(["--to", "9.9"], capsys)
    assert (rc, out) == (1, [])
    assert err == ["rollback: error: version '9.9' is not in the deploy record of InferenceService models/embedding "
                   "(recorded: 1.0, 2.0)"]
    assert len([r for r in two_versions.requests if r["method"] != "GET"]) == writes


def test_a_failing_rollback_revision_leaves_the_service_as_it_was(two_versions, capsys):
    cluster = two_versions
    cluster.fail_revisions = "the storage initializer found no model"
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, out, len(err)) == (1, [], 1)
    assert err[0].startswith("rollback: error: InferenceService models/embedding: rollout failed: Revision "
                             '"embedding-predictor-00003" failed with message: the storage initializer found no model')
    assert err[0].endswith("; spec put back on pvc://models/embedding/2.0")
    cluster.fail_revisions = ""
    assert storage_uri(cluster) == "pvc://models/embedding/2.0"
    assert cluster.isvc("models", "embedding")["metadata"]["labels"]["app.kubernetes.io/version"] == "2.0"
    assert record(cluster)["current"] == entry("2.0", 0.80)


def test_a_conflicting_write_is_retried_on_the_new_version(two_versions, capsys):
    """Another writer (here the controller's status update) moves the object between the read and the patch."""
    cluster = two_versions
    cluster.interfere_next("PATCH", "inferenceservices")
    rc, _, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (0, [])
    patches = [r for r in cluster.requests if r["method"] == "PATCH"][-2:]
    assert patches[0]["body"]["metadata"]["resourceVersion"] != patches[1]["body"]["metadata"]["resourceVersion"]
    assert storage_uri(cluster) == "pvc://models/embedding/1.0"


def test_without_a_service_or_a_record_it_refuses_on_one_line(cluster, capsys):
    rc, _, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (1, ["rollback: error: no InferenceService models/embedding"])
    cluster.objects[("inferenceservices", "models", "embedding")] = {
        "metadata": {"name": "embedding", "namespace": "models", "resourceVersion": "1", "generation": 1}, "spec": {}}
    rc, _, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (1, ["rollback: error: InferenceService models/embedding has no deploy record (ConfigMap "
                             "embedding-deployed-model): nothing to roll back to"])


def test_the_namespace_is_required_outside_a_pod(capsys, monkeypatch, tmp_path):
    from pipeline import kserve_deploy

    monkeypatch.setattr(kserve_deploy.api, "NAMESPACE_FILE", tmp_path / "none")
    parser = argparse.ArgumentParser()
    rollback.add_arguments(parser)
    assert rollback.run(parser.parse_args(["--to", "1.0"])) == 1
    assert capsys.readouterr().err.splitlines() == [
        "rollback: error: --namespace is required (not running in a pod whose namespace could be read)"]


def test_without_the_role_it_refuses_on_one_line(two_versions, capsys):
    two_versions.forbidden = True
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, out) == (1, [])
    assert err == ["rollback: error: cannot read InferenceService models/embedding or its deploy record: 403 Forbidden "
                   "(the Role of deploy/kubeflow/rbac.yaml grants what rollback needs)"]


def test_the_pipeline_cli_runs_rollback(two_versions, capsys):
    from pipeline.cli import main

    rc = main(["rollback", "--to", "1.0", "--namespace", "models", "--poll", "0.01", "--timeout", "5"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert out.startswith("rolled InferenceService models/embedding back from version 2.0 to 1.0")
    assert storage_uri(two_versions) == "pvc://models/embedding/1.0"


@pytest.mark.parametrize("flag, value", [("--timeout", "0"), ("--timeout", "-5"), ("--poll", "nan"), ("--poll", "x")])
def test_timeouts_must_be_positive(flag, value, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["rollback", "--to", "1.0", flag, value])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "is not a positive number of seconds" in line


def test_rollback_restores_the_whole_predictor_the_record_kept(cluster, archive, pvc, capsys):
    """2.0 moved to another runtime, protocol, replicas and scale target; rolling back to 1.0 puts all of it back,
    as 1.0's deploy wrote it, not only the storageUri."""
    from pipeline.kserve_deploy import Scaling, cluster_runtime

    deploy_version(archive, "1.0", 0.90)
    deploy_version(archive, "2.0", 0.80, protocol="grpc-v2", runtime=cluster_runtime("python"),
                   scaling=Scaling(2, 6, 8))
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (0, []) and "; its whole predictor)" in out[0]
    recorded = json.loads(entry("1.0", 0.90)[REVISION_KEY])
    served = cluster.isvc("models", "embedding")
    assert served["spec"]["predictor"] == recorded["predictor"]
    assert served["spec"]["predictor"]["model"]["runtime"] == cluster_runtime("torchserve")
    assert {k: served["metadata"]["annotations"][k] for k in recorded["annotations"]} == recorded["annotations"]
    assert record(cluster)["current"] == entry("1.0", 0.90) and cluster.refused == []


def test_an_entry_recorded_before_predictors_were_restores_the_storage(two_versions, capsys):
    cluster = two_versions
    data = cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"]
    data["history"] = json.dumps([{k: v for k, v in e.items() if k != REVISION_KEY}
                                  for e in json.loads(data["history"])])
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, err) == (0, []) and "; its storage only (recorded before predictors were))" in out[0]
    assert storage_uri(cluster) == "pvc://models/embedding/1.0"


def test_a_rollback_is_refused_while_a_deploy_holds_the_lock(two_versions, capsys):
    cluster = two_versions
    data = cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"]
    data[LOCK_KEY] = json.dumps({"holder": "pipeline run run-7", "since": time.time(), "until": time.time() + 60})
    rc, out, err = run(["--to", "1.0"], capsys)
    assert (rc, out, len(err)) == (1, [], 1)
    assert err[0].startswith("rollback: error: pipeline run run-7 is deploying InferenceService models/embedding "
                             "since "), err
    assert storage_uri(cluster) == "pvc://models/embedding/2.0"


def test_the_runbooks_rollback_step_runs_as_written(two_versions, capsys):
    """The alerts' kserve runbooks roll back with `python -m pipeline rollback`: their step, as written, with the
    previous version and the namespace filled in, rolls the service back."""
    from pipeline.cli import main

    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules" / "alerts.yml").read_text())
    steps = {step.split(": ", 1)[1] for group in rules["groups"] for rule in group["rules"] if "alert" in rule
             for step in rule["annotations"]["runbook_kserve"].split("; ") if "pipeline rollback" in step}
    assert len(steps) == 1, steps
    argv = shlex.split(steps.pop().replace("<previous version>", "1.0").replace("$NS", "models"))
    assert argv[:3] == ["python", "-m", "pipeline"]
    rc = main([*argv[3:], "--poll", "0.01", "--timeout", "5"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert out.startswith("rolled InferenceService models/embedding back from version 2.0 to 1.0")
    assert storage_uri(two_versions) == "pvc://models/embedding/1.0"
