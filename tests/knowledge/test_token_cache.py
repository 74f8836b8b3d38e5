"""Verdicts and token ids from deduplication's first pass, reused by the main pass: found by text
hash only, never trusted by position, and the run's output is the same with or without them."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import SHARED_DATA, require_shared_data
from transforms.core.records import Record, RecordChunk
from transforms.core.tokenizer import DEFAULT_TOKENIZER
from transforms.knowledge import branch, documents
from transforms.knowledge.branch import TokenizeDocuments
from transforms.knowledge.dedup import text_keys
from transforms.knowledge.documents import FilterQuality
from transforms.knowledge.encoding import RawTextEncoder, raw_text_encoder
from transforms.knowledge.quality import QualityConfig, text_hash
from transforms.knowledge.token_cache import (
    Prepared,
    cache_path,
    lookup,
    read_tokens,
    read_verdicts,
    write_chunk,
)

require_shared_data()

C4 = SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl"


def test_verdicts_and_ids_round_trip_by_text_hash(tmp_path):
    texts = ["first document", "junk", "", "第二"]
    reasons = [None, "too_few_words", None, None]
    arrays = [np.array([5, 6, 7], np.int32), np.empty(0, np.int32), np.array([9], np.int32)]
    path = cache_path(str(tmp_path / "cache"), "chunk-0")
    write_chunk(path, [text_hash(t) for t in texts], reasons, arrays,
                [Prepared(text_hash(t)) for t in texts])
    found = lookup(read_tokens(path), [*texts, "not cached"])
    assert [a.tolist() for a in (found[0], found[2], found[3])] == [[5, 6, 7], [], [9]]
    assert found[1] is None and found[4] is None  # a dropped document has no ids
    assert read_verdicts(path) == {text_hash(t): r for t, r in zip(texts, reasons, strict=True)}
    assert read_tokens(cache_path(str(tmp_path / "cache"), "other chunk")) == {}
    assert read_verdicts(cache_path(str(tmp_path / "cache"), "other chunk")) == {}


def test_the_main_pass_takes_cached_verdicts_by_hash_and_judges_the_rest(tmp_path):
    good = ("The river rose slowly through the night, and by morning the old mill stood in "
            "water to its windows. Farmers from the valley came with boats to carry grain, "
            "tools and frightened animals to the higher fields beyond the church.")
    cache = str(tmp_path / "cache")
    # A verdict no rule would give this text, to show it was taken from the file.
    write_chunk(cache_path(cache, "c0"), [text_hash(good)], ["bullet_lines"], [],
                [Prepared(text_hash(good))])
    step = FilterQuality(QualityConfig(), cache)
    chunk = RecordChunk("c0", (Record("s", 0, 0, good), Record("s", 1, 0, "two words")))
    outputs = list(step.process(chunk))
    assert not [o for o in outputs if isinstance(o, RecordChunk)]  # both dropped
    assert step.known(chunk) == {text_hash(good): "bullet_lines"}
    assert step.judge(Record("s", 0, 0, good), {}) == Record("s", 0, 0, good)  # judged afresh


def test_the_main_pass_takes_cached_ids_by_hash_and_encodes_the_rest(tmp_path):
    cached, fresh = "A document the first pass tokenized.", "One it did not see."
    cache = str(tmp_path / "cache")
    # Ids no encoder would give for this text, to show they were taken from the file.
    write_chunk(cache_path(cache, "c0"), [text_hash(cached)], [None],
                [np.array([1, 2, 3], np.int32)], [Prepared(text_hash(cached))])
    step = TokenizeDocuments(DEFAULT_TOKENIZER, cache)
    step.setup()
    try:
        chunk = RecordChunk("c0", (Record("s", 0, 0, cached), Record("s", 1, 0, fresh)))
        ids = step.tokens(chunk)
    finally:
        step.teardown()
    assert ids[0].tolist() == [1, 2, 3]
    assert ids[1].tolist() == raw_text_encoder(DEFAULT_TOKENIZER).encode([fresh])[0].tolist()


def _run(output, *extra):
    run([f"--input={C4}", f"--output={output}", "--block_size=256", "--chunk_records=64",
         "--direct_running_mode=in_memory", *extra])
    return pq.read_table(output / "pretrain")


@pytest.fixture
def encode_calls(monkeypatch):
    """(texts, parallel) of every call to the knowledge encoder."""
    calls = []
    original = RawTextEncoder.encode

    def recorded(self, texts, parallel=True):
        calls.append((len(texts), parallel))
        return original(self, texts, parallel)

    monkeypatch.setattr(RawTextEncoder, "encode", recorded)
    return calls


def test_with_deduplication_the_main_pass_encodes_and_judges_nothing_and_rows_are_unchanged(
        tmp_path, encode_calls, monkeypatch):
    judged = []
    first_failure = documents.first_failure
    for module in (documents, text_keys):  # the main pass's rules, the first pass's
        monkeypatch.setattr(module, "first_failure",
                            lambda stats, config: judged.append(1) or first_failure(stats, config))
    rows = _run(tmp_path / "cached")
    # Only the first pass encoded (on its one background thread) and judged.
    assert encode_calls and all(parallel is False for _, parallel in encode_calls)
    assert not (tmp_path / "cached" / ".staging").exists()
    in_first_pass = len(judged)
    encode_calls.clear()
    judged.clear()
    monkeypatch.setattr(branch, "read_tokens", lambda path: {})  # no file found
    monkeypatch.setattr(documents, "read_verdicts", lambda path: {})
    assert _run(tmp_path / "uncached").equals(rows)
    assert any(parallel for _, parallel in encode_calls)  # the main pass encoded
    assert len(judged) == 2 * in_first_pass > 0  # and judged every document again


def test_without_deduplication_there_is_no_first_pass_to_reuse(tmp_path, encode_calls):
    _run(tmp_path / "plain", "--dedup=none", "--boilerplate=false")
    assert encode_calls and all(parallel for _, parallel in encode_calls)
