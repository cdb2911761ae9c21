"""PII scrubbing: e-mail addresses, phone numbers, IP addresses and secrets become typed placeholders.

Why regexes and not a NER model: the four kinds here have a rigid shape, a regex pass runs at tens
of MB/s per core in the worker processes, and every decision can be explained from a pattern and a
rule. (Names and street addresses need a model; they are out of scope.)

Why one scan per anchor and not one alternation of everything: CPython's `re` skips ahead quickly
only when a pattern starts with a literal (it then searches for that literal, at 1-2 GB/s); a pattern
that starts with a lookbehind, `\\b`, a character class or an alternation is tried at every position.
A first version with one alternation of all kinds ran at 1 MB/s on the shared corpus. So every
detector scans for a literal anchor that each match must contain (`@`, `.d.d.d`, `:h:`, `+d`, `-dddd`,
`AKIA`, `-----BEGIN`, the `=`/`:` of an assignment), matches the full pattern at that spot and checks
it in Python. The detectors run in priority order (secrets, e-mail, IP, phone) and a later span that
overlaps an earlier one is dropped, so text inside a secret is replaced once, as the secret.

What is replaced, and what is deliberately kept:

* email (`<EMAIL>`): `local@domain.tld` with an alphabetic top-level label of 2-24 letters. Kept:
  `a@self.weight.T` style matrix products (the last label is not alphabetic, or a call or subscript
  follows), `user@localhost`, locale names such as `ks_in@devanagari.utf8`.
* phone (`<PHONE>`): numbers written with a leading `+` (8 to 15 digits in groups, as E.164 allows),
  and North-American numbers `(415) 555-2671`, `415-555-2671`, `415.555.2671`, `1-415-555-2671`
  (area code and exchange start with 2-9; the two separators agree). Kept: dates, version strings,
  ISBNs, digit runs without separators (unless they start with `+`), signed decimals (`+1234.5678`),
  and national formats without `+` such as `020 7946 0958`, which look like any other numbers.
* ip (`<IP_ADDRESS>`): IPv4 and IPv6 addresses of hosts on the public Internet. As in BigCode's PII
  pipeline, private and special-purpose ranges stay (loopback, RFC 1918, link-local, CGNAT,
  documentation, benchmarking, multicast, reserved, 0.0.0.0; for IPv6 ::, ::1, fc00::/7, fe80::/10,
  2001:db8::/32, NAT64, multicast, and IPv4-mapped forms of kept IPv4 addresses), and so do the
  well-known public DNS resolvers (8.8.8.8, 1.1.1.1, ...), which identify nobody. Dotted quads that are
  something else stay: after a version word (`version 1.2.3.4`, `v1.2.3.4`); with a version, section,
  RFC or OID word within 100 characters (`section 8.2.4.44`, OID `2.5.29.17`); inside a longer dotted
  number or name (`1.3.6.1.4.1`, `1.0.0.127.in-addr.arpa`); and four single-digit parts (`1.2.3.4`)
  unless a network word (ip, dns, server, host, ...) is within 100 characters (BigCode's rule). An IPv6
  candidate needs three or more non-empty groups and a digit, so slices such as `a[1::2]` stay.
* secret (`<SECRET>`, found by data/secrets.py): AWS access key ids (`AKIA...`), GCP API keys (`AIza...`), GitHub tokens
  (`ghp_...`, `github_pat_...`), Slack tokens (`xoxb-...`), Stripe live keys (`sk_live_...`),
  OpenAI-style keys (`sk-...`), JWTs (`eyJ...eyJ....`), `-----BEGIN ... PRIVATE KEY-----` blocks with
  their body, and the values of `password|secret|token|api_key|... = "..."` assignments (also
  `"api_key": "..."`, unquoted `KEY=value` in env and ini files, `?access_token=...&` in URLs) when the
  value looks random: letters and digits, Shannon entropy of at least 3 bits per character (3.5
  unquoted), no placeholder words. An `aws_secret_access_key` takes any 40-character base64 value.
  Only the value is replaced, so code stays readable: `password = "<SECRET>"`.

Counts per kind go to `doc.meta["pii"]` (kinds with at least one replacement only), so the statistics
can sum them per source.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
import string
from collections import Counter
from collections.abc import Callable, Iterator

from smelt.config import DataConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.secrets import secret_spans
from smelt.data.steps import DocStep
from smelt.errors import ConfigError

KINDS = ("email", "phone", "ip", "secret")
PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "ip": "<IP_ADDRESS>", "secret": "<SECRET>"}

Span = tuple[int, int]  # [start, end) of the text to replace

# ---------------------------------------------------------------------------------------------
# E-mail, IP, phone.

_LOCAL_CHARS = frozenset("._%+-")
_EMAIL_DOMAIN = re.compile(r"@[^\W_][\w-]{0,62}(?:\.[\w-]{1,63})+")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4_ANCHOR = re.compile(r"\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]")
# Not followed by `.5` or `.in-addr`: a longer dotted number (OID) or a name (reverse DNS, file name).
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.[\w-])")
_RUNS = {".": re.compile(r"[\w.]*"), ".:": re.compile(r"[\w.:]*")}  # see _in_runs
_IPV6_ANCHOR = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}|:)(?::[0-9A-Fa-f]{0,4}){1,7}(?:%[0-9A-Za-z]{1,15})?(?![\w:.])"
)
# `+44 20 7946 0958`, `+49 (0)40 890 85-433`, `+14155552671`. No `.` separators: `+1234.5678` is a
# signed decimal far more often than a phone number (`+1.415.555.2671` is found as North-American).
_PHONE_INTL = re.compile(
    r"\+(?<![\w+]\+)[1-9][0-9]{0,2}"
    r"(?:(?:[ -]?\(0\))?[ -]?\(?[0-9]{1,5}\)?(?:[ -][0-9]{1,8}){1,5}|[0-9]{7,12})"
    r"(?![\w-]|[.,][0-9])"
)
# North-American numbers are found from their last separator and four digits: `-2671`, `.2671`, and
# `) 555 2671` for the space-separated form, which is only taken with a parenthesized area code.
_NANP_ANCHORS = (
    re.compile(r"-[0-9]{4}"),
    re.compile(r"\.[0-9]{4}"),
    re.compile(r"\) ?[2-9][0-9]{2} [0-9]{4}"),
)
_NANP_BACK = 14  # characters from the start of `+1 (415) 555-2671` to its last separator, at most
_PHONE_NANP = re.compile(
    r"(?<![\w+./-])(?:\+?1[ .-]?)?"
    r"(?:\([2-9][0-9]{2}\)[ ]?|[2-9][0-9]{2}(?P<s1>[.-]))"
    r"[2-9][0-9]{2}(?P<s2>[ .-])[0-9]{4}(?![\w-]|[.][0-9])"
)

_KEPT_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        # IANA special-purpose IPv4 registry (RFC 6890 and successors), multicast and reserved.
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        # IPv6: unspecified, loopback, discard, IETF protocol assignments, documentation, NAT64, 6to4,
        # ULA, link-local, site-local (deprecated), multicast.
        "::/128",
        "::1/128",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
]
# Public resolvers everybody configures; they identify no person (the list BigCode keeps, plus the
# IPv6 addresses of the Google and Cloudflare resolvers).
_PUBLIC_DNS = frozenset(
    [
        "8.8.8.8",
        "8.8.4.4",
        "1.1.1.1",
        "1.0.0.1",
        "76.76.19.19",
        "76.223.122.150",
        "9.9.9.9",
        "149.112.112.112",
        "208.67.222.222",
        "208.67.220.220",
        "8.26.56.26",
        "8.20.247.20",
        "94.140.14.14",
        "94.140.15.15",
        "2001:4860:4860::8888",
        "2001:4860:4860::8844",
        "2606:4700:4700::1111",
        "2606:4700:4700::1001",
    ]
)
_VERSION_BEFORE = re.compile(r"(?i)(?:\bv|\bversion|\bver|\brelease|\brev|\bbuild)[\s:=.]*\Z")
# Context words, compared with the lowercased words within 100 characters of a dotted quad (a word
# set is 4x faster than a `\b(?:...)\b` pattern over the same window).
_NETWORK_WORDS = frozenset(
    [
        "ip",
        "ipv4",
        "ips",
        "dns",
        "server",
        "host",
        "hostname",
        "addr",
        "address",
        "gateway",
        "proxy",
        "ping",
        "subnet",
        "netmask",
        "router",
        "client",
        "connect",
        "connection",
        "socket",
        "firewall",
        "ssh",
        "http",
        "https",
    ]
)
# Words that make a dotted quad a section number, an OID or a version: `section 8.2.4.44`, OID 2.5.4.10.
_NOT_IP_WORDS = frozenset(
    [
        "version",
        "versions",
        "release",
        "build",
        "section",
        "sections",
        "chapter",
        "clause",
        "paragraph",
        "rfc",
        "spec",
        "specs",
        "asn",
        "x509",
        "oid",
        "oids",
        "§",
    ]
)
_PUNCTUATION_TO_SPACE = str.maketrans(dict.fromkeys(string.punctuation + "§", " "))
_ISBN_BEFORE = re.compile(r"(?i)isbn(?:-1[03])?[\s:]*\Z")


_KEPT_RANGES = {
    version: [
        (int(n.network_address), int(n.broadcast_address)) for n in _KEPT_NETWORKS if n.version == version
    ]
    for version in (4, 6)
}


def _keep_ip(text: str) -> bool:
    """True for text that is no address, or an address that identifies no host on the Internet."""
    if text.count(".") == 3 and ":" not in text:  # IPv4, octets already checked by _IPV4
        a, b, c, d = (int(part) for part in text.split("."))
        n = (a << 24) | (b << 16) | (c << 8) | d
        return text in _PUBLIC_DNS or any(lo <= n <= hi for lo, hi in _KEPT_RANGES[4])
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return True  # `12:30:45`, `a:b:c`: the shape matched, but it is no address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    n = int(ip)
    return str(ip) in _PUBLIC_DNS or any(lo <= n <= hi for lo, hi in _KEPT_RANGES[ip.version])


# ---------------------------------------------------------------------------------------------
# Detectors: text -> spans to replace, in text order.


def _email_spans(text: str) -> Iterator[Span]:
    """From each `@`: the local part backwards (at most 64 characters, starting with a word character),
    the domain forwards."""
    at = text.find("@")
    while at != -1:
        lo = max(0, at - 64)
        start = at
        while start > lo and _is_local(text[start - 1]):
            start -= 1
        too_long = start == lo and lo > 0 and _is_local(text[lo - 1])
        while start < at and text[start] in _LOCAL_CHARS:
            start += 1
        m = _EMAIL_DOMAIN.match(text, at) if start < at and not too_long else None
        if m is not None and _email_domain_ok(text, m):
            yield start, m.end()
            at = text.find("@", m.end())
        else:
            at = text.find("@", at + 1)


def _is_local(c: str) -> bool:
    return c.isalnum() or c == "_" or c in _LOCAL_CHARS


def _email_domain_ok(text: str, m: re.Match) -> bool:
    labels = m.group(0)[1:].split(".")
    tld = labels[-1]
    if not (2 <= len(tld) <= 24 and tld.isalpha() and tld.isascii()) or "_" in m.group(0):
        return False
    if any(label.startswith("-") or label.endswith("-") for label in labels):
        return False
    return text[m.end() : m.end() + 1] not in ("(", "[", "@")  # `a@self.weight.sum(`: code, not mail


def _ip_spans(text: str) -> Iterator[Span]:
    yield from _in_runs(text, _IPV4_ANCHOR, _IPV4, ".", 16, _ipv4_ok)  # 255.255.255.255.
    yield from _in_runs(text, _IPV6_ANCHOR, _IPV6, ".:", 46, _ipv6_ok)  # with a dotted IPv4 tail


def _context_words(text: str, m: re.Match, radius: int = 100) -> set[str]:
    """The lowercased words within `radius` characters of a match (`§` counts as a word)."""
    window = text[max(0, m.start() - radius) : m.end() + radius].lower()
    words = set(window.translate(_PUNCTUATION_TO_SPACE).split())
    if "§" in window:
        words.add("§")
    return words


def _in_runs(
    text: str,
    anchor: re.Pattern,
    full: re.Pattern,
    extra: str,
    longest: int,
    ok: Callable[[str, re.Match], bool],
) -> Iterator[Span]:
    """Addresses start where a run of word characters and `extra` starts (their patterns look behind
    for those), so from each anchor step back to its run's start (at most `longest` characters; a
    longer run holds no address), match there, and then skip the whole run: every character is looked
    at a bounded number of times, even in a hex dump or a long `a:b:c:...` table."""
    run = _RUNS[extra]

    def in_run(c: str) -> bool:
        return c.isalnum() or c == "_" or c in extra

    pos = 0
    while True:
        a = anchor.search(text, pos)
        if a is None:
            return
        start, lo = a.start(), max(0, a.start() - longest)
        while start > lo and in_run(text[start - 1]):
            start -= 1
        end = run.match(text, a.start()).end()
        if start == 0 or not in_run(text[start - 1]):
            m = full.match(text, start)
            if m is not None and ok(text, m):
                yield m.span()
                end = max(end, m.end())
        pos = max(end, a.start() + 1)


def _ipv4_ok(text: str, m: re.Match) -> bool:
    """A public dotted quad that is not a version, section number or OID. Version, section, RFC or OID
    words within 100 characters make it one of those; otherwise network words nearby (ip, server,
    host, ...) make it an address, and without either, four single-digit parts are a version
    (BigCode's rule) and anything else an address."""
    address = m.group(0)
    if _keep_ip(address) or _VERSION_BEFORE.search(text, max(0, m.start() - 24), m.start()):
        return False
    words = _context_words(text, m)
    if not _NOT_IP_WORDS.isdisjoint(words):
        return False
    return len(address) > 7 or not _NETWORK_WORDS.isdisjoint(words)


def _ipv6_ok(text: str, m: re.Match) -> bool:
    address = m.group(0)
    groups = [g for g in address.split("%", 1)[0].split(":") if g]
    return len(groups) >= 3 and any(c.isdigit() for c in address) and not _keep_ip(address)


def _phone_spans(text: str) -> Iterator[Span]:
    for m in _PHONE_INTL.finditer(text):
        digits = sum(c.isdigit() for c in m.group(0)) - m.group(0).count("(0)")
        if 8 <= digits <= 15 and not _ISBN_BEFORE.search(text, max(0, m.start() - 16), m.start()):
            yield m.span()
    for anchor in _NANP_ANCHORS:
        pos = 0
        while True:
            a = anchor.search(text, pos)
            if a is None:
                break
            m = _nanp_at(text, a)
            if m is not None and _nanp_ok(text, m):
                yield m.span()
                pos = m.end()
            else:
                pos = a.start() + 1


def _nanp_at(text: str, a: re.Match) -> re.Match | None:
    """The North-American number around anchor `a`, trying each start up to _NANP_BACK before it."""
    for start in range(max(0, a.start() - _NANP_BACK), a.start()):
        m = _PHONE_NANP.match(text, start)
        if m is not None and m.end() >= a.end():
            return m
    return None


def _nanp_ok(text: str, m: re.Match) -> bool:
    if m.group("s1") is not None and m.group("s1") != m.group("s2"):
        return False  # mixed separators: 212-555.1234 is not how people write numbers
    return not _ISBN_BEFORE.search(text, max(0, m.start() - 16), m.start())


_DETECTORS: dict[str, Callable[[str], Iterator[Span]]] = {
    "secret": secret_spans,
    "email": _email_spans,
    "ip": _ip_spans,
    "phone": _phone_spans,
}
_PRIORITY = ("secret", "email", "ip", "phone")  # on overlap, the earlier kind wins


def scrub(text: str, kinds: tuple[str, ...] | list[str] = KINDS) -> tuple[str, dict[str, int]]:
    """Replace the PII of `kinds` in `text` with placeholders; (new text, {kind: replacements > 0})."""
    starts: list[int] = []
    spans: list[tuple[int, int, str]] = []
    for kind in _PRIORITY:
        if kind not in kinds:
            continue
        for start, end in _DETECTORS[kind](text):
            i = bisect.bisect_right(starts, start)
            if (i > 0 and spans[i - 1][1] > start) or (i < len(spans) and spans[i][0] < end):
                continue  # overlaps a span of a higher-priority kind
            starts.insert(i, start)
            spans.insert(i, (start, end, kind))
    if not spans:
        return text, {}
    out, pos, counts = [], 0, Counter()
    for start, end, kind in spans:
        out += [text[pos:start], PLACEHOLDERS[kind]]
        pos = end
        counts[kind] += 1
    out.append(text[pos:])
    return "".join(out), {k: counts[k] for k in KINDS if counts[k]}


class Pii(DocStep):
    """Replace PII with typed placeholders; count the replacements per kind in `doc.meta["pii"]`.

    Never drops a document. Runs on every source: secrets matter most in code."""

    name = "pii"

    def __init__(self, kinds: tuple[str, ...] | list[str] = KINDS):
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ConfigError(
                f"data.pii.kinds: unknown kind {unknown[0]!r}; valid kinds are {', '.join(KINDS)}. "
                f"Set data.pii.kinds to a list of those, or data.pii.enabled = false to keep all text."
            )
        self.kinds = tuple(k for k in KINDS if k in kinds)

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Pii | None:
        """The step for `data.pii`, or None when it is disabled or `kinds` is empty."""
        if not cfg.pii.enabled or not cfg.pii.kinds:
            return None
        return cls(cfg.pii.kinds)

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        text, counts = scrub(doc.text, self.kinds)
        if counts:
            doc.text = text
            total = Counter(doc.meta.get("pii") or {})
            total.update(counts)
            doc.meta["pii"] = {k: total[k] for k in KINDS if total[k]}
        return doc
