"""The knowledge branch end to end on real corpora: cleaned, filtered, deduplicated documents
in exact-length blocks, the same rows on every runner and run.

The inputs are real: C4 pages, the junk fixture, Korean KLUE premises (each appears three times
in the file: real exact duplicates) and a file of copies made here from the C4 pages (exact,
edited, restyled) plus novel paragraphs. The expected output is built independently from the
readers, the normaliser, the quality rules (each tested on its own), the copies' construction
and the tokenizer's own batch call.
"""

import copy
import json

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from beam_pipeline.running import run
from tests.conftest import ROOT, SHARED_DATA, require_shared_data
from tests.knowledge.test_dedup import edited, restyled
from transforms.core.records import Record, RecordChunk
from transforms.core.steps import STATS
from transforms.core.tokenizer import DEFAULT_TOKENIZER
from transforms.curation.pii import PiiConfig, redact
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard
from transforms.knowledge.branch import TokenizeDocuments
from transforms.knowledge.encoding import RawTextEncoder, raw_text_encoder
from transforms.knowledge.normalize import normalize_text
from transforms.knowledge.options import KnowledgeConfig, KnowledgeOptions
from transforms.knowledge.quality import quality_reason

require_shared_data()

BLOCK_SIZE = 512
C4 = SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl"
NOVEL = SHARED_DATA / "pretrain" / "gutenberg_1342_pride_and_prejudice.txt"
KLUE = SHARED_DATA / "multilingual" / "ko_klue_nli_v1.1_dev.json"
JUNK = ROOT / "tests" / "data" / "knowledge" / "junk.jsonl"
ENDOFTEXT = "<|endoftext|>"


def raw_records(value: str) -> list:
    """(source, position, text) of every record of one --input value, as the readers see it."""
    spec = parse_input_spec(0, value)
    rows = []
    for record in (r for s in plan_shards([spec]) for c in read_shard(s) for r in c.records):
        text = record.value.get(dict(spec.fields).get("text", "text"))
        rows.append((record.source, record.position, text))
    return rows


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """The --input values, and the positions of the near copies made in copies.jsonl."""
    pages = [json.loads(line)["text"] for line in C4.read_text().splitlines()]
    long_pages = [i for i, page in enumerate(pages)
                  if len(page.split()) >= 200 and quality_reason(normalize_text(page)) is None]
    paragraphs = [p for p in NOVEL.read_text(encoding="utf-8").split("\n\n")
                  if len(p.split()) >= 30][100:103]
    copies = [
        pages[0] + "\r\n\r\n\r\n",  # exact copy once normalised
        edited(pages[long_pages[0]], 2, seed=1),  # near copies
        edited(pages[long_pages[1]], 3, seed=2),
        restyled(pages[long_pages[2]]),
        *paragraphs,  # new documents
        paragraphs[1],  # exact copy inside this file
    ]
    path = tmp_path_factory.mktemp("inputs") / "copies.jsonl"
    offsets, offset = [], 0
    with open(path, "w", encoding="utf-8") as f:
        for text in copies:
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            offsets.append(offset)
            offset += len(line.encode("utf-8"))
            f.write(line)
    return {"values": [str(C4), str(path), str(JUNK), f"{KLUE}#branch=knowledge;text=premise"],
            "near": {(str(path), offsets[i]) for i in (1, 2, 3)}}


@pytest.fixture(scope="module")
def expected(inputs) -> dict:
    """Per input, the kept documents in order; and every dropped one with its reason."""
    seen, kept, dropped = set(), [], {}
    for value in inputs["values"]:
        documents = []
        for source, position, raw in raw_records(value):
            text = redact(normalize_text(raw), PiiConfig())[0]  # --pii=redact, the default
            reason = ("empty_after_normalization" if not text else quality_reason(text)
                      or ("duplicate_exact" if text in seen else None)
                      or ("duplicate_near" if (source, position) in inputs["near"] else None))
            if reason:
                dropped[(source, position)] = reason
            else:
                documents.append(text)
            seen.add(text)
        kept.append(documents)
    return {"kept": kept, "dropped": dropped}


