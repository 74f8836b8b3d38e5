"""Personal data and secrets (``transforms/curation/pii.py``): planted data is found and replaced
by its placeholder in both branches, and look-alikes (versions, private and documentation
addresses, ISBNs, dates, order numbers, example domains) are left exactly as they were."""

import json

import pytest

from tests.conftest import EXAMPLES
from tests.support.steps import run_bundle
from transforms.core.records import Record, RecordChunk
from transforms.curation.pii import (
    CARD_NUMBER,
    EMAIL,
    IP_ADDRESS,
    KINDS,
    PHONE,
    PLACEHOLDERS,
    SECRET,
    PiiConfig,
    find_spans,
    luhn_valid,
    parse_kinds,
    redact,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.branch import ConversationChunk, RedactConversations
from transforms.io.manifest import build_manifest, summary_lines
from transforms.knowledge.documents import RedactPersonalData

# (kind, planted text): each is one span of its kind, whole.
PLANTED = [
    (EMAIL, "jane.doe@gmail.com"), (EMAIL, "j_smith+news@mail.co.uk"),
    (IP_ADDRESS, "8.8.4.4"), (IP_ADDRESS, "151.101.1.69"), (IP_ADDRESS, "2606:4700:4700::1111"),
    (PHONE, "(415) 555-2671"), (PHONE, "415-555-2671"), (PHONE, "+44 20 7946 0958"),
    (PHONE, "+1 415 555 2671"), (PHONE, "010-1234-5678"), (PHONE, "+82 10-1234-5678"),
    (CARD_NUMBER, "4111 1111 1111 1111"), (CARD_NUMBER, "3782 822463 10005"),
    (CARD_NUMBER, "5555555555554444"),
    (SECRET, "AKIAIOSFODNN7EXAMPLE"), (SECRET, "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij"),
    (SECRET, "sk-proj-abc123def456ghi789jkl012mno345pqr"),
    (SECRET, "AIzaSyA1234567890abcdefghijklmnopqrstuv"),
    (SECRET, "xoxb-123456789012-abcdefghij"), (SECRET, "glpat-abcdefghij1234567890"),
    (SECRET, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n"),
    (SECRET, "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1234\nabcdEFGH==\n"
             "-----END RSA PRIVATE KEY-----"),
]

# Text that looks like personal data and is not: none of it may change.
LOOK_ALIKES = """\
Python 3.11.7, version 1.2.3.4, v10.0.19041.1 and release 2.4.1.0 were built on 2021-03-15
(15/03/2021) at 12:30:45; the range 1999-2021 and the ratio 16:9 are not numbers to hide.
Private hosts 10.0.0.1, 192.168.1.20, 172.16.5.4, loopback 127.0.0.1 and ::1, link-local
fe80::1 and 169.254.1.1, documentation 192.0.2.1, 198.51.100.7, 203.0.113.9 and 2001:db8::1.
ISBN 978-0-306-40615-7, ISBN 0-306-40615-2 and 9780306406157 name a book. Order #123-456-7890,
order number 4111111111111111 and invoice no. 4111 1111 1111 1111 name purchases.
Write to user@example.com, admin@test.example or root@localhost. $1,234,567.89 and 3.14159265.
std::vector<int> a::b; dead::beef; a population of 1234567890123; 4111111111111112 fails Luhn;
(123) 456-7891 has no area code; 999.1.1.1 is no address; @property, npm i left-pad@1.2.3.
Risk-free desk-top task-list words, sk-short and AKIAS are not keys.
"""


def _sentence(planted: str) -> str:
    return f"Reach the team at {planted} before Friday."


@pytest.mark.parametrize(("kind", "planted"), PLANTED)
def test_planted_personal_data_is_replaced_by_its_placeholder(kind, planted):
    text, found = redact(_sentence(planted), PiiConfig())
    assert text == _sentence(PLACEHOLDERS[kind])
    assert found == {kind: 1}


def test_look_alikes_are_left_alone():
    assert find_spans(LOOK_ALIKES) == []
    assert redact(LOOK_ALIKES, PiiConfig()) == (LOOK_ALIKES, {})


def test_a_real_web_sample_loses_exactly_its_addresses_and_phone_numbers():
    """The C4 sample of the demo: two e-mail addresses and a phone number, and nothing else
    among its 2,000 numbers, dates and prices."""
    texts = [json.loads(line)["text"] for line in
             (EXAMPLES / "c4_sample.jsonl").read_text(encoding="utf-8").splitlines()]
    found = [text[start:end] for text in texts for start, end, _ in find_spans(text)]
    assert found == ["780-800-7092", "vdwarren@education.wisc.edu",
                     "mjgroundworkservices@gmail.com"]


def test_tag_counts_without_changing_and_kinds_and_off_choose_what_is_looked_for():
    text = _sentence("jane.doe@gmail.com") + " " + _sentence("8.8.4.4")
    assert redact(text, PiiConfig(mode="tag")) == (text, {EMAIL: 1, IP_ADDRESS: 1})
    assert redact(text, PiiConfig(kinds=(IP_ADDRESS,)))[1] == {IP_ADDRESS: 1}
    assert redact(text, PiiConfig(mode="off")) == (text, {})
    assert parse_kinds("phone, email") == (EMAIL, PHONE)
    assert parse_kinds(",".join(KINDS)) == KINDS
    with pytest.raises(ValueError, match="unknown kind"):
        parse_kinds("email,passport")
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")


def _record(position: int, value) -> Record:
    return Record(source="s", position=position, input_index=0, value=value)


def test_documents_are_redacted_and_counted_by_kind():
    chunk = RecordChunk("c", (_record(0, _sentence("jane.doe@gmail.com")),
                              _record(1, LOOK_ALIKES)))
    outputs = list(RedactPersonalData(PiiConfig()).process(chunk))
    kept = outputs[0]
    assert [r.value for r in kept.records] == [_sentence("<EMAIL>"), LOOK_ALIKES]
    stats = outputs[-1].value
    assert stats["pii.knowledge.email"] == 1 and stats["pii.knowledge.documents"] == 1


def test_every_message_is_redacted_before_rendering_and_structure_stays():
    """System, user, tool results, the reply and a tool call's arguments; never a role, a tool's
    name or the tool definitions, and the template has not run yet."""
    tools = ({"type": "function", "function": {"name": "send_email", "description": "mail"}},)
    conversation = Conversation((
        {"role": "system", "content": "Escalate to ops@acme-corp.com."},
        {"role": "user", "content": "My card is 4111 1111 1111 1111."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "send_email", "arguments": {"to": "jane.doe@gmail.com", "body": "hi"}}}]},
        {"role": "tool", "content": '{"sent_from": "8.8.4.4"}'},
        {"role": "assistant", "content": "Sent; call (415) 555-2671 if not.",
         "reasoning_content": "The user is jane.doe@gmail.com."},
    ), tools)
    chunk = ConversationChunk("c", (_record(0, {}),), (conversation,))
    outputs = run_bundle(RedactConversations(PiiConfig()), chunk)
    messages = outputs[0].conversations[0].messages
    assert [m["content"] for m in messages] == [
        "Escalate to <EMAIL>.", "My card is <CARD_NUMBER>.", "", '{"sent_from": "<IP_ADDRESS>"}',
        "Sent; call <PHONE> if not."]
    assert messages[2]["tool_calls"][0]["function"] == {
        "name": "send_email", "arguments": {"to": "<EMAIL>", "body": "hi"}}
    assert messages[4]["reasoning_content"] == "The user is <EMAIL>."
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert outputs[0].conversations[0].tools == tools
    stats = outputs[-1].value
    assert (stats["pii.instruction.email"], stats["pii.instruction.examples"]) == (3, 1)


def test_the_manifest_and_summary_count_personal_data_per_branch_and_kind():
    config = {"instruction": {"seq_len": 100}, "knowledge": {"block_size": 8,
                                                              "remainder": "drop"},
              "inputs": [], "curation": {"pii": {"mode": "redact", "kinds": list(KINDS)}}}
    stats = {"pii.knowledge.email": 3, "pii.knowledge.documents": 2,
             "pii.instruction.phone": 1, "pii.instruction.examples": 1}
    manifest = build_manifest(stats, [], config, {})
    assert manifest["personal_data"] == {
        "mode": "redact", "kinds": list(KINDS),
        "knowledge": {"records": 2, "by_kind": {**dict.fromkeys(KINDS, 0), EMAIL: 3}},
        "instruction": {"records": 1, "by_kind": {**dict.fromkeys(KINDS, 0), PHONE: 1}}}
    assert ("personal data replaced: knowledge 2 documents (email 3); instruction 1 examples "
            "(phone 1)") in summary_lines(manifest)
