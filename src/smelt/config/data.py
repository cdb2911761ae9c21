"""The `[data]` section: sources, and the settings of each curation step."""

from __future__ import annotations

from dataclasses import dataclass, field

from smelt.config.fields import option


@dataclass
class SourceConfig:
    name: str = option("", help="source name; becomes documents/<split>/<name>/")
    format: str = option(
        "text",
        choices=("text", "jsonl", "parquet", "html", "warc"),
        help="text/html: one document per file; jsonl/parquet: one per record; warc: one per HTML response",
    )
    root: str = option(".", help="directory the globs are relative to; `{stdlib}` is this Python's stdlib")
    include: list[str] = option(["**/*"], help="glob patterns relative to root")
    exclude: list[str] = option([], help="glob patterns (relative to root) to leave out")
    text_field: str = option("text", help="record field with the text (jsonl, parquet)")
    id_field: str = option("", help="record field with a stable id; empty: <file>:<record number>")
    url_field: str = option("", help="record field with the URL, if any")
    code: bool = option(False, help="code keeps its whitespace exactly (no blank-line collapsing)")
    max_files: int = option(0, range=(0, 10**9), help="read at most this many files (0: all)")
    extractor: str = option(
        "trafilatura",
        choices=("trafilatura", "resiliparse"),
        help="HTML main-text extractor (html, warc): trafilatura extracts cleaner text (F1 0.96 vs 0.93 on "
        "the shared benchmark), resiliparse is ~10x faster; figures from bench/extraction.py",
    )
    mojibake: bool = option(False, help="repair mojibake (text decoded with the wrong codec) with ftfy")
    languages: list[str] = option(
        [], help="language keep-list, ISO 639-1 codes such as en, de, zh (empty: keep every language)"
    )
    declared_language: str = option(
        "",
        help="the language the data says its documents are in (kept as meta.declared_lang; per-language "
        "figures group by it, with the language id label beside it): a code such as pl for every document, "
        "`file` (the file name before its first dot: pl.txt -> pl), `dir` (the top directory) or "
        "field:<record field> (jsonl, parquet); empty: none",
    )
    lang_threshold: float = option(
        0.65, range=(0.0, 1.0), help="minimum language-id confidence (0-1) when `languages` is set"
    )
    filters: list[str] = option(
        ["auto"],
        help="filter steps for this source: gopher_quality, gopher_repetition, c4, fineweb, code, "
        "url_blocklist; `auto`: code for code sources, else gopher_quality + gopher_repetition",
    )
    split_unit: str = option(
        "id",
        help="provenance unit hashed into a split: id, document (each part of a cut text file on its own), "
        "url, domain, file, dir, or field:<record field>; a unit lands whole in one split",
    )
    part_chars: int = option(
        200_000,
        range=(0, 10**12),
        help="format text (not code): a longer file becomes documents of about this many characters, cut "
        "at blank lines (else line ends), ids <file>#part0000, all in the file's split; 0: one per file",
    )


@dataclass
class BoilerplateConfig:
    enabled: bool = option(
        True, help="strip publishers' wrappers (headers, licence footers) from non-code documents"
    )
    publishers: list[str] = option(
        ["gutenberg"], help="wrappers to strip, by name (known: gutenberg); see data/filters/boilerplate.py"
    )


@dataclass
class LangIdConfig:
    enabled: bool = option(True, help="identify the language of every non-code document (lang, lang_score)")
    max_chars: int = option(
        1000,
        range=(50, 10**9),
        help="characters classified per document; longer ones are sampled in 4 windows spread over the text",
    )
    backend: str = option(
        "py3langid",
        choices=("py3langid", "lingua", "lingua_low"),
        help="py3langid (fast, in the base install); lingua (more accurate, ~1.2 GB of models; the "
        "langid-lingua extra); lingua_low (lingua's low-accuracy mode, ~130 MB)",
    )


@dataclass
class GopherQualityConfig:
    min_words: int = option(50, range=(0, 10**9))
    max_words: int = option(100_000, range=(1, 10**12))
    min_mean_word_length: float = option(3.0, range=(0.0, 1000.0), help="characters per word")
    max_mean_word_length: float = option(10.0, range=(0.0, 1000.0), help="characters per word")
    max_symbol_word_ratio: float = option(
        0.1, range=(0.0, 100.0), help="# per word, and ellipses per word (each checked)"
    )
    max_bullet_lines_ratio: float = option(
        0.9, range=(0.0, 1.0), help="non-blank lines starting with a bullet"
    )
    max_ellipsis_lines_ratio: float = option(
        0.3, range=(0.0, 1.0), help="non-blank lines ending in an ellipsis"
    )
    min_alpha_words_ratio: float = option(0.8, range=(0.0, 1.0), help="share of words with a letter")
    min_stop_words: int = option(
        2, range=(0, 10**6), help="occurrences of the, be, to, of, and, that, have, with (English only)"
    )


