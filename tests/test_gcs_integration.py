"""The whole pipeline on gs:// against a local Cloud Storage emulator.

Inputs (one by glob), the tokenizer directory, the chat template and every output live in an
emulated bucket. The run is a subprocess on ``multi_processing`` workers, so each worker process
reaches the emulator and the fake metadata server through the environment it inherits, as
Dataflow workers reach Cloud Storage. Its rows must equal those of a local run over the same
files: only inputs and configuration decide the output, not the filesystem or the runner mode.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.running import run
from tests.conftest import EXAMPLES, ROOT
from tests.support.gcs import (
    child_env,
    cloud_env,
    metadata_server,
    storage_emulator,
    use_in_process,
)
from tests.support.score_models import save_tiny_bert, train_fasttext
from transforms.io.earlier_runs import check_output_dir, clear_previous_outputs
from transforms.io.output_lock import LOCK_NAME, Holder, acquire

BUCKET = "dataprep-test"
TEMPLATE = ROOT / "tests" / "data" / "templates" / "chatml.jinja"
# (file uploaded under inputs/, its --input value with PATH standing for the directory)
INPUTS = [
    ("c4_sample.jsonl", "PATH/c4_*.jsonl"),
    ("tinyshakespeare_excerpt.txt", "PATH/tinyshakespeare_excerpt.txt#text_unit=paragraph"),
    ("alpaca_seed_tasks.json", "PATH/alpaca_seed_tasks.json"),
    ("messages_sample.json", "PATH/messages_sample.json"),
    ("toolcall_sample.json", "PATH/toolcall_sample.json"),
    ("gsm8k_sample.jsonl",
     "PATH/gsm8k_sample.jsonl#branch=instruction;prompt=question;response=answer"),
]
SETTINGS = ["--block_size=512", "--seq_len=1024", "--num_shards=2", "--chunk_records=300",
            "--row_group_rows=64"]
INT32_LIST = pa.list_(pa.int32())
SCHEMAS = {
    "pretrain": pa.schema([(name, INT32_LIST)
                           for name in ("input_ids", "seq_lengths", "sources")]),
    "sft": pa.schema([(name, INT32_LIST) for name in
                      ("input_ids", "labels", "position_ids", "seq_lengths", "sources")]),
}


def pipeline_args(inputs_dir: str, output: str, tokenizer: str, template: str,
                  models: dict[str, str]) -> list[str]:
    return [
        *(f"--input={value.replace('PATH', inputs_dir)}" for _, value in INPUTS),
        f"--output={output}", f"--tokenizer={tokenizer}", f"--chat_template={template}",
        f"--quality_model=ft=fasttext:{models['ft']}#label=hq",
        f"--quality_model=bert=hf:{models['bert']}#branch=knowledge", *SETTINGS,
    ]


def upload(local: Path, uri: str) -> None:
    with FileSystems.create(uri) as dst:
        dst.write(local.read_bytes())


def read_bytes(uri: str) -> bytes:
    with FileSystems.open(uri) as src:
        return src.read()


def list_objects(prefix: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([prefix + "/**"])[0].metadata_list)


def read_parquet(paths: list[str]) -> pa.Table:
    """Reads through Beam's filesystem (gs:// or local) and pyarrow, in file order."""
    return pa.concat_tables(pq.read_table(pa.BufferReader(read_bytes(p))) for p in paths)


def parquet_files(output: str, kind: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([f"{output}/{kind}/*.parquet"])[0]
                  .metadata_list)


