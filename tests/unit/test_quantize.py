"""int8 post-training quantization (`python -m training --quantize int8`): torchao's PT2E flow compiled by AOTInductor
into model.pt2, which stays close to the float network, answers the same whatever it is batched with, is compiled
for x86-64-v3 with the worker's thread count, loads with torch alone, and is refused in one line where it cannot be
built or run; everything in the artifact directory is built with it, and the handler serves it on the CPU only; and
the per-profile default: ``quantize=auto`` (the default of `python -m training`, TrainConfig and the pipeline) builds
int8 for the digits profile (float where int8 cannot be built) and float for full-frame, ``--quantize none`` builds
the float model (with model.onnx), and what train.json, metadata.json and the pipeline record is the resolved value,
never auto."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import zipfile
from dataclasses import replace

import numpy as np
import pytest
import torch
from serving.samples import held_out_digits, user_digit_png

from handler import network
from handler.artifacts import (MODEL_FILE, ONNX_FILE, ArtifactError, artifact_files, quantization, sha256_file,
                               verify_artifacts)
from handler.metadata import MODEL_FILES, read_metadata
from handler.network import load_network, load_package
from handler.preprocessing import PROFILES
from handler.service import EmbeddingService
from settings import REPO
from training import export as export_module
from training import quantize as quantize_module
from training import steps
from training.__main__ import parse_args
from training.config import PROFILE_QUANTIZATION, QUANTIZE_CHOICES, resolve_quantize
from training.data import Dataset
from training.export import ExportError
from training.model import EmbeddingNet
from training.params import CONFIG_FIELDS, TRAINING_PARAMS
from training.quantize import QuantizationError, int8_unavailable, quantize_int8
from training.steps import train_and_export
from training.train import TrainConfig, embed

from support.training_cli import config_from_cli

AOTI_FILE = MODEL_FILES["aotinductor"]


def trained_net(prepared_sample, pool: str = "avg") -> EmbeddingNet:
    """A briefly trained float network (48 steps: its neighbours are meaningful, unlike an untrained one's)."""
    from training.train import train_model

    config = TrainConfig(epochs=3, embedding_dim=16, width=8, seed=0, pool=pool, negatives=0, printed=0)
    model, _ = train_model(prepared_sample.inputs("train")[:2048], prepared_sample.train_labels[:2048],
                           prepared_sample.inputs("test")[:200], prepared_sample.test_labels[:200], 10, config, 5,
                           log=lambda _: None)
    return model


@pytest.fixture(scope="module")
def avg_net(prepared_sample) -> EmbeddingNet:
    return trained_net(prepared_sample)


@pytest.mark.parametrize("pool", ["avg", "flatten"])  # both profiles' networks (digits pool, full-frame flattens)
def test_int8_embeddings_stay_close_to_the_float_ones_at_every_batch_size(prepared_sample, avg_net, tmp_path, pool):
    model = avg_net if pool == "avg" else trained_net(prepared_sample, pool)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = prepared_sample.inputs("test")[:300]
    info = quantize_int8(model, prepared_sample.inputs("train")[:512], x, tmp_path / AOTI_FILE)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the float model is untouched
    assert info["scheme"] == "int8" and info["calibration_images"] == 512
    assert (info["isa"], info["march"]) == ("AVX2", "x86-64-v3") and info["batch_max_abs_diff"] <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == [AOTI_FILE]  # no partial file left beside it
    package = load_package(tmp_path / AOTI_FILE, info["isa"], model.embedding_dim)
    with torch.inference_mode():
        out, ref = package(torch.from_numpy(x)), model(torch.from_numpy(x))
        one_by_one = torch.cat([package(torch.from_numpy(x[i : i + 1])) for i in range(0, 300, 37)])
    assert out.shape == ref.shape and out.dtype == torch.float32
    np.testing.assert_allclose(out.norm(dim=1).numpy(), 1.0, atol=1e-5)  # still unit vectors for the index
    np.testing.assert_allclose(one_by_one.numpy(), out[::37].numpy(), atol=1e-4)  # a batch of one answers alike
    cosine = (out * ref).sum(dim=1)
    assert float(cosine.min()) == pytest.approx(info["min_cosine_vs_float"], abs=1e-6) and float(cosine.min()) > 0.95
    assert 0 < info["max_abs_diff_vs_float"] <= quantize_module.MAX_EMBEDDING_DIFF  # really quantized, not a copy
    # The same nearest-neighbour label for nearly every query, each model searching its own gallery embeddings.
    gallery = prepared_sample.inputs("train")[:1000]
    labels = prepared_sample.train_labels[:1000]
    float_nn = labels[(ref.numpy() @ embed(model, gallery).T).argmax(1)]
    int8_nn = labels[(out.numpy() @ embed(package, gallery).T).argmax(1)]
    assert np.mean(float_nn == int8_nn) >= 0.95


def test_the_package_is_compiled_for_x86_64_v3_with_the_workers_threads(prepared_sample, avg_net,
                                                                       tiny_int8_artifacts, tmp_path):
    """What the build pins, read off the package: vectorized AVX2 code whatever CPU built it (this machine may
    have AVX-512), even in a process that loaded a package first (the loader skips its ISA probe); oneDNN's int8
    convolutions; no kernel with a thread count fixed at build time (it takes the worker's torch threads); and
    nothing in it is a pickle."""
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list.cache_clear()  # as in a fresh process, whose first ISA question is the loader's
    EmbeddingService.from_dir(tiny_int8_artifacts)
    quantize_int8(avg_net, prepared_sample.inputs("train")[:256], prepared_sample.inputs("test")[:64],
                  tmp_path / AOTI_FILE)
    with zipfile.ZipFile(tmp_path / AOTI_FILE) as package:
        names = package.namelist()
        sources = {name: package.read(name).decode() for name in names if name.endswith(".cpp")}
    assert any(name.endswith(".so") for name in names)
    assert not [name for name in names if name.endswith((".pkl", ".pickle")) or "pickle" in name]
    assert sources and all("-march=x86-64-v3" in text and "CPU_CAPABILITY_AVX2" in text for text in sources.values())
    assert any("Vectorized" in text for text in sources.values())
    assert not [n for n, text in sources.items() if "avx512" in text.lower() or "-march=native" in text]
    assert any("qconv" in text for text in sources.values())  # int8 convolutions, not float ones
    assert not [n for n, text in sources.items() if "num_threads(" in text]


def test_a_calibration_that_strays_is_refused_and_leaves_no_file(prepared_sample, avg_net, tmp_path, monkeypatch):
    monkeypatch.setattr(quantize_module, "MAX_EMBEDDING_DIFF", 1e-9)
    with pytest.raises(QuantizationError, match="differ from the float model's"):
        quantize_int8(avg_net, prepared_sample.inputs("train")[:256], prepared_sample.inputs("test")[:64],
                      tmp_path / AOTI_FILE)
    assert list(tmp_path.iterdir()) == []
    assert issubclass(QuantizationError, ExportError)  # the training CLI reports it in one line


def test_an_int8_first_convolution_is_what_the_float_one_guards_against(prepared_sample, avg_net, tmp_path,
                                                                        monkeypatch):
    """FLOAT_MODULES must name modules of the network: a renamed first convolution would be quantized silently."""
    monkeypatch.setattr(quantize_module, "FLOAT_MODULES", ("features.9.9",))
    with pytest.raises(QuantizationError, match=r"no module features\.9\.9 to keep float: training/model.py changed"):
        quantize_int8(avg_net, prepared_sample.inputs("train")[:8], prepared_sample.inputs("test")[:8],
                      tmp_path / AOTI_FILE)


def test_compiler_failures_become_one_line_quantization_errors(prepared_sample, avg_net, tmp_path, monkeypatch):
    def broken(converted, example, path):
        path.write_bytes(b"half a package")
        raise RuntimeError("C++ compile error\nCommand:\ng++ ... 300 lines")

    monkeypatch.setattr(quantize_module, "compile_package", broken)
    with pytest.raises(QuantizationError, match=r"^int8 quantization failed: RuntimeError: C\+\+ compile error$"):
        quantize_int8(avg_net, prepared_sample.inputs("train")[:8], prepared_sample.inputs("test")[:8],
                      tmp_path / AOTI_FILE)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("setting", "message"), [
    ({"CXX": "/nonexistent/g++"}, r"no C\+\+ compiler \(/nonexistent/g\+\+\) is on PATH \(apt-get install g\+\+\)"),
    ({"machine": "aarch64"}, "compiled for x86-64 CPUs and this machine is aarch64"),
])
def test_where_int8_cannot_be_built_it_says_why(monkeypatch, setting, message):
    if "CXX" in setting:
        monkeypatch.setenv("CXX", setting["CXX"])
    else:
        monkeypatch.setattr(quantize_module.platform, "machine", lambda: setting["machine"])
    assert int8_unavailable() is not None
    with pytest.raises(QuantizationError, match=message):
        quantize_int8(EmbeddingNet(16, 8).eval(), np.zeros((8, 1, 28, 28), np.float32),
                      np.zeros((8, 1, 28, 28), np.float32), "unused.pt2")


