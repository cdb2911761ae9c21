"""Drop documents whose URL is on a blocklist (adult, spam or malware domains, or URL patterns).

The list is a text file named by `data.url_filter.blocklist`, one entry per line; `#` starts a
comment (at the start of a line or after a space). An entry that looks like a host name (`example.com`, `*.example.com`, `.example.com`)
blocks that host and every subdomain of it (`www.example.com`, `a.b.example.com`); host names compare
case-insensitively. Any other entry is a Python regular expression searched in the full URL (e.g.
`/casino/` or `^http://[^/]*\\.xxx/`). This is how FineWeb and RefinedWeb apply the UT1 lists:
domain lists first, since most blocked content is whole sites.

A document without a URL passes (its source has no `url_field`).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from smelt.config import DataConfig
from smelt.data.filters.base import sources_using
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep
from smelt.errors import ConfigError

_COMMENT = re.compile(r"\s#")  # a comment starts a line or follows a space; URL fragments keep their #
_HOST = re.compile(r"^(?:\*\.|\.)?((?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?\.)+[a-z0-9-]+)\.?$")


def parse_blocklist(text: str, origin: str = "<blocklist>") -> tuple[frozenset[str], list[re.Pattern]]:
    """(blocked host names, URL regexes) from the blocklist file's text; a bad regex is a ConfigError
    naming the file and line."""
    hosts: set[str] = set()
    patterns: list[re.Pattern] = []
    for number, raw in enumerate(text.splitlines(), 1):
        entry = "" if raw.lstrip().startswith("#") else _COMMENT.split(raw, 1)[0].strip()
        if not entry:
            continue
        host = _HOST.match(entry.lower())
        if host:
            hosts.add(host.group(1))
            continue
        try:
            patterns.append(re.compile(entry))
        except re.error as exc:
            raise ConfigError(
                f"{origin}, line {number}: {entry!r} is neither a host name nor a valid regular "
                f"expression ({exc}). Fix or remove the line (data.url_filter.blocklist)."
            ) from exc
    return frozenset(hosts), patterns


def url_host(url: str) -> str:
    """The lowercase host name of a URL ('' when it has none); a bare 'example.com/x' counts too."""
    try:
        parts = urlsplit(url if "//" in url else "//" + url)
        return (parts.hostname or "").rstrip(".")
    except ValueError:
        return ""


class UrlBlocklist(DocStep):
    """Drop documents whose URL's host (or a parent domain) or full URL matches the blocklist."""

    name = "url_blocklist"
    filter_name = "url_blocklist"

    def __init__(
        self, hosts: frozenset[str], patterns: list[re.Pattern], sources: frozenset[str] | None = None
    ):
        self.sources = None if sources is None else frozenset(sources)
        self.hosts = frozenset(hosts)
        self.patterns = list(patterns)

    @classmethod
    def from_config(cls, cfg: DataConfig) -> UrlBlocklist | None:
        """Reads the blocklist file; ConfigError when a source uses the filter and the file is unset,
        missing or unreadable."""
        sources = sources_using(cfg, cls.filter_name)
        if not sources:
            return None
        path = cfg.url_filter.blocklist
        users = ", ".join(sorted(sources))
        if not path:
            raise ConfigError(
                f"data.url_filter.blocklist is empty, but source(s) {users} list the url_blocklist filter. "
                f"Set data.url_filter.blocklist to a file of blocked domains or URL regexes, or remove "
                f"url_blocklist from their filters."
            )
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"data.url_filter.blocklist = {path!r} cannot be read ({exc}). Point it at a UTF-8 text "
                f"file with one blocked domain or URL regex per line."
            ) from exc
        hosts, patterns = parse_blocklist(text, origin=path)
        return cls(hosts, patterns, sources)

    def blocked(self, url: str) -> tuple[str, str] | None:
        """(`domain` or `pattern`, the entry that matched), or None."""
        host = url_host(url)
        if host:
            parts = host.split(".")
            for i in range(len(parts) - 1):
                candidate = ".".join(parts[i:])
                if candidate in self.hosts:
                    return "domain", candidate
        for pattern in self.patterns:
            if pattern.search(url):
                return "pattern", pattern.pattern
        return None

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        if doc.url:
            hit = self.blocked(doc.url)
            if hit is not None:
                ledger.drop(doc, f"{self.name}.{hit[0]}", url=doc.url, matched=hit[1])
                return None
        doc.meta[self.name] = {"has_url": bool(doc.url)}
        return doc
