"""--output_format: each extra format read back by its trainer's own reader and compared, token
by token, label by label and boundary by boundary, with the Parquet output of the same run.

One pipeline run (module-scoped) writes every format. The readers: megatron-core's
``IndexedDataset`` and ``GPTDataset`` (pretraining), NeMo's packed-SFT layout as its
``GPTSFTPackedDataset`` (nemo-toolkit 2.7.3) loads and collates it (NeMo itself is too heavy to
install here, so its load and slicing are done as its source does), ``streaming.StreamingDataset``
in its own venv (scripts/streaming_env.sh), and ``litdata.StreamingDataset``.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import types
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline.card import CARD_ROOT, build_card
from beam_pipeline.running import run
from tests.conftest import EXAMPLES, ROOT
from transforms.core.vocabulary import IGNORE_INDEX
from transforms.io.earlier_runs import clear_previous_outputs
from transforms.io.formats.how_to_read import how_to_read, snippets
from transforms.io.manifest import summary_lines

EOD = 151643  # <|endoftext|> of the offline Qwen2 tokenizer
BLOCK_SIZE = 256
SEQ_LEN = 1024
FORMATS = ("megatron", "mds", "litdata")
INSTALL_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("formats") / "out"
    run([f"--input={EXAMPLES}/c4_sample.jsonl", f"--input={EXAMPLES}/alpaca_seed_tasks.json",
         f"--input={EXAMPLES}/sharegpt_sample.json", f"--output={out}",
         f"--block_size={BLOCK_SIZE}", f"--seq_len={SEQ_LEN}", "--num_shards=2", "--quiet",
         "--output_format=parquet," + ",".join(FORMATS)])
    return out


@pytest.fixture(scope="module")
def manifest(output: Path) -> dict:
    return json.loads((output / "manifest.json").read_text())


def parquet_rows(output: Path, kind: str) -> list[dict]:
    return [row for path in sorted((output / kind).glob("*.parquet"))
            for row in pq.read_table(path).to_pylist()]


def megatron_documents(manifest: dict) -> list[np.ndarray]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    documents = []
    for entry in manifest["outputs"]["megatron/pretrain"]:
        dataset = IndexedDataset(entry["path"][:-len(".bin")])
        assert dataset.index.dtype == np.int32  # Qwen's 151,646 ids: megatron's int32
        assert len(dataset) == entry["rows"]
        documents += [dataset[i].copy() for i in range(len(dataset))]  # views die with it
    return documents


def test_megatron_documents_hold_every_block_and_its_boundaries(output, manifest):
    documents = megatron_documents(manifest)
    assert len(documents) == manifest["knowledge"]["documents"] == 113
    for document in documents:  # one sequence per document, its end-of-text last and only
        assert document[-1] == EOD and np.count_nonzero(document == EOD) == 1
    blocks = parquet_rows(output, "pretrain")
    in_blocks = collections.Counter(t for row in blocks for t in row["input_ids"])
    in_documents = collections.Counter(int(t) for d in documents for t in d)
    # the blocks are the documents' tokens less the remainder the policy dropped
    assert not in_blocks - in_documents
    assert sum((in_documents - in_blocks).values()) == manifest["knowledge"]["remainder_tokens"]
    # a piece of a block after its first that ends a document is a whole document
    whole = collections.Counter(tuple(d.tolist()) for d in documents)
    pieces = collections.Counter()
    for row in blocks:
        starts = np.cumsum([0, *row["seq_lengths"]])
        for start, end in itertools.pairwise(starts[1:]):
            if row["input_ids"][end - 1] == EOD:
                pieces[tuple(row["input_ids"][start:end])] += 1
    assert pieces and not pieces - whole
    assert sum(e["tokens"] for e in manifest["outputs"]["megatron/pretrain"]) == \
        sum(len(d) for d in documents)


def test_gpt_dataset_builds_its_samples_from_one_prefix(manifest, tmp_path):
    """Megatron's own sampler over one shard, with no process group: every sample is the
    documents its index names, cut where it says."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    prefix = manifest["outputs"]["megatron/pretrain"][0]["path"][:-len(".bin")]
    documents = IndexedDataset(prefix)
    tokenizer = types.SimpleNamespace(eod=EOD, pad=EOD, vocab_size=151646,
                                      unique_identifiers={"class": "qwen2-offline"})
    config = GPTDatasetConfig(random_seed=1234, sequence_length=BLOCK_SIZE, tokenizer=tokenizer,
                              reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=str(tmp_path), split="1,0,0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = GPTDataset(documents, prefix, np.arange(len(documents), dtype=np.int32), 20,
                             Split.train, config)
    stream = np.concatenate([documents[int(i)] for i in dataset.document_index])
    starts = np.cumsum([0, *(len(documents[int(i)]) for i in dataset.document_index)])
    assert len(dataset) >= 20
    for i in range(len(dataset)):
        j = dataset.shuffle_index[i]
        (doc_a, off_a), (doc_b, off_b) = dataset.sample_index[j], dataset.sample_index[j + 1]
        expected = stream[starts[doc_a] + off_a:starts[doc_b] + off_b + 1]
        sample = dataset[i]
        assert np.array_equal(sample["tokens"], expected[:-1])
        assert np.array_equal(sample["labels"], expected[1:])