def test_an_unknown_quantize_value_is_refused_before_training(prepared_sample, tmp_path, monkeypatch):
    from training import steps

    monkeypatch.setattr(steps, "train_model", lambda *a, **k: pytest.fail("trained before checking quantize"))
    with pytest.raises(ValueError, match="quantize must be one of auto, none, int8"):
        train_and_export(prepared_sample, TrainConfig(quantize="int4"), tmp_path)


def test_cli_flag_reaches_the_config():
    assert parse_args(["--quantize", "int8"]).quantize == "int8"
    assert parse_args(["--quantize", "none"]).quantize == "none"
    assert parse_args([]).quantize == "auto"  # resolved per profile by the build (the tests below)
    with pytest.raises(SystemExit):
        parse_args(["--quantize", "fp16"])


def test_int8_artifacts_record_the_package_and_hold_no_other_network(tiny_int8_artifacts):
    metadata = verify_artifacts(tiny_int8_artifacts)
    assert quantization(metadata) == "int8" and metadata.model_format == "aotinductor"
    assert metadata.model_file == AOTI_FILE and AOTI_FILE in metadata.sha256 and MODEL_FILE not in metadata.sha256
    recorded = metadata.quantization
    assert (recorded["isa"], recorded["method"]) == ("AVX2", "pt2e-x86-inductor-aoti")
    train = json.loads((tiny_int8_artifacts / "train.json").read_text())
    assert train["config"]["quantize"] == "int8" and train["quantization"] == recorded
    assert train["model_format"] == "aotinductor"
    assert train["onnx_max_abs_diff"] is None and not (tiny_int8_artifacts / ONNX_FILE).exists()
    assert not (tiny_int8_artifacts / MODEL_FILE).exists()
    assert artifact_files(metadata) == (AOTI_FILE, "index.faiss", "labels.json", "sources.json")


