"""Output planning, staging and the final files: row order, shard counts, formats, refusal."""

import collections
import itertools
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transforms.core.steps import Part
from transforms.io.earlier_runs import (
    REPORT_TAG,
    check_card_place,
    check_output_dir,
    clear_previous_outputs,
    clear_staging,
)
from transforms.io.writers import (
    OutputFile,
    ShardFiles,
    StagedFile,
    StagePart,
    WriteOutputFile,
    cut_shard,
    find_staged,
    output_file,
    place_shards,
    shard_of,
    write_arrow,
)


def staged(kind: str, chunk: str, rows: int, size: int = 100, step: str = "s") -> StagedFile:
    return StagedFile(kind, (chunk, step), f"/staging/{chunk}/{step}", rows, size)


def plan_output_files(files: list[StagedFile], output_dir: str, num_shards: int,
                      target_bytes: int) -> list[OutputFile]:
    """The plan WriteOutputs makes through the shuffle, made here in one process: group by
    (kind, shard), place the shards, cut them, group the slices by output file."""
    groups = collections.defaultdict(list)
    for f in files:
        groups[(f.kind, shard_of(f.order[0]))].append(f)
    shards = {key: find_staged((key, group), "/nonexistent/staging")
              for key, group in groups.items()}
    places = dict(place_shards([(*key, s.rows, s.bytes) for key, s in shards.items()],
                               num_shards, target_bytes))
    pieces = collections.defaultdict(list)
    for key, shard in shards.items():
        joined = (key, {"files": [shard], "place": [places[key]] if key in places else []})
        for file_key, piece in cut_shard(joined, output_dir):
            pieces[file_key].append(piece)
    return sorted((output_file(key, group) for key, group in pieces.items()),
                  key=lambda plan: (plan.kind, plan.path))


def test_plan_cuts_rows_in_chunk_order_into_the_requested_shards():
    files = [staged("sft", "c2", 5), staged("sft", "c0", 3), staged("sft", "c1", 0)]
    plans = plan_output_files(files, "/out", num_shards=3, target_bytes=1)
    assert [p.path for p in plans] == [f"/out/sft/part-{i:05d}-of-00003.parquet" for i in range(3)]
    # 8 rows -> 2, 3, 3; c0's rows come first.
    assert [p.slices for p in plans] == [
        (("/staging/c0/s", 0, 2),),
        (("/staging/c0/s", 2, 3), ("/staging/c2/s", 0, 2)),
        (("/staging/c2/s", 2, 5),),
    ]
    assert [p.rows for p in plans] == [2, 3, 3]


def test_every_planned_shard_receives_rows():
    plans = plan_output_files([staged("pretrain", "c0", 2)], "/out", num_shards=8, target_bytes=1)
    assert [p.rows for p in plans] == [1, 1]


def test_automatic_shard_count_follows_target_size_and_kinds_get_their_format():
    files = [staged("pretrain", "c0", 10, size=250), staged("rejected", "c0", 4, size=10)]
    plans = plan_output_files(files, "/out", num_shards=0, target_bytes=100)
    assert [(p.kind, p.path.rsplit("/", 1)[1]) for p in plans] == [
        ("pretrain", "part-00000-of-00003.parquet"),
        ("pretrain", "part-00001-of-00003.parquet"),
        ("pretrain", "part-00002-of-00003.parquet"),
        ("rejected", "part-00000-of-00001.jsonl"),
    ]


