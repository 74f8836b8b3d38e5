"""End to end on the DirectRunner over a mix of the shared datasets.

One run per configuration is shared by the tests below (module-scoped fixtures), which read
the outputs back the way a training loader would and check them against independent
references: the tokenizer's own decoding, the readers' records and the manifest's arithmetic.
"""

import collections
import json
import os
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from beam_pipeline.progress import read_totals
from beam_pipeline.running import run
from tests.conftest import EXAMPLES, SHARED_DATA, require_shared_data
from transforms.core.progress import PROGRESS_DIR_ENV
from transforms.core.records import InputSpec
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_inputs, plan_shards
from transforms.io.read_formats import read_shard

require_shared_data()

INPUTS = [
    f"{SHARED_DATA}/pretrain/llamafactory_c4_demo.jsonl",
    f"{SHARED_DATA}/pretrain/llamafactory_wiki_demo.txt#text_unit=line",
    f"{SHARED_DATA}/instruction/alpaca_en_demo.json",
    f"{SHARED_DATA}/chat/kto_en_demo_messages.json",
    f"{SHARED_DATA}/chat/fastchat_dummy_conversation.json",
    f"{SHARED_DATA}/math/gsm8k_test.jsonl#branch=instruction;prompt=question;response=answer",
    f"{EXAMPLES}/broken_lines.jsonl",
]
KNOWLEDGE_INPUTS = INPUTS[:2] + INPUTS[-1:]
INT32_LIST = pa.list_(pa.int32())
BLOCK_SIZE = 1024
SEQ_LEN = 2048


def run_pipeline(output, *extra: str) -> dict:
    args = [f"--input={value}" for value in INPUTS]
    args += [
        f"--output={output}",
        f"--block_size={BLOCK_SIZE}",
        f"--seq_len={SEQ_LEN}",
        "--num_shards=3",
        "--chunk_records=500",
        # The reference below is the raw documents: no cleaning, filtering or deduplication.
        "--normalize=false", "--quality_filter=false", "--dedup=none", "--boilerplate=false",
        "--pii=off",
        "--quiet",  # no reporter: the counts go to the side channel named below
        *extra,
    ]
    # The side channel of progress.ProgressReporter, kept: the tests read the final counts.
    counters = output.parent / f"{output.name}-progress"
    counters.mkdir()
    os.environ[PROGRESS_DIR_ENV] = str(counters)
    try:
        run(args)
    finally:
        os.environ.pop(PROGRESS_DIR_ENV)
    PROGRESS[output] = read_totals(str(counters))
    return json.loads((output / "manifest.json").read_text())


PROGRESS: dict[Path, dict[str, int]] = {}  # each run's final progress counts


def read_kind(output, kind: str) -> pa.Table:
    files = sorted((output / kind).glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files)


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory):
    output = tmp_path_factory.mktemp("in_memory")
    return output, run_pipeline(output, "--direct_running_mode=in_memory")


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    output = tmp_path_factory.mktemp("padded")
    return output, run_pipeline(output, "--remainder=pad")