def test_gallery_and_threshold_are_built_with_the_int8_model(tiny_int8_artifacts, prepared_sample):
    """The gallery vectors are the served (int8) model's embeddings of the training images, so a training image
    finds itself at distance 0, and the recorded accuracy is what the served model answers."""
    service = EmbeddingService.from_dir(tiny_int8_artifacts)
    train = prepared_sample.inputs("train")
    vectors = service.embed(train[:64])
    distances, ids = service.searcher.index.search(vectors, 1)
    assert (ids[:, 0] == np.arange(64)).mean() >= 0.95 and float(np.median(distances)) < 1e-6
    test_emb = service.embed(prepared_sample.inputs("test"))
    served = np.array([a.nearest_label for a in service.searcher.classify(test_emb)])
    accuracy = float((served == np.array([prepared_sample.classes[y] for y in prepared_sample.test_labels])).mean())
    assert accuracy == pytest.approx(service.metadata.metrics.accuracy, abs=1e-9)
    assert accuracy > 0.9


def test_the_float_artifacts_are_not_quantized(tiny_artifacts):
    assert quantization(verify_artifacts(tiny_artifacts)) == "none"


def test_int8_serves_on_cpu_and_is_refused_on_cuda_and_onnxruntime(tiny_int8_artifacts):
    service = EmbeddingService.from_dir(tiny_int8_artifacts)
    answers, _ = service.answer([user_digit_png(canvas) for canvas in held_out_digits()])
    assert sum(a["pred"] == str(digit) for digit, a in enumerate(answers)) >= 9, answers
    with pytest.raises(ArtifactError, match=r"runs on the CPU only, not on cuda .*with --quantize none\)$"):
        EmbeddingService.from_dir(tiny_int8_artifacts, device="cuda")
    with pytest.raises(ArtifactError, match=r"model.onnx: an int8 model has none .*with --quantize none\)$"):
        EmbeddingService.from_dir(tiny_int8_artifacts, runtime="onnxruntime")


