"""The main pass takes normalised, redacted texts from deduplication's first pass (by the hash of
the text as read) instead of preparing them again; runs without the bundled shared datasets."""

import collections
import json

import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import ROOT
from transforms.core.records import Record, RecordChunk
from transforms.core.steps import PARTS, STATS
from transforms.core.vocabulary import EMPTY_AFTER_NORMALIZATION
from transforms.curation.pii import PiiConfig
from transforms.knowledge import documents
from transforms.knowledge.documents import (
    NormalizeDocuments,
    RedactPersonalData,
    ReuseFirstPass,
    document_steps,
)
from transforms.knowledge.normalize import NormalizeConfig
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import text_hash
from transforms.knowledge.token_cache import Prepared, cache_path, read_prepared, write_chunk

C4 = ROOT / "examples" / "data" / "c4_sample.jsonl"
# Documents whose text the text steps change: line endings and spaces, personal data, nothing left.
CRAFTED = [
    "Write to ops.team@mailhost.org  about the outage.\r\nThe night shift saw the disk fill "
    "up at three in the morning, and the backups stopped until someone came in to clear it.",
    "Call +44 20 7946 0958 to book.   The clinic opens at eight and closes at six on weekdays, "
    "with a short break for lunch that the staff take in turns.",
    "\u200b\u200b\ufeff",
]


def _steps(cache: str) -> ReuseFirstPass:
    step = ReuseFirstPass([NormalizeDocuments(NormalizeConfig()), RedactPersonalData(PiiConfig())],
                          cache)
    step.setup()
    return step


def test_prepared_texts_round_trip_by_the_hash_of_the_text_as_read(tmp_path):
    prepared = [Prepared(text_hash("kept as read")),
                Prepared(text_hash("mail a@b.org"), "mail <EMAIL>", (("email", 1),)),
                Prepared(text_hash("x"), None, (("phone", 2), ("secret", 1)))]
    path = cache_path(str(tmp_path), "c0")
    write_chunk(path, [b"0" * 16] * 3, [None, "too_few_words", None], [[], []], prepared)
    assert read_prepared(path) == {p.source: p for p in prepared}
    assert read_prepared(cache_path(str(tmp_path), "other chunk")) == {}


def test_cached_documents_are_taken_as_the_first_pass_left_them_and_the_rest_prepared(tmp_path):
    cached = "A text as read, with\r\nno personal data in it at all."
    # A result no step would give this text, to show it was taken from the file.
    write_chunk(cache_path(str(tmp_path), "c0"), [b"0" * 16], [None], [[]],
                [Prepared(text_hash(cached), "Taken <EMAIL> from the file.", (("email", 3),))])
    chunk = RecordChunk("c0", (Record("s", 0, 0, cached), Record("s", 1, 0, CRAFTED[0]),
                               Record("s", 2, 0, CRAFTED[2])))
    outputs = list(_steps(str(tmp_path)).process(chunk))
    kept = next(o for o in outputs if isinstance(o, RecordChunk)).records
    assert [(r.value, r.pii) for r in kept] == [
        ("Taken <EMAIL> from the file.", (("email", 3),)),
        ("Write to <EMAIL> about the outage.\nThe night shift saw the disk fill up at three "
         "in the morning, and the backups stopped until someone came in to clear it.",
         (("email", 1),))]
    tagged = {o.tag: o.value for o in outputs if hasattr(o, "tag")}
    assert tagged[PARTS].step == "normalize"  # drops sort in filtered/ as the step's own
    assert tagged[PARTS].table.column("reason").to_pylist() == [EMPTY_AFTER_NORMALIZATION]
    stats = tagged[STATS]
    assert (stats["pii.knowledge.email"], stats["pii.knowledge.documents"]) == (4, 2)
    assert stats[f"knowledge.dropped.{EMPTY_AFTER_NORMALIZATION}"] == 1


def test_only_the_main_pass_with_a_token_cache_reuses_the_first_pass():
    config = KnowledgeConfig(block_size=2048, remainder="drop")
    assert [label for label, _ in document_steps(config, token_cache="cache")][:1] == \
        ["NormalizeAndRedactPersonalData"]
    assert [label for label, _ in document_steps(config)][:2] == \
        ["Normalize", "RedactPersonalData"]


def _run(output, crafted):
    run([f"--input={C4}", f"--input={crafted}", f"--output={output}", "--block_size=256",
         "--chunk_records=16", "--write_filtered=true", "--direct_running_mode=in_memory"])
    manifest = json.loads((output / "manifest.json").read_text())
    return ((pq.read_table(output / "pretrain"),
             [path.read_bytes() for path in sorted((output / "filtered").iterdir())]),
            {key: manifest[key] for key in ("records", "knowledge", "personal_data")})


@pytest.fixture
def normalized(monkeypatch):
    """How many texts the normalisation step prepared, in both passes together."""
    calls = collections.Counter()
    original = documents.normalize_text

    def counted(text, config):
        calls["texts"] += 1
        return original(text, config)

    monkeypatch.setattr(documents, "normalize_text", counted)
    return calls


def test_the_main_pass_prepares_only_what_the_first_pass_did_not_and_rows_are_unchanged(
        tmp_path, normalized, monkeypatch):
    crafted = tmp_path / "crafted.jsonl"
    crafted.write_text("".join(json.dumps({"text": t}) + "\n" for t in CRAFTED * 2))
    reused, reused_stats = _run(tmp_path / "reused", crafted)
    with_cache = normalized["texts"]
    pii = reused_stats["personal_data"]["knowledge"]
    assert pii["records"] >= 4 and pii["by_kind"]["email"] >= 2  # the crafted copies at least
    assert reused_stats["knowledge"]["dropped"][EMPTY_AFTER_NORMALIZATION] == 2
    normalized.clear()
    monkeypatch.setattr(documents, "read_prepared", lambda path: {})  # no file found
    fresh, fresh_stats = _run(tmp_path / "fresh", crafted)
    assert reused[0].equals(fresh[0]) and reused[1] == fresh[1]
    assert reused_stats == fresh_stats
    # Without the file every document is normalised in both passes; with it only the two
    # left empty, which the first pass dropped before the quality rules.
    documents_read = normalized["texts"] // 2
    assert with_cache == documents_read + 2
