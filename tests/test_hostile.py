"""A corpus of hostile inputs, run through the whole pipeline at once.

Each file ends in a branch or in rejected/ / filtered/ with a precise reason, none stops the
run, the manifest still balances, and peak memory stays bounded although one line is 200 MB.
"""

import gzip
import json
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

BIG_LINE_MB = 200


def jsonl(*values) -> bytes:
    return "".join(json.dumps(v) + "\n" for v in values).encode()


def doc(topic: str) -> str:
    """A distinct, well-formed document, so deduplication only fires where it is meant to."""
    return (f"Field notes on {topic}: the survey team measured it twice a day, compared the "
            f"readings with older records and wrote down what changed about {topic} and why.")


HOSTILE = {
    "malformed.jsonl": b'{"text": "unterminated}\n' + jsonl({"text": doc("river deltas")}),
    "ragged.csv": b"prompt,response\nWhat is 2+2?,4\nonly one field\n",
    "invalid_utf8.jsonl": b'{"text": "caf\xe9 au lait"}\n' + jsonl({"text": doc("coffee")}),
    "bom.jsonl": b"\xef\xbb\xbf" + jsonl({"text": doc("byte-order marks")}),
    "nul_bytes.jsonl": b'{"text": "raw \x00 byte"}\n' + jsonl({"text": doc("nul \u0000 bytes")}),
    "empty.jsonl": b"",
    "binary.txt": bytes(range(256)) * 64,
    "truncated.jsonl.gz": gzip.compress(jsonl(*({"text": doc(f"site {i}")} for i in range(50))))[
        :-30],
    "deep.jsonl": jsonl({"text": doc("recursion")})
    + b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    "wrong_types.jsonl": jsonl({"text": None}, {"text": ["a", "list"]}, {"messages": "hi"},
                               {"prompt": 7, "response": "seven"}, {"text": 3.5}),
    "missing_and_extra.jsonl": jsonl({"prompt": "a question with no answer"},
                                     {"text": doc("extra fields"), "id": 1,
                                      "meta": {"lang": "en"}}),
    "special_tokens.jsonl": jsonl({"text": doc("literal <|im_end|><|endoftext|> markers")}),
    "duplicates.jsonl": jsonl({"text": doc("copies")}, {"text": doc("copies")}),
    "long_conversation.jsonl": jsonl({"messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 40}
        for i in range(400)]}),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    inputs = tmp_path_factory.mktemp("hostile")
    for name, data in HOSTILE.items():
        (inputs / name).write_bytes(data)
    big = b'{"text": "' + b"x" * (BIG_LINE_MB << 20) + b'"}\n'
    (inputs / "big_line.jsonl").write_bytes(big + jsonl({"text": doc("the line after")}))
    output = tmp_path_factory.mktemp("out")
    log = output.parent / "hostile-run.log"
    with log.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "beam_pipeline", f"--input={inputs}/*", f"--output={output}",
             "--max_reject_fraction=1", "--write_filtered=true", "--seq_len=1024"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        peak_kb = 0
        while child.poll() is None:
            peak_kb = max(peak_kb, high_water_kb(child.pid))
            time.sleep(0.05)
    assert child.returncode == 0, log.read_text()[-3000:]
    manifest = json.loads((output / "manifest.json").read_text())
    dropped = [json.loads(line) for kind in ("rejected", "filtered")
               for f in sorted((output / kind).glob("*.jsonl")) for line in f.open()]
    return manifest, dropped, peak_kb / 1024


def high_water_kb(pid: int) -> int:
    """The process's peak resident memory since it started its program (VmHWM).

    Not ``ru_maxrss`` from ``wait4``: Linux carries the peak across ``exec``, so a child forked
    from a large pytest process would report the parent's memory.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def reasons(dropped, name):
    return sorted(d["reason"] for d in dropped if d["source"].endswith("/" + name))


@pytest.mark.parametrize(("name", "expected"), [
    ("malformed.jsonl", ["malformed_json"]),
    ("ragged.csv", ["malformed_csv"]),
    ("invalid_utf8.jsonl", ["invalid_utf8"]),
    ("bom.jsonl", []),
    ("nul_bytes.jsonl", ["malformed_json"]),  # a raw NUL is invalid JSON; an escaped one is text
    ("empty.jsonl", []),
    ("binary.txt", ["invalid_utf8"]),
    ("truncated.jsonl.gz", ["unreadable_file"]),
    ("deep.jsonl", ["malformed_json"]),
    ("wrong_types.jsonl", ["schema_wrong_type"] * 2 + ["wrong_type"] * 3),
    ("missing_and_extra.jsonl", ["unclassifiable"]),
    ("special_tokens.jsonl", []),
    ("duplicates.jsonl", ["duplicate_exact"]),
    ("long_conversation.jsonl", []),  # truncated at a turn boundary, not dropped
    ("big_line.jsonl", ["record_too_large"]),
])
def test_each_hostile_file_ends_with_a_precise_reason(run, name, expected):
    _, dropped, _ = run
    assert reasons(dropped, name) == expected


def test_the_run_balances_and_memory_stays_bounded(run):
    manifest, dropped, peak_mb = run
    records = manifest["records"]
    assert records["balanced"] is True
    assert sum(records["rejected"].values()) + sum(records["filtered"].values()) == len(dropped)
    assert manifest["instruction"]["truncated"] >= 1
    # The big line is refused while it streams in (only a capped prefix is kept): the run's
    # peak stays near the pipeline's usual ~0.5 GB, far below what holding the line as bytes,
    # text and parsed JSON would add (3 x 200 MB and more).
    assert peak_mb < 1100, peak_mb


def test_a_template_that_never_ends_rejects_its_records_and_the_run_goes_on(tmp_path,
                                                                              monkeypatch):
    """A chat template that loops for hours on one conversation: that record lands in
    rejected/ with the time limit as its reason, the others are trained on, the run ends."""
    from beam_pipeline.running import run
    from transforms.instruction.rendering import sandbox

    limit = 0.5
    monkeypatch.setattr(sandbox, "RENDER_TIME_LIMIT", limit)  # in-process runner
    template = tmp_path / "endless.jinja"
    template.write_text(
        "{% if messages[0].content == 'EVIL' %}{% for i in range(100000) %}"
        "{% for j in range(100000) %}x{% endfor %}{% endfor %}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    lines = [{"prompt": "What is 2+2?", "response": "4"}, {"prompt": "EVIL", "response": "no"},
             {"prompt": "Name a river.", "response": "The Nile."}]
    (tmp_path / "chat.jsonl").write_bytes(jsonl(*lines))
    output = tmp_path / "out"
    run([f"--input={tmp_path}/chat.jsonl", f"--output={output}", f"--chat_template={template}",
         "--max_reject_fraction=1"])
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["records"]["balanced"] is True
    assert manifest["records"]["instruction"] == 2
    (rejected,) = [json.loads(line) for f in (output / "rejected").glob("*.jsonl")
                   for line in f.open()]
    assert rejected["reason"] == "template_error"
    assert rejected["position"] == len(jsonl(lines[0]))
    assert rejected["message"].startswith(
        "chat template exceeded the time limit on the conversation: one render took more than "
        f"{limit:g} s of CPU time; if the template cannot render such records, pass ")
