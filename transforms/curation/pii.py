"""Personal data and secrets: found in text and replaced with a placeholder, or only counted.

Kinds (``KINDS``) and what each placeholder stands for:

- ``email`` (``<EMAIL>``): an address whose domain is not reserved for examples (RFC 2606 and
  RFC 6761: ``example.com``, ``*.test``, ``*.invalid``, ``localhost``, ...);
- ``ip_address`` (``<IP_ADDRESS>``): an IPv4 or IPv6 address that is globally routable; private
  (RFC 1918, ``fc00::/7``), loopback, link-local, shared, documentation (RFC 5737, RFC 3849) and
  multicast addresses are left alone;
- ``phone`` (``<PHONE>``): a number written as a phone number is: ``+`` and a country code, a
  North American ``(415) 555-2671`` / ``415-555-2671``, or a dash-separated national number that
  starts with 0 (``010-1234-5678``, ``03-1234-5678``);
- ``card_number`` (``<CARD_NUMBER>``): 13 to 19 digits (optionally in groups) with a card issuer's
  prefix and length that pass the Luhn check;
- ``secret`` (``<SECRET>``): private key blocks, AWS access key ids (and a secret key assigned to
  ``aws_secret_access_key``), GitHub, GitLab, Slack, Stripe, OpenAI and Google API tokens, and
  JSON Web Tokens.

Precision comes before recall: a number that a label names as something else (``Order #``,
``ISBN``, ``version``, ``v``, ``ref``, ``invoice``, ...) is left alone, and so are dates, version
numbers and ISBNs, which no pattern here takes. Each kind has a cheap test (a character or a
marker the text must hold) before its regular expression runs, and a match is checked
(``ipaddress``, Luhn, issuer) before it counts.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

EMAIL, IP_ADDRESS, PHONE, CARD_NUMBER, SECRET = (
    "email", "ip_address", "phone", "card_number", "secret")
KINDS = (EMAIL, IP_ADDRESS, PHONE, CARD_NUMBER, SECRET)
PLACEHOLDERS = {EMAIL: "<EMAIL>", IP_ADDRESS: "<IP_ADDRESS>", PHONE: "<PHONE>",
                CARD_NUMBER: "<CARD_NUMBER>", SECRET: "<SECRET>"}
REDACT, TAG, OFF = "redact", "tag", "off"
MODES = (REDACT, TAG, OFF)


@dataclasses.dataclass(frozen=True)
class PiiConfig:
    """``redact`` replaces what is found with its kind's placeholder; ``tag`` only counts it
    (the text is unchanged); ``off`` looks for nothing."""

    mode: str = REDACT
    kinds: tuple[str, ...] = KINDS

    @property
    def active(self) -> bool:
        return self.mode != OFF and bool(self.kinds)


def parse_kinds(text: str) -> tuple[str, ...]:
    """``email,phone`` -> the kinds in ``KINDS`` order; ValueError names an unknown one."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return tuple(kind for kind in KINDS if kind in names)


# --------------------------------------------------------------------------- what a match must be

# A label right before a number says what it is: an order, an ISBN, a version, never personal.
_LABELLED = re.compile(
    r"(?:\b(?:order|invoice|isbn(?:-1[03])?|issn|ref|reference|tracking|sku|serial|part|model|"
    r"ver|version|build|release|ticket|case|item|product|v)|#)"
    r"\s*(?:number|no|nr|num|id)?\.?\s*[:#]?\s*\Z", re.IGNORECASE)
_LABEL_WINDOW = 24

_RESERVED_DOMAINS = ("example.com", "example.net", "example.org", "localhost")
_RESERVED_SUFFIXES = (".example", ".test", ".invalid", ".localhost", ".local")


def _labelled(text: str, start: int) -> bool:
    return _LABELLED.search(text, max(0, start - _LABEL_WINDOW), start) is not None


def _public_ip(text: str, match: re.Match) -> bool:
    """A globally routable address; IPv6 written with 3 colons or more (``dead::beef`` and
    ``a::b`` are C++, not addresses)."""
    if ":" in match.group(0) and match.group(0).count(":") < 3:
        return False
    try:
        address = ipaddress.ip_address(match.group(0))
    except ValueError:
        return False
    return address.is_global and not address.is_multicast and not _labelled(text, match.start())


