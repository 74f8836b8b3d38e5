"""What a user sees when a run cannot go on: one message naming the option or input to change,
the exit code, no traceback unless --verbose, and a rerun that the failed run does not block."""

import contextlib
import gzip
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline import running
from beam_pipeline.cli import main
from beam_pipeline.planning import prepare
from tests.conftest import EXAMPLES
from transforms.core import tokenizer
from transforms.io import planning

BROKEN = f"{EXAMPLES}/broken_lines.jsonl"
C4 = f"{EXAMPLES}/c4_sample.jsonl"


@pytest.fixture(autouse=True)
def beam_log_level():
    """main() quiets Beam's loggers for the process; later tests get them back."""
    logger = logging.getLogger("apache_beam")
    level = logger.level
    yield
    logger.setLevel(level)


def fail(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def stopped_then_rerun(tmp_path_factory):
    """A run stopped by --max_reject_fraction (its inputs include an empty file; worker
    processes, whose failing step prints a traceback), then the rerun its message prints, with
    the fraction raised and in one process."""
    root = tmp_path_factory.mktemp("stopped")
    empty = root / "empty.jsonl"
    empty.write_bytes(b"")
    output = root / "out"
    argv = [f"--input={BROKEN}", f"--input={empty}", f"--output={output}",
            "--max_reject_fraction=0.01", "--quiet", "--direct_running_mode=multi_processing",
            "--direct_num_workers=2"]
    first = _main_outcome(argv)
    command = first[2].splitlines()[-1].split(": ", 1)[1]
    rerun = shlex.split(command)
    assert rerun[:3] == [sys.executable, "-m", "beam_pipeline"]  # the interpreter that ran
    changes = {"--max_reject_fraction=0.01": "--max_reject_fraction=0.5",
               "--direct_running_mode=multi_processing": "--direct_running_mode=in_memory"}
    rerun = [changes.get(arg, arg) for arg in rerun[3:]]
    second = _main_outcome(rerun)
    return {"argv": argv, "empty": empty, "output": output, "first": first, "second": second,
            "command": command}


@contextlib.contextmanager
def captured_fds() -> Iterator[dict[str, str]]:
    """Everything written to stdout and stderr by this process (Python or not) and by the
    processes it starts, such as multi_processing workers: capsys sees only Python's writes."""
    texts: dict[str, str] = {}
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        files = {"out": out_file, "err": err_file}
        saved = [os.dup(1), os.dup(2)]
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.dup2(out_file.fileno(), 1)
            os.dup2(err_file.fileno(), 2)
            with open(1, "w", closefd=False) as out, open(2, "w", closefd=False) as err, \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield texts
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            for name, file in files.items():
                file.seek(0)
                texts[name] = file.read().decode()


def _main_outcome(argv: list[str]) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, Beam's log records) of main(argv)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    code = 0
    try:
        with captured_fds() as texts:
            try:
                main(argv)
            except SystemExit as exit_info:
                code = exit_info.code
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger("apache_beam").setLevel(logging.NOTSET)
    beam = [r.getMessage() for r in records if r.name.startswith("apache_beam")]
    return code, texts["out"], texts["err"], beam


def test_a_stopped_run_says_so_once_with_the_rerun_command(stopped_then_rerun):
    code, _, err, beam_logs = stopped_then_rerun["first"]
    argv = stopped_then_rerun["argv"]
    assert code == 1
    assert err == (
        f"error: 5 of 13 records of --input {BROKEN} were rejected (38% > "
        "--max_reject_fraction=0.01); top reasons: malformed_json 2, not_an_object 1, "
        "unclassifiable 1. The run is not marked complete (no manifest.json); see rejected/ for "
        "the records.\n"
        "the directory holds this run's partial outputs; once the inputs or the option are "
        "changed, run again with --overwrite=true: "
        f"{shlex.join([sys.executable, '-m', 'beam_pipeline', *argv, '--overwrite=true'])}\n")
    assert beam_logs == []  # Beam's ERROR line with its traceback is not shown


def test_the_suggested_rerun_replaces_the_stopped_runs_files(stopped_then_rerun):
    code, out, err, _ = stopped_then_rerun["second"]
    assert (code, err) == (0, "")
    output = stopped_then_rerun["output"]
    assert (output / "manifest.json").exists()
    assert not (output / ".staging").exists()
    assert out.startswith("records read 13: ")


def test_an_empty_input_gets_a_warning_in_the_summary(stopped_then_rerun):
    _, out, _, _ = stopped_then_rerun["second"]
    empty = stopped_then_rerun["empty"]
    lines = out.splitlines()
    assert lines.count(f"warning: --input {empty} read 0 records (its files are empty)") == 1
    assert not [line for line in lines if line.startswith("warning:") and BROKEN in line]


def test_a_declared_field_missing_from_the_first_records_fails_at_planning(tmp_path, capsys):
    code, err = fail([f"--input={C4}#text=sentence1", f"--output={tmp_path}/o"], capsys)
    assert code == 2
    assert err == (f"error: --input {C4!r}: declared field(s) text=sentence1 not found in the "
                   f"first 20 record(s) of {C4}, whose fields are text; change the "
                   "mapping after '#'\n")
    assert not (tmp_path / "o").exists()


def test_a_directory_input_reads_its_files_of_known_formats(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "more").mkdir(parents=True)
    shutil.copy(C4, folder / "a.jsonl")
    shutil.copy(f"{EXAMPLES}/tinyshakespeare_excerpt.txt", folder / "more" / "b.txt")
    (folder / "notes.bin").write_bytes(b"\x00\x01")
    plan = prepare([f"--input={folder}", f"--output={tmp_path}/o"])
    assert [(s.path, s.format) for s in plan.shards] == [
        (str(folder / "a.jsonl"), "jsonl"), (str(folder / "more" / "b.txt"), "text")]


def test_a_directory_without_known_files_suggests_a_glob(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "part-0.data").write_text('{"text": "x"}\n')
    code, err = fail([f"--input={folder}", f"--output={tmp_path}/o"], capsys)
    assert code == 2
    assert err == (f"error: --input {str(folder)!r} is a directory with no data file of a "
                   "known format (.csv, .json, .jsonl, .md, .ndjson, .parquet, .text, .tsv, "
                   ".txt, optionally compressed); skipped: unknown_extension 1; pass a glob "
                   f"with the format, e.g. --input '{folder}/*.data#format=jsonl'\n")


def test_an_unreachable_hub_tokenizer_fails_at_once_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    code, err = fail([f"--input={C4}", f"--output={tmp_path}/o",
                      "--tokenizer=example-org/no-such-tokenizer"], capsys)
    assert code == 2
    assert err == ("error: --tokenizer 'example-org/no-such-tokenizer': not in the local Hugging "
                   "Face cache and the hub (http://127.0.0.1:9) cannot be reached ([Errno 111] "
                   "Connection refused); pass a local or gs:// tokenizer directory, or leave "
                   "--tokenizer out for the offline default qwen2-offline\n")


def test_earlier_outputs_are_refused_with_the_option_to_pass(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "manifest.json").write_text("{}")
    code, err = fail([f"--input={C4}", f"--output={tmp_path}/o"], capsys)
    assert code == 2
    assert err == (f"error: {tmp_path}/o already holds outputs ({tmp_path}/o/manifest.json); "
                   "pass --overwrite=true to replace them\n")


def test_an_unexpected_failure_is_one_line_unless_verbose(tmp_path, capsys, monkeypatch):
    def broken(plan):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(running, "build_pipeline", broken)
    argv = [f"--input={C4}", f"--output={tmp_path}/o", "--quiet"]
    code, err = fail(argv, capsys)
    assert (code, err) == (1, "error: RuntimeError: disk on fire\n"
                              "run again with --verbose for the traceback\n")
    code, err = fail([*argv, "--verbose"], capsys)
    assert code == 1
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("RuntimeError: disk on fire\nerror: RuntimeError: disk on fire\n"
                        "run again with --verbose for the traceback\n")


def test_a_large_compressed_input_gets_the_advice_at_planning(tmp_path, monkeypatch, caplog):
    big = tmp_path / "crawl.jsonl.gz"
    big.write_bytes(gzip.compress(b'{"text": "a document"}\n' * 1000))
    monkeypatch.setattr(planning, "LARGE_COMPRESSED_BYTES", 100)
    with caplog.at_level(logging.WARNING, logger="beam_pipeline"):
        prepare([f"--input={big}", f"--output={tmp_path}/o"])
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"1 compressed input file(s) over 0 GiB (largest {big}, ")
    assert "Recompress into pieces of about 1 GB" in warning
    assert warning.endswith("see docs/inputs-at-scale.md")


