"""The ``--input`` grammar: ``PATTERN[#key=value;...]`` values and their settings, checked when the
job starts so that a typo fails before any work does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from transforms.core.records import CANONICAL_FIELDS, LABEL, TEXT_UNITS, InputSpec
from transforms.core.vocabulary import BRANCHES, FILE_FORMATS

_SETTINGS = ("branch", "format", "text_unit", "name", "weight", "phase", "license")
# A licence identifier as the Hugging Face dataset card takes it (``apache-2.0``, ``cc-by-4.0``).
_LICENSE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


def split_input_values(values: Iterable[str]) -> list[str]:
    """Split comma-separated ``--input`` values and drop blanks.

    A Flex Template parameter holds one string, so several patterns arrive as ``a,b,c``; the
    command line may also repeat ``--input``. Both forms end up as one flat list. Patterns and
    declarations therefore cannot contain commas.
    """
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def parse_input_spec(index: int, value: str) -> InputSpec:
    """Parse ``PATTERN[#key=value;key=value...]`` into an ``InputSpec``.

    ``branch``, ``format``, ``text_unit``, ``name``, ``weight``, ``phase`` and ``license`` are
    settings; any other key maps a canonical field to a source field (``prompt=question``).
    Everything after the first ``#`` is declarations, so a path pattern cannot contain ``#``.
    Errors name the offending value so a typo fails the job before any work starts.
    """
    pattern, _, declarations = value.partition("#")
    pattern = pattern.strip()
    if not pattern:
        raise ValueError(f"--input {value!r}: the path pattern is empty")
    settings: dict[str, str] = {}
    fields: dict[str, str] = {}
    for pair in declarations.split(";"):
        if not pair.strip():
            continue
        key, eq, val = (part.strip() for part in pair.partition("="))
        if not eq or not key or not val:
            raise ValueError(f"--input {value!r}: {pair.strip()!r} is not key=value")
        if key in settings or key in fields:
            raise ValueError(f"--input {value!r}: {key!r} is declared twice")
        if key not in _SETTINGS and key not in CANONICAL_FIELDS:
            raise ValueError(
                f"--input {value!r}: {key!r} is neither a setting ({', '.join(sorted(_SETTINGS))}) "
                f"nor a canonical field ({', '.join(CANONICAL_FIELDS)})"
            )
        (settings if key in _SETTINGS else fields)[key] = val
    for key, allowed in (("branch", BRANCHES), ("format", FILE_FORMATS), ("text_unit", TEXT_UNITS)):
        if key in settings and settings[key] not in allowed:
            raise ValueError(
                f"--input {value!r}: {key}={settings[key]!r} is not one of {', '.join(allowed)}"
            )
    if settings.get("format", "text") != "text" and "text_unit" in settings:
        raise ValueError(f"--input {value!r}: text_unit applies only to format=text")
    for key in ("name", "phase"):
        if key in settings and not LABEL.fullmatch(settings[key]):
            raise ValueError(f"--input {value!r}: {key}={settings[key]!r} must be letters, "
                             "digits, '_' and '-', starting with a letter or digit")
    weight = None
    if "weight" in settings:
        try:
            weight = float(settings["weight"])
        except ValueError:
            weight = -1.0
        if not weight > 0 or weight == float("inf"):
            raise ValueError(f"--input {value!r}: weight={settings['weight']!r} must be a "
                             "number above 0")
    return InputSpec(
        index=index,
        pattern=pattern,
        branch=settings.get("branch"),
        format=settings.get("format"),
        text_unit=settings.get("text_unit", "file"),
        name=settings.get("name"),
        fields=tuple(sorted(fields.items())),
        weight=weight,
        phase=settings.get("phase"),
        license=_license(value, settings),
    )


def _license(value: str, settings: dict[str, str]) -> str | None:
    """The declared licence, for the dataset card; an identifier, so the card's YAML stays valid."""
    found = settings.get("license")
    if found is not None and not _LICENSE.fullmatch(found):
        raise ValueError(f"--input {value!r}: license={found!r} must be a licence identifier "
                         "such as apache-2.0, cc-by-4.0 or mit (letters, digits, '.', '+', '-')")
    return found
