"""`python -m pipeline compile|submit|runtime`: the explicit, digest-pinned image, a submit through the real kfp
client to a stand-in Kubeflow Pipelines API (tests/support/kfp_standin.py) that records every request, the
backend version the package needs, and the serving runtime manifest."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from serving.server import free_ports
from support.kfp_standin import API, KfpStandin

from pipeline import images, kfp_backend, releases
from pipeline import params as P
from settings import REPO

IMAGE = "registry.example.com/ml/mnist-embedding-pipeline:1.2.3"
DIGEST = "sha256:" + "5e" * 32
TOKEN = "T0k3n-for-the-standin"
SUBMIT_CALLS = [f"GET {API}/healthz", f"GET {API}/experiments", f"POST {API}/experiments", f"POST {API}/runs"]


def _placeholder() -> str:
    from pipeline.components import DEFAULT_PIPELINE_IMAGE

    return DEFAULT_PIPELINE_IMAGE


def _cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess; no $PIPELINE_IMAGE and no images JSON unless given, HOME private (the
    kfp client reads ~/.config/kfp/context.json)."""
    environ = {k: v for k, v in os.environ.items() if k not in (images.IMAGE_ENV, "KF_PIPELINES_TOKEN",
                                                                "KF_PIPELINES_ENDPOINT")}
    environ.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HOME": str(home),
                    images.IMAGES_JSON_ENV: str(home / "no-images.json"), **env})
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=environ, capture_output=True,
                          text=True, timeout=300)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith("pipeline: error: "), proc.stderr
    return lines[0]