def test_enrollment_into_int8_artifacts_embeds_with_the_int8_model(tiny_int8_artifacts, tmp_path):
    from support.enroll_folder import write_new_folder

    from training.enroll import enroll_artifacts

    new = write_new_folder(tmp_path / "new")
    metadata = enroll_artifacts(tiny_int8_artifacts, f"folder:{new}", tmp_path / "out", log=lambda _: None)
    assert quantization(metadata) == "int8" and quantization(verify_artifacts(tmp_path / "out")) == "int8"
    service = EmbeddingService.from_dir(tmp_path / "out")
    labels = json.loads((tmp_path / "out" / "labels.json").read_text())
    box = labels.index("box")  # the first enrolled image of the new class: its vector is the int8 embedding of it
    png = (new / "box" / json.loads((tmp_path / "out" / "sources.json").read_text())["ids"][box].split("/")[-1])
    distances, ids = service.searcher.index.search(service.embed(service.profile.preprocess(png.read_bytes())[None]), 1)
    assert ids[0, 0] == box and distances[0, 0] < 1e-6


def test_cli_passes_quantize_to_the_build(monkeypatch, tmp_path):
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "a"), "--quantize", "int8"]).quantize == "int8"


def test_device_auto_serves_int8_on_the_cpu_of_a_gpu_worker(tiny_int8_artifacts, tiny_artifacts, tmp_path):
    from handler.embedding_handler import auto_device_for

    assert auto_device_for(str(tiny_int8_artifacts), "cuda:0") == "cpu"
    assert auto_device_for(str(tiny_artifacts), "cuda:0") == "cuda:0"
    assert auto_device_for(str(tmp_path), "cuda:0") == "cuda:0"  # no metadata: loading reports it


def copied(artifacts, tmp_path):
    import shutil

    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    return copy


