"""The handler's device setting and the service's CUDA set-up, checked without a GPU."""

from __future__ import annotations

import pytest
import torch

from handler.embedding_handler import pick_device


@pytest.mark.parametrize(
    ("gpu_id", "setting", "available", "expected"),
    [(0, "auto", True, "cuda:0"), (1, "auto", True, "cuda:1"), (0, "auto", False, "cpu"), (None, "auto", True, "cpu"),
     (0, "cpu", True, "cpu"), (None, "cuda", True, "cuda:0"), (2, "cuda", True, "cuda:2"),
     (None, "cuda:3", True, "cuda:3"), (0, "", True, "cuda:0")])
def test_handler_device_setting(gpu_id, setting, available, expected):
    assert pick_device(gpu_id, setting, available) == expected


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "tpu"])
def test_handler_device_setting_is_refused_when_it_cannot_be_honoured(setting):
    with pytest.raises(ValueError, match="handler.device"):
        pick_device(0, setting, cuda_available=False)


def test_service_on_cuda_turns_tf32_off(monkeypatch):
    """The CUDA branch of EmbeddingService's set-up, without a GPU (embed is stubbed)."""
    import numpy as np

    from handler.metadata import Metrics, ModelMetadata
    from handler.preprocessing import DIGITS
    from handler.service import EmbeddingService

    recorded = ModelMetadata(k=5, metrics=Metrics(0.9), preprocessing=DIGITS.record())

    class Searcher:
        dim = 4

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setattr(EmbeddingService, "embed", lambda self, batch: np.zeros((len(batch), 4), np.float32))
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        EmbeddingService(None, Searcher(), recorded, device="cpu")
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        EmbeddingService(None, Searcher(), recorded, device="cuda")
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
