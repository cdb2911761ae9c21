"""Heuristic filters: every rule at its threshold (just kept / just dropped) on hand-written texts,
filter selection per source, and the filters on real shared text."""

import json
from collections import Counter

import pytest

from smelt.config import (
    C4Config,
    CodeFilterConfig,
    DataConfig,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    SourceConfig,
    UrlFilterConfig,
)
from smelt.data.filters import (
    FILTER_NAMES,
    FILTER_STEPS,
    C4Filter,
    CodeFilter,
    FineWebFilter,
    GopherQuality,
    GopherRepetition,
    LengthFilter,
    UrlBlocklist,
    filter_names,
)
from smelt.data.filters.c4 import c4_clean
from smelt.data.filters.fineweb import fineweb_scores
from smelt.data.filters.gopher import gopher_quality_scores, gopher_repetition_scores, ngram_char_ratios
from smelt.data.ledger import Doc, Ledger
from smelt.data.normalize import normalize_text
from smelt.errors import ConfigError

# A hand-written pool of distinct content words (no stop word among them), 3 to 7 letters.
# fmt: off
POOL = [
    "river", "stone", "garden", "window", "candle", "forest", "market", "bridge", "silver", "winter",
    "harbor", "meadow", "lantern", "pepper", "violin", "castle", "orange", "marble", "valley", "thunder",
    "copper", "anchor", "basket", "canyon", "desert", "falcon", "glacier", "hammer", "island", "jungle",
    "kettle", "ladder", "mirror", "needle", "oyster", "parrot", "quartz", "rocket", "saddle", "tunnel",
    "velvet", "walnut", "yarn", "zebra", "bottle", "cactus", "dragon", "engine", "feather", "goblet",
]
# fmt: on


def doc(text, source="s", id="d", file="f.txt", url=None):
    return Doc(source, 0, id, text, file, url=url)


def run(step, text, **kw):
    """(kept doc or None, the ledger entry or None)."""
    ledger = Ledger()
    ledger.step = step.name
    out = step.apply(doc(text, **kw), ledger)
    return out, (ledger.entries[0] if ledger.entries else None)


def reason(step, text, **kw):
    out, entry = run(step, text, **kw)
    return None if out is not None else entry["reason"]


def prose(n_words, stop_words=2):
    """n words: `stop_words` times "the", the rest from POOL (cycled)."""
    words = ["the"] * stop_words + [POOL[i % len(POOL)] for i in range(n_words - stop_words)]
    return " ".join(words) + "."


# ---------------------------------------------------------------------------------------------
# Selection of filters per source


def test_auto_resolves_to_code_rules_or_gopher():
    assert filter_names(SourceConfig(name="web")) == ["gopher_quality", "gopher_repetition"]
    assert filter_names(SourceConfig(name="py", code=True)) == ["code"]
    assert filter_names(SourceConfig(name="web", filters=["url_blocklist", "auto", "c4", "auto"])) == [
        "url_blocklist",
        "gopher_quality",
        "gopher_repetition",
        "c4",
    ]
    assert filter_names(SourceConfig(name="web", filters=[])) == []


def test_unknown_filter_names_the_key_and_the_valid_names():
    with pytest.raises(ConfigError) as err:
        filter_names(SourceConfig(name="web", filters=["gopher_qualty"]), index=3)
    message = str(err.value)
    assert "data.sources[3].filters" in message and "'web'" in message and "'gopher_qualty'" in message
    assert "did you mean 'gopher_quality'" in message
    assert all(name in message for name in FILTER_NAMES)


