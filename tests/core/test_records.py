"""``replaced``: the branches' cheap ``dataclasses.replace`` of a ``Record``."""

import dataclasses

import pytest

from transforms.core.records import Record, replaced
from transforms.core.vocabulary import MALFORMED_JSON, Drop


def test_replaced_gives_what_dataclasses_replace_gives():
    record = Record("a.jsonl", 120, 2, value={"text": "x"}, url="https://example.org/a",
                    pii=(("email", 1),), scores=(("fineweb_edu", 2.5),))
    for changes in ({"value": "x", "format": "text"}, {"language": "en", "language_score": 0.93},
                    {"error": Drop(MALFORMED_JSON, "bad"), "raw": "{"}, {}):
        copy = replaced(record, **changes)
        assert copy == dataclasses.replace(record, **changes)
        assert type(copy) is Record and copy is not record
        assert {f.name: getattr(copy, f.name) for f in dataclasses.fields(Record)} == {
            **{f.name: getattr(record, f.name) for f in dataclasses.fields(Record)}, **changes}
    assert record.format is None  # the original is untouched
    with pytest.raises(TypeError, match="no field"):
        replaced(record, lang="en")
    with pytest.raises(dataclasses.FrozenInstanceError):
        replaced(record, value="y").value = "z"