@pytest.mark.parametrize(("machine", "capability", "why"), [
    ("aarch64", "SVE256", "it was compiled for x86-64 CPUs and this machine is aarch64"),
    ("x86_64", "DEFAULT", "it was compiled for AVX2 and this CPU offers DEFAULT"),
])
def test_a_cpu_that_cannot_run_the_package_is_refused_in_one_line(tiny_int8_artifacts, monkeypatch, machine,
                                                                  capability, why):
    monkeypatch.setattr(network.platform, "machine", lambda: machine)
    monkeypatch.setattr(network.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    with pytest.raises(ArtifactError, match=rf"model\.pt2: cannot run here: {why}.* \(build the float model with "
                                            r"--quantize none, which runs anywhere torch does\)$") as caught:
        EmbeddingService.from_dir(tiny_int8_artifacts)
    assert "\n" not in str(caught.value)


def test_a_package_the_loader_cannot_open_is_refused_in_one_line(tiny_int8_artifacts, tmp_path):
    """Checksums match (metadata.json rewritten for it), but the file is no AOTInductor package: an ArtifactError,
    not a crash of the worker."""
    copy = copied(tiny_int8_artifacts, tmp_path)
    (copy / AOTI_FILE).write_bytes(b"PK\x03\x04 not really a package")
    metadata = json.loads((copy / "metadata.json").read_text())
    metadata["sha256"][AOTI_FILE] = sha256_file(copy / AOTI_FILE)
    (copy / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match=r"model\.pt2: the AOTInductor package does not load here \(.*\); "
                                            r"rebuild it where it is served, or build the float model") as caught:
        EmbeddingService.from_dir(copy)
    assert "\n" not in str(caught.value)


def test_a_network_file_of_the_other_format_beside_it_is_refused(tiny_int8_artifacts, tmp_path):
    copy = copied(tiny_int8_artifacts, tmp_path)
    (copy / MODEL_FILE).write_bytes(b"left over from a float build")
    with pytest.raises(ArtifactError, match=r"model\.pt: present, but metadata\.json names model\.pt2 \(aotinductor\)"):
        verify_artifacts(copy)


def test_a_worker_without_a_compiler_or_torchao_serves_the_package(tiny_int8_artifacts, tmp_path):
    """What a serving image has: torch, no C++ compiler on PATH, no torchao. The answers are the in-process ones."""
    bodies = [user_digit_png(canvas) for canvas in held_out_digits()]
    for i, body in enumerate(bodies):
        (tmp_path / f"{i}.png").write_bytes(body)
    script = (
        "import sys, json, shutil; sys.modules['torchao'] = None\n"
        "assert not [c for c in ('g++', 'gcc', 'c++', 'cc', 'clang') if shutil.which(c)]\n"
        "from pathlib import Path\n"
        "from handler.service import EmbeddingService\n"
        f"service = EmbeddingService.from_dir({str(tiny_int8_artifacts)!r})\n"
        f"bodies = [Path({str(tmp_path)!r}, f'{{i}}.png').read_bytes() for i in range({len(bodies)})]\n"
        "print(json.dumps(service.answer(bodies)[0]))\n"
        "assert 'torchao' not in sys.modules or sys.modules['torchao'] is None\n"
    )
    env = {"PATH": str(tmp_path / "bin"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served == EmbeddingService.from_dir(tiny_int8_artifacts).answer(bodies)[0]


def legacy_int8(net: EmbeddingNet, calibration: torch.Tensor, path) -> None:
    """model.pt as the int8 builds before model.pt2 wrote it: torch.ao's eager static quantization, traced."""
    import warnings

    from torch.ao import quantization as tq
    from torch.nn import functional as F

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.features, self.project = net.features, net.project

        def forward(self, x):
            return F.normalize(self.project(self.dequant(self.features(self.quant(x)))), dim=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.quantized.engine = "x86"
        wrapped = Wrapped().eval()
        wrapped.qconfig = tq.get_default_qconfig("x86")
        wrapped.project.qconfig = None
        prepared = tq.prepare(wrapped)
        with torch.inference_mode():
            prepared(calibration)
        converted = tq.convert(prepared)
        with torch.inference_mode():
            torch.jit.freeze(torch.jit.trace(converted, calibration[:8]).eval()).save(str(path))


def test_a_torchscript_int8_model_of_an_earlier_build_still_loads_on_its_engine(prepared_sample, avg_net, tmp_path):
    x = torch.from_numpy(prepared_sample.inputs("test")[:64])
    legacy_int8(copy.deepcopy(avg_net), torch.from_numpy(prepared_sample.inputs("train")[:256]), tmp_path / MODEL_FILE)
    model = load_network(tmp_path / MODEL_FILE, "torchscript", {"scheme": "int8", "engine": "x86"})
    assert any("quantized::" in node.kind() for node in model.graph.nodes())
    with torch.inference_mode():
        assert float((model(x) * avg_net(x)).sum(1).min()) > 0.95
    with pytest.raises(ArtifactError, match="quantized for the 'qnnpack-arm' engine, which this torch build lacks"):
        load_network(tmp_path / MODEL_FILE, "torchscript", {"scheme": "int8", "engine": "qnnpack-arm"})


def test_pipeline_report_says_which_model_it_describes(tiny_int8_artifacts, tiny_artifacts):
    from pipeline.report import render_report

    def report(directory):
        return render_report(read_metadata(directory),
                             json.loads((directory / "metrics.json").read_text()),
                             json.loads((directory / "train.json").read_text())["history"])

    int8, float32 = report(tiny_int8_artifacts), report(tiny_artifacts)
    assert "| model | int8 convolutions (--quantize int8), CPU serving only |" in int8
    assert "the float network's, before quantization" in int8
    assert "| model | float32 |" in float32 and "before quantization" not in float32


# --- the per-profile default (quantize=auto) ---------------------------------------------------------------------

SMALL = dict(epochs=1, embedding_dim=16, width=8, seed=0)


def test_auto_resolves_per_profile_and_an_explicit_choice_wins():
    assert resolve_quantize("auto", "digits") == "int8"
    assert resolve_quantize("auto", "full-frame") == "none"
    assert resolve_quantize("none", "digits") == "none"
    assert resolve_quantize("int8", "full-frame") == "int8"
    assert resolve_quantize("auto", "a-profile-nobody-measured") == "none"  # float unless int8 was shown to qualify
    with pytest.raises(ValueError, match="quantize must be one of auto, none, int8, got 'int4'"):
        resolve_quantize("int4", "digits")


def test_every_profile_has_a_decided_default():
    assert set(PROFILE_QUANTIZATION) == set(PROFILES)


def test_auto_is_the_default_of_the_config_the_cli_and_the_pipeline(monkeypatch, tmp_path):
    from pipeline import params

    assert TrainConfig().quantize == "auto"
    assert parse_args([]).quantize == "auto" and parse_args(["--quantize", "none"]).quantize == "none"
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "a")]).quantize == "auto"
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "b"), "--quantize", "none"]).quantize == "none"
    (param,) = [p for p in params.PARAMS if p.name == "quantize"]
    assert param.default == "auto" and param.choices == QUANTIZE_CHOICES == ("auto", "none", "int8")