@dataclass
class GopherRepetitionConfig:
    max_dup_line_ratio: float = option(0.30, range=(0.0, 1.0), help="duplicate lines / lines")
    max_dup_para_ratio: float = option(0.30, range=(0.0, 1.0), help="duplicate paragraphs / paragraphs")
    max_dup_line_char_ratio: float = option(0.20, range=(0.0, 1.0), help="chars in duplicate lines / chars")
    max_dup_para_char_ratio: float = option(
        0.20, range=(0.0, 1.0), help="chars in duplicate paragraphs / chars"
    )
    max_top_ngram_char_ratio: list[float] = option(
        [0.20, 0.18, 0.16], help="top 2-, 3-, 4-gram character fractions"
    )
    max_dup_ngram_char_ratio: list[float] = option(
        [0.15, 0.14, 0.13, 0.12, 0.11, 0.10],
        help="duplicate 5- to 10-gram character fractions (all occurrences, overlaps counted once)",
    )


@dataclass
class C4Config:
    min_words_per_line: int = option(3, range=(0, 10**6), help="lines with fewer words are removed")
    max_word_length: int = option(1000, range=(1, 10**9), help="lines with a longer word are removed")
    remove_citations: bool = option(True, help="strip [1], [edit] and [citation needed] marks from lines")
    min_sentences: int = option(5, range=(0, 10**6), help="documents with fewer sentences are dropped")
    require_terminal_punctuation: bool = option(True, help="remove lines not ending in . ! ? or a quote")
    remove_javascript_lines: bool = option(True)
    remove_policy_lines: bool = option(True, help="terms of use, cookie and privacy-policy lines")
    drop_lorem_ipsum: bool = option(True)
    drop_curly_brace: bool = option(True, help="drop documents with { in a kept line (code, not prose)")


@dataclass
class FineWebConfig:
    min_line_punct_ratio: float = option(
        0.12, range=(0.0, 1.0), help="non-blank lines ending in punctuation / non-blank lines"
    )
    max_short_line_ratio: float = option(
        0.67, range=(0.0, 1.0), help="non-blank lines of at most short_line_chars / non-blank lines"
    )
    short_line_chars: int = option(30, range=(0, 10**6))
    max_dup_line_char_ratio: float = option(
        0.01, range=(0.0, 1.0), help="chars in repeats of non-blank lines / chars (newlines left out)"
    )
    max_newline_word_ratio: float = option(
        0.3, range=(0.0, 100.0), help="line breaks between non-blank lines / words (list-like pages)"
    )


@dataclass
class CodeFilterConfig:
    max_line_length: int = option(1000, range=(1, 10**9), help="characters")
    max_mean_line_length: float = option(100.0, range=(1.0, 10**9), help="characters")
    min_alnum_ratio: float = option(0.25, range=(0.0, 1.0), help="letters and digits / characters")
    min_bytes: int = option(0, range=(0, 10**12), help="UTF-8 bytes")
    max_bytes: int = option(1_000_000, range=(1, 10**12), help="UTF-8 bytes")
    drop_autogenerated: bool = option(
        True, help="`auto-generated`/`do not edit` markers in the first 5 lines"
    )
    drop_minified: bool = option(True, help="*.min.js-style names, or long lines with under 5% whitespace")


@dataclass
class UrlFilterConfig:
    blocklist: str = option(
        "", help="file of blocked domains (and their subdomains) or URL regexes, one per line, # comments"
    )


@dataclass
class PiiConfig:
    enabled: bool = option(
        True, help="replace PII with typed placeholders: <EMAIL>, <PHONE>, <IP_ADDRESS>, <SECRET>"
    )
    kinds: list[str] = option(
        ["email", "phone", "ip", "secret"], help="which kinds to replace: email, phone, ip, secret"
    )


@dataclass
class QualityConfig:
    model: str = option("", help="classifier from `smelt curate quality-train` (empty: no quality step)")
    sources: list[str] = option([], help="sources the classifier scores (empty: every non-code source)")
    threshold: float = option(0.0, range=(0.0, 1.0), help="keep documents scoring at least this")
    top_fraction: float = option(
        1.0, range=(0.0, 1.0), help="keep only this top share per source (1: threshold only)"
    )
    positive_sources: list[str] = option([], help="quality-train: sources of good documents")
    negative_sources: list[str] = option([], help="quality-train: sources of poor documents")
    max_docs: int = option(100_000, range=(1, 10**9), help="quality-train: documents per class at most")
    max_chars: int = option(
        10_000, range=(100, 10**8), help="quality-train: leading characters of a document it reads"
    )
    buckets: int = option(1 << 20, range=(1024, 1 << 26), help="quality-train: hashed feature slots")
    char_ngrams: int = option(
        0, range=(0, 8), help="quality-train: also character 3..n-grams of each word, n >= 3 (0: words only)"
    )


