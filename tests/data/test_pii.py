"""PII patterns: positive and negative cases per kind, the step, and a pass over real code and prose.

Every key below is made up (right shape, random characters); none was ever valid."""

import json

import pytest

from smelt.config import DataConfig, PiiConfig, SourceConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.pii import KINDS, Pii, scrub
from smelt.data.steps import run_steps
from smelt.errors import ConfigError


def replaced(text: str, kinds=KINDS) -> str:
    return scrub(text, kinds)[0]


def assert_kept(text: str) -> None:
    new, counts = scrub(text)
    assert new == text and counts == {}, f"changed: {text!r} -> {new!r}"


# ---------------------------------------------------------------------------------------------
# e-mail


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Contact jane.doe+news@example.co.uk today.", "Contact <EMAIL> today."),
        ('__author__ = "Guido <guido@python.org>"', '__author__ = "Guido <<EMAIL>>"'),
        ("mailto:first_last-2@mail.sub-domain.org", "mailto:<EMAIL>"),
        ("(write to ops@example.museum)", "(write to <EMAIL>)"),
        ("Grüße an jürgen@example.de.", "Grüße an <EMAIL>."),
    ],
)
def test_email_replaced(text, expected):
    assert scrub(text) == (expected, {"email": 1})


@pytest.mark.parametrize(
    "text",
    [
        "@property\ndef x(self): ...",
        "y = a@b",  # matrix product
        "y = self.x@self.weight.T",  # one-letter final label
        "z = a@self.w.sum()",  # a call follows: code, not mail
        "'ks_in@devanagari.utf8'",  # locale alias: the final label has a digit
        "root@localhost",
        "x@y.z",
        "a" * 70 + "@example.com",  # local part longer than 64 characters
    ],
)
def test_email_kept(text):
    assert_kept(text)


# ---------------------------------------------------------------------------------------------
# phone


@pytest.mark.parametrize(
    "number",
    [
        "(415) 555-2671",
        "(415) 555 2671",
        "(415)555-2671",
        "415-555-2671",
        "415.555.2671",
        "1-800-555-0199",
        "+1 415 555 2671",
        "+1-415-555-2671",
        "+44 20 7946 0958",
        "+49 (0)30 1234567",
        "+49 40 890 85-433",
        "+33 1 23 45 67 89",
        "+7 (495) 123-45-67",
        "+14155552671",
    ],
)
def test_phone_replaced(number):
    assert scrub(f"Call {number} now.") == ("Call <PHONE> now.", {"phone": 1})


@pytest.mark.parametrize(
    "text",
    [
        "released on 2021-03-15 at 10:30",
        "Python version 3.10.12 and 2.7.18",
        "ISBN 978-0-306-40615-7",
        "ISBN 0-306-40615-2",
        "ISBN 212-555-1234",  # the right shape, but labelled as an ISBN
        "MAGIC = 12345678901234",  # digit runs without separators
        "x = 4155552671",
        "Decimal('+35236450.6')",  # a signed decimal, not a number to call
        "Decimal('+1234.5678')",
        "1e+100000000",
        "555-1234",  # no area code
        "123-456-7890",  # area codes and exchanges start with 2-9
        "415-155-2671",
        "415-555.2671",  # mixed separators
        "020 7946 0958",  # national formats without + are left alone
        "+1 2 3",  # too few digits
        "pages 1850-1900",
        "x = [+12, 345]",
    ],
)
def test_phone_kept(text):
    assert_kept(text)


# ---------------------------------------------------------------------------------------------
# IP addresses


@pytest.mark.parametrize(
    "text, expected",
    [
        ("login from 81.2.69.160 at noon", "login from <IP_ADDRESS> at noon"),
        ("dns server 8.8.8.9", "dns server <IP_ADDRESS>"),  # x.x.x.x next to a network word
        ("ping 203.0.114.7.", "ping <IP_ADDRESS>."),
        ("host = '2607:f8b0:4005:80a::200e'", "host = '<IP_ADDRESS>'"),
        ("connect to [2a00:1450:4001:81b::200e]:443", "connect to [<IP_ADDRESS>]:443"),
        ("addr 2a00:1450:4001:81b:0:0:0:200e%eth0", "addr <IP_ADDRESS>"),
        ("mapped ::ffff:81.2.69.160 here", "mapped ::ffff:<IP_ADDRESS> here"),
    ],
)
def test_ip_replaced(text, expected):
    assert scrub(text) == (expected, {"ip": 1})