def _phone(text: str, match: re.Match) -> bool:
    """E.164: at most 15 digits, and at least 8 in any number written with a country code."""
    digits = sum(char.isdigit() for char in match.group(0))
    return 8 <= digits <= 15 and not _labelled(text, match.start())


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


# (issuer prefix pattern, lengths it issues): Visa, Mastercard, American Express, Discover,
# JCB, Diners Club, UnionPay.
_ISSUERS = re.compile(
    r"4\d{12}(?:\d{3}){0,2}|5[1-5]\d{14}|2(?:2[2-9][1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)\d{12}"
    r"|3[47]\d{13}|6(?:011|5\d\d|4[4-9]\d)\d{12}(?:\d{3})?|35(?:2[89]|[3-8]\d)\d{12}(?:\d{3})?"
    r"|3(?:0[0-5]|[68]\d)\d{11}|62\d{14,17}")


def _card(text: str, match: re.Match) -> bool:
    digits = re.sub(r"[ -]", "", match.group(0))
    return (_ISSUERS.fullmatch(digits) is not None and luhn_valid(digits)
            and not _labelled(text, match.start()))


# --------------------------------------------------------------------------- the detectors

Found = tuple[int, int]  # a span's start and end


@dataclasses.dataclass(frozen=True)
class Detector:
    """One kind: where in a text it may be (a cheap test), then the search of those regions."""

    kind: str
    regions: Callable[[str], list[Found]]
    search: Callable[[str, int, int], Iterator[Found]]


def _whole_text(text: str) -> list[Found]:
    return [(0, len(text))]


# Runs of digits and the separators numbers are written with, 7 characters or more: the only
# places a card number, an IPv4 address or a phone number can be. The pattern starts with a
# character class, so the engine skips to candidates fast; the detectors' own patterns, which
# start with lookbehinds, only run inside these runs.
_NUMERIC = re.compile(r"[0-9+(][0-9().+ /-]{6,}")


def _numeric_runs(text: str) -> list[Found]:
    return [match.span() for match in _NUMERIC.finditer(text)]


# Colons with at most 4 hex digits between them: the middle of an IPv6 address. The pattern
# starts with a literal colon, which the engine finds fast.
_HEX_COLONS = re.compile(r":(?:[0-9A-Fa-f]{0,4}:)+")


def _colon_runs(text: str) -> list[Found]:
    """Where an IPv6 address may be: each run of colons and hex digits, with room for the
    first and last group around it."""
    if text.count(":") < 3:
        return []
    return [(max(0, match.start() - 4), match.end() + 4)
            for match in _HEX_COLONS.finditer(text)]


def _matches(pattern: re.Pattern, valid: Callable[[str, re.Match], bool]
             ) -> Callable[[str, int, int], Iterator[Found]]:
    """A search that keeps the matches of ``pattern`` that ``valid`` accepts: the whole match,
    or its group named ``value`` where one matched (a key's value, without its name). The
    search looks 2 characters past its region, so that a number's end is checked."""
    def search(text: str, start: int, end: int) -> Iterator[Found]:
        for match in pattern.finditer(text, start, end + 2):
            if valid(text, match):
                yield match.span(match.lastgroup or 0)
    return search


def _any_match(text: str, match: re.Match) -> bool:
    return True


# An address is found from its ``@`` outwards: a pattern that starts at the local part would be
# tried at every letter of the text.
_DOMAIN = re.compile(r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24})\b")
_LOCAL_PART = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}\Z")


def _emails(text: str, start: int, end: int) -> Iterator[Found]:
    if "@" not in text:
        return
    for match in _DOMAIN.finditer(text, start, end):
        at = match.start()
        local = _LOCAL_PART.search(text, max(0, at - 64), at)
        if local is not None and not _reserved(match.group(1)):
            yield local.start(), match.end()


def _reserved(domain: str) -> bool:
    domain = domain.lower()
    return (domain in _RESERVED_DOMAINS or domain.endswith(_RESERVED_SUFFIXES)
            or any(domain.endswith("." + reserved) for reserved in _RESERVED_DOMAINS))


