"""The secrets PII scrubbing replaces (data/pii.py says what is found and kept): API keys and tokens of
known shapes, private key blocks with their body, and random-looking values of password/secret/token
assignments. Each pattern starts with a literal so that CPython's `re` can search for it fast."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator

Span = tuple[int, int]  # [start, end) of the text to replace

# ---------------------------------------------------------------------------------------------
# Secrets. Each pattern starts with a literal; a word-boundary check comes right after the literal as
# a lookbehind (`A(?<!\wA)`), where it does not hide the literal from the fast search.


def _openai_ok(token: str) -> bool:
    return _looks_random(token[3:], 3.5)  # not `sk-` + a long hyphenated identifier


# (pattern, characters of the token before the match, extra check of the token or None). Patterns are
# anchored on a rare character inside the prefix (`k-` of `sk-`, `J` of `eyJ`) where the first one is
# common: a scan is as fast as its first character is rare.
_SECRET_TOKENS: list[tuple[re.Pattern, int, Callable[[str], bool] | None]] = [
    # AWS access key ids and GCP API keys.
    (
        re.compile(
            r"A(?<![A-Za-z0-9_]A)(?:(?:3T[A-Z0-9]|KIA|SIA|GPA|IDA|ROA|IPA|NPA|NVA|BIA|CCA)[A-Z0-9]{16}"
            r"(?![A-Za-z0-9_])|Iza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-]))"
        ),
        0,
        None,
    ),
    # GitHub personal, OAuth, user-to-server, server-to-server and refresh tokens; fine-grained PATs.
    (re.compile(r"gh(?<![A-Za-z0-9_]gh)[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])"), 0, None),
    (re.compile(r"github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{22,244}(?![A-Za-z0-9_])"), 0, None),
    # Slack bot, user, app, refresh and legacy tokens: xoxb-<team>-<bot>-<secret>.
    (
        re.compile(
            r"xox(?<![A-Za-z0-9_]xox)[baprs]-[0-9A-Za-z]{6,}(?:-[0-9A-Za-z]{6,}){1,4}(?![A-Za-z0-9_-])"
        ),
        0,
        None,
    ),
    # Stripe live secret and restricted keys: sk_live_..., rk_live_...
    (
        re.compile(r"k_live_(?<=[sr]k_live_)(?<![A-Za-z0-9_][sr]k_live_)[0-9A-Za-z]{16,247}(?![A-Za-z0-9_])"),
        1,
        None,
    ),
    # OpenAI-style keys: sk-..., sk-proj-..., sk-ant-api03-...
    (
        re.compile(
            r"k-(?<=sk-)(?<![A-Za-z0-9_]sk-)(?:[a-z]{2,8}(?:[0-9]{2})?-){0,2}[A-Za-z0-9_-]{32,200}"
            r"(?![A-Za-z0-9_-])"
        ),
        1,
        _openai_ok,
    ),
    # JSON Web Tokens: base64url header and payload (both JSON objects, so `eyJ`), optional signature.
    (
        re.compile(r"J(?<=eyJ)(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
        2,
        None,
    ),
]
# The body: base64, whitespace, quotes and escaped newlines (keys pasted into string literals), and
# PEM header fields. It stops at the END line or at the first character that cannot belong to a key,
# so a PEM header written alone as a string constant has (almost) no body and is not replaced.
_KEY_BLOCK = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----"
    r"(?P<body>(?:\\[nr]|[A-Za-z0-9+/=\s\"']|(?:Proc-Type|DEK-Info|Comment|Version):[^\n]*)*)"
    r"(?:-----END[A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----)?"
)
_KEY_BLOCK_MIN_BODY = 64  # alphanumeric characters: a real key has hundreds
# `<keyword>["']? <op> "value"` or `<keyword> <op> value`; the keyword is checked in _assign_spans.
# Two scans, one per operator character, because a literal first character is what makes a scan fast.
# A bare value stops at `:`, `=` and `&` (base64 padding `==` aside), so a scan from one operator
# never runs past the next one (`a:a:a:...` costs one pass) and `?token=...&user=...` yields the token.
_ASSIGN_VALUE = (
    r"[ \t]*(?:(?P<q>[\"'`])(?P<quoted>[^\"'`\s\\]{8,256})(?P=q)"
    r"|(?P<bare>[^\"'`\s\\,;)(\[\]{}<>:=&]{16,256}={0,2})(?![^\s,;)\]}&]))"
)
_ASSIGN = (re.compile("=>?" + _ASSIGN_VALUE), re.compile(":=?" + _ASSIGN_VALUE))
_ASSIGN_KEYWORDS = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "access_key",
    "access-key",
    "accesskey",
    "secret_key",
    "secretkey",
    "secret-key",
    "private_key",
    "privatekey",
    "auth_key",
    "authkey",
    "credential",
    "credentials",
)
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}\Z")
_SECRET_PLACEHOLDER = re.compile(
    r"(?i)example|changeme|change_me|your|xxxx|\*\*\*|dummy|placeholder|redacted|sample|secret|password"
    r"|token|\$\{|\{\{|%\(|<[a-z_]+>"
)


def _entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def _looks_random(value: str, min_entropy: float) -> bool:
    """A credential rather than a word, identifier or template: letters and digits both present (a
    random 16-character base62 string lacks digits 6% of the time; identifiers and words nearly always
    do), no placeholder words (`your_api_key`, `${TOKEN}`), and Shannon entropy of at least
    `min_entropy` bits per character."""
    if not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if _SECRET_PLACEHOLDER.search(value):
        return False
    return _entropy(value) >= min_entropy


def secret_spans(text: str) -> Iterator[Span]:
    if "-----BEGIN" in text:
        for m in _KEY_BLOCK.finditer(text):
            if sum(c.isalnum() for c in m.group("body")) >= _KEY_BLOCK_MIN_BODY:
                yield m.span()
    for regex, before, check in _SECRET_TOKENS:
        for m in regex.finditer(text):
            start, end = m.start() - before, m.end()
            if check is None or check(text[start:end]):
                yield start, end
    yield from _assign_spans(text)


def _assign_spans(text: str) -> Iterator[Span]:
    for m in (m for regex in _ASSIGN for m in regex.finditer(text)):
        head = text[max(0, m.start() - 64) : m.start()].rstrip("\"' \t").lower()
        if not head.endswith(_ASSIGN_KEYWORDS):
            continue
        group = "quoted" if m.group("quoted") is not None else "bare"
        value = m.group(group)
        if group == "bare" and _DOTTED_NAME.fullmatch(value):
            continue  # `secret = settings.APP_KEY_2`: code, not a credential
        aws = "aws" in head[-32:] and head.endswith(("secret_access_key", "secretaccesskey", "secret_key"))
        if (aws and _AWS_SECRET.match(value)) or _looks_random(value, 3.0 if group == "quoted" else 3.5):
            yield m.span(group)
