"""The dataset card OUTPUT/README.md: its YAML configs load with `datasets` (each config and
split holds exactly the rows of its Parquet files), and it states the declared licences."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from datasets import load_dataset

from beam_pipeline.card import CARD_NAME, build_card
from tests.support.report_run import curated_run
from transforms.io.earlier_runs import is_our_card
from transforms.io.input_specs import parse_input_spec


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return curated_run(tmp_path_factory.getbasetemp())


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_card_yaml_lists_every_config_and_split_that_was_written(prepared):
    header = front_matter((prepared.output / CARD_NAME).read_text())
    assert header["configs"] == [
        {"config_name": "pretrain", "data_files": [
            {"split": "train", "path": "pretrain/*.parquet"},
            {"split": "validation", "path": "validation/pretrain/*.parquet"}]},
        {"config_name": "sft", "data_files": [
            {"split": "train", "path": "sft/*.parquet"},
            {"split": "validation", "path": "validation/sft/*.parquet"}]},
    ]
    # Every declared licence, and "other" for the two inputs that declared none.
    assert header["license"] == ["apache-2.0", "mit", "odc-by", "other"]
    # Licences come before the tag: a rerun still knows the card as its own and replaces it.
    assert is_our_card(str(prepared.output / CARD_NAME))


@pytest.mark.parametrize(("config", "split", "kind"), [
    ("sft", "train", "sft"),
    ("sft", "validation", "validation/sft"),
    ("pretrain", "train", "pretrain"),
    ("pretrain", "validation", "validation/pretrain"),
])
def test_load_dataset_reads_each_config_and_split(prepared, tmp_path_factory, config, split,
                                                   kind):
    loaded = load_dataset(str(prepared.output), config, split=split,
                          cache_dir=str(tmp_path_factory.mktemp("hf-cache")))
    files = sorted((prepared.output / kind).glob("*.parquet"))
    expected = pa.concat_tables(pq.read_table(f) for f in files)
    assert loaded.num_rows == expected.num_rows > 0
    assert loaded.column_names == expected.column_names
    assert loaded[0]["input_ids"] == expected.column("input_ids")[0].as_py()
    assert loaded[-1]["seq_lengths"] == expected.column("seq_lengths")[-1].as_py()
    rows = {"sft": prepared.manifest["instruction"]["packs"],
            "pretrain": prepared.manifest["knowledge"]["blocks"],
            "validation/sft": prepared.manifest["validation"]["instruction"]["packs"],
            "validation/pretrain": prepared.manifest["validation"]["knowledge"]["blocks"]}
    assert loaded.num_rows == rows[kind]


def test_the_cards_json_command_reads_the_rejected_records_with_their_reasons(prepared,
                                                                              tmp_path):
    card = (prepared.output / CARD_NAME).read_text()
    assert '`load_dataset("json", data_files="rejected/*.jsonl")` reads them' in card
    loaded = load_dataset("json", data_files=str(prepared.output / "rejected/*.jsonl"),
                          split="train", cache_dir=str(tmp_path))
    reasons: dict[str, int] = {}
    for reason in loaded["reason"]:
        reasons[reason] = reasons.get(reason, 0) + 1
    assert reasons == prepared.manifest["records"]["rejected"]


def test_card_states_facts_and_licences_per_input(prepared):
    card = (prepared.output / CARD_NAME).read_text()
    manifest = prepared.manifest
    assert f"| tokenizer | {manifest['tokenizer']['name']} " in card
    assert f"| sft | train | `sft/*.parquet` (2) | {manifest['instruction']['packs']:,} |" in card
    for entry, spec in zip(manifest["inputs"], manifest["config"]["inputs"], strict=True):
        licence = spec["license"] or "not declared"
        assert (f"| `{entry['pattern']}` | {entry['name'] or ''} | {licence} | "
                f"{entry['read']:,} |") in card
    assert 'load_dataset("path/to/this/folder", "sft", split="validation")' in card


def test_configs_follow_what_a_run_wrote(prepared):
    outputs = prepared.manifest["outputs"]
    only_sft = {**prepared.manifest, "outputs": {"sft": outputs["sft"]}}
    assert front_matter(build_card(only_sft))["configs"] == [
        {"config_name": "sft", "data_files": [{"split": "train", "path": "sft/*.parquet"}]}]
    nothing = {**prepared.manifest, "outputs": {"rejected": outputs["rejected"]}}
    assert "configs" not in front_matter(build_card(nothing))


def test_license_is_declared_per_input_and_checked():
    spec = parse_input_spec(0, "data/*.jsonl#license=cc-by-sa-4.0;name=web")
    assert (spec.license, spec.name) == ("cc-by-sa-4.0", "web")
    assert parse_input_spec(1, "data/*.jsonl").license is None
    with pytest.raises(ValueError, match=r"license=.CC BY 4\.0. must be a licence identifier"):
        parse_input_spec(0, "data/*.jsonl#license=CC BY 4.0")