@pytest.mark.parametrize(
    "text",
    [
        # private, loopback, unspecified, link-local, CGNAT, documentation, multicast, reserved
        "bind 127.0.0.1 or 0.0.0.0, 10.1.2.3, 172.16.5.4, 192.168.1.1, 169.254.0.1, 100.64.1.1",
        "docs use 192.0.2.1, 198.51.100.7 and 203.0.113.9; multicast 224.0.0.251; 255.255.255.255",
        "ipv6 ::1, ::, fe80::1ff:fe23:4567:890a, fd12:3456:789a::1, 2001:db8::8a2e:370:7334, ff02::1",
        "mapped ::ffff:10.0.0.1",
        "resolver 8.8.8.8 and 1.1.1.1 and 2001:4860:4860::8888",  # public DNS identifies nobody
        "version 1.2.3.4",
        "v1.2.3.4",
        "release 11.20.30.40",
        "bump to 1.2.3.4 soon",  # x.x.x.x without a network word: a version (BigCode)
        "see section 8.2.4.44 of the HTML spec",
        "OID 2.5.29.17",
        "oid_string(), '2.5.4.10'",
        "1.3.6.1.4.1.311",  # a longer OID
        "1.0.0.127.in-addr.arpa",
        "999.1.1.1 and 1.2.3",
        "a[1::2] and b[::-1] and dead::beef",  # slices and words, not addresses
        "at 12:30:45",
        "mac 00:1a:2b:3c:4d:5e",
        "std::vector<int> v; ab::cd::ef(x)",
    ],
)
def test_ip_kept(text):
    assert_kept(text)


# ---------------------------------------------------------------------------------------------
# secrets

FAKE_PEM_BODY = (
    "MIIEpAIBAAKCAQEAu7Zq2Xk9Vb3mN4pQ8rT1wY6eH0jL5sD2fG9aK3cV7bN1mX4z\n"
    "Qp8Rt2Wy5Eu7Io9Pa1Sd3Fg6Hj8Kl0Zx2Cv4Bn6Mq8Wr1Ty3Ui5Op7As9Df2Gh4J\n"
    "k6L8z0X2c4V6b8N0m2Q4w6E8r0T2y4U6i8O0p2A4s6D8f0G2h4J6k8L0zXcVbNmQ==\n"
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("key = AKIAZ3X9Q2W7E5R1T8Y4", "key = <SECRET>"),
        ("id ASIAQ7W2E9R4T1Y6U3I8 end", "id <SECRET> end"),
        ("gcp: AIzaSyD3x9Q-2W7e5R1t8Y4u6I0o_PaSdFgHjKl", "gcp: <SECRET>"),
        ("GH=ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7c", "GH=<SECRET>"),
        (
            "github_pat_11AB2CD3E0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567 x",
            "<SECRET> x",
        ),
        ("xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1", "<SECRET>"),
        ("stripe sk_live_51Hx9QbC2dE3fG4hI5jK6lM7n;", "stripe <SECRET>;"),
        ("rk_live_51Hx9QbC2dE3fG4hI5jK6lM7n", "<SECRET>"),
        ("OPENAI=sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l", "OPENAI=<SECRET>"),
        ("k = 'sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l'", "k = '<SECRET>'"),
        (
            "Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6"
            "IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            "Authorization: Bearer <SECRET>",
        ),
        (
            f"before\n-----BEGIN RSA PRIVATE KEY-----\n{FAKE_PEM_BODY}-----END RSA PRIVATE KEY-----\nafter",
            "before\n<SECRET>\nafter",
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\\n"
            + FAKE_PEM_BODY.replace("\n", "\\n")
            + '-----END OPENSSH PRIVATE KEY-----"',
            '<SECRET>"',
        ),
        ('password = "x7Gq2mPz9LwR4v"', 'password = "<SECRET>"'),
        ('{"api_key": "a8f3k2m9q1z7x4c6"}', '{"api_key": "<SECRET>"}'),
        ("DB_PASSWORD=Zq8wX2pL9mV4nB7cR1tY", "DB_PASSWORD=<SECRET>"),
        ("SECRET_KEY=dGhpcyBpcyBhIHNlY3JldCBrZXk5==", "SECRET_KEY=<SECRET>"),
        ("client_secret: 'Qm3nV8xZ1pL6wR4tY9sK'", "client_secret: '<SECRET>'"),
        ("GITHUB_TOKEN := `9f8e7d6c5b4a39281706`", "GITHUB_TOKEN := `<SECRET>`"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz9Xq1LmNo",
            "aws_secret_access_key = <SECRET>",
        ),
        (
            "https://x.example.com/cb?access_token=ya29a0AfH6SMBx9Qw2Er7Ty4Ui1Op8",
            "https://x.example.com/cb?access_token=<SECRET>",
        ),
    ],
)
def test_secret_replaced(text, expected):
    assert scrub(text) == (expected, {"secret": 1})


