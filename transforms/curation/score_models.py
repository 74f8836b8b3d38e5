"""``RunInference`` model handlers for ``--quality_model``: one per kind of model.

A handler's example is one chunk, so each ``RunInference`` batch is one chunk (up to
``--chunk_records`` records, already a deterministic group); inside it a Hugging Face model
reads the texts sorted by length in batches of at most ``TOKEN_BUDGET`` padded tokens. The
loaded model is a small object whose ``score(texts)`` does the work, so that with
``share=true`` Beam can serve one copy per machine to every process
(``multi_process_shared``), calling ``score`` across processes.

- ``fasttext``: a ``.bin`` model read with ``fasttext-predict`` (the pipeline's language
  model's reader); the score of a text is the probability fastText's ``predict(text, k=-1)``
  gives the model's ``label``, with line breaks as spaces (the model reads one line; DCLM and
  datatrove do the same). fastText reads the whole text.
- ``hf``: a directory holding an ``AutoModelForSequenceClassification`` and its tokenizer (needs
  ``torch``, which the pipeline does not install for you), run on the worker's GPU when it has
  one. A text is read up to the tokenizer's
  ``model_max_length`` (or the model's position limit, if smaller) and cut there, as FineWeb-Edu's
  classifier does (``truncation=True``, 512 tokens). The score is the regression head's value,
  or the softmax probability of ``label`` (class 1 of a two-class head by default).

Paths may be local or on any Beam filesystem (``gs://``): they are copied to a local cache once
per machine first.
"""

from __future__ import annotations

import functools
import resource
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference import base as inference_base
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from transforms.core.tokenizer import fetch_remote_dir, fetch_remote_file
from transforms.curation.scores import ScoreModel, chunk_texts

# Beam 2.77 imports ``resource`` in the same try as its model manager, which needs scipy: without
# scipy it logs a warning per batch and reports no memory. The standard module is all it needs.
if inference_base.resource is None:
    inference_base.resource = resource

TOKEN_BUDGET = 16384  # padded tokens per forward pass of a Hugging Face model
MAX_BATCH = 64  # texts per forward pass
FASTTEXT_PREFIX = "__label__"


def _local(path: str, directory: bool) -> str:
    """``path`` itself when local, else a local copy of the file or directory."""
    if FileSystems.get_scheme(path) in (None, "file"):
        return path
    return fetch_remote_dir(path) if directory else fetch_remote_file(path)


class FastTextScores:
    """A fastText classifier's probability of one label, per text."""

    def __init__(self, path: str, label: str):
        import fasttext  # fasttext-predict

        self.model = fasttext.load_model(path)
        self.label = FASTTEXT_PREFIX + label
        known, _ = self.model.predict("", k=-1, threshold=-1.0)
        if self.label not in known:
            names = ", ".join(sorted(name.removeprefix(FASTTEXT_PREFIX) for name in known))
            raise ValueError(f"fastText model {path}: no label {label!r} (its labels: {names})")

    def score(self, texts: Sequence[str]) -> np.ndarray:
        scores = np.zeros(len(texts), np.float32)
        for index, text in enumerate(texts):
            labels, probabilities = self.model.predict(text.replace("\n", " "), k=-1,
                                                       on_unicode_error="replace")
            for label, probability in zip(labels, probabilities, strict=True):
                if label == self.label:
                    scores[index] = probability
        return scores


class HfScores:
    """A sequence classifier's regression value or class probability, per text."""

    def __init__(self, folder: str, label: str | None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        # A GPU worker's (docs/deployment.md); the CPU everywhere else.
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder).eval().to(
            self.device)
        config = self.model.config
        self.max_length = min(self.tokenizer.model_max_length,
                              getattr(config, "max_position_embeddings", None) or 10**9)
        self.column = None if config.num_labels == 1 else class_index(config, label, folder)

    def score(self, texts: Sequence[str]) -> np.ndarray:
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        ids = encoded["input_ids"]
        scores = np.zeros(len(texts), np.float32)
        for batch in length_batches([len(i) for i in ids]):
            features = self.tokenizer.pad({key: [values[i] for i in batch]
                                           for key, values in encoded.items()},
                                          return_tensors="pt").to(self.device)
            with self.torch.inference_mode():
                logits = self.model(**features).logits.float()
            values = (logits[:, 0] if self.column is None
                      else logits.softmax(-1)[:, self.column])
            scores[batch] = values.cpu().numpy()
        return scores


def class_index(config: Any, label: str | None, folder: str) -> int:
    """The column of ``label`` (a name in ``id2label`` or an index); class 1 of two by
    default."""
    names = {str(name): int(index) for index, name in config.id2label.items()}
    if label is None:
        if config.num_labels == 2:
            return 1
        raise ValueError(f"model {folder} has {config.num_labels} classes: name the one to "
                         f"score with '#label=NAME' ({', '.join(names)})")
    if label in names:
        return names[label]
    if label.isdigit() and int(label) < config.num_labels:
        return int(label)
    raise ValueError(f"model {folder}: no class {label!r} (its classes: {', '.join(names)})")


def length_batches(lengths: Sequence[int]) -> list[list[int]]:
    """Indices grouped into batches, shortest texts first, each of at most ``MAX_BATCH`` texts
    and ``TOKEN_BUDGET`` tokens once padded to its longest."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if batch and (len(batch) == MAX_BATCH
                      or (len(batch) + 1) * lengths[index] > TOKEN_BUDGET):
            batches.append(batch)
            batch = []
        batch.append(index)
    if batch:
        batches.append(batch)
    return batches


class ChunkScorer(ModelHandler[Any, np.ndarray, Any]):
    """Scores whole chunks: each ``RunInference`` batch is one chunk; the model's ``score``
    batches its texts. Subclasses load the model."""

    def __init__(self, model: ScoreModel, text: Callable[..., str] | None):
        super().__init__(min_batch_size=1, max_batch_size=1, large_model=model.share)
        self.spec = model
        self.text = text

    def run_inference(self, batch: Sequence[Any], model: Any,
                      inference_args: dict | None = None) -> Iterable[PredictionResult]:
        for chunk in batch:
            yield PredictionResult(chunk, model.score(chunk_texts(chunk, self.text)),
                                   self.spec.name)

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        """Characters scored (Beam's default pickles the whole batch to measure it)."""
        return sum(len(text) for chunk in batch for text in chunk_texts(chunk, self.text))

    def get_metrics_namespace(self) -> str:
        return f"quality_model_{self.spec.name}"


@functools.cache
def loaded(kind: str, path: str, label: str | None) -> FastTextScores | HfScores:
    """A model, loaded once per process: both branches' ``RunInference`` steps (each holds its
    own handle) then share one copy instead of loading it twice."""
    if kind == "fasttext":
        return FastTextScores(_local(path, directory=False), label or "")
    return HfScores(_local(path, directory=True), label)


class FastTextScorer(ChunkScorer):
    def load_model(self) -> FastTextScores:
        return loaded("fasttext", self.spec.path, self.spec.label)


class HfScorer(ChunkScorer):
    def load_model(self) -> HfScores:
        return loaded("hf", self.spec.path, self.spec.label)


HANDLERS: dict[str, type[ChunkScorer]] = {"fasttext": FastTextScorer, "hf": HfScorer}


def model_handler(model: ScoreModel, text: Callable[..., str] | None) -> ChunkScorer:
    return HANDLERS[model.kind](model, text)