def test_another_model_familys_chat_template_fails_at_planning(tmp_path, capsys):
    """Llama 3's markup with the default (Qwen2) tokenizer would be trained as plain text."""
    code, err = fail([f"--input={C4}", f"--output={tmp_path}/o", "--chat_template=llama3"],
                     capsys)
    assert code == 2
    assert err == ("error: --chat_template 'llama3' writes <|start_header_id|>, <|end_header_id|>, "
                   "<|eot_id|>, which the tokenizer 'qwen2-offline' does not hold as tokens "
                   "(another model family's template): they would be trained as plain text; pass "
                   "the --tokenizer of the template's model, or a template written for this "
                   "tokenizer (or --template_markup_as_text=true if it spells its markup as text "
                   "by design)\n")
    assert not (tmp_path / "o").exists()


ZEPHYR_STYLE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_a_template_that_spells_its_markup_as_text_runs_when_asked(tmp_path):
    """Zephyr-style markup is text by design: with --template_markup_as_text the run goes on,
    the markup is in the tokens as text and only the replies (and their end token) train."""
    template = tmp_path / "zephyr.jinja"
    template.write_text(ZEPHYR_STYLE)
    out = tmp_path / "o"
    records = json.loads((EXAMPLES / "messages_sample.json").read_text())
    main([f"--input={EXAMPLES}/messages_sample.json", f"--output={out}", "--quiet",
          f"--chat_template={template}", "--template_markup_as_text=true",
          "--seq_len=8192"])  # nothing truncated: every reply is whole
    tok = tokenizer.load_tokenizer(None, str(template))
    replies = []
    for path in sorted((out / "sft").glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
            assert "<|user|>\n" in tok.decode(ids)  # several tokens, as the template means
            trained = labels != -100
            edges = np.flatnonzero(np.diff(np.concatenate([[0], trained.astype(int), [0]])))
            replies += [tok.decode(ids[start:end]) for start, end in zip(edges[::2], edges[1::2],
                                                                          strict=True)]
    expected = [m["content"] + tok.eos_token for r in records for m in r["messages"]
                if m["role"] == "assistant"]
    assert sorted(replies) == sorted(expected)


def test_a_users_readme_stops_a_run_only_where_its_card_would_go(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "README.md").write_text("# My notes\n")
    prepare([f"--input={C4}#phase=one", f"--output={out}"])  # phases' cards go in o/one/
    code, err = fail([f"--input={C4}", f"--output={out}", "--overwrite=true"], capsys)
    assert code == 2
    assert err == (f"error: {out}/README.md is not a dataset card of this pipeline, and a run "
                   "writes its card there; move the file, or choose another --output\n")
    assert (out / "README.md").read_text() == "# My notes\n"


def test_clusters_that_need_more_rounds_name_the_option(tmp_path, capsys):
    """Two exact copies are one edge: its label changes in round 1, so a single round cannot
    confirm it and the run stops instead of deciding on labels that may not be final."""
    doc = {"text": "The quick brown fox jumps over the lazy dog while the farmer watches from "
                   "the old wooden fence near the river bank every single morning."}
    (tmp_path / "copies.jsonl").write_text(f"{json.dumps(doc)}\n" * 2)
    code, err = fail([f"--input={tmp_path}/copies.jsonl", f"--output={tmp_path}/o",
                      "--dedup_rounds=1", "--quiet"], capsys)
    assert code == 1
    assert err.endswith(
        "error: RuntimeError: deduplication's clusters did not converge in 1 rounds of label "
        "propagation (a chain of near copies longer than that); rerun with --dedup_rounds above "
        "1\nrun again with --verbose for the traceback\n")
    assert not (tmp_path / "o" / "manifest.json").exists()