@pytest.mark.parametrize(
    "text",
    [
        'PEM_HEADER = "-----BEGIN PRIVATE KEY-----"\nPEM_FOOTER = "-----END PRIVATE KEY-----"',
        "-----BEGIN CERTIFICATE-----\n" + FAKE_PEM_BODY + "-----END CERTIFICATE-----",  # public
        "AKIAZ3X9Q2W7E5R1T8Y",  # 19 characters
        "XAKIAZ3X9Q2W7E5R1T8Y4",  # inside a word
        "sk_test_51Hx9QbC2dE3fG4hI5jK6lM7n",  # test keys unlock nothing
        "ask_live_51Hx9QbC2dE3fG4hI5jK6lM7n",
        "pip install scikit-learn sk-learn",
        "sk-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",  # no digits, low entropy
        "task-runner-with-a-very-long-hyphenated-name-2",
        "ghp_short",
        "eyJhbGciOiJIUzI1NiJ9 alone",  # a header is not a token
        'password = "changeme123"',  # placeholder words
        'api_key = "YOUR_API_KEY_HERE1"',
        'token = "${GITHUB_TOKEN}"',
        'password = "%(password)s"',
        'password = "correcthorse"',  # no digit: a word, not a credential
        'token_type = "bearer12345678"',  # the keyword does not end the name
        'password = os.environ["DB_PASSWORD"]',
        "passwd='geheim$parole'",
        'if password == "x7Gq2mPz9LwR4v":',  # a comparison, not an assignment
        "token = compute_token_from(request, 42)",
        "secret_key = settings.SECRET_KEY_2",
        "secret_key = settings.APP_KEY_27x",
        "The password: hunter2 was weak.",
    ],
)
def test_secret_kept(text):
    assert_kept(text)


# ---------------------------------------------------------------------------------------------
# all kinds together, and the step


def test_every_kind_counted_and_only_enabled_kinds_replaced():
    text = (
        "mail bob@example.org or call +44 20 7946 0958 from 81.2.69.160 using "
        'api_key = "a8f3k2m9q1z7x4c6" and alice@example.com'
    )
    new, counts = scrub(text)
    assert counts == {"email": 2, "phone": 1, "ip": 1, "secret": 1}
    assert new == ('mail <EMAIL> or call <PHONE> from <IP_ADDRESS> using api_key = "<SECRET>" and <EMAIL>')
    only_mail, counts = scrub(text, ("email",))
    assert counts == {"email": 2}
    assert "+44 20 7946 0958" in only_mail and "81.2.69.160" in only_mail and "a8f3k2m9q1z7x4c6" in only_mail


def test_overlaps_and_neighbours():
    # a JWT in a token assignment: one secret, not two
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    assert scrub(f'token = "{jwt}"') == ('token = "<SECRET>"', {"secret": 1})
    # a query string: the token ends at `&`, the address after it is an address
    text = "https://example.com/cb?token=Zq8wX2pL9mV4nB7c&email=bob@mail.org"
    assert scrub(text) == ("https://example.com/cb?token=<SECRET>&email=<EMAIL>", {"email": 1, "secret": 1})