@pytest.fixture(scope="module")
def digits(prepared_sample) -> Dataset:
    """1,024 training and 256 held-out canvases of the bundled sample (digits profile)."""
    s = prepared_sample
    return Dataset("digits-subset", s.train_images[:1024], s.train_labels[:1024], s.test_images[:256],
                   s.test_labels[:256], s.classes, profile=s.profile)


@pytest.fixture(scope="module")
def trained(digits):
    """One briefly trained network and its history, trained once: these tests are about what is exported."""
    from training.train import train_model

    config = TrainConfig(**SMALL, negatives=0, printed=0)
    return train_model(digits.inputs("train"), digits.train_labels, digits.inputs("test"), digits.test_labels,
                       len(digits.classes), config, 5, log=lambda _: None)


@pytest.fixture
def trained_with(monkeypatch, trained) -> list[TrainConfig]:
    """train_model returns a copy of ``trained``; the list collects the configs the build trained with."""
    configs: list[TrainConfig] = []

    def fake_train_model(*args, **kwargs):
        configs.append(args[5])
        model, history = trained
        return copy.deepcopy(model), history

    monkeypatch.setattr(steps, "train_model", fake_train_model)
    return configs


@pytest.mark.parametrize(("profile", "choice", "built"), [
    ("digits", "auto", "int8"), ("digits", "none", "none"), ("full-frame", "auto", "none"),
    ("full-frame", "int8", "int8")])
