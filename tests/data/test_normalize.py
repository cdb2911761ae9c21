import unicodedata

import pytest

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


def test_whitespace_only_blank_lines_count_as_blank_in_prose():
    assert normalize_text("a\n  \n\t\n \nb") == "a\n\nb"
    assert normalize_text("a\n  \nb") == "a\n  \nb"  # one blank line is left as it is
    assert normalize_text("a\n  \n\t\n \nb", code=True) == "a\n  \n\t\n \nb"


def test_code_keeps_form_feed_prose_drops_it():
    text = "def f():\n    pass\n\x0c\ndef g():\n    pass\n"
    assert normalize_text(text, code=True) == text
    assert normalize_text(text) == text.replace("\x0c", "")
    assert normalize_text("x\x00\x1b\x7f\x85y", code=True) == "xy"


def test_mojibake_repair_only_when_asked():
    broken = "CafÃ© ZÃ¼rich â€” itâ€™s naÃ¯ve"
    assert normalize_text(broken, mojibake=True) == "Café Zürich — it’s naïve"
    assert normalize_text(broken) == broken.replace("\x80", "").replace("\x9d", "")
    # correct text is left alone: no quote uncurling, no HTML unescaping, no width folding
    fine = "“Smart” quotes, &amp; ＦＵＬＬ width, ﬁ ligature, naïve café"
    assert normalize_text(fine, mojibake=True) == fine


@pytest.mark.slow
def test_mojibake_repair_restores_real_utf8_text_read_as_latin_1(shared_data):
    raw = (shared_data / "corpus" / "prose" / "gutenberg" / "2701-0.txt").read_bytes()
    original = raw.decode("utf-8-sig")
    # Moby Dick's curly quotes and dashes (UTF-8) misread as Latin-1, the classic mojibake
    broken = raw[3:].decode("latin-1")
    assert "â\x80\x9d" in broken and broken != original
    assert normalize_text(broken, mojibake=True) == normalize_text(original)


def test_normalize_step_from_config_per_source():
    from smelt.config import DataConfig, SourceConfig
    from smelt.data.ledger import Doc, Ledger
    from smelt.data.normalize import Normalize

    cfg = DataConfig(
        sources=[
            SourceConfig(name="web", mojibake=True),
            SourceConfig(name="books"),
            SourceConfig(name="py", code=True),
        ]
    )
    step = Normalize.from_config(cfg)
    assert step.code_sources == {"py"} and step.mojibake_sources == {"web"}
    text = "CafÃ©\n\n\n\nend"
    out = {s: step.apply(Doc(s, 0, "d", text, "f"), Ledger()).text for s in ("web", "books", "py")}
    assert out == {"web": "Café\n\nend", "books": "CafÃ©\n\nend", "py": "CafÃ©\n\n\n\nend"}
