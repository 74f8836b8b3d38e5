"""Deduplication's first pass judges a large chunk in helper processes exactly as in the calling
process: the same verdicts, text hashes, texts, MinHash keys and boilerplate units, in order."""

import csv
import json
import os
from pathlib import Path

from transforms.core import helpers
from transforms.core.records import InputSpec, Record
from transforms.curation.language import LanguageConfig
from transforms.curation.options import BranchCuration
from transforms.knowledge.dedup.first_pass import JudgeDocuments
from transforms.knowledge.options import KnowledgeConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def _records() -> list[Record]:
    """More than a helper batch from the bundled examples (present on every clone): C4 pages,
    some twice and some with an e-mail address planted (personal data), Shakespeare ten lines
    at a time (some the quality rules drop), Korean chatbot lines (another language), an
    instruction example (not a knowledge document) and a record that is not an object."""
    pages = [json.loads(line)["text"] for line in (EXAMPLES / "c4_sample.jsonl").open()]
    pages += pages[:20]
    pages += [f"{page}\n\nWrite to jane.doe{n}@mailbox.org for details." for n, page in
              enumerate(pages[:10])]
    lines = (EXAMPLES / "tinyshakespeare_excerpt.txt").read_text().splitlines()
    pages += ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
    pages += [" ".join(row[:2]) for row in csv.reader((EXAMPLES / "ko_chatbot_sample.csv").open())]
    values: list = [*pages, {"prompt": "Add 2 and 3.", "response": "5"}, 42]
    return [Record("examples", position, 0, value) for position, value in enumerate(values)]


def test_helper_processes_judge_a_large_chunk_exactly_as_this_process():
    records = _records()
    assert len(records) >= 2 * helpers.MIN_ITEMS
    english = BranchCuration(language=LanguageConfig(languages=("en",)))
    judge = JudgeDocuments([InputSpec(0, "examples")], KnowledgeConfig(2048, "drop"), english)
    here = judge(records)
    assert here[-2:] == [None, None]  # the instruction example and the rejected record
    assert here[-3] is None  # Korean, not selected
    kept = [found for found in here if found is not None and found.reason is None]
    assert {found.reason for found in here if found is not None} > {None}  # some dropped
    assert all(found.near[1] and found.text for found in kept)
    assert any(found.units for found in kept)  # paragraphs to count across documents
    planted = here[140:150]
    assert all(found.text.endswith("Write to <EMAIL> for details.") for found in planted)
    if (os.cpu_count() or 1) >= 2:
        helpers.close_helpers()
    assert helpers.start_split(judge, records)() == here
    if (os.cpu_count() or 1) >= 2:
        assert os.getpid() in helpers._POOLS  # the batch went to the helpers
