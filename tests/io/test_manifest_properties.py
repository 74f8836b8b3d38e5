"""Property test of the manifest: it adds up over random runs of the whole pipeline.

Random input files (valid documents and instruction records in four formats, broken lines, wrong
types, blank lines, copies) run through the pipeline under random options, and every record read
is found in a branch, in filtered/ or in rejected/, counted once, per input and by reason.
"""

import collections
import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_pipeline.running import run

WORDS = [
    "river", "delta", "survey", "water", "measured", "twice", "every", "morning", "compared",
    "readings", "older", "records", "changed", "because", "glacier", "moves", "slowly", "under",
    "weight", "thick", "surface", "faster", "ancient", "forest", "canopy", "sunlight", "reaches",
    "ground", "floor", "ferns", "mosses", "grow", "where", "shade", "keeps", "moisture", "high",
    "farmers", "planted", "wheat", "barley", "spring", "harvested", "autumn", "stored", "grain",
    "dry", "barns", "winter", "market", "town", "traders", "arrived", "boats", "carrying", "salt",
    "cloth", "pottery", "copper", "tools", "exchange", "library", "maps", "letters",
    "diaries", "written", "sailors", "explorers", "centuries", "travel",
]
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(
    lambda words: " ".join(words).capitalize() + ".")
documents = st.lists(sentences, min_size=1, max_size=4).map(" ".join)
replies = st.lists(st.sampled_from(WORDS), min_size=1, max_size=120).map(" ".join)
ROLES_OF = {"messages": ("role", "content", "user", "assistant"),
            "conversations": ("from", "value", "human", "gpt")}


@st.composite
def instruction_records(draw) -> dict:
    """A valid record in one of the formats the classifier detects."""
    fmt = draw(st.sampled_from(["alpaca", "prompt", "messages", "conversations"]))
    if fmt == "alpaca":
        return {"instruction": draw(sentences), "input": draw(st.sampled_from(["", "some input"])),
                "output": draw(replies)}
    if fmt == "prompt":
        return {"prompt": draw(sentences), "response": draw(replies)}
    role, content, asker, answerer = ROLES_OF[fmt]
    turns = []
    for _ in range(draw(st.integers(1, 3))):
        turns += [{role: asker, content: draw(sentences)}, {role: answerer, content: draw(replies)}]
    return {fmt: turns}


# (line, the reason it must be rejected with), one line each; JSON that parses is dumped.
BAD_LINES = [
    (b'{"text": "unterminated', "malformed_json"),
    (b"not json at all", "malformed_json"),
    (b'{"messages": [', "malformed_json"),
    (b'{"text": "caf\xe9 au lait, in Latin-1"}', "invalid_utf8"),
    (b"[1, 2, 3]", "not_an_object"),
    (b"42", "not_an_object"),
    (b"null", "not_an_object"),
    (b'{"text": 5}', "wrong_type"),
    (b'{"text": null}', "wrong_type"),
    (b'{"text": ["a", "list"]}', "wrong_type"),
    (b'{"title": "no field the classifier knows"}', "unclassifiable"),
]
BLANK_LINES = [b"", b"   ", b"\t"]


@st.composite
def input_files(draw) -> list[list[tuple[bytes, str | None]]]:
    """1 to 3 JSONL files of (line, expected fate): "kept or filtered" for valid records, a
    rejection reason for broken ones, "blank" for lines that are no record; some lines repeat."""
    files = []
    for _ in range(draw(st.integers(1, 3))):
        valid_document = documents.map(lambda text: (json.dumps({"text": text}).encode(), "valid"))
        valid_instruction = instruction_records().map(
            lambda value: (json.dumps(value).encode(), "valid"))
        lines = draw(st.lists(st.one_of(
            valid_document, valid_document, valid_instruction, valid_instruction,
            st.sampled_from(BAD_LINES),
            st.sampled_from(BLANK_LINES).map(lambda line: (line, "blank")),
        ), max_size=30))
        for _ in range(draw(st.integers(0, 4))):  # exact copies of earlier lines
            if lines:
                lines.append(lines[draw(st.integers(0, len(lines) - 1))])
        files.append(draw(st.permutations(lines)))
    return files


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(files=input_files(),
       options=st.fixed_dictionaries({
           "chunk_records": st.sampled_from([2, 5, 1000]),
           "seq_len": st.sampled_from([48, 256]),
           "overflow": st.sampled_from(["truncate", "drop"]),
           "block_size": st.sampled_from([16, 128]),
           "dedup": st.sampled_from(["near", "exact", "none"]),
       }))