_UNDERSCORE_MARKERS = ("ws_secret_access_key", "WS_SECRET_ACCESS_KEY", "ghp_", "gho_", "ghu_",
                       "ghs_", "ghr_", "github_pat_", "_live_")
_OTHER_MARKERS = ("PRIVATE KEY-----", "AKIA", "ASIA", "glpat-", "xox", "sk-", "AIza", "eyJ")


def _may_hold_secret(text: str) -> list[Found]:
    """The whole text, if it holds a marker of any secret; the markers with ``_`` are only
    looked for in a text that has one (one scan instead of nine)."""
    for marker in _OTHER_MARKERS:  # a loop, not any(): called for every message's text
        if marker in text:
            return [(0, len(text))]
    if "_" in text:
        for marker in _UNDERSCORE_MARKERS:
            if marker in text:
                return [(0, len(text))]
    return []


def _secret(pattern: str, *markers: str) -> Detector:
    """Secrets of one family: searched only in texts that hold one of its markers. Each
    pattern starts with its literal marker (which the engine finds fast) and checks the word
    boundary before it with a lookbehind."""
    found = _matches(re.compile(pattern, re.DOTALL), _any_match)

    def search(text: str, start: int, end: int) -> Iterator[Found]:
        return found(text, start, end) if any(m in text for m in markers) else iter(())
    return Detector(SECRET, _may_hold_secret, search)


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_NUMBER_START = r"(?<![\w.,/-])"  # not inside a word, a longer number or a decimal
_NUMBER_END = r"(?![\w-]|[.,]\d)"  # not followed by more of a word, a number or a decimal

