"""A mapping onto the wrong column gets a warning that names the input, in the manifest, the
summary and the report; ``--strict`` turns it into a failed run without a manifest."""

from __future__ import annotations

import json

import pytest

from beam_pipeline.cli import main
from tests.conftest import EXAMPLES

CHATS = EXAMPLES / "ko_chatbot_sample.csv"  # Q, A and a 0/1/2 sentiment label per row
RIGHT = f"{CHATS}#branch=instruction;prompt=Q;response=A"
WRONG = f"{CHATS}#branch=instruction;prompt=Q;response=label;name=labels"


@pytest.fixture(scope="module")
def warned(tmp_path_factory):
    output = tmp_path_factory.mktemp("warned") / "out"
    main([f"--input={RIGHT}", f"--input={WRONG}", f"--output={output}", "--quiet"])
    return output, json.loads((output / "manifest.json").read_text())


def test_the_label_mapped_as_the_response_is_named_and_the_right_mapping_is_not(warned):
    _, manifest = warned
    right, wrong = manifest["inputs"]
    assert right["tokenized"]["instruction"]["short_replies"] < right["read"] / 2
    rows = len(CHATS.read_text(encoding="utf-8").splitlines()) - 1
    assert wrong["tokenized"]["instruction"]["records"] == rows
    assert wrong["tokenized"]["instruction"]["short_replies"] == rows  # "0" + end of turn
    assert len(manifest["warnings"]) == 1
    [warning] = manifest["warnings"]
    assert warning.startswith(f"--input {CHATS} (labels): {rows} of {rows} examples (100%) "
                              "train on a reply of at most 2 tokens")


def test_the_warning_is_in_the_report(warned):
    output, _ = warned
    page = (output / "report.html").read_text()
    assert f"warning: --input {CHATS} (labels): 300 of 300 examples" in page


def test_strict_fails_the_run_without_a_manifest(tmp_path, capsys):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as failed:
        main([f"--input={WRONG}", f"--output={output}", "--quiet", "--strict=true"])
    assert failed.value.code == 1
    err = capsys.readouterr().err
    assert f"--strict: --input {CHATS} (labels): 300 of 300" in err and "no manifest.json" in err
    assert "--overwrite=true" in err  # the rerun advice of a stopped run
    assert not (output / "manifest.json").exists()