def test_from_config_scopes_each_filter_to_the_sources_that_use_it():
    cfg = DataConfig(
        sources=[
            SourceConfig(name="web", filters=["auto", "c4", "fineweb"]),
            SourceConfig(name="books"),
            SourceConfig(name="py", code=True),
        ]
    )
    steps = {cls.__name__: cls.from_config(cfg) for cls in FILTER_STEPS}
    assert steps["GopherQuality"].sources == {"web", "books"}
    assert steps["GopherRepetition"].sources == {"web", "books"}
    assert steps["C4Filter"].sources == {"web"} and steps["FineWebFilter"].sources == {"web"}
    assert steps["CodeFilter"].sources == {"py"}
    assert steps["UrlBlocklist"] is None
    # a code source is not run through prose rules: the Gopher step passes it through untouched
    code = "x=1\n" * 5
    kept = list(steps["GopherQuality"].run([doc(code, source="py")], Ledger()))
    assert kept[0].text == code and "gopher_quality" not in kept[0].meta


def test_from_config_error_names_the_source_index():
    cfg = DataConfig(sources=[SourceConfig(name="a"), SourceConfig(name="b", filters=["c5"])])
    with pytest.raises(ConfigError, match=r"data\.sources\[1\]\.filters .*'c5'"):
        GopherQuality.from_config(cfg)


def test_filter_steps_cover_every_filter_name_once():
    assert sorted(cls.filter_name for cls in FILTER_STEPS) == sorted(FILTER_NAMES)
    assert len({cls.name for cls in FILTER_STEPS}) == len(FILTER_STEPS)
    assert LengthFilter(1, 2).name == "length_filter"


def test_kept_doc_gets_rounded_scores_and_dropped_doc_a_reason_with_scores():
    step = GopherQuality(GopherQualityConfig())
    out, _ = run(step, prose(60))
    scores = out.meta["gopher_quality"]
    assert scores["words"] == 60 and scores["stop_words"] == 2
    assert all(round(v, 4) == v for v in scores.values() if isinstance(v, float))
    _, entry = run(step, prose(10))
    assert entry["reason"] == "gopher_quality.min_words" and entry["step"] == "gopher_quality"
    assert entry["words"] == 10 and entry["kind"] == "dropped"


# ---------------------------------------------------------------------------------------------
# Gopher quality, each rule at its boundary (default thresholds unless stated)


def test_gopher_min_words_50():
    step = GopherQuality(GopherQualityConfig())
    assert reason(step, prose(50)) is None
    assert reason(step, prose(49)) == "gopher_quality.min_words"
    # tokens made only of punctuation or symbols are not words
    assert reason(step, prose(49) + " - -- * |") == "gopher_quality.min_words"


def test_gopher_max_words():
    step = GopherQuality(GopherQualityConfig(max_words=60))
    assert reason(step, prose(60)) is None
    assert reason(step, prose(61)) == "gopher_quality.max_words"


def test_gopher_mean_word_length_3_to_10():
    step = GopherQuality(GopherQualityConfig())
    words = ["the", "and"] + [w for w in ("cat", "dog", "sun", "map", "owl", "fox") for _ in range(8)]
    assert len(words) == 50 and sum(map(len, words)) == 150
    assert reason(step, " ".join(words)) is None  # mean 3.0
    assert reason(step, " ".join(words[:-1] + ["ox"])) == "gopher_quality.min_mean_word_length"  # 2.98
    long_step = GopherQuality(GopherQualityConfig(min_stop_words=0))
    tens = ["everywhere", "background", "basketball", "friendship", "playground"] * 10
    assert reason(long_step, " ".join(tens)) is None  # mean 10.0
    assert reason(long_step, " ".join(tens[:-1] + ["playgrounds"])) == "gopher_quality.max_mean_word_length"


def test_gopher_symbol_ratio_hash_and_ellipsis():
    step = GopherQuality(GopherQualityConfig())
    words = prose(50)[:-1].split()
    five_hash = " ".join(("#" + w if 2 <= i < 7 else w) for i, w in enumerate(words)) + "."
    six_hash = " ".join(("#" + w if 2 <= i < 8 else w) for i, w in enumerate(words)) + "."
    assert reason(step, five_hash) is None  # 5 / 50 = 0.1
    assert reason(step, six_hash) == "gopher_quality.max_symbol_word_ratio"
    five_dots = " ".join((w + "..." if 2 <= i < 7 else w) for i, w in enumerate(words)) + "."
    six_dots = " ".join((w + "…" if 2 <= i < 8 else w) for i, w in enumerate(words)) + "."
    assert reason(step, five_dots) is None
    out, entry = run(step, six_dots)
    assert out is None and entry["reason"] == "gopher_quality.max_symbol_word_ratio"
    assert entry["ellipsis_word_ratio"] == 0.12


