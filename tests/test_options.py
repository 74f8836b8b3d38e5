"""The command line: --help documents every option, and bad input fails before any work."""

import importlib.util
import subprocess
import sys

import pytest

from beam_pipeline import beam_internals
from beam_pipeline.cli import main
from beam_pipeline.options import argument_parser
from beam_pipeline.planning import prepare
from tests.conftest import EXAMPLES, ROOT
from transforms.core.vocabulary import (
    INSTRUCTION,
)
from transforms.instruction.options import InstructionOptions

# The command line's contract (the README's *Options*) and a few of each group's; every option of
# our groups is checked for help text below, whatever else the groups grow.
CORE_OPTIONS = {"--input", "--output", "--tokenizer", "--block_size", "--seq_len",
                "--chat_template", "--num_shards", "--overwrite", "--max_reject_fraction",
                "--remainder", "--dedup", "--write_filtered", "--assistant_turns",
                "--train_end_of_turn"}


def test_help_documents_every_option_ours_first_then_beams():
    result = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    text = result.stdout
    assert text.index("--seq_len") < text.index("--runner") < text.index("--direct_num_workers")
    parser = argument_parser()
    titles = ("data preparation", "knowledge branch", "instruction branch")
    groups = beam_internals.group_actions(parser)
    own = [action for title in titles for action in groups[title]]
    names = {a.option_strings[0] for a in own}
    assert names >= CORE_OPTIONS
    for action in own:
        assert action.help, action.option_strings[0]
        assert action.option_strings[0] in text


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--block_size=0", "--block_size: expected an integer >= 1, got 0"),
        ("--seq_len=abc", "--seq_len: expected an integer, got 'abc'"),
        ("--blocksize=5", "unknown option(s): --blocksize (did you mean --block_size?)"),
        ("--block-size=5", "unknown option(s): --block-size (did you mean --block_size?)"),
        ("--zzz", "unknown option(s): --zzz\n"),
        ("--remainder=keep", "invalid choice: 'keep'"),
        ("--train_end_of_turn=maybe", "expected true or false, got 'maybe'"),
    ],
)
def test_bad_values_stop_before_any_work(argument, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"--input={EXAMPLES}/c4_sample.jsonl", f"--output={tmp_path}/o", argument])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "--input is required"),
        (["--input=nope/*.jsonl"], "matches no files"),
        ([f"--input={EXAMPLES}/c4_sample.jsonl#branch=bogus"], "branch='bogus'"),
        ([f"--input={EXAMPLES}/c4_sample.jsonl", "--tokenizer=/no/such/dir"], "/no/such/dir"),
    ],
)
def test_invalid_inputs_fail_with_a_message(arguments, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*arguments, f"--output={tmp_path}/o"])
    assert message in capsys.readouterr().err


def test_inputs_repeat_or_come_comma_separated_with_declarations(tmp_path):
    plan = prepare(
        [
            f"--input={EXAMPLES}/c4_sample.jsonl,{EXAMPLES}/gsm8k_sample.jsonl"
            "#branch=instruction;prompt=question;response=answer",
            f"--input={EXAMPLES}/alpaca_seed_tasks.json",
            f"--output={tmp_path}/o",
            "--train_end_of_turn=false",
            "--seq_len=4096",
        ]
    )
    specs = plan.config.inputs
    assert [s.pattern.rsplit("/", 1)[1] for s in specs] == [
        "c4_sample.jsonl",
        "gsm8k_sample.jsonl",
        "alpaca_seed_tasks.json",
    ]
    assert specs[1].branch == INSTRUCTION
    assert specs[1].field_map == {"prompt": "question", "response": "answer"}
    assert plan.config.instruction.train_end_of_turn is False
    assert plan.config.instruction.seq_len == 4096
    assert plan.options.view_as(InstructionOptions).seq_len == 4096
    assert plan.config.tokenizer in (None, "qwen2-offline")  # the job loads it (light launcher)
    assert len(plan.shards) == 3


def test_a_run_whose_input_is_mostly_rejected_fails_without_a_manifest(tmp_path, capsys):
    # GSM8K without its declared mapping is unclassifiable: a configuration mistake.
    arguments = [f"--input={EXAMPLES}/gsm8k_sample.jsonl", f"--input={EXAMPLES}/c4_sample.jsonl",
                 f"--output={tmp_path}/o"]
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == 1
    assert ("200 of 200 records of --input " in capsys.readouterr().err)
    assert not (tmp_path / "o" / "manifest.json").exists()
    main([*arguments[:-1], f"--output={tmp_path}/p", "--max_reject_fraction=1"])
    assert (tmp_path / "p" / "manifest.json").exists()


def test_the_options_reference_is_generated_from_the_parser():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_options_doc.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (ROOT / "docs" / "options.md").read_text() == generator.options_reference()