@pytest.fixture(scope="module")
def cloud() -> Iterator[dict[str, str]]:
    """The emulator and metadata server for this module; this process uses them too."""
    with storage_emulator(BUCKET) as url, metadata_server() as metadata, \
            pytest.MonkeyPatch.context() as patch:
        env = cloud_env(url, metadata)
        use_in_process(patch, env)
        yield env


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, qwen_tokenizer) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A fastText model (one file) and a small BERT classifier (a folder), made here."""
    folder = tmp_path_factory.mktemp("models")
    return {"ft": train_fasttext(folder / "fasttext"),
            "bert": save_tiny_bert(folder / "bert", num_labels=2)}


def upload_folder(local: Path, uri: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            upload(path, f"{uri}/{path.relative_to(local).as_posix()}")


@pytest.fixture(scope="module")
def uploaded(cloud, tokenizer_dir, models) -> dict[str, str]:
    """Inputs, tokenizer, template and quality models in the bucket; returns their gs://
    locations."""
    root = f"gs://{BUCKET}"
    for name, _ in INPUTS:
        upload(EXAMPLES / name, f"{root}/inputs/{name}")
    upload_folder(tokenizer_dir, f"{root}/tokenizers/qwen2")
    upload(TEMPLATE, f"{root}/templates/chatml.jinja")
    upload(models["ft"], f"{root}/models/ft/model.bin")
    upload_folder(models["bert"], f"{root}/models/bert")
    return {"inputs": f"{root}/inputs", "tokenizer": f"{root}/tokenizers/qwen2",
            "template": f"{root}/templates/chatml.jinja", "output": f"{root}/runs/2026-11-29",
            "models": {"ft": f"{root}/models/ft/model.bin", "bert": f"{root}/models/bert"}}


def run_subprocess(args: list[str], env: dict[str, str],
                   cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *args], check=False,
        cwd=ROOT, env=child_env({**env, "BEAM_PIPELINE_CACHE": str(cache)}),
        capture_output=True, text=True, timeout=600)


STALE = ("sft/part-00007-of-00009.parquet", "manifest.json", ".staging/sft/leftover.parquet")


@pytest.fixture(scope="module")
def gcs_run(cloud, uploaded, tmp_path_factory) -> dict:
    """One run on gs:// with --overwrite over a planted earlier run, on two worker processes."""
    output = uploaded["output"]
    for name in (*STALE, "notes.txt"):
        with FileSystems.create(f"{output}/{name}") as handle:
            handle.write(b"from an earlier run")
    args = pipeline_args(uploaded["inputs"], output, uploaded["tokenizer"], uploaded["template"],
                         uploaded["models"])
    result = run_subprocess(
        [*args, "--overwrite=true", "--direct_running_mode=multi_processing",
         "--direct_num_workers=2"],
        cloud, tmp_path_factory.mktemp("worker-cache"))
    assert result.returncode == 0, result.stderr[-5000:]
    return {"output": output, "args": args, "stdout": result.stdout,
            "manifest": json.loads(read_bytes(f"{output}/manifest.json"))}


@pytest.fixture(scope="module")
def local_run(tokenizer_dir, models, tmp_path_factory) -> dict:
    """The same files and settings on local disk, in memory: the reference rows."""
    inputs = str(EXAMPLES)
    output = str(tmp_path_factory.mktemp("local") / "out")
    run(pipeline_args(inputs, output, str(tokenizer_dir), str(TEMPLATE),
                      {name: str(path) for name, path in models.items()}))
    return {"output": output, "manifest": json.loads(Path(output, "manifest.json").read_text())}


def test_manifest_on_gcs_accounts_for_every_record(gcs_run, local_run):
    manifest = gcs_run["manifest"]
    records = manifest["records"]
    assert records["balanced"] is True
    assert records["read"] > 0
    assert records["knowledge"] > 0
    assert records["instruction"] > 0
    for section in ("records", "knowledge", "instruction"):
        assert manifest[section] == local_run["manifest"][section], section
    assert "records read" in gcs_run["stdout"]  # the local-runner summary, read back from gs://


def test_tokenizer_and_template_came_from_the_bucket(gcs_run, local_run):
    tokenizer = gcs_run["manifest"]["tokenizer"]
    assert tokenizer["name"] == f"gs://{BUCKET}/tokenizers/qwen2"
    assert tokenizer["chat_template_sha256"] == hashlib.sha256(TEMPLATE.read_bytes()).hexdigest()
    local = local_run["manifest"]["tokenizer"]
    assert {k: v for k, v in tokenizer.items() if k != "name"} == {
        k: v for k, v in local.items() if k != "name"}


def test_quality_models_came_from_the_bucket_and_score_as_the_local_copies(gcs_run, local_run):
    found, local = (run["manifest"]["quality_scores"] for run in (gcs_run, local_run))
    assert found["knowledge"]["ft"]["path"] == f"gs://{BUCKET}/models/ft/model.bin"
    assert set(found["knowledge"]) == {"ft", "bert"} and set(found["instruction"]) == {"ft"}
    for branch, models in found.items():
        for name, entry in models.items():
            assert entry["scored"] > 0
            assert {k: v for k, v in entry.items() if k != "path"} == {
                k: v for k, v in local[branch][name].items() if k != "path"}, (branch, name)