def test_nemo_packs_train_exactly_the_sft_labels(output, manifest):
    packs = [pack for entry in manifest["outputs"]["megatron/sft"]
             for pack in np.load(entry["path"], allow_pickle=True)]
    rows = parquet_rows(output, "sft")
    assert len(packs) == len(rows) == manifest["instruction"]["packs"]
    for pack, row in zip(packs, rows, strict=True):
        assert np.array_equal(pack["input_ids"], row["input_ids"])
        assert pack["seq_start_id"] == np.cumsum([0, *row["seq_lengths"][:-1]]).tolist()
        # GPTSFTPackedDataset.__getitem__ and collate_fn, per segment [s, e): tokens
        # input_ids[s:e-1], labels input_ids[s+1:e], loss mask loss_mask[s:e-1]
        bounds = pack["seq_start_id"] + [len(pack["input_ids"])]
        labels = np.array(row["labels"])
        for s, e in itertools.pairwise(bounds):
            trained = np.asarray(pack["loss_mask"][s:e - 1], bool)
            targets = np.asarray(pack["input_ids"][s + 1:e])
            assert np.array_equal(trained, labels[s + 1:e] != IGNORE_INDEX)
            assert np.array_equal(targets[trained], labels[s + 1:e][trained])


def assert_same_rows(found: dict[str, list[np.ndarray]], rows: list[dict]) -> None:
    assert set(found) == set(rows[0])
    for column, values in found.items():
        assert len(values) == len(rows)
        for value, row in zip(values, rows, strict=True):
            assert value.dtype == np.int32 and value.tolist() == row[column], column