@dataclass
class NearDedupConfig:
    enabled: bool = option(False, help="MinHash-LSH near-duplicate removal (one representative per cluster)")
    threshold: float = option(0.8, range=(0.05, 0.99), help="Jaccard similarity the LSH bands are tuned for")
    ngram: int = option(5, range=(1, 50), help="words per shingle")
    num_perm: int = option(128, range=(8, 1024), help="MinHash permutations (signature length)")
    verify: str = option(
        "signature",
        choices=("none", "signature", "jaccard"),
        help="check LSH candidates: `signature` keeps a pair if its estimated Jaccard >= threshold - 0.05; "
        "`jaccard` if the true Jaccard of its shingle sets (kept on disk) >= threshold",
    )
    scope: str = option(
        "global",
        help="`global`, `source`, `dir` (top directory of the file: one crawl dump per folder) or "
        "`field:<meta key>` (e.g. field:dump, with split_unit = field:dump)",
    )
    memory_mb: int = option(1024, range=(16, 10**6), help="memory budget for the band buckets (partitions)")


@dataclass
class LineDedupConfig:
    enabled: bool = option(False, help="remove lines that occur in more than `max_docs` documents")
    max_docs: int = option(100, range=(2, 10**12), help="a line in more documents than this is boilerplate")
    min_chars: int = option(20, range=(1, 10**6), help="shorter lines are never removed")


@dataclass
class EvalSetConfig:
    name: str = option("", help="benchmark name in the report (e.g. hellaswag)")
    path: str = option("", help="benchmark file or directory (relative paths: to the working directory)")
    format: str = option(
        "mosaic",
        choices=("mosaic", "olmes", "gsm8k", "mmlu_csv", "jsonl"),
        help="file layout: mosaic jsonl, olmes requests.jsonl.gz, gsm8k jsonl, mmlu csv, jsonl (`fields`)",
    )
    fields: list[str] = option([], help="format jsonl: the record fields joined into the item text")


@dataclass
class DecontamConfig:
    evals: list[EvalSetConfig] = option([], help="[[data.decontam.evals]] benchmark files (empty: off)")
    ngram: int = option(13, range=(3, 100), help="words per n-gram compared with the benchmarks")
    threshold: float = option(
        0.5, range=(0.0, 1.0), help="a document matches an item when this share of the item's n-grams occurs"
    )
    action: str = option(
        "remove", choices=("remove", "flag"), help="remove matching documents or flag in meta"
    )


# Keys that decide where curation's tasks run and where URL inputs and outputs are staged, never what the
# stage makes: left out of the stage's cache key, so a run resumes across a change of them.
PLACEMENT_KEYS = ("executor", "ray_address", "retries", "url_cache")


@dataclass
class DataConfig:
    sources: list[SourceConfig] = option([], help="[[data.sources]] tables")
    min_chars: int = option(64, range=(0, 10**9), help="drop documents shorter than this")
    max_chars: int = option(1_000_000, range=(1, 10**10), help="drop documents longer than this")
    exact_dedup: bool = option(True, help="drop exact duplicates of normalized text")
    val_fraction: float = option(0.02, range=(0.0, 0.5), help="share of provenance units sent to val")
    test_fraction: float = option(0.0, range=(0.0, 0.5), help="share of provenance units sent to test")
    min_split_docs: int = option(
        1, range=(0, 10**9), help="per source, at least this many documents in val and in test (if > 0)"
    )
    docs_per_part: int = option(50_000, range=(1, 10**8), help="documents per parquet part")
    workers: int = option(0, range=(0, 1024), help="reader processes (0: one per core)")
    executor: str = option(
        "pool",
        choices=("pool", "ray"),
        help="where the map and the MinHash signatures run: `pool` (local processes) or `ray` (Ray tasks; "
        "the ray extra), same bytes out",
    )
    ray_address: str = option(
        "", help="executor ray: empty starts a local Ray; `auto` or ray://HOST:10001 joins a running cluster"
    )
    retries: int = option(
        3, range=(0, 100), help="times a task whose worker process (or Ray node) died is run again"
    )
    url_cache: str = option(
        "",
        help="where documents for a store's URL are staged, and memory:// sources mirrored (empty: "
        "~/.cache/smelt/urls)",
    )
    shard_bytes: int = option(
        64_000_000, range=(1_000, 10**12), help="input bytes per work shard (large files split by records)"
    )
    canaries: int = option(
        0,
        range=(0, 10_000),
        help="random canary strings planted in the first source's train split, string i repeated "
        "2^(i mod 6) times (1, 2, 4 ... 32), for the contamination meter's memorisation curve",
    )
    boilerplate: BoilerplateConfig = field(default_factory=BoilerplateConfig)
    langid: LangIdConfig = field(default_factory=LangIdConfig)
    gopher_quality: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    gopher_repetition: GopherRepetitionConfig = field(default_factory=GopherRepetitionConfig)
    c4: C4Config = field(default_factory=C4Config)
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    code_filter: CodeFilterConfig = field(default_factory=CodeFilterConfig)
    url_filter: UrlFilterConfig = field(default_factory=UrlFilterConfig)
    pii: PiiConfig = field(default_factory=PiiConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    near_dedup: NearDedupConfig = field(default_factory=NearDedupConfig)
    line_dedup: LineDedupConfig = field(default_factory=LineDedupConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