@pytest.mark.parametrize("seed", range(20))
def test_shard_by_shard_planning_cuts_every_row_once_in_input_order(seed):
    """Against the plain definition: all of a kind's rows in (shard, chunk, step) order, row i
    in file i * files // rows; the real chunk ids' form (``shard:n``) and tail groups."""
    rng = random.Random(seed)
    files = []
    for shard in rng.sample(range(50), rng.randint(1, 6)):
        for chunk in range(rng.randint(1, 4)):
            for step in rng.sample(["blocks", "filter", "pack"], rng.randint(1, 3)):
                files.append(staged(rng.choice(["pretrain", "sft"]),
                                    f"000:in.jsonl:{shard:015d}:{chunk:06d}", rng.randint(0, 9),
                                    step=step))
    files.append(staged("pretrain", "~tails-00000", rng.randint(0, 9), step="blocks"))
    num_shards = rng.randint(0, 7)
    rng.shuffle(files)
    plans = plan_output_files(files, "/out", num_shards, target_bytes=250)
    for kind in ("pretrain", "sft"):
        # The definition, as the plan made in one place before: every row in (chunk, step)
        # order, cut at rows * i // count.
        rows = [(f.path, i) for f in sorted((f for f in files if f.kind == kind),
                                            key=lambda f: f.order)
                for i in range(f.rows)]
        mine = [plan for plan in plans if plan.kind == kind]
        count = len(mine)
        if not rows:
            assert not mine
            continue
        wanted = num_shards or -(-sum(f.bytes for f in files if f.kind == kind and f.rows)
                                   // 250)
        assert count == max(1, min(wanted, len(rows)))
        bounds = [len(rows) * i // count for i in range(count + 1)]
        assert [[(path, i) for path, start, end in plan.slices for i in range(start, end)]
                for plan in mine] == [rows[lo:hi] for lo, hi in itertools.pairwise(bounds)]
        assert all(plan.rows for plan in mine)


def test_staged_parts_become_parquet_and_jsonl_files(tmp_path):
    table = pa.table({"input_ids": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32()))})
    rejected = pa.table({"source": ["a"], "position": [3], "reason": ["malformed_json"]})
    stage = StagePart(str(tmp_path / "staging"))
    stage.setup()
    stage.start_bundle()
    [data] = stage.process(Part("pretrain", "c0", "blocks", table))
    [bad] = stage.process(Part("rejected", "c0", "classify", rejected))
    # Restaging the same part rewrites the same file: retries cannot duplicate rows.
    assert next(stage.process(Part("pretrain", "c0", "blocks", table))).path == data.path
    stage.finish_bundle()  # the files are written in the background until here
    writer = WriteOutputFile(row_group_rows=2)
    writer.setup()
    writer.start_bundle()
    out = tmp_path / "out"
    [info] = writer.process(OutputFile("pretrain", str(out / "a.parquet"), ((data.path, 1, 3),)))
    list(writer.process(OutputFile("rejected", str(out / "r.jsonl"), ((bad.path, 0, 1),))))
    writer.finish_bundle()
    assert info["rows"] == 2
    written = pq.ParquetFile(out / "a.parquet")
    assert written.read().column("input_ids").to_pylist() == [[3, 4], [5, 6]]
    assert written.schema_arrow.field("input_ids").type == pa.list_(pa.int32())
    assert written.metadata.row_group(0).column(0).compression == "ZSTD"
    lines = (out / "r.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"source": "a", "position": 3, "reason": "malformed_json"}
    ]


def prepare_output_dir(output: str, overwrite: bool) -> None:
    """The launcher's check, then the job's first step, as a run does them."""
    if check_output_dir(output, overwrite):
        clear_staging(output)
        clear_previous_outputs(output)


def test_existing_outputs_are_refused_unless_overwrite(tmp_path):
    assert check_output_dir(str(tmp_path), overwrite=False) is False  # empty: fine
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "part-00000-of-00001.parquet").write_bytes(b"old")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "report.html").write_text(f"<!DOCTYPE html><head>{REPORT_TAG}")  # the report
    (tmp_path / "README.md").write_text('---\ntags:\n- "beam-llm-dataprep"\n---\n# card\n')
    (tmp_path / ".staging" / "sft").mkdir(parents=True)
    (tmp_path / ".staging" / "sft" / "a.arrow").write_bytes(b"a failed run's")
    (tmp_path / "unrelated.txt").write_text("keep me")
    with pytest.raises(ValueError, match="--overwrite"):
        check_output_dir(str(tmp_path), overwrite=False)
    # Once it holds the lock, the launcher deletes only a failed run's staging directory; the
    # job deletes the rest.
    assert check_output_dir(str(tmp_path), overwrite=True) is True
    clear_staging(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "manifest.json", "report.html", "sft", "unrelated.txt"]
    assert clear_previous_outputs(str(tmp_path)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unrelated.txt"]


USER_FILES = ["pretrain/notes.txt", "pretrain/mine.parquet", "sft/README.md", "rejected/keep.jsonl",
              "tokenizer/my_tokenizer.json", "validation/pretrain/x.parquet",
              "validation/mine.txt", "elsewhere/part-00000-of-00001.parquet", "report.html",
              "pretrain/part-1-of-2.parquet"]


def test_overwrite_deletes_only_what_an_earlier_run_wrote(tmp_path):
    """The earlier manifest lists its files; a failed run's output files are known by their
    names; a user's files in every folder, and a report or card not ours, all stay."""
    ours = ["pretrain/part-00000-of-00002.parquet", "pretrain/part-00001-of-00002.parquet",
            "validation/pretrain/part-00000-of-00001.parquet", "rejected/part-00000-of-00001.jsonl",
            "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "manifest.json",
            "sft/part-00003-of-00004.parquet"]  # a failed run's, listed nowhere
    for name in ours + USER_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "report.html").write_text("<html>my own report</html>")
    manifest = {"outputs": {"pretrain": [{"path": "/moved/pretrain/part-00000-of-00002.parquet"},
                                         {"path": "pretrain/part-00001-of-00002.parquet"}],
                            "rejected": [{"path": "../../etc/part-00000-of-00001.jsonl"}]},
                "tokenizer_files": ["tokenizer.json", "tokenizer_config.json", "../../x"]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    prepare_output_dir(str(tmp_path), overwrite=True)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(USER_FILES)


@pytest.mark.parametrize("text", ["# My notes\n", '---\ntags:\n- "other"\n---\n',
                                  '# Notes\n---\n- "beam-llm-dataprep"\n'])
def test_a_users_own_readme_is_never_deleted(tmp_path, text):
    """A run writes its card as README.md: a user's file of that name stops it, overwrite or
    not, and an overwrite leaves it as it was."""
    (tmp_path / "README.md").write_text(text)
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match=r"README\.md is not a dataset card of this "
                                         r"pipeline.*move the file, or choose another"):
        check_card_place(str(tmp_path))
    prepare_output_dir(str(tmp_path), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]
    assert (tmp_path / "README.md").read_text() == text


