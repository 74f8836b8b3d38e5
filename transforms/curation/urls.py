"""Documents' URLs: the domain each comes from, and domain blocklists in the UT1 format.

A knowledge record's ``url`` field (or the field ``#url=FIELD`` names) travels with its document
(``Record.url``). Its domain is the URL's host, lower-cased, without a port, a trailing dot or a
leading ``www.``: what the manifest ranks documents and tokens by. A blocklist lists one domain
per line, as the Université Toulouse 1 lists (UT1) and most others do; ``#`` starts a comment.
A listed domain blocks itself and every subdomain: ``example.org`` blocks ``ads.example.org``
but not ``badexample.org``.
"""

from __future__ import annotations

import dataclasses
import functools
import urllib.parse
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems


@dataclasses.dataclass(frozen=True)
class UrlConfig:
    """``blocklist``: the files of blocked domains (local paths or ``gs://``)."""

    blocklist: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.blocklist)


def parse_paths(text: str) -> tuple[str, ...]:
    """``a.txt,b.txt`` -> the paths, in order; empty names are skipped."""
    return tuple(path.strip() for path in text.split(",") if path.strip())


def url_domain(url: str | None) -> str | None:
    """The domain a URL names (``https://WWW.Example.org:8080/a`` -> ``example.org``), or None
    when there is no URL or it names no host. A URL without a scheme (``example.org/page``) is
    read as a host and path."""
    if not url:
        return None
    if "//" not in url:
        url = "//" + url
    try:
        host = urllib.parse.urlsplit(url.strip()).hostname
    except ValueError:  # a malformed IPv6 literal or port
        return None
    if not host:
        return None
    return _bare(host)


def _bare(host: str) -> str:
    host = host.rstrip(".").lower()
    return host[4:] if host.startswith("www.") and host.count(".") > 1 else host


def parse_blocklist(lines: Iterable[str], name: str = "blocklist") -> frozenset[str]:
    """The domains of a blocklist's lines: blank lines and ``#`` comments skipped, ``*.`` and
    ``www.`` prefixes dropped. ValueError names a line that is not a bare domain (a URL or a
    path: UT1's ``urls`` files, which this does not read)."""
    domains = set()
    for number, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip().lower()
        if not entry:
            continue
        if "/" in entry or any(char.isspace() for char in entry):
            raise ValueError(f"{name}:{number}: {line.strip()!r} is not a domain (a blocklist "
                             "has one domain per line; URL and path lists are not read)")
        domains.add(_bare(entry.removeprefix("*.").lstrip(".")))
    return frozenset(domains)


@functools.lru_cache(maxsize=4)
def load_blocklist(paths: tuple[str, ...]) -> frozenset[str]:
    """Every domain the files list; read once per process, however many steps ask."""
    domains: set[str] = set()
    for path in paths:
        with FileSystems.open(path) as handle:
            text = handle.read().decode("utf-8", "replace")
        domains |= parse_blocklist(text.splitlines(), path)
    return frozenset(domains)


def check_blocklist(config: UrlConfig) -> int:
    """How many domains ``--url_blocklist`` lists; ValueError, before any work, for a file that
    cannot be read or a line that is not a domain."""
    try:
        return len(load_blocklist(config.blocklist))
    except OSError as error:  # Beam's BeamIOError is one too
        raise ValueError(f"--url_blocklist: cannot read {', '.join(config.blocklist)}: "
                         f"{error}") from None


def blocked_by(domain: str, blocklist: frozenset[str]) -> str | None:
    """The listed domain that blocks ``domain`` (itself or a parent), or None: one set lookup
    per label of the host."""
    while True:
        if domain in blocklist:
            return domain
        dot = domain.find(".")
        if dot < 0:
            return None
        domain = domain[dot + 1:]
