"""Mixing, curriculum phases, validation splits and decontamination, end to end on the shared
data: shares reached, phases apart, validation stable and disjoint, planted test data removed."""

import collections
import itertools
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import SHARED_DATA, require_shared_data
from transforms.io.input_specs import parse_input_spec
from transforms.io.manifest import summary_lines
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard

require_shared_data()

D = SHARED_DATA
INSTRUCTION_MIX = {  # the example: source -> (input, weight)
    "general": (f"{D}/instruction/alpaca_en_demo.json", 40),
    "code": (f"{D}/code/humaneval.jsonl#prompt=prompt;response=canonical_solution", 20),
    "math": (f"{D}/math/gsm8k_train.jsonl#prompt=question;response=answer", 15),
    "safety": (f"{D}/preference/hh_rlhf_harmless_base_test.jsonl", 10),
    "conversation": (f"{D}/chat/kto_en_demo_messages.json", 15),
}
KNOWLEDGE_MIX = {
    "web": (f"{D}/pretrain/llamafactory_c4_demo.jsonl", 5),
    "books": (f"{D}/pretrain/tinyshakespeare.txt#text_unit=paragraph", 3),
    "wiki": (f"{D}/pretrain/wikitext2_valid.txt#text_unit=paragraph", 2),
}
RAW = ("--normalize=false", "--quality_filter=false", "--dedup=none", "--boilerplate=false",
       "--pii=off")


def weighted(mix: dict, branch: str, phase: str | None = None) -> list[str]:
    extra = f";phase={phase}" if phase else ""
    return [f"--input={path}{'#' if '#' not in path else ';'}branch={branch};name={name};"
            f"weight={weight}{extra}" for name, (path, weight) in mix.items()]


def prepare(output, *args: str) -> dict:
    run([*args, f"--output={output}", "--chunk_records=512"])
    return json.loads((output / "manifest.json").read_text())