def lines_of(n_lines, words_per_line=6, start=0):
    return [
        " ".join(
            ["the"] + [POOL[(start + i * words_per_line + j) % len(POOL)] for j in range(words_per_line - 1)]
        )
        for i in range(n_lines)
    ]


def test_gopher_bullet_lines_90_percent():
    step = GopherQuality(GopherQualityConfig())
    lines = lines_of(10)
    nine = "\n".join(("• " + line if i < 9 else line) for i, line in enumerate(lines))
    ten = "\n".join("- " + line for line in lines)
    assert reason(step, nine) is None
    assert reason(step, ten) == "gopher_quality.max_bullet_lines_ratio"
    # blank lines do not count as lines; "-" without a space after it is not a bullet
    assert reason(step, "\n\n".join("-" + line for line in lines)) is None


def test_gopher_ellipsis_lines_30_percent():
    step = GopherQuality(GopherQualityConfig())
    lines = lines_of(10)
    three = "\n".join((line + " …" if i < 3 else line + ".") for i, line in enumerate(lines))
    four = "\n".join((line + "..." if i < 4 else line + ".") for i, line in enumerate(lines))
    assert reason(step, three) is None
    assert reason(step, four) == "gopher_quality.max_ellipsis_lines_ratio"


def test_gopher_alpha_words_80_percent():
    step = GopherQuality(GopherQualityConfig())
    words = prose(50)[:-1].split()
    forty = " ".join((str(1900 + i) if i >= 40 else w) for i, w in enumerate(words))
    thirty_nine = " ".join((str(1900 + i) if i >= 39 else w) for i, w in enumerate(words))
    assert reason(step, forty) is None  # 40 / 50 words hold a letter
    assert reason(step, thirty_nine) == "gopher_quality.min_alpha_words_ratio"
    assert gopher_quality_scores("x1 2y 33 _ a_b")["alpha_words_ratio"] == 3 / 4


def test_gopher_stop_words_at_least_two_case_insensitive():
    step = GopherQuality(GopherQualityConfig())
    assert reason(step, prose(50, stop_words=0).replace("river", "The", 1) + " with") is None
    assert reason(step, prose(50, stop_words=1)) == "gopher_quality.min_stop_words"
    # "theory" and "tower" contain stop words but are not stop words
    assert gopher_quality_scores("theory tower bewith andes")["stop_words"] == 0


# ---------------------------------------------------------------------------------------------
# Gopher repetition


def only(**limits):
    """A repetition config where every rule is off (1.0) except the ones given."""
    base = {
        "max_dup_line_ratio": 1.0,
        "max_dup_para_ratio": 1.0,
        "max_dup_line_char_ratio": 1.0,
        "max_dup_para_char_ratio": 1.0,
        "max_top_ngram_char_ratio": [1.0, 1.0, 1.0],
        "max_dup_ngram_char_ratio": [1.0] * 6,
    }
    return GopherRepetition(GopherRepetitionConfig(**{**base, **limits}))


def test_dup_line_ratio_30_percent():
    step = only(max_dup_line_ratio=0.3)
    distinct = lines_of(7)
    three_dups = "\n".join(distinct + distinct[:3])  # 3 of 10 lines repeat an earlier one
    four_dups = "\n".join(distinct[:6] + distinct[:4])
    assert reason(step, three_dups) is None
    assert reason(step, four_dups) == "gopher_repetition.max_dup_line_ratio"


def test_dup_para_ratio_30_percent():
    step = only(max_dup_para_ratio=0.3)
    paras = ["\n".join(lines_of(2, start=3 * i)) for i in range(7)]
    assert reason(step, "\n\n".join(paras + paras[:3])) is None
    assert reason(step, "\n\n".join(paras[:6] + paras[:4])) == "gopher_repetition.max_dup_para_ratio"