def _submit(standin: KfpStandin, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return _cli("submit", "--host", standin.url, "--token", TOKEN, *args, home=home, **env)


@pytest.fixture
def cli_main(tmp_path, monkeypatch, capsys):
    """`main(argv)` in this process (faster than a subprocess: kfp and torch are imported once), with the
    environment of `_cli`; returns (exit code, stdout, the single stderr line checked like _error_line, or
    all of stderr when the command succeeded)."""
    from kfp.client import Client

    from pipeline.cli import main

    monkeypatch.setattr(Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setenv(images.IMAGE_ENV, "")  # main() sets it; monkeypatch restores it afterwards
    monkeypatch.setenv(images.IMAGES_JSON_ENV, str(tmp_path / "no-images.json"))
    for name in ("KF_PIPELINES_TOKEN", "KF_PIPELINES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, _error_line(subprocess.CompletedProcess(argv, code, out, err)) if code else err

    return run


def _executor_images(spec: dict) -> set[str]:
    return {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}


def _run_spec(run: dict) -> dict:
    spec = run["pipeline_spec"]  # {"pipeline_spec", "platform_spec"} when the pipeline has a platform spec
    return spec.get("pipeline_spec", spec)


def _run_platform(run: dict) -> dict:
    return run["pipeline_spec"]["platform_spec"]


# ---------------------------------------------------------------- a submit that works


@pytest.fixture(scope="module")
def submitted(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with KfpStandin(tag_name="2.3.0") as standin:
        proc = _submit(standin, home, "--image", IMAGE, "--experiment", "mnist-nightly", "--run-name", "r-1",
                       "--epochs", "3", "--model-version", "2.0", "--min-accuracy", "0.75")
    assert proc.returncode == 0, proc.stderr
    return proc, standin


def test_submit_speaks_the_kfp_paths_in_order(submitted):
    proc, standin = submitted
    assert standin.calls() == SUBMIT_CALLS
    listed = standin.requests[1]
    assert json.loads(listed.query["filter"][0])["predicates"][0]["stringValue"] == "mnist-nightly"
    assert standin.requests[2].json()["display_name"] == "mnist-nightly"
    run = standin.runs[0]
    assert run["experiment_id"] == standin.experiments[0]["experiment_id"] and run["display_name"] == "r-1"
    assert f"submitted run {run['run_id']}: {standin.url}/#/runs/details/{run['run_id']}" in proc.stdout


def test_submit_sends_the_token_on_every_request(submitted):
    _, standin = submitted
    assert [r.headers.get("authorization") for r in standin.requests] == [f"Bearer {TOKEN}"] * len(SUBMIT_CALLS)


def test_submit_sends_the_compiled_spec_naming_the_chosen_image(submitted):
    proc, standin = submitted
    run = standin.runs[0]
    spec = _run_spec(run)
    assert spec["pipelineInfo"]["name"] == "mnist-embedding"
    assert _executor_images(spec) == {IMAGE}
    assert len(spec["deploymentSpec"]["executors"]) >= 6
    assert _placeholder().split(":")[0] not in json.dumps(run)
    assert f"image: {IMAGE} (not pinned: no pipeline image in " in proc.stdout


def test_submit_sends_the_parameters(submitted):
    _, standin = submitted
    sent = standin.runs[0]["runtime_config"]["parameters"]
    assert sent == P.validate({"epochs": 3, "model_version": "2.0", "min_accuracy": 0.75})
    assert (sent["epochs"], sent["model_version"], sent["min_accuracy"]) == (3, "2.0", 0.75)
    assert "storage_secret" not in sent  # a compile option unless --secret-name-parameter


def test_submit_sends_a_package_for_the_oldest_backend(submitted):
    _, standin = submitted
    run = standin.runs[0]
    spec, platform = _run_spec(run), _run_platform(run)
    assert kfp_backend.needs(spec, platform) == []
    deploy = kfp_backend.executor_configs(platform)["exec-deploy-kserve"]
    assert deploy["secretAsVolume"] == [{"mountPath": P.STORAGE_SECRET_MOUNT, "optional": True,
                                         "secretName": P.STORAGE_SECRET.default}]


def test_submit_with_every_default_is_accepted(cli_main):
    """Only what a cluster needs named (--host, --image): every parameter's default is one submit accepts, and
    the run carries them all, the quality gate's open-set minimums and a deploy target other than local."""
    with KfpStandin(tag_name="2.3.0") as standin:
        code, out, _ = cli_main("submit", "--host", standin.url, "--image", IMAGE)
        assert code == 0 and standin.calls() == SUBMIT_CALLS, out
    sent = standin.runs[0]["runtime_config"]["parameters"]
    assert sent == P.DEFAULTS and sent["deploy_target"] != "local"
    assert sent["min_open_set_rejection"] > 0 and sent["min_digits_accepted"] > 0


# ---------------------------------------------------------------- the backend's version


def test_submit_refuses_an_old_backend_before_uploading(cli_main):
    with KfpStandin(tag_name="2.2.0") as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--token", TOKEN, "--image", IMAGE)
    assert code == 1
    assert line == ("pipeline: error: KFP backend 2.2.0 is older than 2.3.0, which this package needs: the oldest "
                    "backend this pipeline supports")
    assert standin.calls() == [f"GET {API}/healthz"]


@pytest.mark.parametrize("tag, accepted", [("2.4.1", False), ("2.5.0", True)])
def test_an_opt_in_feature_needs_its_backend(cli_main, tag, accepted):
    """--secret-name-parameter makes the storage Secret's name a run parameter (secretNameParameter), which
    backends read from 2.5.0 on."""
    with KfpStandin(tag_name=tag) as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--image", IMAGE, "--secret-name-parameter",
                                 "--storage-secret", "team-storage")
    if not accepted:
        assert code == 1 and standin.calls() == [f"GET {API}/healthz"]
        assert line == (f"pipeline: error: KFP backend {tag} is older than 2.5.0, which this package needs: a "
                        "Secret's name from a run parameter (exec-deploy-kserve)")
        return
    assert code == 0 and standin.calls() == SUBMIT_CALLS
    run = standin.runs[0]
    assert run["runtime_config"]["parameters"]["storage_secret"] == "team-storage"
    (volume,) = kfp_backend.executor_configs(_run_platform(run))["exec-deploy-kserve"]["secretAsVolume"]
    assert volume["secretNameParameter"] == {"componentInputParameter": "pipelinechannel--storage_secret"}
    declared = _run_spec(run)["root"]["inputDefinitions"]["parameters"]
    assert declared["storage_secret"]["defaultValue"] == "team-storage"


def test_submit_refuses_a_backend_that_does_not_say_its_version(tmp_path):
    """What it cannot verify is refused, before anything is uploaded, unless the user states the version."""
    with KfpStandin(tag_name=None) as standin:
        proc = _submit(standin, tmp_path, "--image", IMAGE)
    assert proc.returncode == 1
    line = _error_line(proc)
    assert "does not report its Kubeflow Pipelines version (healthz tag_name None" in line
    assert "KFP 2.4.1 (Kubeflow 1.10.0)" in line and "--backend-version" in line
    assert "this package's need for 2.3.0 or later cannot be checked" in line
    assert standin.calls() == [f"GET {API}/healthz"]


@pytest.mark.parametrize("release", releases.RELEASES, ids=[r.kubeflow for r in releases.RELEASES])
def test_submit_to_each_supported_release(cli_main, release):
    """Each supported Kubeflow's KFP API server answers healthz as its image does (pipeline.releases): a backend
    that names its version is checked against it; one that answers "unknown" is refused, and accepted once the
    user states the version."""
    for stated in ((), ("--backend-version", release.kfp_text)):
        with KfpStandin(tag_name=release.healthz_tag) as standin:
            code, _, err = cli_main("submit", "--host", standin.url, "--image", IMAGE, *stated)
        if release.kfp_names_version or stated:
            assert code == 0 and standin.calls() == SUBMIT_CALLS, err
            assert "warning" not in err
        else:
            assert code == 1 and standin.calls() == [f"GET {API}/healthz"]
            assert "healthz tag_name 'unknown'" in err and release.kubeflow in err and release.kfp_text in err


def test_the_stated_version_is_checked_like_a_reported_one(cli_main):
    with KfpStandin(tag_name="unknown") as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--image", IMAGE, "--backend-version", "2.4.1",
                                 "--secret-name-parameter")
    assert code == 1 and standin.calls() == [f"GET {API}/healthz"]
    assert line == ("pipeline: error: KFP backend 2.4.1 (--backend-version) is older than 2.5.0, which this package "
                    "needs: a Secret's name from a run parameter (exec-deploy-kserve)")


def test_a_stated_version_that_contradicts_the_backend_is_refused(cli_main):
    with KfpStandin(tag_name="2.3.0") as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--image", IMAGE, "--backend-version", "2.5.0")
    assert code == 1 and standin.calls() == [f"GET {API}/healthz"]
    assert line == f"pipeline: error: --backend-version 2.5.0, but {standin.url} reports KFP backend 2.3.0"


def test_a_backend_newer_than_the_table_is_accepted_with_a_warning(cli_main):
    with KfpStandin(tag_name="2.17.0") as standin:
        code, _, err = cli_main("submit", "--host", standin.url, "--image", IMAGE)
    assert code == 0 and standin.calls() == SUBMIT_CALLS
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert warning == ("pipeline: warning: KFP backend 2.17.0 is newer than the newest supported, 2.16.0 "
                       "(Kubeflow 26.03); going on")


@pytest.mark.parametrize("text", ["2.5", "latest", "2.5.0-rc.1"])
def test_a_backend_version_that_is_no_version_is_a_usage_error(capsys, text):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["submit", "--host", "http://127.0.0.1:9", "--image", IMAGE, "--backend-version", text])
    assert exited.value.code == 2
    assert f"argument --backend-version: '{text}' is not a version X.Y.Z" in capsys.readouterr().err


@pytest.mark.parametrize("tag, version", [("2.0.2", (2, 0, 2)), ("v2.3.0-rc.1", (2, 3, 0)), ("2.14.3", (2, 14, 3)),
                                          ("unknown", None), ("", None), (None, None), ("master", None)])
def test_backend_version_reads_healthz_tag_names(tag, version):
    assert kfp_backend.parse_version(tag) == version


def test_the_oldest_backend_is_one_constant():
    assert kfp_backend.OLDEST == releases.OLDEST.kfp == (2, 3, 0)
    assert all(feature.since > kfp_backend.OLDEST for feature in kfp_backend.FEATURES.values())


# ---------------------------------------------------------------- server errors: one line each


@pytest.mark.parametrize("route, status, expected", [
    ("healthz", 401, "check the token (--token or $KF_PIPELINES_TOKEN)"),
    ("healthz", 404, "check --host"),
    ("healthz", 503, "API server failed"),
    ("list-experiments", 403, "check --namespace"),
    ("create-experiment", 404, "that the experiment and --namespace exist"),
    ("create-run", 500, "API server failed"),
    ("create-run", 401, "check the token"),
])
def test_submit_server_errors_fail_on_one_line(cli_main, route, status, expected):
    message = f"stand-in says {route} failed"
    with KfpStandin(failures={route: (status, message)}) as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--token", TOKEN, "--image", IMAGE)
    assert code == 1
    assert f"{standin.url} answered {status} " in line and f"({message})" in line and expected in line, line
    assert not standin.runs
    failed_at = {"healthz": 1, "list-experiments": 2, "create-experiment": 3, "create-run": 4}[route]
    assert standin.calls() == SUBMIT_CALLS[:failed_at]


def test_submit_to_a_multi_user_backend_needs_a_namespace(cli_main):
    with KfpStandin(multi_user=True) as standin:
        code, _, line = cli_main("submit", "--host", standin.url, "--image", IMAGE)
    assert code == 1 and "is a multi-user Kubeflow Pipelines: pass --namespace" in line
    assert standin.calls() == [f"GET {API}/healthz"]


def test_submit_to_a_multi_user_backend_uses_the_namespace(tmp_path):
    with KfpStandin(multi_user=True) as standin:
        proc = _submit(standin, tmp_path, "--image", IMAGE, "--namespace", "team-a")
    assert proc.returncode == 0, proc.stderr
    assert standin.calls() == SUBMIT_CALLS
    assert standin.requests[1].query["namespace"] == ["team-a"]
    assert standin.requests[2].json()["namespace"] == "team-a"


def test_submit_to_an_unreachable_host_fails_on_one_line(tmp_path):
    (port,) = free_ports(1)
    proc = _cli("submit", "--host", f"http://127.0.0.1:{port}", "--image", IMAGE, "--epochs", "1", home=tmp_path)
    assert proc.returncode == 1
    assert _error_line(proc).startswith("pipeline: error: cannot reach Kubeflow Pipelines at http://127.0.0.1:")


# ---------------------------------------------------------------- the image


def test_compile_without_an_image_is_a_usage_error(tmp_path):
    out = tmp_path / "p.yaml"
    proc = _cli("compile", "--out", str(out), home=tmp_path)
    assert proc.returncode == 2 and not out.exists()
    assert "no pipeline image: pass --image REF or set $PIPELINE_IMAGE" in _error_line(proc)


def test_submit_without_an_image_is_a_usage_error_before_any_request(cli_main):
    with KfpStandin() as standin:
        code, _, line = cli_main("submit", "--host", standin.url)
    assert code == 2 and "no pipeline image: pass --image REF or set $PIPELINE_IMAGE" in line
    assert standin.requests == []


def test_the_placeholder_image_from_the_environment_is_refused(tmp_path):
    out = tmp_path / "p.yaml"
    proc = _cli("compile", "--out", str(out), home=tmp_path, PIPELINE_IMAGE=_placeholder())
    assert proc.returncode == 2 and not out.exists()
    assert f"{_placeholder()} is the placeholder image" in _error_line(proc)


@pytest.mark.parametrize("command", ["compile", "submit"])
@pytest.mark.parametrize("tag", ["same", "other"])
def test_the_placeholder_image_is_refused(cli_main, tmp_path, command, tag):
    placeholder = _placeholder() if tag == "same" else _placeholder().rsplit(":", 1)[0] + ":9.9"
    out = tmp_path / "p.yaml"
    with KfpStandin() as standin:
        argv = ["--out", str(out)] if command == "compile" else ["--host", standin.url]
        code, _, line = cli_main(command, *argv, "--image", placeholder)
    assert code == 2 and "is the placeholder image" in line
    assert not out.exists() and standin.requests == []


def test_compile_pins_a_pushed_image_by_digest(tmp_path):
    repo = IMAGE.rsplit(":", 1)[0]
    record = tmp_path / "images.json"
    record.write_text(json.dumps({"engine": "podman", "pipeline": {
        "ref": f"{repo}:h-0123456789ab", "tags": ["h-0123456789ab", "1.2.3"], "id": "f" * 64, "digest": DIGEST,
        "size_bytes": 1}, "serving": {"ref": "x/serving:h-1", "tags": ["h-1"], "digest": None}}))
    out = tmp_path / "p.yaml"
    proc = _cli("compile", "--out", str(out), home=tmp_path, PIPELINE_IMAGE=IMAGE, IMAGES_JSON=str(record))
    assert proc.returncode == 0, proc.stderr
    pinned = f"{IMAGE}@{DIGEST}"
    assert _executor_images(next(yaml.safe_load_all(out.read_text()))) == {pinned}
    assert f"image: {pinned} (pinned to the digest {record} records for {IMAGE})" in proc.stdout
    assert _placeholder().split(":")[0] not in out.read_text()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp.yaml")]


def test_compile_in_process_names_the_image_even_after_components_were_imported(tmp_path, monkeypatch, capsys):
    """pipeline.components reads $PIPELINE_IMAGE once, at import; a later compile still names the chosen
    image in every executor (the package is rewritten and checked)."""
    import pipeline.components  # noqa: F401  (imported now, with whatever $PIPELINE_IMAGE is)
    from pipeline.cli import main

    monkeypatch.setenv(images.IMAGE_ENV, "")
    monkeypatch.setenv(images.IMAGES_JSON_ENV, str(tmp_path / "none.json"))
    chosen = f"registry.example.com/other/pipeline:7@{DIGEST}"
    out = tmp_path / "p.yaml"
    assert main(["compile", "--out", str(out), "--image", chosen]) == 0
    assert _executor_images(next(yaml.safe_load_all(out.read_text()))) == {chosen}
    assert f"image: {chosen} (pinned by digest as given)" in capsys.readouterr().out


# ---------------------------------------------------------------- images.resolve


def _record(tmp_path: Path, digest: str | None = DIGEST, tags=("h-abc", "0.1.0")) -> Path:
    path = tmp_path / "images.json"
    path.write_text(json.dumps({"pipeline": {"ref": "reg.example.com/ml/p:h-abc", "tags": list(tags),
                                             "digest": digest}}))
    return path


@pytest.mark.parametrize("given, ref, how", [
    ("reg.example.com/ml/p:0.1.0", f"reg.example.com/ml/p:0.1.0@{DIGEST}", "pinned to the digest"),
    ("reg.example.com/ml/p:h-abc", f"reg.example.com/ml/p:h-abc@{DIGEST}", "pinned to the digest"),
    ("reg.example.com/ml/p:0.2.0", "reg.example.com/ml/p:0.2.0", "not pinned"),
    ("other.example.com/ml/p:0.1.0", "other.example.com/ml/p:0.1.0", "not pinned"),
    (f"reg.example.com/ml/p@{'sha256:' + '0' * 64}", f"reg.example.com/ml/p@{'sha256:' + '0' * 64}", "as given"),
    ("reg.example.com/ml/p", "reg.example.com/ml/p", ":latest"),
])
def test_resolve_pins_only_what_images_json_pushed(tmp_path, given, ref, how):
    resolved = images.resolve(given, _record(tmp_path))
    assert resolved.ref == ref and how in resolved.how


def test_resolve_does_not_pin_without_a_pushed_digest(tmp_path):
    resolved = images.resolve("reg.example.com/ml/p:0.1.0", _record(tmp_path, digest=None))
    assert resolved.ref == "reg.example.com/ml/p:0.1.0" and "no pushed digest" in resolved.how
    assert images.resolve("reg.example.com/ml/p:0.1.0", tmp_path / "absent.json").ref == "reg.example.com/ml/p:0.1.0"


@pytest.mark.parametrize("given, message", [
    (None, "no pipeline image"), ("  ", "no pipeline image"),
    ("Registry.example.com/ML/p:1", "not a valid reference"), ("reg.example.com/p:bad tag", "not a valid reference"),
    ("reg.example.com/p@sha256:abc", "64 lowercase hex"),
])
def test_resolve_refuses_unusable_references(tmp_path, given, message):
    with pytest.raises(images.ImageError, match=message):
        images.resolve(given, tmp_path / "absent.json")


def test_resolve_refuses_a_broken_images_json(tmp_path):
    broken = tmp_path / "images.json"
    broken.write_text("{not json")
    with pytest.raises(images.ImageError, match="cannot read"):
        images.resolve("reg.example.com/ml/p:1", broken)


def test_parse_ref_splits_registry_port_tag_and_digest():
    assert images.parse_ref("localhost:5000/a/b:1") == images.ImageRef("localhost:5000/a/b", "1")
    assert images.parse_ref("localhost:5000/a/b") == images.ImageRef("localhost:5000/a/b")
    assert images.parse_ref(f"r.io/a:t@{DIGEST}") == images.ImageRef("r.io/a", "t", DIGEST)
    assert str(images.parse_ref(f"r.io/a:t@{DIGEST}")) == f"r.io/a:t@{DIGEST}"


def test_submit_refuses_the_local_deploy_target():
    """deploy_target=local would serve from inside a task's pod, which dies with the task."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", "submit", "--host", "http://127.0.0.1:9", "--image",
                           "registry.example.com/ml/mnist-embedding-pipeline:1.0", "--deploy-target", "local"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pipeline: error: deploy_target=local starts TorchServe inside a task's pod, which ends with the task: use "
        "it with run-local; on a cluster use --deploy-target kserve"]


# ---------------------------------------------------------------- compile options


def test_compile_names_the_backend_the_package_needs(cli_main, tmp_path):
    out = tmp_path / "p.yaml"
    code, stdout, _ = cli_main("compile", "--out", str(out), "--image", IMAGE, "--image-pull-secret", "regcred",
                               "--task-cpu", "train=3/3500m", "--task-memory", "all=1Gi/3Gi")
    assert code == 0
    assert f"wrote {out} (needs KFP backend 2.3.0 or later: the oldest backend this pipeline supports)" in stdout
    spec, platform = yaml.safe_load_all(out.read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert executors["exec-train"]["container"]["resources"] == {
        "cpuRequest": 3.0, "cpuLimit": 3.5, "memoryRequest": 2**30 / 1e9, "memoryLimit": 3 * 2**30 / 1e9}
    assert {e["container"]["resources"]["memoryLimit"] for e in executors.values()} == {3 * 2**30 / 1e9}
    configs = kfp_backend.executor_configs(platform)
    assert set(configs) == set(executors)
    assert all(c["imagePullSecret"] == [{"secretName": "regcred"}] for c in configs.values())
    deploy = spec["components"]["comp-deploy-kserve"]["inputDefinitions"]["parameters"]
    assert "image_pull_secret" in deploy


@pytest.mark.parametrize("argv, message", [
    (["--task-cpu", "train=abc"], "train: cpu abc/abc: Invalid cpu string"),
    (["--task-memory", "evaluate=4Gi/1Gi"], "evaluate: memory request 4Gi is above its limit 1Gi"),
    (["--task-cpu", "nosuch=1"], "--task-cpu 'nosuch=1': expected TASK=REQUEST[/LIMIT]"),
    (["--task-memory", "train"], "--task-memory 'train': expected TASK=REQUEST[/LIMIT]"),
    (["--image-pull-secret", "Reg_Cred"], "'Reg_Cred' is not a Secret name"),
    (["--storage-secret", "Storage"], "'Storage' is not a Secret name"),
])
def test_unusable_compile_options_fail_on_one_line(cli_main, tmp_path, argv, message):
    out = tmp_path / "p.yaml"
    code, _, line = cli_main("compile", "--out", str(out), "--image", IMAGE, *argv)
    assert code == 1 and message in line, line
    assert not out.exists()


def test_the_predictor_pull_secret_is_a_checked_run_parameter():
    assert P.validate({"kserve_image_pull_secret": "regcred"})["kserve_image_pull_secret"] == "regcred"
    with pytest.raises(P.ParamError, match="kserve_image_pull_secret='Reg_Cred': a Secret name"):
        P.validate({"kserve_image_pull_secret": "Reg_Cred"})


@pytest.mark.parametrize("values, message", [
    ({"kserve_min_replicas": 3, "kserve_max_replicas": 2}, "0 <= min (3) <= max (2)"),
    ({"kserve_min_replicas": -1}, "0 <= min (-1)"),
    ({"kserve_min_replicas": 0, "kserve_max_replicas": 0}, "max >= 1"),
    ({"kserve_scale_target": 0}, "at least 1 request in flight per pod, not 0"),
    ({"kserve_watch_timeout": 0.0}, "kserve_watch_timeout=0.0: must be > 0"),
])
def test_scaling_params_are_checked_before_the_run(values, message):
    with pytest.raises(P.ParamError, match=re.escape(message)):
        P.validate(values)


def test_scaling_params_reach_the_inference_service():
    """Replicas in the spec (both modes); the target as the Knative annotations KServe copies to the revision."""
    from pipeline.kserve_deploy import Scaling, inference_service

    values = P.validate({"kserve_min_replicas": 0, "kserve_max_replicas": 6, "kserve_scale_target": 8})
    scaling = Scaling(values["kserve_min_replicas"], values["kserve_max_replicas"], values["kserve_scale_target"])
    manifest = inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0", scaling=scaling)
    assert (manifest["spec"]["predictor"]["minReplicas"], manifest["spec"]["predictor"]["maxReplicas"]) == (0, 6)
    assert manifest["metadata"]["annotations"] == {"autoscaling.knative.dev/metric": "concurrency",
                                                   "autoscaling.knative.dev/target": "8",
                                                   "serving.kserve.io/enable-tag-routing": "true"}


# ---------------------------------------------------------------- the serving runtime manifest


def test_runtime_writes_the_manifest_with_the_pinned_image(cli_main, tmp_path):
    from pipeline.cli import RUNTIME_MANIFEST
    from pipeline.manifests import validate

    out = tmp_path / "deploy" / "runtime.yaml"
    pinned = f"registry.example.com/ml/mnist-embedding-serving:1.2.3@{DIGEST}"
    code, _, _ = cli_main("runtime", "--image", pinned, "--out", str(out))
    assert code == 0
    written = yaml.safe_load(out.read_text())
    validate(written)
    (container,) = written["spec"]["containers"]
    assert container["image"] == pinned
    source = yaml.safe_load(RUNTIME_MANIFEST.read_text())
    source["spec"]["containers"][0]["image"] = pinned
    assert written == source  # only the image changed


def test_runtime_python_writes_the_jre_free_runtime_and_each_may_replace_the_other(cli_main, tmp_path):
    """--runtime python writes deploy/kserve/servingruntime-python.yaml with the image: the ClusterServingRuntime
    the pipeline names for serving_runtime=python; a file either runtime wrote may be written again."""
    from pipeline.kserve_deploy import cluster_runtime
    from serving.runtimes import SERVING_RUNTIMES

    out = tmp_path / "runtime.yaml"
    pinned = f"registry.example.com/ml/mnist-embedding-serving-python:1.2.3@{DIGEST}"
    assert cli_main("runtime", "--image", f"registry.example.com/serving@{DIGEST}", "--out", str(out))[0] == 0
    code, _, line = cli_main("runtime", "--runtime", "python", "--image", pinned, "--out", str(out))
    assert code == 0, line
    written = yaml.safe_load(out.read_text())
    source = yaml.safe_load(SERVING_RUNTIMES["python"].manifest.read_text())
    source["spec"]["containers"][0]["image"] = pinned
    assert written == source and written["metadata"]["name"] == cluster_runtime("python")
    (container,) = written["spec"]["containers"]
    assert container["command"] == ["python", "-m", "serving.python_runtime"]
    assert out.read_text().startswith("# servingruntime-python.yaml with the serving image pinned by digest")


def test_runtime_writes_to_standard_output(cli_main):
    code, stdout, _ = cli_main("runtime", "--image", f"registry.example.com/serving@{DIGEST}")
    assert code == 0
    assert yaml.safe_load(stdout)["spec"]["containers"][0]["image"] == f"registry.example.com/serving@{DIGEST}"


@pytest.mark.parametrize("argv, message", [
    (["--image", "registry.example.com/serving:1.2.3"], "is not pinned by digest"),
    (["--image", "registry.example.com/serving", "--allow-tag"], "name a tag or a digest"),
    (["--image", "Registry.example.com/serving:1"], "is not a valid reference"),
    (["--image", "registry.example.com/serving@sha256:abc"], "64 lowercase hex"),
])
def test_runtime_refuses_an_unpinned_or_bad_image(cli_main, tmp_path, argv, message):
    out = tmp_path / "runtime.yaml"
    code, _, line = cli_main("runtime", *argv, "--out", str(out))
    assert code == 2 and message in line, line
    assert not out.exists()


def test_runtime_accepts_a_tag_when_asked(cli_main, tmp_path):
    out = tmp_path / "runtime.yaml"
    code, _, _ = cli_main("runtime", "--image", "registry.example.com/serving:1.2.3", "--allow-tag", "--out", str(out))
    assert code == 0
    assert yaml.safe_load(out.read_text())["spec"]["containers"][0]["image"] == "registry.example.com/serving:1.2.3"