def test_mds_shards_read_by_streaming_are_the_parquet_rows(output, manifest, tmp_path):
    made = subprocess.run(["bash", str(ROOT / "scripts" / "streaming_env.sh")], check=False,
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert made.returncode == 0, made.stderr[-5000:]
    python = made.stdout.strip().splitlines()[-1]
    kinds = ("pretrain", "sft")
    read = subprocess.run([python, str(ROOT / "tests" / "support" / "streaming" / "read_mds.py"),
                           str(tmp_path), *(str(output / "mds" / kind) for kind in kinds)],
                          check=False, capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())
    assert read.returncode == 0, read.stderr[-5000:]
    for index, kind in enumerate(kinds):
        saved = np.load(tmp_path / f"{index}.npz")
        columns = [name for name in saved.files if not name.endswith(".lengths")]
        found = {c: np.split(saved[c], np.cumsum(saved[f"{c}.lengths"])[:-1]) for c in columns}
        assert_same_rows(found, parquet_rows(output, kind))
        index_json = json.loads((output / "mds" / kind / "index.json").read_text())
        assert [s["raw_data"]["basename"] for s in index_json["shards"]] == \
            ["part-00000-of-00002.mds", "part-00001-of-00002.mds"]


def test_litdata_chunks_read_by_litdata_are_the_parquet_rows(output):
    from litdata import StreamingDataset

    for kind in ("pretrain", "sft"):
        dataset = StreamingDataset(str(output / "litdata" / kind))
        items = [dataset[i] for i in range(len(dataset))]
        rows = parquet_rows(output, kind)
        assert_same_rows({c: [item[c] for item in items] for c in rows[0]}, rows)


def test_manifest_lists_every_format_file_with_rows_and_tokens(output, manifest):
    assert manifest["formats"]["written"] == ["parquet", *FORMATS]
    for fmt in FORMATS:
        for kind in ("pretrain", "sft"):
            entries = manifest["outputs"][f"{fmt}/{kind}"]
            assert [Path(e["path"]).parent for e in entries] == [output / fmt / kind] * 2
            assert all(e["rows"] > 0 and e["tokens"] > 0 for e in entries)
    sft_tokens = sum(len(r["input_ids"]) for r in parquet_rows(output, "sft"))
    assert {sum(e["tokens"] for e in manifest["outputs"][f"{fmt}/sft"]) for fmt in FORMATS} == \
        {sft_tokens}
    assert sorted(manifest["formats"]["index_files"]) == [
        "litdata/pretrain/index.json", "litdata/sft/index.json", "mds/pretrain/index.json",
        "mds/sft/index.json"]


def test_an_overwrite_deletes_every_format_file_and_nothing_of_the_users(output, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(output, copy)
    mine = copy / "mds" / "sft" / "notes.txt"
    mine.write_text("the user's")
    clear_previous_outputs(str(copy))
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == \
        ["mds/sft/notes.txt"]


def test_the_summary_and_card_point_each_trainer_at_the_files_written(output, manifest, tmp_path,
                                                                       monkeypatch):
    from megatron.core.datasets.utils import get_blend_from_list

    summary = summary_lines(manifest, str(output))
    lines = summary[next(i for i, line in enumerate(summary)
                         if line.startswith("formats written: parquet, megatron, mds, litdata")):]
    text = "\n".join(lines)
    [data_path] = [line.split() for line in lines if line.strip().startswith("--data-path ")]
    prefixes, weights = get_blend_from_list(data_path[1:])  # Megatron's own parsing
    entries = manifest["outputs"]["megatron/pretrain"]
    assert prefixes == [entry["path"][:-len(".bin")] for entry in entries]
    # weights are the shards' tokens: every document's tokens and its end-of-text token
    assert weights == [entry["tokens"] for entry in entries]
    assert sum(weights) == manifest["knowledge"]["tokens"] + manifest["knowledge"]["documents"]
    named = set(re.findall(re.escape(str(output)) + r"/[\w./-]+", text))
    assert {Path(p).relative_to(output).as_posix() for p in named} == {
        *(Path(prefix).relative_to(output).as_posix() for prefix in prefixes),
        "megatron/sft/part-00000-of-00002.npy", "megatron/sft/part-00001-of-00002.npy",
        *(f"{fmt}/{kind}" for fmt in ("mds", "litdata") for kind in ("pretrain", "sft"))}
    for path in named:
        assert Path(path).exists() or Path(f"{path}.bin").exists(), path
    # the LitData snippet and NeMo's joining of the .npy shards run as they are
    found = {snippet.title.split()[0]: snippet.lines
             for snippet in snippets(manifest["formats"]["how_to_read"], str(output))}
    litdata: dict = {}
    exec("\n".join(found["LitData"]), litdata)
    assert len(litdata["pretrain"]) == manifest["knowledge"]["blocks"]
    assert len(litdata["sft"]) == manifest["instruction"]["packs"]
    monkeypatch.chdir(tmp_path)
    nemo = found["NeMo"]
    exec("\n".join(nemo[:nemo.index("from nemo.collections import llm")]), {})
    assert [pack["seq_start_id"] for pack in np.load("train.npy", allow_pickle=True)] == [
        pack["seq_start_id"] for entry in manifest["outputs"]["megatron/sft"]
        for pack in np.load(entry["path"], allow_pickle=True)]
    assert 'packed_train_data_path="train.npy",' in "\n".join(nemo)
    # the card shows the same snippets, rooted at its own folder
    card = build_card(manifest)
    assert "--data-path " + " ".join(
        f"{entry['tokens']} {CARD_ROOT}/megatron/pretrain/{Path(entry['path']).stem}"
        for entry in entries) in card
    assert f'StreamingDataset(local="{CARD_ROOT}/mds/sft", shuffle=True)' in card


def test_one_npy_per_split_goes_to_nemo_as_it_is_and_a_bucket_streams_into_a_cache():
    outputs = {"megatron/sft": [{"path": "gs://b/run/megatron/sft/part-00000-of-00001.npy",
                                 "rows": 3, "tokens": 30}],
               "mds/sft": [{"path": "gs://b/run/mds/sft/part-00000-of-00001.mds", "rows": 3,
                            "tokens": 30}]}
    found = how_to_read(outputs, ("parquet", "megatron", "mds"), 2048)
    assert found["megatron"]["pretrain"] == {}
    nemo, mds = (s.lines for s in snippets(found, "gs://b/run"))
    assert "import numpy as np" not in nemo
    assert ('        packed_train_data_path="gs://b/run/megatron/sft/part-00000-of-00001.npy",'
            in nemo)
    assert mds[1] == ('sft = StreamingDataset(remote="gs://b/run/mds/sft", '
                      'local="/tmp/mds-cache/mds/sft", shuffle=True)')