DETECTORS: tuple[Detector, ...] = (
    _secret(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----"
            r"|(?:\s+[A-Za-z0-9+/=:,-]+)*)", "PRIVATE KEY-----"),
    _secret(r"A(?<!\wA)(?:KIA|SIA)[0-9A-Z]{16}\b", "AKIA", "ASIA"),
    _secret(r"(?:aws_secret_access_key|AWS_SECRET_ACCESS_KEY)\s*[=:]\s*[\"']?"
            r"(?P<value>[A-Za-z0-9/+]{40})\b",
            "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
    _secret(r"gh(?<!\wgh)(?:[pousr]_[A-Za-z0-9]{36}|ithub_pat_\w{82})\b",
            "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    _secret(r"glpat-(?<!\wglpat-)[\w-]{20}\b", "glpat-"),
    _secret(r"xox(?<!\wxox)[abposr]-[A-Za-z0-9-]{10,}", "xox"),
    _secret(r"[sr]k_live_(?<!\w[sr]k_live_)[0-9A-Za-z]{24,}", "_live_"),
    _secret(r"sk-(?<!\wsk-)(?:proj-|svcacct-)?(?=[\w-]*\d)[A-Za-z0-9_-]{32,}", "sk-"),
    _secret(r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}\b", "AIza"),
    _secret(r"eyJ(?<!\weyJ)[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
            "eyJ"),
    Detector(EMAIL, _whole_text, _emails),
    Detector(CARD_NUMBER, _numeric_runs, _matches(re.compile(
        rf"{_NUMBER_START}(?:(?:\d{{4}}[ -]){{3}}\d{{1,7}}|\d{{4}}[ -]\d{{6}}[ -]\d{{4,5}}"
        rf"|\d{{13,19}}){_NUMBER_END}", re.ASCII), _card)),
    Detector(IP_ADDRESS, _numeric_runs, _matches(re.compile(
        rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)", re.ASCII), _public_ip)),
    Detector(IP_ADDRESS, _colon_runs, _matches(re.compile(
        r"(?<![\w:.])(?=[0-9A-Fa-f:]*[0-9A-Fa-f]{4})(?:[0-9A-Fa-f]{1,4}:){1,7}:?"
        r"(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})?(?![\w:])"), _public_ip)),
    Detector(PHONE, _numeric_runs, _matches(re.compile(
        rf"(?<![\w+])\+\d{{1,3}}(?:[ .-]?\(?\d{{1,4}}\)?){{2,5}}{_NUMBER_END}"
        rf"|(?<![\w(-])\(?[2-9]\d{{2}}\)?[ .-]?[2-9]\d{{2}}[ .-]\d{{4}}{_NUMBER_END}"
        rf"|(?<![\w-])0\d{{1,2}}-\d{{3,4}}-\d{{4}}{_NUMBER_END}", re.ASCII), _phone)),
)


# --------------------------------------------------------------------------- finding and redacting

Span = tuple[int, int, str]  # start, end, kind


def find_spans(text: str, kinds: Iterable[str] = KINDS) -> list[Span]:
    """Every span of personal data in ``text``, without overlaps, in text order. Detectors run
    in ``DETECTORS`` order (secrets first: a key may hold what looks like a number), and a
    span that overlaps one found before is dropped."""
    regions: dict[Callable, list[Found]] = {}  # a region finder shared by detectors runs once
    taken: list[Span] = []
    for finder, detectors in _runs(kinds if isinstance(kinds, tuple) else tuple(kinds)):
        where = regions.get(finder)
        if where is None:
            where = regions[finder] = finder(text)
        for detector in detectors if where else ():
            for region in where:
                for start, end in detector.search(text, *region):
                    if not any(s < end and start < e for s, e, _ in taken):
                        taken.append((start, end, detector.kind))
    return sorted(taken)


@functools.cache
def _runs(kinds: tuple[str, ...]) -> tuple[tuple[Callable, tuple[Detector, ...]], ...]:
    """The detectors of ``kinds`` in ``DETECTORS`` order, in runs of neighbours that share a
    region finder: a text without a region skips the run at once (most texts hold no secret
    marker, and the ten secret detectors are one run)."""
    runs: list[tuple[Callable, list[Detector]]] = []
    for detector in DETECTORS:
        if detector.kind not in kinds:
            continue
        if runs and runs[-1][0] is detector.regions:
            runs[-1][1].append(detector)
        else:
            runs.append((detector.regions, [detector]))
    return tuple((finder, tuple(detectors)) for finder, detectors in runs)


def redact(text: str, config: PiiConfig) -> tuple[str, collections.Counter]:
    """``text`` with each span found replaced by its placeholder (unchanged in ``tag`` mode),
    and the count of spans by kind."""
    if not config.active:
        return text, collections.Counter()
    spans = find_spans(text, config.kinds)
    found = collections.Counter(kind for _, _, kind in spans)
    if config.mode != REDACT or not spans:
        return text, found
    pieces, last = [], 0
    for start, end, kind in spans:
        pieces += [text[last:start], PLACEHOLDERS[kind]]
        last = end
    pieces.append(text[last:])
    return "".join(pieces), found


def count_found(branch: str, found: collections.Counter) -> dict[str, int]:
    """A chunk's counters: spans by kind, and the records holding any (``documents`` in the
    knowledge branch, ``examples`` in the instruction branch), under ``pii.BRANCH.``."""
    return {f"pii.{branch}.{name}": count for name, count in found.items()}


_STRUCTURAL_KEYS = frozenset({"role", "type", "name"})  # a role, a call's type, a tool's name


def redact_value(value: Any, config: PiiConfig, found: collections.Counter) -> Any:
    """``value`` with every string inside it (dict values, list items) redacted, but for the
    values of ``_STRUCTURAL_KEYS``; dict keys stay."""
    if isinstance(value, str):
        text, spans = redact(value, config)
        found.update(spans)
        return text
    if isinstance(value, dict):
        return {key: item if key in _STRUCTURAL_KEYS else redact_value(item, config, found)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item, config, found) for item in value)
    return value


@dataclasses.dataclass(frozen=True)
class MessageRedactor:
    """``redact_value`` over a batch of conversations' messages, one result per conversation:
    None where nothing was found (the usual case, so little travels back from a helper
    process), else the redacted messages and the spans found by kind. Picklable, and this
    module imports no Beam: the instruction branch sends large batches to helper processes."""

    config: PiiConfig

    def __call__(self, batch: Sequence[Sequence[Any]]
                 ) -> list[tuple[tuple[Any, ...], collections.Counter] | None]:
        results: list[tuple[tuple[Any, ...], collections.Counter] | None] = []
        for messages in batch:
            found: collections.Counter = collections.Counter()
            redacted = tuple(redact_value(message, self.config, found) for message in messages)
            results.append((redacted, found) if found else None)
        return results
