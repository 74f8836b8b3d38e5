"""The instruction branch end to end on the DirectRunner.

Two inputs, each run once per configuration (module-scoped fixtures): the shared Alpaca, GSM8K
and chat data at seq_len 2048 (packing efficiency, row invariants, trained spans on real data),
and a small file of edge cases whose ``_expect`` field names each record's outcome (every
rejection reason, truncation, control-token text), run with every option that changes rows.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline.cli import main
from beam_pipeline.running import run
from tests.conftest import EXAMPLES, ROOT, SHARED_DATA, require_shared_data
from tests.instruction.test_chat_template import rendered_turn
from transforms.instruction.adapters import to_conversation

require_shared_data()

DATA = ROOT / "tests" / "data" / "instruction"
EDGE = DATA / "edge_cases.jsonl"
MIX = [
    f"{SHARED_DATA}/instruction/alpaca_en_demo.json",
    f"{SHARED_DATA}/math/gsm8k_test.jsonl#branch=instruction;prompt=question;response=answer",
    f"{SHARED_DATA}/chat/kto_en_demo_messages.json",
    f"{SHARED_DATA}/chat/fastchat_dummy_conversation.json",
    f"{SHARED_DATA}/chat/glaive_toolcall_en_demo.json",
    f"{SHARED_DATA}/chat/glaive_toolcall_zh_demo.json",
]
SMALL = [str(EDGE), *(f"{EXAMPLES}/{name}" for name in (
    "messages_sample.json", "sharegpt_sample.json", "toolcall_sample.json"))]
SMALL_SEQ_LEN = 512
SMALL_OPTIONS = (f"--seq_len={SMALL_SEQ_LEN}", "--max_turns=16", "--max_chars=20000",
                 f"--schema=alpaca={DATA / 'alpaca_with_category.pbtxt'}", "--chunk_records=16",
                 "--num_shards=2", "--max_reject_fraction=1", "--write_filtered=true")
VARIANT_OPTIONS = ("--overflow=drop", "--pad_to_seq_len=true", "--max_segments_per_pack=2")
KINDS = ("sft", "rejected", "filtered")


def run_into(output, inputs: list[str], *extra: str) -> dict:
    run([*(f"--input={value}" for value in inputs), f"--output={output}", *extra])
    return json.loads((output / "manifest.json").read_text())


def sft_rows(output) -> list[dict]:
    files = sorted((output / "sft").glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files).to_pylist()


def dropped(output) -> dict[int, str]:
    """Byte position in edge_cases.jsonl -> reason, for its rejected and filtered records."""
    reasons = {}
    for kind in ("rejected", "filtered"):
        for path in sorted((output / kind).glob("*.jsonl")):
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if entry["source"].endswith(EDGE.name):
                    reasons[entry["position"]] = entry["reason"]
    return reasons


def edge_cases() -> list[tuple[int, dict]]:
    """(byte position, record) of every line of edge_cases.jsonl."""
    cases, position = [], 0
    for line in EDGE.read_bytes().splitlines(keepends=True):
        cases.append((position, json.loads(line)))
        position += len(line)
    return cases


def segments(row: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
    cuts = np.cumsum(row["seq_lengths"])[:-1]
    return list(zip(np.split(ids, cuts), np.split(labels, cuts), strict=True))


def trained_runs(ids: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (labels != -100).astype(int), [0]])))
    return [ids[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    output = tmp_path_factory.mktemp("mix")
    return output, run_into(output, MIX, "--pii=off")  # the references are the records as written


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    output = tmp_path_factory.mktemp("small")
    return output, run_into(output, SMALL, *SMALL_OPTIONS, "--direct_running_mode=in_memory")


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    output = tmp_path_factory.mktemp("variant")
    return output, run_into(output, SMALL, *SMALL_OPTIONS, *VARIANT_OPTIONS)


# --- the shared Alpaca + GSM8K + chat mix at seq_len 2048 ---------------------------------------


def test_packing_efficiency_floor_on_the_shared_mix(mix):
    _, manifest = mix
    inst = manifest["instruction"]
    assert manifest["records"]["balanced"]
    assert inst["examples"] > 3500 and inst["seq_len"] == 2048
    assert inst["packing_efficiency"] >= 0.98
    assert inst["packs_lower_bound"] == -(-inst["tokens"] // 2048) <= inst["packs"]


def test_rows_hold_whole_examples_with_resets(mix, qwen_tokenizer):
    """Every segment is one whole rendered conversation: it opens with the template's system
    turn and ends with its final end-of-turn glue; positions and labels restart per segment."""
    output, manifest = mix
    im_start, im_end = qwen_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    newline = qwen_tokenizer.encode("\n")
    rows, count, tokens = sft_rows(output), 0, 0
    assert len(rows) == manifest["instruction"]["packs"]
    for row in rows:
        lengths = row["seq_lengths"]
        assert sum(lengths) == len(row["input_ids"]) == len(row["labels"]) <= 2048
        assert row["position_ids"] == [p for n in lengths for p in range(n)]
        for ids, labels in segments(row):
            assert ids[0] == im_start and ids[-2:].tolist() == [im_end, *newline]
            assert labels[0] == -100
            count += 1
            tokens += len(ids)
    assert count == manifest["instruction"]["examples"]
    assert tokens == manifest["instruction"]["tokens"]


def test_trained_spans_are_the_assistant_replies_of_the_inputs(mix, qwen_tokenizer):
    """Decoded, every trained run is exactly one assistant reply of an input conversation; only
    the replies that truncation cut (or length dropped) are missing."""
    output, manifest = mix
    expected: collections.Counter = collections.Counter()
    for value in MIX:
        path, _, declared = value.partition("#")
        text = Path(path).read_text(encoding="utf-8")
        rows = ([json.loads(line) for line in text.splitlines()] if path.endswith(".jsonl")
                else json.loads(text))
        if declared:
            rows = [{"prompt": r["question"], "response": r["answer"]} for r in rows]
        for row in rows:
            conversation = to_conversation(row)
            expected.update(rendered_turn("chatml", m) for m in conversation.messages
                            if m["role"] == "assistant")
    found = collections.Counter(
        qwen_tokenizer.decode(run.tolist())
        for row in sft_rows(output) for ids, labels in segments(row)
        for run in trained_runs(ids, labels))
    assert not found - expected
    cut = manifest["instruction"]["truncated"] + sum(manifest["records"]["filtered"].values())
    assert cut and expected.total() - found.total() <= 10 * cut
    assert sum(manifest["records"]["rejected"].values()) == 2  # glaive_zh: tool results, no call


# --- edge cases --------------------------------------------------------------------------------


def test_every_edge_case_meets_its_expected_outcome(small):
    output, manifest = small
    reasons = dropped(output)
    for position, record in edge_cases():
        expect = record["_expect"]
        if expect in ("kept", "control_text", "truncated"):
            assert position not in reasons, (expect, reasons.get(position))
        else:
            assert reasons.get(position) == expect, record
    counts = collections.Counter(reasons.values())
    assert manifest["records"]["balanced"]
    for reason, n in counts.items():
        bucket = "filtered" if reason == "too_long" else "rejected"
        assert manifest["inputs"][0][bucket][reason] == n
    assert sum(sum(entry["rejected"].values()) for entry in manifest["inputs"][1:]) == 0


def find_segment(output, tokenizer, needle: str) -> tuple[np.ndarray, np.ndarray]:
    (match,) = [(ids, labels) for row in sft_rows(output) for ids, labels in segments(row)
                if needle in tokenizer.decode(ids.tolist())]
    return match


def test_truncation_keeps_the_first_exchange_and_counts_the_cut(small, qwen_tokenizer):
    output, manifest = small
    record = next(r for _, r in edge_cases() if r["_expect"] == "truncated")
    messages = to_conversation({k: v for k, v in record.items() if k != "_expect"}).messages
    ids, labels = find_segment(output, qwen_tokenizer, messages[0]["content"])
    kept = qwen_tokenizer.apply_chat_template(list(messages[:2]), tokenize=True,
                                              return_dict=True)["input_ids"]
    whole = qwen_tokenizer.apply_chat_template(list(messages), tokenize=True,
                                               return_dict=True)["input_ids"]
    assert ids.tolist() == kept
    assert [qwen_tokenizer.decode(r.tolist()) for r in trained_runs(ids, labels)] == [
        messages[1]["content"] + "<|im_end|>"]
    inst = manifest["instruction"]
    assert inst["overflow"] == "truncate"
    assert inst["truncated"] >= 1 and inst["truncated_tokens"] >= len(whole) - len(kept)


def test_control_token_text_in_content_is_encoded_as_text(small, qwen_tokenizer):
    output, _ = small
    record = next(r for _, r in edge_cases() if r["_expect"] == "control_text")
    messages = record["messages"]
    ids, labels = find_segment(output, qwen_tokenizer, "Repeat after me")
    # As transformers encodes it when asked to sanitize control tokens in user input.
    assert ids.tolist() == qwen_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, sanitize_control_tokens=True)["input_ids"]
    im_start, im_end = qwen_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert (ids == im_start).sum() == (ids == im_end).sum() == 3  # system, user, assistant
    assert [qwen_tokenizer.decode(r.tolist()) for r in trained_runs(ids, labels)] == [
        messages[1]["content"] + "<|im_end|>"]


def test_same_rows_on_multi_processing_and_on_a_second_run(small, tmp_path):
    output, manifest = small
    others = {
        "multi": ("--direct_running_mode=multi_processing", "--direct_num_workers=2"),
        "again": ("--direct_running_mode=in_memory",),
    }
    for name, mode in others.items():
        other = tmp_path / name
        assert run_into(other, SMALL, *SMALL_OPTIONS, *mode)["records"] == manifest["records"]
        for kind in KINDS:
            mine, theirs = sorted((output / kind).iterdir()), sorted((other / kind).iterdir())
            assert [p.name for p in mine] == [p.name for p in theirs]
            for a, b in zip(mine, theirs, strict=True):
                if a.suffix == ".parquet":
                    assert pq.read_table(a).equals(pq.read_table(b)), (name, a.name)
                else:
                    assert a.read_text() == b.read_text(), (name, a.name)


# --- padding, the segment cap and the drop policy ----------------------------------------------


def test_padded_rows_have_a_pad_segment_and_at_most_two_examples(variant, qwen_tokenizer):
    output, manifest = variant
    pad = qwen_tokenizer.pad_token_id
    pad_tokens = 0
    per_input: collections.Counter = collections.Counter()
    for row in sft_rows(output):
        assert len(row["input_ids"]) == sum(row["seq_lengths"]) == SMALL_SEQ_LEN
        assert row["position_ids"] == [p for n in row["seq_lengths"] for p in range(n)]
        parts, sources = segments(row), row["sources"]
        assert len(sources) == len(parts)
        ids, labels = parts[-1]
        if (ids == pad).all():  # the room left by the examples, as its own segment of no input
            assert (labels == -100).all() and sources[-1] == -1
            pad_tokens += len(ids)
            parts, sources = parts[:-1], sources[:-1]
        assert 1 <= len(parts) <= 2
        assert all((ids != pad).any() for ids, _ in parts)
        for (ids, _), source in zip(parts, sources, strict=True):
            per_input[source] += len(ids)
    inst = manifest["instruction"]
    assert pad_tokens == inst["pad_tokens"] > 0
    assert per_input == {entry["index"]: entry["tokenized"]["instruction"]["tokens"]
                         for entry in manifest["inputs"] if "instruction" in entry["tokenized"]}
    assert inst["packing_efficiency"] == pytest.approx(
        inst["tokens"] / (inst["packs"] * SMALL_SEQ_LEN), abs=1e-6)


def test_drop_policy_filters_what_truncate_would_cut(small, variant):
    (_, truncated), (output, dropped_run) = small, variant
    record = next(p for p, r in edge_cases() if r["_expect"] == "truncated")
    assert dropped(output)[record] == "too_long"
    assert dropped_run["instruction"]["truncated"] == 0
    assert dropped_run["records"]["filtered"]["too_long"] == (
        truncated["records"]["filtered"]["too_long"] + truncated["instruction"]["truncated"])


# --- options that fail before any work ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("alpaca", "expected FORMAT=PATH"),
        ("yaml=x.pbtxt", "unknown format(s) ['yaml']"),
        ("alpaca=/no/such/schema.pbtxt", "cannot read schema /no/such/schema.pbtxt"),
        (f"alpaca={EDGE}", "not a tensorflow-metadata Schema"),
    ],
)
def test_bad_schema_option_stops_before_any_work(value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"--input={EDGE}", f"--output={tmp_path}/o", f"--schema={value}"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
