import unicodedata

from smelt.data.normalize import normalize_text


def test_nfc():
    decomposed = "Cafe\u0301 Zu\u0308rich"
    out = normalize_text(decomposed)
    assert out == "Café Zürich"
    assert unicodedata.is_normalized("NFC", out)


def test_newlines_crlf_and_lone_cr():
    assert normalize_text("a\r\nb\rc\n") == "a\nb\nc\n"
    assert normalize_text("a\r\n\r\n\r\n\r\nb", code=True) == "a\n\n\n\nb"


def test_control_characters_removed_but_newline_and_tab_kept():
    text = "a\x00b\x07c\td\ne\x1bf\x7fg\x85h\x0ci\x0bj"
    assert normalize_text(text) == "abc\td\nefghij"


def test_blank_line_collapse_for_prose_only():
    text = "para one\n\n\n\n\npara two\n\n\nthree\n\nfour"
    assert normalize_text(text) == "para one\n\npara two\n\nthree\n\nfour"
    code = "def f():\n    pass\n\n\n\nclass A:\n  \t x = 1  \n"
    assert normalize_text(code, code=True) == code


def test_collapse_applies_after_control_removal():
    assert normalize_text("a\n\x00\n\x00\nb") == "a\n\nb"


def test_never_lowercases_and_keeps_other_whitespace():
    text = "HELLO World  \n  Indented\u00a0NBSP"
    assert normalize_text(text) == text
