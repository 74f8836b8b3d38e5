"""Model-based quality scores (``--quality_model``): users' own classifiers over the text that
is trained on, as FineWeb-Edu and DCLM filter.

Each model scores every knowledge document (after normalisation, personal data, boilerplate,
deduplication and decontamination, so on the text the tokenizer sees) and, unless declared for
one branch, every conversation. A score is a number per record: the probability of one class
(``label``), or a regression head's value. Scoring goes through Beam's ``RunInference`` with
one ``ModelHandler`` per kind (``transforms.curation.score_models``): the model is loaded once
per process, or once per machine with ``share=true``; each batch is one chunk, batched again
inside by length. ``FilterByScore`` then keeps a record's scores on it (``documents/``,
``sft_examples/``, the manifest's histogram) and drops those under ``--min_quality_score`` as
``low_quality_score``.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam

from transforms.core.chunks import Chunk
from transforms.core.records import LABEL, Record, Rejection, replaced, strings_in
from transforms.core.steps import ChunkStep
from transforms.core.vocabulary import BRANCHES, FILTERED, LOW_QUALITY_SCORE

KINDS = ("fasttext", "hf")
MODEL_SETTINGS = ("label", "branch", "share")
INSTRUCTION_TEXTS = ("conversation", "assistant")  # or FIELD + a field's name
FIELD = "field:"
BIN_WIDTH = 0.05  # the manifest's histogram of each model's scores
_MICRO = 1_000_000  # scores are summed as integer millionths: counters are integers


@dataclasses.dataclass(frozen=True)
class ScoreModel:
    """One ``--quality_model`` value: ``[NAME=]KIND:PATH[#label=L;branch=B;share=true]``.

    ``label`` names the class whose probability is the score (a fastText label without
    ``__label__``; a Hugging Face class name from ``id2label`` or its index); a regression head
    needs none, and a two-class head defaults to class 1. ``branch`` scores one branch only.
    ``share`` loads one copy per machine instead of one per process.
    """

    name: str
    kind: str
    path: str
    label: str | None = None
    branch: str | None = None
    share: bool = False

    def scores(self, branch: str) -> bool:
        return self.branch in (None, branch)


@dataclasses.dataclass(frozen=True)
class ScoreConfig:
    models: tuple[ScoreModel, ...] = ()
    thresholds: tuple[tuple[str, float], ...] = ()  # (model name, minimum score)
    instruction_text: str = "conversation"

    def for_branch(self, branch: str) -> ScoreConfig:
        """The models that score ``branch`` and their thresholds."""
        models = tuple(model for model in self.models if model.scores(branch))
        names = {model.name for model in models}
        return ScoreConfig(models, tuple(t for t in self.thresholds if t[0] in names),
                           self.instruction_text)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(model.name for model in self.models)


def parse_model(value: str) -> ScoreModel:
    """``dclm=fasttext:gs://bucket/dclm.bin#label=hq`` -> a ``ScoreModel``; ValueError names
    what is wrong."""
    spec, _, declarations = value.strip().partition("#")
    name, eq, rest = spec.partition("=")
    if not eq:
        name, rest = "", spec
    kind, colon, path = rest.partition(":")
    kind, path = kind.strip(), path.strip()
    if not colon or kind not in KINDS or not path:
        raise ValueError(f"--quality_model {value!r}: expected [NAME=]KIND:PATH with KIND one "
                         f"of {', '.join(KINDS)} (e.g. 'edu=hf:/models/fineweb-edu')")
    name = name.strip() or pathlib.PurePosixPath(path.rstrip("/")).stem.replace(".", "_")
    if not LABEL.fullmatch(name):
        raise ValueError(f"--quality_model {value!r}: name {name!r} must be letters, digits, "
                         "'_' and '-' (give one: NAME=KIND:PATH)")
    settings: dict[str, str] = {}
    for pair in filter(str.strip, declarations.split(";")):
        key, eq, setting = (part.strip() for part in pair.partition("="))
        if not eq or key not in MODEL_SETTINGS or not setting:
            raise ValueError(f"--quality_model {value!r}: {pair.strip()!r} is not one of "
                             f"{', '.join(k + '=...' for k in MODEL_SETTINGS)}")
        settings[key] = setting
    branch = settings.get("branch")
    if branch is not None and branch not in BRANCHES:
        raise ValueError(f"--quality_model {value!r}: branch must be one of {', '.join(BRANCHES)}")
    share = settings.get("share", "false").lower()
    if share not in ("true", "false"):
        raise ValueError(f"--quality_model {value!r}: share must be true or false")
    if kind == "fasttext" and "label" not in settings:
        raise ValueError(f"--quality_model {value!r}: a fastText model needs the label whose "
                         "probability is the score, e.g. '#label=hq' for DCLM's classifier")
    return ScoreModel(name, kind, path, settings.get("label"), branch, share == "true")


def parse_models(text: str) -> tuple[ScoreModel, ...]:
    """Comma-separated ``--quality_model`` values; names must differ."""
    models = tuple(parse_model(part) for part in text.split(",") if part.strip())
    names = [model.name for model in models]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"--quality_model: two models are named {', '.join(twice)}; name them "
                         "apart with NAME=KIND:PATH")
    return models


def parse_thresholds(text: str) -> tuple[tuple[str, float], ...]:
    """``edu=3,dclm=0.5`` -> ((name, minimum), ...), sorted by name."""
    found: dict[str, float] = {}
    for pair in filter(str.strip, text.split(",")):
        name, eq, number = (part.strip() for part in pair.partition("="))
        try:
            minimum = float(number)
        except ValueError:
            minimum = math.nan
        if not eq or not name or math.isnan(minimum):
            raise ValueError(f"--min_quality_score: {pair.strip()!r} is not NAME=NUMBER")
        found[name] = minimum
    return tuple(sorted(found.items()))


def check_config(config: ScoreConfig) -> None:
    """ValueError for a threshold on a model that is not given, and for a bad text choice."""
    names = {model.name for model in config.models}
    unknown = [name for name, _ in config.thresholds if name not in names]
    if unknown:
        raise ValueError(f"--min_quality_score names no --quality_model: {', '.join(unknown)} "
                         f"(models: {', '.join(sorted(names)) or 'none'})")
    text = config.instruction_text
    field = text.startswith(FIELD) and text.removeprefix(FIELD).strip()
    if text not in INSTRUCTION_TEXTS and not field:
        raise ValueError(f"--quality_text {text!r}: expected {', '.join(INSTRUCTION_TEXTS)} or "
                         "field:NAME")


# --------------------------------------------------------------------------- what is scored


def message_text(messages: Sequence[dict], roles: tuple[str, ...]) -> str:
    """The text contents of the messages of ``roles``, in order, one per line."""
    return "\n".join(m["content"] for m in messages
                     if m.get("role") in roles and isinstance(m.get("content"), str))


def field_text(value: Any) -> str:
    """A record field as text: a string as it is, anything else as its strings joined."""
    return value if isinstance(value, str) else "\n".join(strings_in(value))


@dataclasses.dataclass(frozen=True)
class InstructionText:
    """What a conversation's score reads (``--quality_text``): the user and assistant turns
    (``conversation``), the assistant's only, or one field of the record as stored."""

    choice: str = "conversation"

    def __call__(self, record: Record, conversation: Any) -> str:
        if self.choice.startswith(FIELD):
            name = self.choice.removeprefix(FIELD)
            value = record.value.get(name) if isinstance(record.value, dict) else None
            return "" if value is None else field_text(value)
        roles = ("assistant",) if self.choice == "assistant" else ("user", "assistant")
        return message_text(conversation.messages, roles)


def chunk_texts(chunk: Any, text: Callable[..., str] | None) -> list[str]:
    """The texts a chunk's records are scored on: documents as they are, conversations by
    ``text``."""
    if text is None:
        return [record.value for record in chunk.records]
    return [text(record, conversation)
            for record, conversation in zip(chunk.records, chunk.conversations, strict=True)]


# --------------------------------------------------------------------------- the steps


def with_scores(chunk: Any, name: str, scores: Sequence[float]) -> Any:
    """``chunk`` with each record's score from model ``name`` added to ``Record.scores``."""
    records = tuple(replaced(record, scores=(*record.scores, (name, float(score))))
                    for record, score in zip(chunk.records, scores, strict=True))
    return dataclasses.replace(chunk, records=records)


def attach_scores(result: Any, name: str) -> Any:
    """A ``PredictionResult`` (a chunk and its scores) -> the chunk, scores on its records."""
    return with_scores(result.example, name, result.inference)


class ScoreRecords(beam.PTransform):
    """Scores a branch's chunks with each model in turn, through ``RunInference``."""

    def __init__(self, models: Sequence[ScoreModel], text: Callable[..., str] | None = None):
        super().__init__()
        self.models = tuple(models)
        self.text = text

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        from apache_beam.ml.inference.base import RunInference

        from transforms.curation.score_models import model_handler

        for model in self.models:
            handler = model_handler(model, self.text)
            chunks = (chunks
                      | f"Score_{model.name}" >> RunInference(
                          handler, model_identifier=f"quality-model-{model.name}")
                      | f"Attach_{model.name}" >> beam.Map(attach_scores, model.name)
                      .with_output_types(Chunk))
        return chunks


def score_bin(score: float) -> int:
    """The histogram bin of a score: ``BIN_WIDTH`` wide, numbered from 0 up (and down)."""
    return math.floor(score / BIN_WIDTH)


class FilterByScore(ChunkStep):
    """Counts each record's scores into the manifest's histogram (``scores.BRANCH.NAME.``) and
    drops a record scored under a ``--min_quality_score`` as ``low_quality_score``."""

    step_name = "scores"

    def __init__(self, branch: str, thresholds: Sequence[tuple[str, float]]):
        self.branch = branch
        self.thresholds = tuple(thresholds)

    def run(self, chunk: Any) -> Iterator[Any]:
        kept = []
        for index, record in enumerate(chunk.records):
            scores = dict(record.scores)
            for name, score in scores.items():
                prefix = f"scores.{self.branch}.{name}"
                self.count(f"{prefix}.scored")
                self.count(f"{prefix}.sum_micro", round(score * _MICRO))
                self.count(f"{prefix}.bin.{score_bin(score)}")
            failed = next(((name, minimum) for name, minimum in self.thresholds
                           if scores[name] < minimum), None)
            if failed is None:
                kept.append(index)
                continue
            name, minimum = failed
            self.count(f"scores.{self.branch}.{name}.filtered")
            if self.branch == "knowledge":
                self.count(f"knowledge.dropped.{LOW_QUALITY_SCORE}")
            self.drop(Rejection.of(record, LOW_QUALITY_SCORE,
                                   f"scored {scores[name]:.4f} by {name}, under "
                                   f"--min_quality_score {name}={minimum:g}"), kind=FILTERED)
        if kept:
            yield chunk.take(kept)


def score_summary(counts: dict[str, int], minimum: float | None) -> dict:
    """One model's manifest entry from its counters (``FilterByScore``): how many records it
    scored, their mean, a histogram by ``BIN_WIDTH`` (lower edge -> records), the threshold and
    how many records it filtered."""
    scored = counts.get("scored", 0)
    bins = sorted((int(key[4:]), value) for key, value in counts.items()
                  if key.startswith("bin."))
    return {
        "scored": scored,
        "mean": round(counts.get("sum_micro", 0) / _MICRO / scored, 4) if scored else None,
        "bin_width": BIN_WIDTH,
        "histogram": {f"{round(b * BIN_WIDTH, 4):g}": n for b, n in bins},
        "min_score": minimum,
        "filtered": counts.get("filtered", 0),
    }
