"""ClassifyRecords: routes every record to the knowledge branch, the instruction branch or
rejected/, by what the user declared for its input or else by the record's own shape.

Routing is decided per record by ``classify``, a pure function, so the rules are easy to test
and the PTransform only splits each chunk into the branch chunks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam

from transforms.core.fields import apply_field_map
from transforms.core.records import InputSpec, Record, RecordChunk, Rejection, replaced
from transforms.core.steps import ChunkStep, StepOutput, apply_step
from transforms.core.vocabulary import (
    EMPTY_RECORD,
    INSTRUCTION,
    KNOWLEDGE,
    MISSING_FIELD,
    NOT_AN_OBJECT,
    UNCLASSIFIABLE,
    WRONG_TYPE,
)
from transforms.curation.urls import url_domain
from transforms.instruction.adapters import instruction_format

TEXT_FORMAT = "text"


def classify(record: Record, spec: InputSpec) -> tuple[str, Record] | Rejection:
    """Returns (branch, record with its canonical value and format) or a Rejection."""
    if record.error is not None:
        return Rejection.of(record, record.error.reason, record.error.message)
    value: Any = record.value
    if isinstance(value, str):
        if spec.branch == INSTRUCTION:
            return Rejection.of(record, UNCLASSIFIABLE,
                                "input declared branch=instruction but the record is plain text")
        return _knowledge(record, value)
    if not isinstance(value, dict):
        return Rejection.of(record, NOT_AN_OBJECT, f"record is {type(value).__name__}")
    try:
        value = apply_field_map(value, spec.field_map)
    except KeyError as missing:
        return Rejection.of(record, MISSING_FIELD,
                            f"declared field(s) missing from the record: {missing.args[0]}")
    if spec.branch != KNOWLEDGE:
        fmt = instruction_format(value)
        if fmt is not None:
            return INSTRUCTION, replaced(record, value=value, format=fmt)
        if spec.branch == INSTRUCTION:
            return Rejection.of(record, UNCLASSIFIABLE,
                                "input declared branch=instruction but no instruction format "
                                f"matches fields {sorted(value)[:10]}")
    if "text" in value:
        text = value["text"]
        if not isinstance(text, str):
            return Rejection.of(record, WRONG_TYPE,
                                f"field 'text' is {type(text).__name__}, expected a string")
        url = value.get("url")
        if url is not None and not isinstance(url, str):
            return Rejection.of(record, WRONG_TYPE,
                                f"field 'url' is {type(url).__name__}, expected a string")
        return _knowledge(record, text, url or None)
    if spec.branch == KNOWLEDGE:
        return Rejection.of(record, MISSING_FIELD,
                            "input declared branch=knowledge but the record has no 'text' field "
                            "(map one with '#text=FIELD')")
    return Rejection.of(record, UNCLASSIFIABLE,
                        f"no known format matches fields {sorted(value)[:10]}")


def _knowledge(record: Record, text: str,
               url: str | None = None) -> tuple[str, Record] | Rejection:
    if not text.strip():
        return Rejection.of(record, EMPTY_RECORD, "document has no text")
    return KNOWLEDGE, replaced(record, value=text, format=TEXT_FORMAT, url=url)


class _Classify(ChunkStep):
    step_name = "classify"
    chunk_tags = (KNOWLEDGE, INSTRUCTION)

    def __init__(self, specs: Sequence[InputSpec]):
        self.specs = {spec.index: spec for spec in specs}

    def run(self, chunk: RecordChunk) -> Iterator[Any]:
        routed: dict[str, list[Record]] = {KNOWLEDGE: [], INSTRUCTION: []}
        self.count("records_read", len(chunk.records))
        for record in chunk.records:
            self.count(f"input.{record.input_index}.read")
            result = classify(record, self.specs[record.input_index])
            if isinstance(result, Rejection):
                self.drop(result)
            else:
                branch, routed_record = result
                routed[branch].append(routed_record)
        self.count_domains(routed[KNOWLEDGE])
        for branch, kept in routed.items():
            if kept:
                self.count(f"{branch}.records_in", len(kept))
                yield beam.pvalue.TaggedOutput(branch, RecordChunk(chunk.chunk_id, tuple(kept)))


    def count_domains(self, documents: Sequence[Record]) -> None:
        """Knowledge documents in, per domain of their URL: what the manifest's domain ranking
        subtracts the kept documents from."""
        for record in documents:
            domain = url_domain(record.url)
            if domain is not None:
                self.count("domains.documents")
                self.count_domain(domain, "documents")


class ClassifyRecords(beam.PTransform):
    """Chunks in; knowledge and instruction chunks, rejected parts and stats out."""

    def __init__(self, specs: Sequence[InputSpec]):
        super().__init__()
        self.specs = tuple(specs)

    def expand(self, chunks: beam.PCollection) -> StepOutput:
        return apply_step(chunks, "Classify", _Classify(self.specs), KNOWLEDGE, INSTRUCTION)