def test_a_build_records_the_resolved_scheme_and_writes_model_onnx_only_for_float(digits, trained_with, tmp_path,
                                                                                   profile, choice, built):
    data = replace(digits, profile=profile)
    lines: list[str] = []
    info = steps.train_and_export(data, TrainConfig(**SMALL, quantize=choice), tmp_path, log=lines.append)
    assert [c.quantize for c in trained_with] == [built]
    recorded = json.loads((tmp_path / steps.TRAIN_FILE).read_text())
    assert recorded["config"]["quantize"] == info["config"]["quantize"] == built
    assert (recorded["quantization"] or {}).get("scheme", "none") == built
    network_file = AOTI_FILE if built == "int8" else MODEL_FILE
    assert [p.name for p in tmp_path.iterdir() if p.name in MODEL_FILES.values()] == [network_file]
    onnx_expected = built == "none" and export_module.onnx_modules() is not None
    assert (tmp_path / ONNX_FILE).is_file() == onnx_expected
    assert (recorded["onnx_opset"] is not None) == onnx_expected
    said = [line for line in lines if line.startswith("quantize auto:")]
    hint = " (--quantize none builds the float model: GPU serving, model.onnx)" if built == "int8" else ""
    assert said == ([f"quantize auto: {built} for the {profile} profile{hint}"] if choice == "auto" else [])


def test_the_default_digit_build_is_int8_in_metadata_too(digits, trained_with, tmp_path):
    steps.train_and_export(digits, TrainConfig(**SMALL), tmp_path, log=lambda _: None)
    steps.build_gallery(digits, tmp_path, log=lambda _: None)
    metadata = steps.evaluate_and_finalize(digits, tmp_path, plots=False, log=lambda _: None)
    assert metadata == verify_artifacts(tmp_path)
    assert quantization(metadata) == "int8" and metadata.training["config"]["quantize"] == "int8"
    assert ONNX_FILE not in metadata.sha256


def test_a_failed_int8_build_names_the_float_flag(digits, trained_with, tmp_path, monkeypatch):
    monkeypatch.setattr(quantize_module, "MAX_EMBEDDING_DIFF", 1e-9)
    with pytest.raises(quantize_module.QuantizationError,
                       match=r"calibration failed \(--quantize none builds the float model\)$"):
        steps.train_and_export(digits, TrainConfig(**SMALL), tmp_path, log=lambda _: None)


def test_auto_builds_the_float_model_where_int8_cannot_be_built_and_says_why(digits, trained_with, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    lines: list[str] = []
    info = steps.train_and_export(digits, TrainConfig(**SMALL), tmp_path, log=lines.append)
    assert info["config"]["quantize"] == "none" and info["model_format"] == "torchscript"
    assert (tmp_path / MODEL_FILE).is_file() and not (tmp_path / AOTI_FILE).exists()
    (said,) = [line for line in lines if line.startswith("quantize auto:")]
    assert said.startswith("quantize auto: none for the digits profile, because the int8 model is compiled ahead of "
                           "time and no C++ compiler (/nonexistent/g++) is on PATH (apt-get install g++); the float")


def test_an_explicit_int8_that_cannot_be_built_is_refused_before_training(digits, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(steps, "train_model", lambda *a, **k: pytest.fail("trained before refusing int8"))
    with pytest.raises(QuantizationError, match=r"no C\+\+ compiler .*\(--quantize none builds the float model\)$"):
        steps.train_and_export(digits, TrainConfig(**SMALL, quantize="int8"), tmp_path, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("profile", "built", "accuracy_key"), [
    ("digits", "int8", "float_knn_accuracy"), ("full-frame", "none", "knn_accuracy")])
def test_the_pipeline_train_task_records_the_resolved_scheme(digits, trained, trained_with, tmp_path, profile, built,
                                                             accuracy_key):
    from kfp.dsl import Dataset as DatasetArtifact
    from kfp.dsl import Model

    from pipeline.components import train

    data = replace(digits, profile=profile)
    data.save(tmp_path / "data.npz")
    model = Model(name="model", uri=str(tmp_path / "model"))
    words = {p.name: p.default for p in TRAINING_PARAMS if p.name in CONFIG_FIELDS}  # quantize: its default
    words.update(epochs=1, embedding_dim=16, width=8, seed=0)
    train.python_func(dataset=DatasetArtifact(name="dataset", uri=str(tmp_path / "data.npz")), k=5, model=model,
                      **words)
    assert model.metadata["quantize"] == built
    other = {"knn_accuracy", "float_knn_accuracy"} - {accuracy_key}
    assert model.metadata[accuracy_key] == trained[1].epochs[-1]["knn_accuracy"] and not other & set(model.metadata)
