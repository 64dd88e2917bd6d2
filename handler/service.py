"""The model service without TorchServe: decode -> predict -> encode for a batch of requests."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .artifacts import (
    INDEX_FILE,
    LABELS_FILE,
    METADATA_FILE,
    ONNX_FILE,
    SOURCE_KEYS,
    ArtifactError,
    enrolled_switch,
    open_set_settings,
    read_sources,
    sha256_file,
    verify_artifacts,
)
from .answer import NO_INK, SEVERAL_DIGITS, Answer, Refusal, Result
from .metadata import ModelMetadata
from .network import DEFAULT_RUNTIME, AotiModel, OnnxModel, load_model
from .preprocessing import DEFAULT_MAX_PIXELS, InvalidImageError, ProfileError, is_blank, profile_of
from .requests import RequestError
from .search import GallerySearcher

logger = logging.getLogger(__name__)


@dataclass
class BatchTimings:
    """Seconds spent in each stage of one batch (fed to TorchServe metrics and logs)."""

    preprocess: float = 0.0
    embed: float = 0.0
    search: float = 0.0
    rejected: int = 0
    unknown: int = 0
    top1: list[float] = field(default_factory=list)


@dataclass
class Prepared:
    """A batch after preprocessing: answers so far (errors for refused payloads), tensors of the good ones, and
    which payloads hold several digits side by side."""

    answers: list[Result | None]
    good: list[int] = field(default_factory=list)
    tensors: list[np.ndarray] = field(default_factory=list)
    several: set[int] = field(default_factory=set)
    timings: BatchTimings = field(default_factory=BatchTimings)


def with_embedding(answer: Answer, embedding: np.ndarray, gallery_ids: np.ndarray,
                   sources: tuple[str, Sequence[str | int]] | None = None) -> Answer:
    """The answer of the request option: each neighbour gets its gallery index ``id`` and, when training
    recorded one, its source (``file`` or ``dataset_index``); the answer gets the ``embedding`` vector.

    ``gallery_ids`` is the query's row of ``GallerySearcher.neighbours`` (-1 for missing hits, which the
    answer's neighbours skip). Floats are float32 values written exactly (no rounding).
    """
    valid = [int(i) for i in gallery_ids if i >= 0]
    if len(valid) != len(answer.neighbours):
        raise ValueError(f"{len(answer.neighbours)} neighbours in the answer for {len(valid)} gallery ids")
    neighbours = []
    for neighbour, gallery_id in zip(answer.neighbours, valid):
        source = {} if sources is None else {SOURCE_KEYS[sources[0]]: sources[1][gallery_id]}
        neighbours.append(replace(neighbour, id=gallery_id, **source))
    return replace(answer, neighbours=tuple(neighbours),
                   embedding=tuple(float(v) for v in np.asarray(embedding, dtype=np.float32).ravel()))


class EmbeddingService:
    """Verified artifacts loaded once; answers a batch of image payloads with one forward and one search."""

    def __init__(self, model: "torch.jit.ScriptModule | AotiModel | OnnxModel", searcher: GallerySearcher,
                 metadata: ModelMetadata,
                 device: str = "cpu", max_pixels: int = DEFAULT_MAX_PIXELS,
                 sources: tuple[str, Sequence[str | int]] | None = None, digest: str | None = None) -> None:
        self.model = model
        #: What runs the network (handler.network.RUNTIMES), and from which file.
        self.runtime = "onnxruntime" if isinstance(model, OnnxModel) else "torch"
        self.network_file = ONNX_FILE if isinstance(model, OnnxModel) else metadata.model_file
        self.searcher = searcher
        self.metadata = metadata
        #: The preprocessing the model was trained with (raises ProfileError for one this code does not know).
        self.profile = profile_of(metadata.preprocessing)
        self.device = torch.device(device)
        self.max_pixels = max_pixels
        #: (kind, id per gallery item) recorded by training; None for artifacts older than sources.json.
        self.sources = sources
        #: "sha256:<hex>" of metadata.json, every answer's ``model_digest``; None for a service built in memory.
        self.digest = digest
        if self.device.type == "cuda":
            # cuDNN convolves float32 in TF32 by default (Ampere and later): 10 mantissa bits, errors of about
            # 1e-3 in the embeddings. Answers on a GPU must be the CPU's (python -m bench.gpu_check): float32.
            # The legacy switches on purpose: once torch >= 2.9's fp32_precision API is used, reading
            # allow_tf32 (as other code may) raises.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        probe = self.embed(np.zeros((1, 1, 28, 28), np.float32))  # warm-up, and a contract check
        if probe.shape[1] != searcher.dim:
            raise ArtifactError(f"model embeds into {probe.shape[1]} dimensions but the index holds {searcher.dim}")

    @classmethod
    def from_dir(cls, model_dir: Path, device: str = "cpu", k: int | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS, runtime: str = DEFAULT_RUNTIME,
                 threads: int | None = None) -> "EmbeddingService":
        """Load from a directory only after every artifact's SHA-256 matched metadata.json; the open-set score and
        threshold are the ones metadata.json records (handler.artifacts.open_set_settings), and so is the
        enrolled-class switch (handler.artifacts.enrolled_switch; none: the vote alone). ``runtime`` and ``threads``:
        see :func:`handler.network.load_model`."""
        model_dir = Path(model_dir)
        metadata = verify_artifacts(model_dir)
        try:
            profile_of(metadata.preprocessing)
        except ProfileError as exc:
            raise ArtifactError(str(exc)) from None
        open_set = open_set_settings(metadata)
        switch = enrolled_switch(metadata)
        model = load_model(model_dir, metadata, device, runtime, threads)
        searcher = GallerySearcher.from_files(
            model_dir / INDEX_FILE, model_dir / LABELS_FILE, k=k or metadata.k,
            threshold=open_set["threshold"], score=open_set["score"], kth=open_set["kth"],
            prototypes=open_set["prototypes"], switch=switch,
            search_params=metadata.index.get("search_params"),
        )
        sources = read_sources(model_dir, metadata, searcher.index.ntotal)
        digest = f"sha256:{sha256_file(model_dir / METADATA_FILE)}"
        return cls(model, searcher, metadata, device, max_pixels, sources, digest)

    def embed(self, batch: np.ndarray) -> np.ndarray:
        """(N, 1, 28, 28) float32 inputs -> (N, D) float32 embeddings, in either runtime."""
        if isinstance(self.model, OnnxModel):
            return self.model(batch).astype(np.float32, copy=False)
        with torch.inference_mode():
            x = torch.from_numpy(batch).to(self.device)
            return self.model(x).float().cpu().numpy()

    def prepare(self, payloads: Sequence[bytes | np.ndarray | RequestError]) -> Prepared:
        """Stage 1, preprocessing: each payload (image bytes, or a 2-D uint8 image) to the training tensor, and
        whether it is blank or holds several digits; a bad one gets its error answer here and takes no part in the
        later stages."""
        prepared = Prepared([None] * len(payloads))
        started = time.perf_counter()
        for i, payload in enumerate(payloads):
            try:
                if isinstance(payload, RequestError):
                    raise payload
                tensor, several = self.profile.read(payload, self.max_pixels)
                prepared.tensors.append(tensor)
                prepared.good.append(i)
                if several:
                    prepared.several.add(i)
            except (RequestError, InvalidImageError) as exc:
                prepared.answers[i] = Refusal.of(exc)
                prepared.timings.rejected += 1
            except Exception:  # a bug, not bad input: fail this request alone, keep the batch
                logger.exception("unexpected error preprocessing request %d", i)
                prepared.answers[i] = Refusal("internal error while preprocessing this image", 500)
                prepared.timings.rejected += 1
        prepared.timings.preprocess = time.perf_counter() - started
        return prepared

    def predict(self, prepared: Prepared, embedding: Sequence[bool] | None = None
                ) -> tuple[list[Result], BatchTimings]:
        """Stages 2 and 3: one forward pass and one gallery search for the prepared tensors; one answer per
        payload, in order. ``embedding[i]`` true: payload i's answer also carries its embedding and the
        neighbours' gallery ids (:func:`with_embedding`)."""
        answers, timings = prepared.answers, prepared.timings
        if embedding is not None and len(embedding) != len(answers):
            raise ValueError(f"{len(embedding)} embedding flags for {len(answers)} payloads")
        if prepared.good:
            started = time.perf_counter()
            embeddings = self.embed(np.stack(prepared.tensors))
            timings.embed = time.perf_counter() - started
            started = time.perf_counter()
            distances, ids, scores = self.searcher.search(embeddings)
            switched = self.searcher.switched(embeddings)  # None without an enrolled-class switch: the vote alone
            if switched is None:
                results = [self.searcher.answer(d, g, score) for d, g, score in zip(distances, ids, scores)]
            else:
                results = [self.searcher.answer(d, g, score, to)
                           for d, g, score, to in zip(distances, ids, scores, switched)]
            timings.search = time.perf_counter() - started
            for row, (i, tensor, result) in enumerate(zip(prepared.good, prepared.tensors, results)):
                # Nothing to recognise, or more than one digit: never answered as one.
                reason = NO_INK if is_blank(tensor) else SEVERAL_DIGITS if i in prepared.several else None
                if reason is not None:
                    result = result.as_unknown(reason)
                if embedding is not None and embedding[i]:
                    result = with_embedding(result, embeddings[row], ids[row], self.sources)
                result.model_digest = self.digest  # a fresh answer of this batch's: set, not copied
                answers[i] = result
                timings.unknown += result.unknown
                timings.top1.append(result.dist)
        return answers, timings  # type: ignore[return-value]

    def answer(self, payloads: Sequence[bytes | np.ndarray | RequestError],
               embedding: Sequence[bool] | None = None) -> tuple[list[dict[str, Any]], BatchTimings]:
        """All stages for a batch, as a server answers it: :meth:`prepare`, then :meth:`predict`, each answer (or
        a bad item's refusal) as its JSON object."""
        answers, timings = self.predict(self.prepare(payloads), embedding)
        return [answer.to_json() for answer in answers], timings