def test_the_manifest_accounts_for_every_record_of_random_inputs(files, options):
    """Random runs of the real pipeline: records read = written to a branch + filtered +
    rejected, overall and per input, by reason; rejected/ and filtered/ hold exactly the counted
    records, each at the byte offset of its line, with the reason its line calls for; the
    Parquet rows are the manifest's blocks and packs and hold its instruction examples."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        offsets = []  # per input: {byte offset of a record's line: its expected fate}
        for k, lines in enumerate(files):
            data, fates, position = b"", {}, 0
            for line, fate in lines:
                if fate != "blank":
                    fates[position] = fate
                data += line + b"\n"
                position += len(line) + 1
            (root / f"input{k}.jsonl").write_bytes(data)
            offsets.append(fates)
        output = root / "out"
        run([*(f"--input={root}/input{k}.jsonl" for k in range(len(files))), f"--output={output}",
             "--max_reject_fraction=1", "--write_filtered=true",
             *(f"--{name}={value}" for name, value in options.items())])
        manifest = json.loads((output / "manifest.json").read_text())
        dropped = [json.loads(line) for kind in ("rejected", "filtered")
                   for f in sorted((output / kind).glob("*.jsonl"))
                   for line in f.read_text().splitlines()]
        kinds = [kind for kind in ("rejected", "filtered")
                 for f in sorted((output / kind).glob("*.jsonl"))
                 for _ in f.read_text().splitlines()]
        tables = {kind: [pq.read_table(f) for f in sorted((output / kind).glob("*.parquet"))]
                  for kind in ("pretrain", "sft")}

    records = manifest["records"]
    assert records["read"] == sum(len(fates) for fates in offsets)  # blank lines are no records
    assert records["read"] == (records["knowledge"] + records["instruction"]
                               + sum(records["filtered"].values())
                               + sum(records["rejected"].values()))
    assert records["balanced"] is True

    # Per input, and by reason: the manifest's counts are exactly the records in the files.
    found: dict = {}
    for entry, kind in zip(dropped, kinds, strict=True):
        index = int(Path(entry["source"]).stem.removeprefix("input"))
        found.setdefault((index, kind), collections.Counter())[entry["reason"]] += 1
    kept = 0
    for index, (entry, fates) in enumerate(zip(manifest["inputs"], offsets, strict=True)):
        assert entry["read"] == len(fates)
        for kind in ("rejected", "filtered"):
            assert entry[kind] == dict(found.get((index, kind), {})), (index, kind)
        kept += entry["read"] - sum(entry["rejected"].values()) - sum(entry["filtered"].values())
    assert kept == records["knowledge"] + records["instruction"]
    for kind in ("rejected", "filtered"):
        total = collections.Counter()
        for (_, kind_), reasons in found.items():
            if kind_ == kind:
                total += reasons
        assert records[kind] == dict(total)

    # Each dropped record is one line, dropped once, for the reason its line calls for.
    places = [(entry["source"], entry["position"]) for entry in dropped]
    assert len(places) == len(set(places))
    for entry, kind in zip(dropped, kinds, strict=True):
        fate = offsets[int(Path(entry["source"]).stem.removeprefix("input"))][entry["position"]]
        assert fate == (entry["reason"] if kind == "rejected" else "valid"), entry
    for index, fates in enumerate(offsets):
        for position, fate in fates.items():
            if fate != "valid":  # every broken line is in rejected/, at its offset
                assert (f"{root}/input{index}.jsonl", position) in places, (index, position, fate)

    # The Parquet files hold what the manifest counts.
    pretrain_rows = sum(t.num_rows for t in tables["pretrain"])
    assert pretrain_rows == manifest["knowledge"]["blocks"]
    assert pretrain_rows * options["block_size"] == manifest["knowledge"]["tokens_out"]
    assert sum(t.num_rows for t in tables["sft"]) == manifest["instruction"]["packs"]
    segments = sum(len(lengths) for t in tables["sft"]
                   for lengths in t.column("seq_lengths").to_pylist())
    assert segments == manifest["instruction"]["examples"] == records["instruction"]
    tokens = sum(sum(lengths) for t in tables["sft"]
                 for lengths in t.column("seq_lengths").to_pylist())
    assert tokens == manifest["instruction"]["tokens"]