def test_manifest_accounts_for_every_record(in_memory):
    output, manifest = in_memory
    records = manifest["records"]
    assert records["read"] == 300 + 30 + 999 + 300 + 500 + 1319 + 13
    assert records["balanced"] is True
    assert records["read"] == (
        records["knowledge"]
        + records["instruction"]
        + sum(records["filtered"].values())
        + sum(records["rejected"].values())
    )
    assert records["rejected"] == {
        "malformed_json": 2,
        "not_an_object": 1,
        "unclassifiable": 1,
        "wrong_type": 1,
    }
    assert records["knowledge"] == 300 + 30 + 4
    rejected = [
        json.loads(line)
        for f in sorted((output / "rejected").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert sorted(r["reason"] for r in rejected) == sorted(
        reason for reason, n in records["rejected"].items() for _ in range(n)
    )
    assert all(r["source"].endswith("broken_lines.jsonl") for r in rejected)
    lines = (EXAMPLES / "broken_lines.jsonl").read_bytes()
    for r in rejected:  # a rejected record's position is the byte offset of its line
        assert lines[r["position"] :].decode().startswith(r["raw"])


def test_outputs_are_sharded_zstd_parquet_with_the_contract_schema(in_memory):
    output, manifest = in_memory
    for kind, columns in (
        ("pretrain", ["input_ids", "seq_lengths", "sources"]),
        ("sft", ["input_ids", "labels", "position_ids", "seq_lengths", "sources"]),
    ):
        files = sorted((output / kind).glob("*.parquet"))
        assert [f.name for f in files] == [f"part-{i:05d}-of-00003.parquet" for i in range(3)]
        for f in files:
            parquet = pq.ParquetFile(f)
            assert parquet.schema_arrow == pa.schema([(c, INT32_LIST) for c in columns])
            assert parquet.metadata.num_rows > 0
            assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
        assert sum(f["rows"] for f in manifest["outputs"][kind]) == read_kind(output, kind).num_rows
    assert not (output / ".staging").exists()


def test_blocks_have_exact_length_and_piece_lengths_sum_to_it(in_memory):
    output, manifest = in_memory
    table = read_kind(output, "pretrain")
    assert table.num_rows == manifest["knowledge"]["blocks"]
    ids = np.asarray(table.column("input_ids").combine_chunks().values).reshape(-1, BLOCK_SIZE)
    assert ids.shape[0] == table.num_rows
    for lengths in table.column("seq_lengths").to_pylist():
        assert sum(lengths) == BLOCK_SIZE and min(lengths) > 0
    know = manifest["knowledge"]
    assert know["tokens"] + know["separator_tokens"] == (
        know["tokens_out"] + know["remainder_tokens"] - know["pad_tokens"]
    )


def _documents_per_input() -> list[list[str]]:
    """The knowledge documents of each knowledge input, in order, straight from the readers."""
    per_input = []
    for value in KNOWLEDGE_INPUTS:
        path, _, declared = value.partition("#")
        spec = InputSpec(0, path, text_unit="line" if declared else "file")
        docs = []
        for record in (r for s in plan_shards([spec]) for c in read_shard(s) for r in c.records):
            text = record.value.get("text") if isinstance(record.value, dict) else record.value
            if isinstance(text, str):
                docs.append(unicodedata.normalize("NFC", text))
        per_input.append(docs)
    return per_input


def test_blocks_are_the_documents_in_order_then_the_joined_leftovers(padded, qwen_tokenizer):
    """Each input (one chunk here) fills whole blocks with its documents, each followed by
    end-of-text; the tokens left after each chunk's last full block are joined, in input
    order, into the final blocks, the last one padded. The reference is built from the readers
    and the tokenizer alone, and decoding it gives back the documents' text."""
    output, manifest = padded
    end_of_text = qwen_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    heads, tails = [], []
    for docs in _documents_per_input():
        encoded = qwen_tokenizer(docs, add_special_tokens=True, split_special_tokens=True)
        stream = [t for ids in encoded["input_ids"] for t in [*ids, end_of_text]]
        assert qwen_tokenizer.decode(stream) == "".join(d + "<|endoftext|>" for d in docs)
        full = len(stream) // BLOCK_SIZE * BLOCK_SIZE
        heads += stream[:full]
        tails += stream[full:]
    pad = manifest["knowledge"]["pad_tokens"]
    assert pad == -len(tails) % BLOCK_SIZE
    expected = heads + tails + [end_of_text] * pad
    ids = read_kind(output, "pretrain").column("input_ids").combine_chunks().values
    assert np.asarray(ids).tolist() == expected
    assert manifest["knowledge"]["remainder_tokens"] == 0


def token_sources(table: pa.Table) -> np.ndarray:
    """Each token's ``sources`` entry: its piece's, repeated over the piece's length."""
    lengths = pc.list_value_length(table["sources"])
    assert lengths.equals(pc.list_value_length(table["seq_lengths"]))
    return np.repeat(pc.list_flatten(table["sources"]).to_numpy(),
                     pc.list_flatten(table["seq_lengths"]).to_numpy())


def test_block_pieces_of_each_input_are_that_inputs_documents(padded, qwen_tokenizer):
    """The tokens whose piece names input ``i`` are input ``i``'s documents, whole and in
    order, though pieces are cut at block edges and the leftovers joined across inputs; the
    padding names no input."""
    output, manifest = padded
    end_of_text = qwen_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    table = read_kind(output, "pretrain")
    ids = pc.list_flatten(table["input_ids"]).to_numpy()
    sources = token_sources(table)
    indices = [INPUTS.index(value) for value in KNOWLEDGE_INPUTS]
    for index, docs in zip(indices, _documents_per_input(), strict=True):
        mine = ids[sources == index].tolist()
        assert qwen_tokenizer.decode(mine) == "".join(d + "<|endoftext|>" for d in docs)
    assert set(np.unique(sources).tolist()) == {*indices, -1}
    assert ids[sources == -1].tolist() == [end_of_text] * manifest["knowledge"]["pad_tokens"]


def test_sources_add_up_to_each_inputs_tokens(padded):
    """Per input, the pieces' lengths sum to its tokenized tokens in the manifest (plus an
    end-of-text per document in blocks); nothing is left out here, and only padding is -1."""
    output, manifest = padded
    for kind, branch, separators in (("pretrain", "knowledge", True),
                                     ("sft", "instruction", False)):
        table = read_kind(output, kind)
        found = collections.Counter(token_sources(table).tolist())
        expected = {entry["index"]: entry["tokenized"][branch]["tokens"]
                    + separators * entry["tokenized"][branch]["records"]
                    for entry in manifest["inputs"] if branch in entry["tokenized"]}
        if kind == "pretrain":
            expected[-1] = manifest["knowledge"]["pad_tokens"]
        assert found == expected
    assert [entry["index"] for entry in manifest["inputs"]] == list(range(len(INPUTS)))


def test_sft_segments_of_gsm8k_are_exactly_its_questions(padded, qwen_tokenizer):
    """A segment names GSM8K's input (index 5) exactly when it renders one of its questions."""
    output, _ = padded
    path = INPUTS[5].partition("#")[0]
    questions = [unicodedata.normalize("NFC", json.loads(line)["question"])
                 for line in Path(path).read_text().splitlines()]
    table = read_kind(output, "sft")
    ids = pc.list_flatten(table["input_ids"]).to_numpy()
    lengths = pc.list_flatten(table["seq_lengths"]).to_numpy()
    sources = pc.list_flatten(table["sources"]).to_numpy()
    found = 0
    for segment, source in zip(np.split(ids, np.cumsum(lengths)[:-1]), sources, strict=True):
        text = qwen_tokenizer.decode(segment.tolist())
        asks = any(question in text for question in questions)
        assert asks == (source == 5)
        found += asks
    assert found == len(questions)


def test_sft_rows_respect_seq_len_and_segment_boundaries(in_memory):
    output, manifest = in_memory
    table = read_kind(output, "sft")
    assert table.num_rows == manifest["instruction"]["packs"]
    total = 0
    for row in table.to_pylist():
        lengths = row["seq_lengths"]
        assert sum(lengths) == len(row["input_ids"]) == len(row["labels"]) <= SEQ_LEN
        starts = np.cumsum([0, *lengths[:-1]])
        expected_positions = np.concatenate([np.arange(n) for n in lengths])
        assert row["position_ids"] == expected_positions.tolist()
        assert all(row["labels"][s] == -100 for s in starts)
        total += len(row["input_ids"])
    inst = manifest["instruction"]
    assert total == inst["tokens"]
    assert inst["packing_efficiency"] == pytest.approx(total / (inst["packs"] * SEQ_LEN), 1e-5)


def test_only_assistant_turns_carry_loss(in_memory, qwen_tokenizer):
    output, _ = in_memory
    table = read_kind(output, "sft")
    decode = qwen_tokenizer.decode
    runs = 0
    for row in table.to_pylist():
        ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
        trained = labels != -100
        assert (labels[trained] == ids[trained]).all()
        edges = np.flatnonzero(np.diff(np.concatenate([[0], trained.astype(int), [0]])))
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            # Every trained run is one assistant reply: it follows the assistant header and
            # ends with the end-of-turn token, and holds no other turn's header.
            assert decode(ids[max(0, start - 3) : start].tolist()).endswith(
                "<|im_start|>assistant\n"
            )
            span = decode(ids[start:end].tolist())
            assert span.endswith("<|im_end|>")
            assert "<|im_start|>" not in span
            runs += 1
    assert runs >= 999 + 1319


@pytest.fixture(scope="module")
def multi_processing(tmp_path_factory):
    output = tmp_path_factory.mktemp("multi") / "out"
    return output, run_pipeline(
        output, "--direct_running_mode=multi_processing", "--direct_num_workers=2")


def test_multi_processing_writes_the_same_rows(in_memory, multi_processing):
    output, manifest = in_memory
    other, other_manifest = multi_processing
    assert other_manifest["records"] == manifest["records"]
    for kind in ("pretrain", "sft"):
        for mine, theirs in zip(
            sorted((output / kind).glob("*")), sorted((other / kind).glob("*")), strict=True
        ):
            assert pq.read_table(mine).equals(pq.read_table(theirs)), mine.name
    for mine, theirs in zip(
        sorted((output / "rejected").glob("*")), sorted((other / "rejected").glob("*")), strict=True
    ):
        assert mine.read_text() == theirs.read_text()


@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_progress_counts_what_was_read_and_written_in_both_running_modes(mode, request):
    """The counts the progress line shows, summed from every worker process's side-channel
    file, equal the manifest's records, the inputs' bytes and shards, and the tokens in the
    output files."""
    output, manifest = request.getfixturevalue(mode)
    counts = PROGRESS[output]
    plan = plan_inputs([parse_input_spec(i, value) for i, value in enumerate(INPUTS)])
    sizes = sum(os.path.getsize(value.partition("#")[0]) for value in INPUTS)
    tokens = sum(len(ids) for kind in ("pretrain", "sft")
                 for ids in read_kind(output, kind)["input_ids"].to_pylist())
    assert counts == {"records_read": manifest["records"]["read"], "bytes_read": sizes,
                      "shards_done": len(plan.shards), "tokens_written": tokens}
    assert plan.total_bytes == sizes


def test_the_direct_runner_goes_straight_to_the_fn_api_runner(tmp_path, monkeypatch, capsys):
    """Beam's DirectRunner would first try Prism (a binary downloaded from GitHub, which
    ignores --direct_running_mode) and fall back quietly when that fails. Without --quiet the
    run ends its progress on stderr with the whole input read."""
    from apache_beam.runners.portability.prism_runner import PrismRunner

    tried = []
    monkeypatch.setattr(PrismRunner, "run_pipeline", lambda *args: tried.append(args))
    run([f"--input={EXAMPLES}/c4_sample.jsonl", f"--output={tmp_path}", "--block_size=256"])
    assert not tried
    read = json.loads((tmp_path / "manifest.json").read_text())["records"]["read"]
    assert read > 0
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("progress: ")]
    size = (EXAMPLES / "c4_sample.jsonl").stat().st_size
    assert lines[-1].startswith(f"progress: {read:,} records read (1/1 shards, "
                                f"{size / 1000:.1f} KB of {size / 1000:.1f} KB, 100%), ")
    assert lines[-1].endswith(", all input read")