def test_scrub_is_idempotent():
    text = "mail bob@example.org, call (415) 555-2671, host 81.2.69.160, key AKIAZ3X9Q2W7E5R1T8Y4"
    once, counts = scrub(text)
    assert sum(counts.values()) == 4
    assert scrub(once) == (once, {})


def doc(text: str, source: str = "s", **meta) -> Doc:
    return Doc(source, 0, "a", text, "f", meta=dict(meta))


def test_step_counts_into_meta_and_never_drops():
    ledger = Ledger()
    docs = [doc("write to bob@example.org or amy@example.org"), doc("nothing here"), doc("", "t")]
    docs[1].meta["lang"] = "en"
    out = list(run_steps([Pii()], docs, ledger))
    assert len(out) == 3 and ledger.entries == []
    assert out[0].text == "write to <EMAIL> or <EMAIL>" and out[0].meta == {"pii": {"email": 2}}
    assert out[1].meta == {"lang": "en"}  # no zero counts
    assert ledger.steps[("pii", "s", "in")] == 2 and ledger.steps[("pii", "s", "out")] == 2


def test_step_adds_to_existing_counts():
    d = doc("call +44 20 7946 0958", pii={"email": 1, "phone": 2})
    assert Pii().apply(d, Ledger()).meta["pii"] == {"email": 1, "phone": 3}


def test_from_config():
    assert isinstance(Pii.from_config(DataConfig()), Pii)
    assert Pii.from_config(DataConfig(pii=PiiConfig(enabled=False))) is None
    assert Pii.from_config(DataConfig(pii=PiiConfig(kinds=[]))) is None
    step = Pii.from_config(DataConfig(pii=PiiConfig(kinds=["secret", "email"])))
    assert step.kinds == ("email", "secret")
    assert step.apply(doc("call (415) 555-2671 or bob@example.org"), Ledger()).text == (
        "call (415) 555-2671 or <EMAIL>"
    )


def test_unknown_kind_is_a_config_error_naming_the_key():
    cfg = DataConfig(sources=[SourceConfig(name="s")], pii=PiiConfig(kinds=["email", "names"]))
    with pytest.raises(ConfigError) as err:
        Pii.from_config(cfg)
    message = str(err.value)
    assert "data.pii.kinds" in message and "'names'" in message
    assert all(kind in message for kind in KINDS)


# ---------------------------------------------------------------------------------------------
# real text


def test_real_code_and_prose(shared_data):
    """The stdlib carries author addresses and example IPs; prose a publisher's phone number. What
    must change changes, what must stay (versions, OIDs, private IPs, decimals) stays."""
    corpus = shared_data / "corpus"
    with open(corpus / "code" / "cpython_stdlib_lib.jsonl", encoding="utf-8") as handle:
        files = {record["path"]: record["text"] for record in map(json.loads, handle)}
    totals: dict[str, int] = {}
    scrubbed = {}
    for path, text in files.items():
        scrubbed[path], counts = scrub(text)
        for kind, n in counts.items():
            totals[kind] = totals.get(kind, 0) + n
    assert totals.get("email", 0) >= 100  # author and list addresses in docstrings and headers
    assert totals.get("secret", 0) == 0  # the stdlib holds no credentials
    assert totals.get("phone", 0) == 0
    everything = "\n".join(scrubbed.values())
    assert "guido@python.org" not in everything and "<EMAIL>" in everything
    for kept in ("127.0.0.1", "Decimal('+35236450.6')", "'13.2.5.8 Tag name state'", "192.168.0.1"):
        assert kept.strip("'") in everything, kept
    assert "(123.45.67.89)" not in everything  # the socket docs' public example address

    book = (corpus / "prose" / "gutenberg" / "1342-0.txt").read_text(encoding="utf-8-sig")
    new, counts = scrub(book)
    assert counts.get("phone", 0) >= 1 and "(801) 596-1887" not in new  # the foundation's number
    assert counts.get("email", 0) >= 1 and "@pglaf.org" not in new
    # nothing but the replaced spans changed: removing placeholders leaves a subsequence of the text
    assert len(new) < len(book) and new.count("<PHONE>") == counts["phone"]
