"""model.onnx beside model.pt: the parity-checked export, its checksum, and the handler's onnxruntime runtime giving
the TorchScript runtime's answers. Real onnx/onnxruntime throughout; only their absence is simulated."""

from __future__ import annotations

import json
import logging
import shutil
import sys

import numpy as np
import pytest
import torch
from serving.samples import user_digit_png
from support.handler_context import make_context, run_batch
from support.imagegen import raw_row

from handler.artifacts import METADATA_FILE, MODEL_FILE, ONNX_FILE, ArtifactError, artifact_files, verify_artifacts
from handler.embedding_handler import EmbeddingHandler
from handler.service import EmbeddingService, OnnxModel
from training import export as export_module
from training.export import PARITY_TOLERANCE, ExportError, export_onnx
from training.model import EmbeddingNet

pytest.importorskip("onnxruntime")


def copy_of(tiny_artifacts, tmp_path):
    copy = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    return copy


def without_onnx(directory) -> None:
    """Make artifacts look like those trained without onnx installed."""
    (directory / ONNX_FILE).unlink()
    metadata = json.loads((directory / METADATA_FILE).read_text())
    del metadata["sha256"][ONNX_FILE]
    (directory / METADATA_FILE).write_text(json.dumps(metadata))


def test_onnx_export_matches_eager_for_any_batch_size(tmp_path, prepared_sample):
    import onnxruntime as ort

    torch.manual_seed(0)
    model = EmbeddingNet(embedding_dim=16, width=8)  # left in train mode: export must switch to eval
    path = tmp_path / ONNX_FILE
    diff = export_onnx(model, path, prepared_sample.inputs("test")[:64])
    assert diff is not None and 0.0 <= diff <= PARITY_TOLERANCE
    assert [p.name for p in tmp_path.iterdir()] == [ONNX_FILE]  # no partial file left beside it
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 3, 130):  # the batch axis is dynamic
        x = prepared_sample.inputs("test")[100 : 100 + n]
        with torch.no_grad():
            eager = model(torch.as_tensor(x)).numpy()
        out = session.run(None, {session.get_inputs()[0].name: x})[0]
        assert out.shape == (n, 16) and out.dtype == np.float32
        np.testing.assert_allclose(out, eager, atol=PARITY_TOLERANCE, rtol=0)


def test_onnx_parity_failure_raises_and_leaves_no_file(tmp_path, prepared_sample, monkeypatch):
    monkeypatch.setattr(export_module, "PARITY_TOLERANCE", -1.0)
    path = tmp_path / ONNX_FILE
    path.write_bytes(b"stale model from an earlier build")
    with pytest.raises(ExportError, match="ONNX Runtime output differs from eager"):
        export_onnx(EmbeddingNet(embedding_dim=8, width=4), path, prepared_sample.inputs("test")[:8])
    assert list(tmp_path.iterdir()) == []


def test_training_records_onnx_checksum_and_parity(tiny_artifacts):
    metadata = verify_artifacts(tiny_artifacts)
    assert ONNX_FILE in artifact_files(metadata)  # so serving/archive.py packs it into the .mar
    assert (tiny_artifacts / ONNX_FILE).is_file()
    train = json.loads((tiny_artifacts / "train.json").read_text())
    assert 0.0 <= train["onnx_max_abs_diff"] <= PARITY_TOLERANCE
    assert metadata.training["onnx_max_abs_diff"] == train["onnx_max_abs_diff"]
    assert metadata.training["onnx_opset"] == export_module.ONNX_OPSET
    assert {"onnx", "onnxruntime"} <= set(metadata.versions)