@pytest.mark.parametrize("kind", ["pretrain", "sft"])
def test_parquet_read_back_from_gcs_equals_the_local_run(gcs_run, local_run, kind):
    gcs_files = parquet_files(gcs_run["output"], kind)
    local_files = parquet_files(local_run["output"], kind)
    assert [p.rsplit("/", 1)[1] for p in gcs_files] == [
        p.rsplit("/", 1)[1] for p in local_files] == [
        f"part-0000{i}-of-00002.parquet" for i in range(2)]
    from_gcs = read_parquet(gcs_files)
    assert from_gcs.schema == SCHEMAS[kind]
    assert from_gcs.num_rows > 0
    assert from_gcs.equals(read_parquet(local_files))
    listed = {entry["path"]: entry["rows"] for entry in gcs_run["manifest"]["outputs"][kind]}
    assert listed == {p: pq.ParquetFile(pa.BufferReader(read_bytes(p))).metadata.num_rows
                      for p in gcs_files}


def test_overwrite_replaced_the_earlier_run_and_kept_other_files(gcs_run):
    output = gcs_run["output"]
    objects = list_objects(output)
    assert f"{output}/notes.txt" in objects
    assert f"{output}/sft/part-00007-of-00009.parquet" not in objects
    assert not [p for p in objects if "/.staging/" in p]
    kinds = {p[len(output) + 1:].split("/")[0] for p in objects}
    assert kinds <= {"pretrain", "sft", "rejected", "filtered", "manifest.json", "notes.txt",
                     "tokenizer", "report.html", "README.md"}


def test_a_second_run_without_overwrite_is_refused_and_changes_nothing(
        gcs_run, cloud, tmp_path_factory):
    before = {p: read_bytes(p) for p in list_objects(gcs_run["output"])}
    result = run_subprocess(gcs_run["args"], cloud, tmp_path_factory.mktemp("refused-cache"))
    assert result.returncode == 2
    assert "already holds outputs" in result.stderr
    assert "--overwrite=true" in result.stderr
    assert {p: read_bytes(p) for p in list_objects(gcs_run["output"])} == before


def test_the_run_released_its_lock_and_a_held_folder_refuses_a_run(
        gcs_run, cloud, tmp_path_factory):
    """On gs:// as on a local disk: the finished run left no lock; while another run holds the
    folder, even an overwrite is refused before it touches anything."""
    assert f"{gcs_run['output']}/{LOCK_NAME}" not in list_objects(gcs_run["output"])
    before = {p: read_bytes(p) for p in list_objects(gcs_run["output"])}
    with acquire(gcs_run["output"], Holder.this_run("holder", "a run still writing")):
        result = run_subprocess([*gcs_run["args"], "--overwrite=true"], cloud,
                                tmp_path_factory.mktemp("locked-cache"))
        assert result.returncode == 2, result.stderr[-3000:]
        assert "is being written by another run (run holder" in result.stderr
        after = {p: read_bytes(p) for p in list_objects(gcs_run["output"])}
    assert {p: v for p, v in after.items() if not p.endswith(LOCK_NAME)} == before


def test_prepare_output_dir_matches_objects_under_gcs_prefixes(cloud):
    output = f"gs://{BUCKET}/prepare-check"
    assert check_output_dir(output, overwrite=False) is False  # nothing there yet
    for name in ("pretrain/part-00000-of-00001.parquet", "rejected/part-00000-of-00001.jsonl",
                 "keep/me.txt", "pretrain-notes.txt"):
        with FileSystems.create(f"{output}/{name}") as handle:
            handle.write(b"x")
    with pytest.raises(ValueError, match=r"prepare-check/pretrain/part-00000-of-00001.parquet, "
                                         r".*prepare-check/rejected/part-"):
        check_output_dir(output, overwrite=False)
    assert check_output_dir(output, overwrite=True) is True
    assert clear_previous_outputs(output) == 2
    assert list_objects(output) == [f"{output}/keep/me.txt", f"{output}/pretrain-notes.txt"]


def test_worker_environment_reaches_the_emulator(cloud, uploaded):
    """Guards the fixture itself: a fresh process lists the bucket with no credential wait."""
    code = ("from apache_beam.io.filesystems import FileSystems as F;"
            f"print(len(F.match(['{uploaded['inputs']}/*'])[0].metadata_list))")
    result = subprocess.run([sys.executable, "-c", code], check=False, env=child_env(cloud),
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(INPUTS)