def run_knowledge(output, values, *extra: str) -> dict:
    run([*(f"--input={value}" for value in values), f"--output={output}",
         f"--block_size={BLOCK_SIZE}", "--remainder=pad", "--num_shards=2", *extra])
    return json.loads((output / "manifest.json").read_text())


@pytest.fixture(scope="module")
def first(tmp_path_factory, inputs):
    output = tmp_path_factory.mktemp("first")
    return output, run_knowledge(output, inputs["values"], "--write_filtered=true")


def rows(output, kind: str) -> list:
    files = sorted((output / kind).glob("*"))
    if kind == "filtered":
        return [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_every_drop_is_counted_and_written_with_its_reason(first, expected):
    output, manifest = first
    dropped = expected["dropped"]
    assert manifest["records"]["balanced"]
    know = manifest["knowledge"]
    assert know["records_in"] == know["documents"] + len(dropped)
    assert know["documents"] == sum(map(len, expected["kept"]))
    reasons = sorted(set(dropped.values()))
    assert know["dropped"] == {r: list(dropped.values()).count(r) for r in reasons}
    assert manifest["records"]["filtered"] == know["dropped"]
    assert know["dropped"]["duplicate_exact"] == 2000 + 2  # KLUE's repeats, two made here
    assert know["dropped"]["duplicate_near"] == 3
    written = {(r["source"], r["position"]): r["reason"] for r in rows(output, "filtered")}
    assert written == dropped


def test_blocks_hold_the_cleaned_documents_in_order(first, expected, qwen_tokenizer):
    """One chunk per input here: each fills whole blocks, then the chunks' leftovers are joined
    in input order into the final blocks, the last one padded."""
    output, manifest = first
    end_of_text = qwen_tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    heads, tails, lengths = [], [], []
    for documents in expected["kept"]:
        encoded = qwen_tokenizer(documents, add_special_tokens=True,
                                 split_special_tokens=True)["input_ids"]
        lengths += map(len, encoded)
        stream = [t for ids in encoded for t in [*ids, end_of_text]]
        assert qwen_tokenizer.decode(stream) == "".join(d + ENDOFTEXT for d in documents)
        full = len(stream) // BLOCK_SIZE * BLOCK_SIZE
        heads += stream[:full]
        tails += stream[full:]
    padding = [end_of_text] * (-len(tails) % BLOCK_SIZE)
    blocks = rows(output, "pretrain")
    assert [t for row in blocks for t in row["input_ids"]] == heads + tails + padding
    assert all(len(row["input_ids"]) == BLOCK_SIZE == sum(row["seq_lengths"]) for row in blocks)
    summary = manifest["knowledge"]["document_tokens"]
    assert (summary["min"], summary["max"]) == (min(lengths), max(lengths))
    assert summary["mean"] == round(sum(lengths) / len(lengths), 1)
    assert sum(summary["histogram"].values()) == len(lengths)


def test_korean_and_english_survive_together(expected):
    korean = expected["kept"][3]
    assert len(korean) == 1000 and all(max(text) >= "\uac00" for text in korean)


def test_a_second_run_writes_the_same_files(first, inputs, tmp_path):
    output, manifest = first
    again = run_knowledge(tmp_path / "again", inputs["values"], "--write_filtered=true")
    assert again["knowledge"] == manifest["knowledge"]
    for kind in ("pretrain", "filtered"):
        mine = [f.read_bytes() for f in sorted((output / kind).glob("*"))]
        assert mine == [f.read_bytes() for f in sorted((tmp_path / "again" / kind).glob("*"))]


def test_multi_processing_writes_the_same_rows_and_by_default_no_filtered_files(
        first, inputs, tmp_path):
    output, manifest = first
    other = run_knowledge(tmp_path / "multi", inputs["values"],
                          "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert other["knowledge"] == manifest["knowledge"]
    assert other["records"] == manifest["records"]
    assert rows(tmp_path / "multi", "pretrain") == rows(output, "pretrain")
    assert not (tmp_path / "multi" / "filtered").exists()


def test_document_lengths_are_a_beam_distribution(qwen_tokenizer):
    texts = ["One short document.", "A second, somewhat longer document than the first."]
    chunk = RecordChunk("c0", tuple(Record("s", i, 0, text) for i, text in enumerate(texts)))
    lengths = [len(ids) for ids in qwen_tokenizer(texts)["input_ids"]]
    pipeline = test_pipeline.TestPipeline()
    _ = (pipeline | beam.Create([chunk])
         | beam.ParDo(TokenizeDocuments(DEFAULT_TOKENIZER)).with_outputs(STATS, main="main"))
    result = pipeline.run()
    result.wait_until_finish()
    (found,) = result.metrics().query(
        MetricsFilter().with_name("knowledge.document_tokens"))["distributions"]
    value = found.committed
    assert (value.count, value.sum, value.min, value.max) == (
        2, sum(lengths), min(lengths), max(lengths))


def test_encoder_keeps_literal_control_tokens_as_text(qwen_tokenizer):
    text = f"A page that shows {ENDOFTEXT} and <|im_start|> as text."
    encoder = raw_text_encoder(DEFAULT_TOKENIZER)
    (ids,) = encoder.encode([text])
    assert ids.dtype == np.int32
    assert not set(ids.tolist()) & set(qwen_tokenizer.all_special_ids)
    assert qwen_tokenizer.decode(ids) == text
    # Its own backend: the shared tokenizer serves the instruction branch, which parses them.
    assert encoder.backend is not qwen_tokenizer.backend_tokenizer


def test_encoder_ignores_truncation_that_transformers_left_on_the_tokenizer(qwen_tokenizer):
    """A call with ``truncation=True`` leaves it set on the backend; the backend is then not
    proven for tiktoken, and the private copy that encodes instead truncates nothing."""
    texts = [f"A page that shows {ENDOFTEXT} twice: {ENDOFTEXT}", "秦川雄帝宅 " * 50]
    expected = raw_text_encoder(DEFAULT_TOKENIZER).encode(texts)
    tok = copy.deepcopy(qwen_tokenizer)
    tok(["x"], truncation=True, max_length=3, split_special_tokens=False)
    assert tok.backend_tokenizer.truncation is not None
    encoder = RawTextEncoder(tok)
    assert encoder.fast is None
    found = encoder.encode(texts)
    assert [a.tolist() for a in found] == [a.tolist() for a in expected]
    assert len(found[1]) > 50


def test_encoder_follows_the_tokenizers_bos_and_never_doubles_its_end_of_text():
    """A tokenizer that wraps each text in BOS ... end-of-text itself (a tiny one built here)."""
    backend = Tokenizer(models.WordLevel({"<s>": 0, ENDOFTEXT: 1, "hello": 2, "world": 3,
                                          "[UNK]": 4}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", ENDOFTEXT])
    backend.post_processor = TemplateProcessing(
        single=f"<s> $A {ENDOFTEXT}", special_tokens=[("<s>", 0), (ENDOFTEXT, 1)])
    assert backend.encode("hello world").ids == [0, 2, 3, 1]
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>",
                                      eos_token=ENDOFTEXT)
    (ids,) = RawTextEncoder(wrapped).encode(["hello world"])
    assert ids.tolist() == [0, 2, 3]  # ConcatenateBlocks adds the one separator


def test_options_build_the_config_and_refuse_bad_values():
    config = KnowledgeConfig.from_options(PipelineOptions([
        "--block_size=64", "--min_words=5", "--max_top_ngram=2:0.3", "--dedup=exact",
        "--quality_filter=true", "--collapse_whitespace=false"]))
    assert (config.quality.min_words, config.quality.max_top_ngram) == (5, ((2, 0.3),))
    assert config.dedup.mode == "exact" and not config.normalize.collapse_whitespace
    assert config.dedup.rounds == 8
    assert KnowledgeConfig.from_options(PipelineOptions(["--dedup_rounds=12"])).dedup.rounds == 12
    assert KnowledgeConfig.from_options(PipelineOptions(["--quality_filter=false"])).quality is None
    with pytest.raises(ValueError, match="multiple"):
        KnowledgeConfig.from_options(PipelineOptions(["--dedup_num_perm=100"]))
    for bad in ("--max_top_ngram=2", "--min_alpha_fraction=2", "--dedup=fuzzy",
                "--min_mean_word_length=-1", "--dedup_rounds=0"):
        with pytest.raises(SystemExit):
            PipelineOptions([bad]).view_as(KnowledgeOptions)