def test_an_earlier_runs_phases_count_as_its_outputs(tmp_path):
    """Only the phases ``phases.json`` names, and only under the output directory."""
    outside = tmp_path / "outside"
    (outside / "sft").mkdir(parents=True)
    (outside / "sft" / "part-00000-of-00001.parquet").write_bytes(b"not ours")
    out = tmp_path / "out"
    for phase in ("basic", "other"):
        (out / phase / "sft").mkdir(parents=True)
        (out / phase / "sft" / "part-00000-of-00001.parquet").write_bytes(b"old")
        (out / phase / "manifest.json").write_text("{}")
    (out / "basic" / "notes.txt").write_text("keep me")
    listing = [{"name": "basic"}, {"name": "../outside"}]
    (out / "phases.json").write_text(json.dumps({"phases": listing}))
    with pytest.raises(ValueError, match=r"basic/manifest\.json"):
        prepare_output_dir(str(out), overwrite=False)
    prepare_output_dir(str(out), overwrite=True)
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["out/basic/notes.txt", "out/other/manifest.json",
                     "out/other/sft/part-00000-of-00001.parquet",
                     "outside/sft/part-00000-of-00001.parquet"]
    (out / "phases.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a phases listing"):
        prepare_output_dir(str(out), overwrite=True)


def test_a_failed_background_write_fails_the_bundle(tmp_path):
    """Staged files are written on a thread; an error there must still fail the bundle, at the
    latest when it finishes, so the runner retries it instead of committing its outputs."""
    (tmp_path / "staging").write_text("a file where the staging directory should be")
    stage = StagePart(str(tmp_path / "staging"))
    stage.setup()
    stage.start_bundle()
    table = pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))})
    list(stage.process(Part("sft", "c0", "pack", table)))
    with pytest.raises(OSError):
        stage.finish_bundle()
    stage.teardown()


def test_staged_files_the_runner_did_not_report_are_found_in_their_shards_folder(tmp_path):
    staging = str(tmp_path / "staging")
    stage = StagePart(staging)
    stage.setup()
    stage.start_bundle()
    table = pa.table({"input_ids": pa.array([[1], [2], [3]], pa.list_(pa.int32()))})
    [first] = stage.process(Part("sft", "s:000000", "pack", table))
    [second] = stage.process(Part("sft", "s:000001", "pack", table.slice(0, 2)))
    [empty] = stage.process(Part("sft", "s:000002", "pack", table.slice(0, 0)))
    [other] = stage.process(Part("sft", "t:000000", "pack", table))  # another shard
    [bad] = stage.process(Part("rejected", "s:000001", "validate", pa.table({"reason": ["x"]})))
    stage.finish_bundle()
    # Other files under staging (the first pass's token ids) are not output parts.
    write_arrow(f"{staging}/token-cache/c0.arrow", pa.table({"tokens": [[1, 2]]}))
    found = find_staged((("sft", "s"), [first]), staging)
    assert found == ShardFiles("sft", "s", (first, second))  # in order, without empty parts
    assert found.rows == 5 and other not in found.files
    assert find_staged((("sft", "s"), [second, first, empty, first]), staging) == found
    assert find_staged((("rejected", "s"), []), staging).files == (bad,)
    # The order entry stays in staging: output files carry no footer entry of ours.
    out = tmp_path / "out.parquet"
    writer = WriteOutputFile(row_group_rows=8)
    writer.setup()
    writer.start_bundle()
    list(writer.process(OutputFile("sft", str(out), ((second.path, 0, 2),))))
    writer.finish_bundle()
    assert pq.read_schema(out).metadata is None