def rows(output, kind: str) -> list[dict]:
    files = sorted((output / kind).glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def jsonl(output, kind: str) -> list[dict]:
    return [json.loads(line) for f in sorted((output / kind).glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def segments(row: dict) -> list[tuple[int, ...]]:
    ids, bounds = row["input_ids"], np.cumsum([0, *row["seq_lengths"]])
    return [tuple(ids[a:b]) for a, b in itertools.pairwise(bounds)]


def tokens_per_input(found: list[dict]) -> collections.Counter:
    """Tokens per ``sources`` entry over the rows, each piece's length to its input."""
    counts: collections.Counter = collections.Counter()
    for row in found:
        assert len(row["sources"]) == len(row["seq_lengths"])
        for source, length in zip(row["sources"], row["seq_lengths"], strict=True):
            counts[source] += length
    return counts


def mixed_tokens(manifest: dict, branch: str) -> dict[int, int]:
    """Per input index, the tokens mixing wrote of its source."""
    index = {entry["name"]: entry["index"] for entry in manifest["inputs"]}
    return {index[name]: figures["tokens_out"]
            for name, figures in manifest["mixing"][branch].items()}


def assert_shares(report: dict, mix: dict) -> None:
    total = sum(weight for _, weight in mix.values())
    assert set(report) == set(mix)
    for name, (_, weight) in mix.items():
        assert abs(report[name]["share"] - weight / total) <= 0.01, (name, report[name])


@pytest.fixture(scope="module")
def instruction_down(tmp_path_factory):
    output = tmp_path_factory.mktemp("mix-down")
    return output, prepare(output, *weighted(INSTRUCTION_MIX, "instruction"))


def test_instruction_sources_reach_their_token_shares(instruction_down):
    output, manifest = instruction_down
    report = manifest["mixing"]["instruction"]
    assert_shares(report, INSTRUCTION_MIX)
    # Scaling down keeps whole records once or not at all, and the scarcest source whole.
    assert all(s["records_out"] <= s["records_in"] for s in report.values())
    scarcest = min(report, key=lambda n: report[n]["tokens_in"] / (INSTRUCTION_MIX[n][1]))
    assert report[scarcest]["records_out"] == report[scarcest]["records_in"]
    # What was packed is exactly what mixing chose.
    packed = sum(sum(row["seq_lengths"]) for row in rows(output, "sft"))
    assert packed == sum(s["tokens_out"] for s in report.values())
    assert packed == manifest["instruction"]["packed_tokens"]
    left_out = manifest["records"]["filtered"]["mix_unselected"]
    assert left_out == sum(s["records_in"] - s["records_out"] for s in report.values())
    assert manifest["records"]["balanced"]
    # The summary says how many of the branch's tokens mixing kept: exactly what was packed.
    [line] = [line for line in summary_lines(manifest) if line.startswith("mixing instruction")]
    tokenized = sum(s["tokens_in"] for s in report.values())
    assert line.startswith(f"mixing instruction (scale down): {tokenized:,} training tokens "
                           f"-> {packed:,}; ")
    assert packed < tokenized


def test_scaling_up_repeats_records_and_leaves_none_out(tmp_path):
    manifest = prepare(tmp_path, *weighted(INSTRUCTION_MIX, "instruction"), "--mix_scale=up")
    report = manifest["mixing"]["instruction"]
    assert_shares(report, INSTRUCTION_MIX)
    assert "mix_unselected" not in manifest["records"]["filtered"]
    assert all(s["records_out"] >= s["records_in"] for s in report.values())
    assert report["code"]["records_out"] > 2 * report["code"]["records_in"]
    assert manifest["records"]["balanced"]
    # every copy of a repeated record names its input
    assert tokens_per_input(rows(tmp_path, "sft")) == mixed_tokens(manifest, "instruction")


def test_knowledge_shares_hold_when_recounted_from_the_inputs(tmp_path, qwen_tokenizer):
    """An independent recount: every input document minus those mixing left out (listed in
    filtered/), tokenized here, gives the target shares."""
    manifest = prepare(tmp_path, *weighted(KNOWLEDGE_MIX, "knowledge"), *RAW,
                       "--write_filtered=true")
    left_out = {(r["source"], r["position"]) for r in jsonl(tmp_path, "filtered")
                if r["reason"] == "mix_unselected"}
    assert left_out
    tokens = {}
    for index, (name, (path, _)) in enumerate(KNOWLEDGE_MIX.items()):
        kept = [record.value["text"] if isinstance(record.value, dict) else record.value
                for shard in plan_shards([parse_input_spec(index, path)])
                for chunk in read_shard(shard) for record in chunk.records
                if record.key not in left_out]
        encoded = qwen_tokenizer(kept, add_special_tokens=False, split_special_tokens=True)
        tokens[name] = sum(len(ids) + 1 for ids in encoded["input_ids"])  # + end-of-text
    total = sum(tokens.values())
    weights = sum(weight for _, weight in KNOWLEDGE_MIX.values())
    for name, (_, weight) in KNOWLEDGE_MIX.items():
        assert abs(tokens[name] / total - weight / weights) <= 0.01, (name, tokens)
        assert tokens[name] == manifest["mixing"]["knowledge"][name]["tokens_out"]


def test_phases_land_in_their_own_directories(tmp_path, qwen_tokenizer):
    run([f"--input={D}/instruction/alpaca_en_demo.json#phase=basic",
         f"--input={D}/pretrain/llamafactory_c4_demo.jsonl#phase=basic",
         f"--input={D}/math/gsm8k_test.jsonl#branch=instruction;prompt=question;response=answer;"
         "phase=reasoning",
         f"--output={tmp_path}"])
    listing = json.loads((tmp_path / "phases.json").read_text())["phases"]
    assert [(p["phase"], p["name"]) for p in listing] == [(1, "basic"), (2, "reasoning")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic", "phases.json", "reasoning"]
    basic = json.loads((tmp_path / "basic" / "manifest.json").read_text())
    reasoning = json.loads((tmp_path / "reasoning" / "manifest.json").read_text())
    assert [i["pattern"] for i in basic["inputs"]] == [
        f"{D}/instruction/alpaca_en_demo.json", f"{D}/pretrain/llamafactory_c4_demo.jsonl"]
    assert reasoning["records"]["read"] == reasoning["records"]["instruction"] == 1319
    assert basic["records"]["instruction"] == 999 and basic["knowledge"]["blocks"] > 0
    assert not (tmp_path / "reasoning" / "pretrain").exists()
    text = "".join(qwen_tokenizer.decode(r["input_ids"])
                   for r in rows(tmp_path / "reasoning", "sft"))
    assert "Janet\u2019s ducks lay 16 eggs per day" in text
    basic_text = "".join(qwen_tokenizer.decode(r["input_ids"])
                         for r in rows(tmp_path / "basic", "sft"))
    assert "Janet\u2019s ducks" not in basic_text
    assert "Describe a process of making crepes." in basic_text
    # A later run into the same directory, without phases, replaces the phases' outputs too.
    again = [f"--input={D}/instruction/alpaca_en_demo.json", f"--output={tmp_path}"]
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}/basic/manifest.json")):
        run(again)
    run([*again, "--overwrite=true"])
    assert not [p for p in tmp_path.rglob("*") if p.is_file()
                and p.parts[-2] not in ("sft", "tokenizer")
                and p.name not in ("manifest.json", "report.html", "README.md")]
    assert not [p for p in (tmp_path / "basic").rglob("*") if p.is_file()]
    assert not [p for p in (tmp_path / "reasoning").rglob("*") if p.is_file()]


def test_inputs_must_all_name_a_phase_once_one_does(tmp_path):
    with pytest.raises(ValueError, match="every input must"):
        run([f"--input={D}/instruction/alpaca_en_demo.json#phase=basic",
             f"--input={D}/chat/kto_en_demo_messages.json", f"--output={tmp_path}"])


SPLIT_ARGS = (  # mixing too, so that both are compared across runners
    f"--input={D}/instruction/alpaca_en_demo.json#branch=instruction;name=general;weight=2",
    f"--input={D}/chat/kto_en_demo_messages.json#branch=instruction;name=chat;weight=1",
    f"--input={D}/pretrain/llamafactory_c4_demo.jsonl#branch=knowledge;name=web;weight=1",
    "--instruction_validation=0.1", "--knowledge_validation=25", "--num_shards=2",
    "--block_size=512",
)


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory):
    first = tmp_path_factory.mktemp("split-in-memory")
    second = tmp_path_factory.mktemp("split-multi")
    return (first, prepare(first, *SPLIT_ARGS)), (second, prepare(
        second, *SPLIT_ARGS, "--direct_running_mode=multi_processing", "--direct_num_workers=2"))


def test_validation_split_is_held_out_and_disjoint_from_train(split_runs):
    (output, manifest), _ = split_runs
    held = manifest["validation"]
    assert held["knowledge"]["documents"] == 25
    unselected = manifest["records"]["filtered"]["mix_unselected"]
    examples = manifest["instruction"]["examples"] + held["instruction"]["examples"] + unselected
    assert 0.05 < held["instruction"]["examples"] / examples < 0.15
    assert manifest["records"]["balanced"]
    assert held["records"] == held["knowledge"]["documents"] + held["instruction"]["examples"]
    validation = [s for row in rows(output, "validation/sft") for s in segments(row)]
    train = {s for row in rows(output, "sft") for s in segments(row)}
    assert len(validation) == held["instruction"]["examples"]
    assert validation and not set(validation) & train  # copies of a record stay together
    assert len(rows(output, "validation/pretrain")) == held["knowledge"]["blocks"] > 0
    assert all(len(r["input_ids"]) == 512 for r in rows(output, "validation/pretrain"))


def test_sources_name_the_inputs_of_both_splits_after_mixing(split_runs):
    """Training rows hold per input what mixing wrote of it (blocks less the dropped
    remainder); validation rows come from the same inputs, their tokens the split's."""
    (output, manifest), _ = split_runs
    know, held = manifest["knowledge"], manifest["validation"]
    assert tokens_per_input(rows(output, "sft")) == mixed_tokens(manifest, "instruction")
    [(web, tokens)] = mixed_tokens(manifest, "knowledge").items()
    assert tokens_per_input(rows(output, "pretrain")) == {web: tokens - know["remainder_tokens"]}
    validation = tokens_per_input(rows(output, "validation/sft"))
    assert set(validation) == set(mixed_tokens(manifest, "instruction"))
    assert sum(validation.values()) == held["instruction"]["packed_tokens"]
    held_blocks = held["knowledge"]
    assert tokens_per_input(rows(output, "validation/pretrain")) == {web: (
        held_blocks["tokens"] + held_blocks["documents"] - held_blocks["remainder_tokens"])}


def test_validation_split_and_mixing_are_the_same_on_every_runner(split_runs):
    (first, manifest), (second, other) = split_runs
    assert other["validation"] == manifest["validation"]
    assert other["mixing"] == manifest["mixing"]
    for kind in ("validation/sft", "validation/pretrain", "sft", "pretrain"):
        mine, theirs = sorted((first / kind).glob("*")), sorted((second / kind).glob("*"))
        assert [f.name for f in mine] == [f.name for f in theirs]
        for a, b in zip(mine, theirs, strict=True):
            assert pq.read_table(a).equals(pq.read_table(b)), (kind, a.name)


def test_planted_test_questions_are_removed_and_the_rest_stays(tmp_path):
    test_rows = [json.loads(line) for line in (D / "math/gsm8k_test.jsonl").open()][:20]
    train_rows = [json.loads(line) for line in (D / "math/gsm8k_train.jsonl").open()][:300]
    humaneval = [json.loads(line) for line in (D / "code/humaneval.jsonl").open()][:5]
    instructions = [{"prompt": r["question"], "response": r["answer"]} for r in train_rows]
    planted = [{"prompt": f"Solve the following problem.\n{r['question']}",
                "response": "Let me think. The answer is 42."} for r in test_rows[:12]]
    planted += [{"prompt": "Complete this function:\n" + h["prompt"], "response": "pass"}
                for h in humaneval]
    documents = [{"text": f"Worked example. {r['question']} {r['answer']}"} for r in train_rows]
    planted_documents = [{"text": f"A forum post asks: {r['question']} Nobody replied."}
                         for r in test_rows[12:]]
    expected = write_jsonl(tmp_path / "sft.jsonl", instructions[:150] + planted
                           + instructions[150:], range(150, 150 + len(planted)))
    expected |= write_jsonl(tmp_path / "docs.jsonl", planted_documents + documents,
                            range(len(planted_documents)))
    output = tmp_path / "out"
    manifest = prepare(
        output, f"--input={tmp_path}/sft.jsonl", f"--input={tmp_path}/docs.jsonl", *RAW,
        f"--decontaminate={D}/math/gsm8k_test.jsonl#text=question",
        f"--decontaminate={D}/code/humaneval.jsonl#text=prompt", "--write_filtered=true")
    report = manifest["decontamination"]
    assert report["removed"] == {
        "knowledge": {f"{D}/math/gsm8k_test.jsonl": 8},
        "instruction": {f"{D}/math/gsm8k_test.jsonl": 12, f"{D}/code/humaneval.jsonl": 5}}
    assert manifest["records"]["filtered"] == {"contaminated": 25}
    assert report["eval_texts"] == {f"{D}/math/gsm8k_test.jsonl": {"indexed": 1319, "too_short": 0},
                                    f"{D}/code/humaneval.jsonl": {"indexed": 164, "too_short": 0}}
    assert manifest["records"]["instruction"] == 300 and manifest["knowledge"]["documents"] == 300
    assert {(r["source"], r["position"]) for r in jsonl(output, "filtered")} == expected
    assert len(report["examples"]) == 20  # the first, in (source, position) order
    assert all(e["overlap"] >= 0.5 and (e["source"], e["position"]) in expected
               for e in report["examples"])


def write_jsonl(path, records: list[dict], marked: range) -> set[tuple[str, int]]:
    """Writes one record per line; returns the (source, byte offset) of the marked ones."""
    offsets, lines, offset = [], [], 0
    for record in records:
        line = json.dumps(record) + "\n"
        offsets.append(offset)
        lines.append(line)
        offset += len(line.encode("utf-8"))
    path.write_text("".join(lines))
    return {(str(path), offsets[n]) for n in marked}