@pytest.mark.parametrize("damage", ["tampered", "missing", "unrecorded"])
def test_model_onnx_is_checksummed(tiny_artifacts, tmp_path, damage):
    copy = copy_of(tiny_artifacts, tmp_path)
    if damage == "tampered":
        data = bytearray((copy / ONNX_FILE).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (copy / ONNX_FILE).write_bytes(bytes(data))
    elif damage == "missing":
        (copy / ONNX_FILE).unlink()
    else:  # a model.onnx that training did not write
        content = (copy / ONNX_FILE).read_bytes()
        without_onnx(copy)
        (copy / ONNX_FILE).write_bytes(content)
    with pytest.raises(ArtifactError, match=r"model\.onnx") as excinfo:
        verify_artifacts(copy)
    assert "\n" not in str(excinfo.value)


@pytest.fixture(scope="module")
def both_services(tiny_artifacts):
    return (EmbeddingService.from_dir(tiny_artifacts),
            EmbeddingService.from_dir(tiny_artifacts, runtime="onnxruntime", threads=1))


def test_onnxruntime_service_answers_as_torchscript(both_services, prepared_sample):
    torchscript, onnxrt = both_services
    assert (torchscript.runtime, onnxrt.runtime) == ("torch", "onnxruntime")
    assert isinstance(onnxrt.model, OnnxModel) and onnxrt.model.threads == 1
    x = prepared_sample.inputs("test")[:300]
    a, b = torchscript.embed(x), onnxrt.embed(x)
    assert b.dtype == np.float32 and b.shape == a.shape == (300, torchscript.searcher.dim)
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    da, ia, sa = torchscript.searcher.search(a)
    db, ib, sb = onnxrt.searcher.search(b)
    labels = torchscript.searcher.labels
    assert [[labels[i] for i in row] for row in ia] == [[labels[i] for i in row] for row in ib]
    np.testing.assert_allclose(db, da, atol=1e-5, rtol=0)
    np.testing.assert_allclose(sb, sa, atol=1e-5, rtol=0)
    answers_a, answers_b = torchscript.searcher.classify(a), onnxrt.searcher.classify(b)
    assert [(r["pred"], r["unknown"]) for r in answers_a] == [(r["pred"], r["unknown"]) for r in answers_b]


def test_handler_with_onnxruntime_serves_the_torchscript_answers(loaded, tiny_artifacts, prepared_sample, caplog):
    handler, context = loaded
    onnx_context = make_context(tiny_artifacts, {"runtime": "onnxruntime", "threads": 1})
    onnx_handler = EmbeddingHandler()
    with caplog.at_level(logging.INFO):
        onnx_handler.initialize(onnx_context)
    assert "(onnxruntime: model.onnx)" in caplog.text
    rows = [raw_row(user_digit_png(prepared_sample.test_images[i])) for i in range(0, 80, 10)]
    expected, _ = run_batch(handler, context, rows)
    served, statuses = run_batch(onnx_handler, onnx_context, rows)
    assert statuses == [200] * len(rows)
    for a, b in zip(expected, served):
        assert (a["pred"], a["unknown"]) == (b["pred"], b["unknown"])
        assert [n["label"] for n in a["neighbours"]] == [n["label"] for n in b["neighbours"]]
        assert b["dist"] == pytest.approx(a["dist"], abs=1e-5)


def test_onnxruntime_refused_without_model_onnx(tiny_artifacts, tmp_path, caplog):
    copy = copy_of(tiny_artifacts, tmp_path)
    without_onnx(copy)
    EmbeddingService.from_dir(copy)  # the TorchScript default still serves these artifacts
    with pytest.raises(ArtifactError, match=r"model\.onnx: missing") as excinfo:
        EmbeddingService.from_dir(copy, runtime="onnxruntime")
    assert "\n" not in str(excinfo.value)
    with caplog.at_level(logging.ERROR), pytest.raises(ArtifactError, match=r"model\.onnx"):
        EmbeddingHandler().initialize(make_context(copy, {"runtime": "onnxruntime"}))
    assert any("refusing to load model" in r.getMessage() for r in caplog.records)


def test_onnxruntime_refused_when_not_installed_or_on_cuda(tiny_artifacts, monkeypatch):
    with pytest.raises(ArtifactError, match="runs on the CPU only"):
        EmbeddingService.from_dir(tiny_artifacts, device="cuda", runtime="onnxruntime")
    with pytest.raises(ValueError, match="handler.runtime must be"):
        EmbeddingService.from_dir(tiny_artifacts, runtime="tensorrt")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(ArtifactError, match="onnxruntime is not installed") as excinfo:
        EmbeddingService.from_dir(tiny_artifacts, runtime="onnxruntime")
    assert "\n" not in str(excinfo.value)
    assert EmbeddingService.from_dir(tiny_artifacts).runtime == "torch"  # needs no onnxruntime
    # "torchscript", the default's name in model-config.yaml files written before model.pt2, still means it
    assert EmbeddingService.from_dir(tiny_artifacts, runtime="torchscript").runtime == "torch"


def test_training_without_onnx_installed_writes_no_model_onnx(prepared_sample, tmp_path, monkeypatch):
    from training.data import Dataset
    from training.steps import build_gallery, evaluate_and_finalize, train_and_export
    from training.train import TrainConfig

    monkeypatch.setattr(export_module, "onnx_modules", lambda: None)
    small = Dataset(prepared_sample.name, prepared_sample.train_images[:600], prepared_sample.train_labels[:600],
                    prepared_sample.test_images[:200], prepared_sample.test_labels[:200], prepared_sample.classes,
                    profile=prepared_sample.profile)
    out = tmp_path / "no-onnx"
    out.mkdir()
    (out / ONNX_FILE).write_bytes(b"stale model from an earlier build")
    lines: list[str] = []
    info = train_and_export(small, TrainConfig(epochs=1, embedding_dim=8, width=4, batch_size=32, seed=0,
                                                   negatives=0, printed=0, quantize="none"), out,
                            log=lines.append)
    assert any(line.startswith("ONNX export skipped: onnx/onnxruntime not installed") for line in lines)
    assert info["onnx_max_abs_diff"] is None
    build_gallery(small, out, log=lambda _: None)
    metadata = evaluate_and_finalize(small, out, plots=False, log=lambda _: None)
    assert not (out / ONNX_FILE).exists() and (out / MODEL_FILE).is_file()
    assert ONNX_FILE not in metadata.sha256 and "onnxruntime" not in metadata.versions
    assert ONNX_FILE not in artifact_files(verify_artifacts(out))
