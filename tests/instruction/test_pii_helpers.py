"""The instruction branch searches large chunks for personal data in helper processes: the same
messages and counts as in the calling process, and the same run outputs. Runs on the bundled
examples, without the shared datasets."""

import json
import os

import pyarrow.parquet as pq

from beam_pipeline.running import run
from tests.conftest import EXAMPLES
from tests.curation.test_pii import LOOK_ALIKES, PLANTED
from tests.support.helper_processes import heavy_modules_loaded_by, send_every_batch_to_helpers
from transforms.core import helpers
from transforms.curation.pii import MessageRedactor, PiiConfig

MESSAGES = EXAMPLES / "messages_sample.json"


def _conversations() -> list[list[dict]]:
    """The bundled chats, and one chat per planted kind of personal data (in the user's turn,
    the reply and a tool call's arguments), with look-alikes that must stay."""
    chats = [record["messages"] for record in json.loads(MESSAGES.read_text())]
    for kind, planted in PLANTED:
        chats.append([
            {"role": "user", "content": f"My {kind} is {planted}. {LOOK_ALIKES}"},
            {"role": "assistant", "content": f"Noted: {planted}.", "tool_calls": [
                {"type": "function", "function": {"name": "save",
                                                  "arguments": {"value": planted}}}]}])
    return chats


def test_helpers_redact_conversations_as_the_calling_process_does(monkeypatch):
    chats = _conversations()
    for config in (PiiConfig(), PiiConfig(mode="tag")):
        redactor = MessageRedactor(config)
        here = redactor(chats)
        assert sum(result is not None for result in here) == len(PLANTED)
        monkeypatch.setattr(helpers, "MIN_CHARS", 1_000)
        helpers.close_helpers()
        assert helpers.start_split(redactor, chats, 10_000)() == here
        assert os.getpid() in helpers._POOLS  # the batch went to the helpers


def test_a_helper_redacting_loads_no_beam():
    assert heavy_modules_loaded_by("transforms.curation.pii") == []


def _run(output, chats):
    run([f"--input={chats}#branch=instruction", f"--input={MESSAGES}", f"--output={output}",
         "--seq_len=1024", "--write_examples=true", "--direct_running_mode=in_memory"])
    manifest = json.loads((output / "manifest.json").read_text())
    return (pq.read_table(output / "sft"), pq.read_table(output / "sft_examples"),
            {key: manifest[key] for key in ("records", "instruction", "personal_data")})


def test_a_run_that_redacts_in_helpers_writes_the_same_rows(tmp_path, monkeypatch):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in
                             _conversations()))
    monkeypatch.setattr(helpers, "_pool", lambda: None)
    here = _run(tmp_path / "here", chats)
    found = here[2]["personal_data"]["instruction"]
    assert found["records"] == len(PLANTED) and all(found["by_kind"].values())
    monkeypatch.undo()
    batches = send_every_batch_to_helpers(monkeypatch, MessageRedactor)
    in_helpers = _run(tmp_path / "helpers", chats)
    assert os.getpid() in helpers._POOLS and batches and max(batches) > 1  # went to helpers
    assert in_helpers[0].equals(here[0]) and in_helpers[1].equals(here[1])
    assert in_helpers[2] == here[2]