def test_dup_line_and_para_char_ratio_20_percent():
    line = "the cat sat on mats"  # 19 characters
    assert len(line) == 19
    filler = "a different line that is here to make the total right!!"  # 55 characters
    assert len(filler) == 55
    text = f"{line}\n{line}\n{filler}"  # 19 duplicate characters / 95 = 0.2
    assert len(text) == 95
    step = only(max_dup_line_char_ratio=0.2)
    assert reason(step, text) is None
    assert reason(step, text[:-1]) == "gopher_repetition.max_dup_line_char_ratio"
    para_text = f"{line}\n\n{line}\n\n{filler[:-2]}"  # still 95 characters
    assert len(para_text) == 95
    para_step = only(max_dup_para_char_ratio=0.2)
    assert reason(para_step, para_text) is None
    assert reason(para_step, para_text[:-1]) == "gopher_repetition.max_dup_para_char_ratio"


def two_char_words(n, start=0):
    """n distinct two-character words."""
    return [f"{chr(97 + (i // 10) % 26)}{i % 10}" for i in range(start, start + n)]


@pytest.mark.parametrize("n, limit, count", [(2, 0.20, 2), (3, 0.18, 3), (4, 0.16, 2)])
def test_top_ngram_char_ratio(n, limit, count):
    """The most frequent n-gram (n two-character words) occurs `count` times in a text whose words
    hold exactly `2 n count / limit` characters: kept at the limit, dropped one character later."""
    gram = [f"z{i}" for i in range(n)]
    total_chars = round(2 * n * count / limit)
    filler = two_char_words(total_chars // 2 - n * count)
    words = []
    chunk = len(filler) // count
    for k in range(count):
        words += gram + filler[k * chunk : (k + 1) * chunk]
    words += filler[count * chunk :]
    assert sum(map(len, words)) == total_chars
    limits = [1.0, 1.0, 1.0]
    limits[n - 2] = limit
    step = only(max_top_ngram_char_ratio=limits)
    assert reason(step, " ".join(words)) is None
    shorter = words[:-1] + [words[-1][0]]
    assert reason(step, " ".join(shorter)) == f"gopher_repetition.max_top_{n}gram_char_ratio"


def test_dup_5gram_char_ratio_counts_every_occurrence_once():
    gram = ["v1", "v2", "v3", "v4", "v5"]
    filler = two_char_words(85)
    words = gram + filler[:30] + gram + filler[30:60] + gram + filler[60:]
    assert len(words) == 100  # 200 characters, 15 words (30 characters) inside duplicated 5-grams
    step = GopherRepetition(GopherRepetitionConfig())  # default 0.15 for 5-grams
    out, _ = run(step, " ".join(words))
    assert out.meta["gopher_repetition"]["dup_5gram_char_ratio"] == 0.15
    assert out.meta["gopher_repetition"]["dup_6gram_char_ratio"] == 0.0
    shorter = words[:-1] + ["z"]
    assert reason(step, " ".join(shorter)) == "gopher_repetition.max_dup_5gram_char_ratio"


def test_overlapping_duplicate_ngrams_count_characters_once():
    top, dup = ngram_char_ratios(["ha"] * 12, (2, 3, 4), (5, 6, 7, 8, 9, 10))
    assert dup == [1.0] * 6 and top == [1.0, 1.0, 1.0]
    top, dup = ngram_char_ratios(["a", "b", "c"], (2, 3, 4), (5,))
    assert top == [2 / 3, 1.0, 0.0] and dup == [0.0]  # a single n-gram is the most frequent one


def naive_ngram_ratios(words, n):
    """Reference: n-grams as tuples, positions marked word by word."""
    total = sum(map(len, words))
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(grams)
    if not grams:
        return 0.0, 0.0
    best = max(counts.values())
    top = best * max(sum(map(len, g)) for g, c in counts.items() if c == best) / total
    covered = set()
    for i, g in enumerate(grams):
        if counts[g] > 1:
            covered.update(range(i, i + n))
    return min(top, 1.0), sum(len(words[i]) for i in covered) / total


def test_vectorized_ngrams_match_a_naive_reference_on_real_text(shared_data):
    web = shared_data / "corpus" / "web" / "dolma-cc-sample" / "cc_en_head-0091.jsonl"
    texts = [json.loads(line)["text"] for line in web.read_text().splitlines()]
    texts.append((shared_data / "corpus" / "prose" / "tinyshakespeare" / "input.txt").read_text()[:20000])
    for text in texts:
        words = text.split()
        top, dup = ngram_char_ratios(words, (2, 3, 4), (5, 6, 7, 8, 9, 10))
        for n, got in zip((2, 3, 4), top, strict=True):
            assert got == pytest.approx(naive_ngram_ratios(words, n)[0], abs=1e-12)
        for n, got in zip(range(5, 11), dup, strict=True):
            assert got == pytest.approx(naive_ngram_ratios(words, n)[1], abs=1e-12)


def test_repetition_config_lists_are_checked():
    with pytest.raises(
        ConfigError, match=r"data\.gopher_repetition\.max_top_ngram_char_ratio .* 3 fractions"
    ):
        GopherRepetition(GopherRepetitionConfig(max_top_ngram_char_ratio=[0.2, 0.18]))
    with pytest.raises(ConfigError, match=r"max_dup_ngram_char_ratio"):
        GopherRepetition(GopherRepetitionConfig(max_dup_ngram_char_ratio=[0.1] * 5 + [1.5]))


def test_repetition_scores_of_empty_text_are_zero():
    scores = gopher_repetition_scores("")
    assert set(scores.values()) == {0.0}


# ---------------------------------------------------------------------------------------------
# C4


def test_c4_line_rules_and_rewritten_text():
    text = "\n".join(
        [
            "Menu",
            "Paris is the capital of France.[1]",
            "Enable JavaScript to see this page properly.",
            "We use cookies, see the privacy policy for details.",
            "This line has no final punctuation",
            "It trails off into an ellipsis...",
            "Too short.",
            "Three words here.",
            "A " + "x" * 1001 + " word.",
            'She said "yes".',
            "Is it? Yes! It is. Dr. Who said so.",
        ]
    )
    kept, scores, rule = c4_clean(text, C4Config())
    assert rule is None
    assert (
        kept
        == 'Paris is the capital of France.\nThree words here.\nShe said "yes".\nIs it? Yes! It is. Dr. Who said so.'
    )
    assert scores["sentences"] == 1 + 1 + 1 + 5
    assert scores["removed_javascript"] == 1 and scores["removed_policy"] == 1
    assert scores["removed_no_terminal_punct"] == 3 and scores["removed_few_words"] == 1
    assert scores["removed_long_word"] == 1 and scores["lines"] == 11 and scores["lines_kept"] == 4


def test_c4_min_sentences_5_and_min_words_per_line_3():
    step = C4Filter(C4Config())
    five = "\n".join(f"Sentence number {i} is fine." for i in range(5))
    out, _ = run(step, five)
    assert out.text == five and out.meta["c4"]["sentences"] == 5
    out, entry = run(step, "\n".join(f"Sentence number {i} is fine." for i in range(4)))
    assert out is None and entry["reason"] == "c4.min_sentences" and entry["sentences"] == 4
    words = C4Filter(C4Config(min_sentences=1))
    assert run(words, "Three words here.")[0].text == "Three words here."
    assert reason(words, "Two words.") == "c4.min_sentences"


def test_c4_lorem_ipsum_and_curly_brace_drop_the_page_only_in_kept_lines():
    good = "\n".join(f"Sentence number {i} is fine." for i in range(5))
    step = C4Filter(C4Config())
    assert reason(step, good + "\nLorem ipsum dolor sit amet.") == "c4.drop_lorem_ipsum"
    assert reason(step, good + "\nThe set {1, 2} has two elements.") == "c4.drop_curly_brace"
    assert reason(step, good + "\nfunction f() { return 1 }") is None  # removed line: no final punctuation
    lenient = C4Filter(C4Config(drop_curly_brace=False, require_terminal_punctuation=False))
    assert "function f() { return 1 }" in run(lenient, good + "\nfunction f() { return 1 }")[0].text


def test_c4_is_opt_in():
    assert C4Filter.from_config(DataConfig(sources=[SourceConfig(name="web")])) is None
    step = C4Filter.from_config(DataConfig(sources=[SourceConfig(name="web", filters=["c4"])]))
    assert step.sources == {"web"}


# ---------------------------------------------------------------------------------------------
# FineWeb


def long_line(i, end="."):
    return f"This is line number {i} of a page about rivers{end}"


def test_fineweb_line_punct_ratio_12_percent():
    step = FineWebFilter(FineWebConfig())
    three = "\n".join(long_line(i, "." if i < 3 else "") for i in range(25))  # 3 / 25 = 0.12
    two = "\n".join(long_line(i, "." if i < 2 else "") for i in range(25))
    assert reason(step, three) is None
    assert reason(step, two) == "fineweb.min_line_punct_ratio"


def test_fineweb_short_line_ratio_67_percent():
    step = FineWebFilter(FineWebConfig())

    def page(short):
        lines = [f"Short line {i} here." for i in range(short)] + [long_line(i) for i in range(100 - short)]
        assert all(len(line) <= 30 for line in lines[:short]) and all(
            len(line) > 30 for line in lines[short:]
        )
        return "\n".join(lines)

    assert reason(step, page(67)) is None
    assert reason(step, page(68)) == "fineweb.max_short_line_ratio"


def test_fineweb_dup_line_char_ratio_1_percent():
    step = FineWebFilter(FineWebConfig())
    dup = "This line repeats!!"  # 19 characters, repeated once
    lines = [dup, dup] + [long_line(i) for i in range(40)]
    text = "\n".join(lines)
    chars = len(text) - text.count("\n")
    pad = 1900 - chars  # make the text 1,900 characters without newlines: 19 / 1900 = 0.01
    assert pad > 0
    text = text + " " + "w" * (pad - 2) + "."
    assert len(text) - text.count("\n") == 1900
    assert reason(step, text) is None
    assert reason(step, text[:-2] + ".") == "fineweb.max_dup_line_char_ratio"


def test_fineweb_newline_word_ratio_30_percent():
    step = FineWebFilter(FineWebConfig())
    lines = [
        "Internationalization responsibilities.",
        "Extraordinarily misunderstood characteristics.",
        "Counterrevolutionary telecommunications.",
        "Incomprehensibilities notwithstanding.",
    ]
    text = "\n".join(lines)  # 3 line breaks, 9 words
    assert reason(step, text) == "fineweb.max_newline_word_ratio"
    text10 = text.replace("Extraordinarily", "Extraordinarily truly")  # 3 / 10 = 0.3
    out, _ = run(step, text10)
    assert out.meta["fineweb"]["newline_word_ratio"] == 0.3
    # blank lines between paragraphs are not extra line breaks
    assert fineweb_scores(text10.replace("\n", "\n\n\n"), 30)["newline_word_ratio"] == 0.3


# ---------------------------------------------------------------------------------------------
# Code rules


def test_code_max_line_length_1000():
    step = CodeFilter(CodeFilterConfig())
    body = "\n".join(f"x{i} = {i}" for i in range(30))

    def with_line(n):
        line = "s = '" + "ab " * ((n - 6) // 3) + "'"
        line += " " * (n - len(line))
        assert len(line) == n
        return body + "\n" + line + "\n"

    out, _ = run(step, with_line(1000))
    assert out.meta["code_filter"]["max_line_length"] == 1000
    assert reason(step, with_line(1001)) == "code_filter.max_line_length"


def test_code_mean_line_length_100_ignores_the_final_newline():
    step = CodeFilter(CodeFilterConfig())
    line = "value = '" + "a" * 90 + "'"  # 100 characters
    assert len(line) == 100
    assert reason(step, f"{line}\n{line}\n") is None
    assert reason(step, f"{line}\n{line}x\n") == "code_filter.max_mean_line_length"


def test_code_alnum_ratio_25_percent():
    step = CodeFilter(CodeFilterConfig())
    assert reason(step, "a" * 25 + "=" * 75) is None
    assert reason(step, "a" * 24 + "_" * 76) == "code_filter.min_alnum_ratio"


def test_code_size_bounds_in_utf8_bytes():
    step = CodeFilter(CodeFilterConfig(min_bytes=10, max_bytes=12, min_alnum_ratio=0.0))
    assert reason(step, "x = 'é'  #") is None  # 10 characters, 11 bytes
    assert reason(step, "x = 1  #") == "code_filter.min_bytes"
    assert reason(step, "x = 'éé' #") is None  # 12 bytes
    assert reason(step, "x = 'ééé' ") == "code_filter.max_bytes"  # 10 characters, 13 bytes


def test_code_autogenerated_marker_in_first_five_lines():
    step = CodeFilter(CodeFilterConfig())
    lines = [f"a{i} = {i}" for i in range(10)]
    at_five = "\n".join(lines[:4] + ["# This file was automatically generated."] + lines[4:])
    at_six = "\n".join(lines[:5] + ["# DO NOT EDIT"] + lines[5:])
    assert reason(step, at_five) == "code_filter.drop_autogenerated"
    assert reason(step, at_six) is None
    assert reason(CodeFilter(CodeFilterConfig(drop_autogenerated=False)), at_five) is None


def test_code_minified_by_name_or_shape():
    step = CodeFilter(CodeFilterConfig(max_line_length=10**6, max_mean_line_length=10**6))
    js = "a.b=function(c){return c+1};" * 60  # 1,680 characters, one line, no whitespace
    assert reason(step, js) == "code_filter.drop_minified"
    assert reason(step, "var a = 1;\n", file="static/jquery.min.js") == "code_filter.drop_minified"
    assert reason(step, "var a = 1;\n", file="static/admin.js") is None
    spaced = "var a = 1; " * 150  # the same shape with normal spacing is not minified
    assert reason(step, spaced) is None
    assert (
        reason(
            CodeFilter(
                CodeFilterConfig(drop_minified=False, max_line_length=10**6, max_mean_line_length=10**6)
            ),
            js,
        )
        is None
    )


# ---------------------------------------------------------------------------------------------
# URL blocklist


BLOCKLIST = """# adult and spam domains
example.com
*.casino.test      # wildcard form, same meaning
/ads?/\\d+           # a URL regex
"""


def blocklist_step(tmp_path, text=BLOCKLIST):
    path = tmp_path / "block.txt"
    path.write_text(text)
    cfg = DataConfig(
        sources=[SourceConfig(name="web", filters=["url_blocklist"])], url_filter=UrlFilterConfig(str(path))
    )
    return UrlBlocklist.from_config(cfg)


def test_url_blocklist_domains_subdomains_and_patterns(tmp_path):
    step = blocklist_step(tmp_path)
    assert step.hosts == {"example.com", "casino.test"} and len(step.patterns) == 1
    out, entry = run(step, "text", url="https://WWW.Example.com:8080/page")
    assert out is None and entry["reason"] == "url_blocklist.domain" and entry["matched"] == "example.com"
    assert reason(step, "text", url="http://a.b.casino.test/x") == "url_blocklist.domain"
    assert reason(step, "text", url="http://notexample.com/") is None
    assert reason(step, "text", url="example.com/path") == "url_blocklist.domain"
    assert reason(step, "text", url="https://news.test/ad/123") == "url_blocklist.pattern"
    assert reason(step, "text", url="https://news.test/adage") is None
    out, _ = run(step, "text")  # no URL: passes
    assert out.meta["url_blocklist"] == {"has_url": False}


def test_url_blocklist_config_errors(tmp_path):
    cfg = DataConfig(sources=[SourceConfig(name="web", filters=["url_blocklist"])])
    with pytest.raises(ConfigError, match=r"data\.url_filter\.blocklist is empty.*web"):
        UrlBlocklist.from_config(cfg)
    cfg.url_filter.blocklist = str(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match=r"data\.url_filter\.blocklist = .*missing\.txt.* cannot be read"):
        UrlBlocklist.from_config(cfg)
    with pytest.raises(ConfigError, match=r"block\.txt, line 2: '\(unclosed' is neither"):
        blocklist_step(tmp_path, "ok.com\n(unclosed\n")
    assert UrlBlocklist.from_config(DataConfig(sources=[SourceConfig(name="web")])) is None


# ---------------------------------------------------------------------------------------------
# Real shared text


@pytest.mark.slow
def test_real_prose_is_kept_and_shakespeare_dialogue_dropped_by_repeated_lines(shared_data):
    cfg = DataConfig()
    steps = [GopherQuality(cfg.gopher_quality), GopherRepetition(cfg.gopher_repetition)]
    speeches = sorted((shared_data / "corpus" / "prose" / "nltk_inaugural").glob("*.txt"))
    texts = [
        normalize_text(p.read_bytes().decode("utf-8", "replace")) for p in speeches if "README" not in p.name
    ]
    assert len(texts) == 59
    for step in steps:
        kept = [t for t in texts if run(step, t)[0] is not None]
        assert len(kept) == len(texts), step.name
    # Gutenberg books cut into chapters of ~150 paragraphs: all kept by both Gopher filters
    book = (shared_data / "corpus" / "prose" / "gutenberg" / "1342-0.txt").read_text(encoding="utf-8-sig")
    paras = normalize_text(book).split("\n\n")
    chunks = ["\n\n".join(paras[i : i + 150]) for i in range(0, len(paras), 150)]
    assert all(run(step, chunk)[0] is not None for chunk in chunks for step in steps)
    # FineWeb drops Shakespeare's dialogue for its repeated speaker lines ("ROMEO:")
    play = normalize_text((shared_data / "corpus" / "prose" / "tinyshakespeare" / "input.txt").read_text())
    scene = play[:20000]
    out, entry = run(FineWebFilter(cfg.fineweb), scene)
    assert out is None and entry["reason"] == "fineweb.max_dup_line_char_ratio"


def test_real_web_teaser_list_dropped_by_ellipsis_rule(shared_data):
    web = shared_data / "corpus" / "web" / "dolma-cc-sample"
    records = [json.loads(line) for p in sorted(web.glob("*.jsonl")) for line in p.read_text().splitlines()]
    step = GopherQuality(GopherQualityConfig())
    reasons = {r["id"]: reason(step, normalize_text(r["text"])) for r in records}
    kept = [i for i, r in reasons.items() if r is None]
    assert len(kept) >= 16  # curated CC text: nearly all kept
    # a page of headlines cut off with "..." is a list of teasers
    teaser = "http://cempaka-tourist.blogspot.com/2017/07/aborigines-in-australia-longer-than.html"
    assert reasons[teaser] in {"gopher_quality.min_words", "gopher_quality.max_ellipsis_lines_ratio"}
    text = normalize_text(next(r["text"] for r in records if r["id"] == teaser))
    assert gopher_quality_scores(text)["ellipsis_lines_ratio"] == 1.0


@pytest.mark.slow
def test_real_code_mostly_kept_and_generated_files_dropped(shared_data):
    path = shared_data / "corpus" / "code" / "cpython_stdlib_lib.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    step = CodeFilter(CodeFilterConfig())
    reasons = {r["path"]: reason(step, normalize_text(r["text"], code=True), id=r["path"]) for r in records}
    nonempty = [r["path"] for r in records if r["text"].strip()]
    kept = [p for p in nonempty if reasons[p] is None]
    assert len(kept) >= 0.98 * len(nonempty)
    assert reasons["Lib/token.py"] == "code_filter.drop_autogenerated"  # "# Auto-generated by Tools/..."
    assert reasons["Lib/stringprep.py"] == "code_filter.drop_autogenerated"  # "DO NOT EDIT"
