"""Typed pipeline configuration: TOML files, `--set a.b=c` overrides, validation with helpful errors.

A pipeline is one TOML file with the sections `[run]`, `[data]`, `[tokenizer]`, `[tokens]`,
`[model]`, `[train]`, `[checkpoint]` and `[eval]`. Every section is a dataclass below; field metadata
carries the allowed range or choices, so that an out-of-range value names the range and an unknown
key names the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from smelt.errors import ConfigError
from smelt.model.presets import MODEL_PRESETS


def _opt(
    default: Any, *, range: tuple[float, float] | None = None, choices: tuple | None = None, help: str = ""
) -> Any:
    meta = {"range": range, "choices": choices, "help": help}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    name: str = _opt("run", help="run directory name under `dir`")
    dir: str = _opt("runs", help="parent directory of run directories")
    seed: int = _opt(1337, range=(0, 2**32 - 1), help="seed every stage derives its randomness from")


@dataclass
class SourceConfig:
    name: str = _opt("", help="source name; becomes documents/<split>/<name>/")
    format: str = _opt(
        "text",
        choices=("text", "jsonl", "parquet", "html", "warc"),
        help="text/html: one document per file; jsonl/parquet: one per record; warc: one per HTML response",
    )
    root: str = _opt(".", help="directory the globs are relative to; `{stdlib}` is this Python's stdlib")
    include: list[str] = _opt(["**/*"], help="glob patterns relative to root")
    exclude: list[str] = _opt([], help="glob patterns (relative to root) to leave out")
    text_field: str = _opt("text", help="record field with the text (jsonl, parquet)")
    id_field: str = _opt("", help="record field with a stable id; empty: <file>:<record number>")
    url_field: str = _opt("", help="record field with the URL, if any")
    code: bool = _opt(False, help="code keeps its whitespace exactly (no blank-line collapsing)")
    max_files: int = _opt(0, range=(0, 10**9), help="read at most this many files (0: all)")
    extractor: str = _opt(
        "trafilatura",
        choices=("trafilatura", "resiliparse"),
        help="HTML main-text extractor (html, warc): trafilatura extracts cleaner text (F1 0.96 vs 0.93 on "
        "the shared benchmark), resiliparse is ~10x faster; figures from bench/extraction.py",
    )
    mojibake: bool = _opt(False, help="repair mojibake (text decoded with the wrong codec) with ftfy")
    languages: list[str] = _opt(
        [], help="language keep-list, ISO 639-1 codes such as en, de, zh (empty: keep every language)"
    )
    lang_threshold: float = _opt(
        0.65, range=(0.0, 1.0), help="minimum language-id confidence (0-1) when `languages` is set"
    )
    filters: list[str] = _opt(
        ["auto"],
        help="filter steps for this source: gopher_quality, gopher_repetition, c4, fineweb, code, "
        "url_blocklist; `auto`: code for code sources, else gopher_quality + gopher_repetition",
    )
    split_unit: str = _opt(
        "id",
        help="provenance unit hashed into a split: id, url, domain, file, dir, or field:<record field>",
    )


@dataclass
class LangIdConfig:
    enabled: bool = _opt(True, help="identify the language of every non-code document (lang, lang_score)")
    max_chars: int = _opt(
        1000,
        range=(50, 10**9),
        help="characters classified per document; longer ones are sampled in 4 windows spread over the text",
    )


@dataclass
class GopherQualityConfig:
    min_words: int = _opt(50, range=(0, 10**9))
    max_words: int = _opt(100_000, range=(1, 10**12))
    min_mean_word_length: float = _opt(3.0, range=(0.0, 1000.0), help="characters per word")
    max_mean_word_length: float = _opt(10.0, range=(0.0, 1000.0), help="characters per word")
    max_symbol_word_ratio: float = _opt(
        0.1, range=(0.0, 100.0), help="# per word, and ellipses per word (each checked)"
    )
    max_bullet_lines_ratio: float = _opt(0.9, range=(0.0, 1.0), help="non-blank lines starting with a bullet")
    max_ellipsis_lines_ratio: float = _opt(
        0.3, range=(0.0, 1.0), help="non-blank lines ending in an ellipsis"
    )
    min_alpha_words_ratio: float = _opt(0.8, range=(0.0, 1.0), help="share of words with a letter")
    min_stop_words: int = _opt(
        2, range=(0, 10**6), help="occurrences of the, be, to, of, and, that, have, with (English only)"
    )


@dataclass
class GopherRepetitionConfig:
    max_dup_line_ratio: float = _opt(0.30, range=(0.0, 1.0), help="duplicate lines / lines")
    max_dup_para_ratio: float = _opt(0.30, range=(0.0, 1.0), help="duplicate paragraphs / paragraphs")
    max_dup_line_char_ratio: float = _opt(0.20, range=(0.0, 1.0), help="chars in duplicate lines / chars")
    max_dup_para_char_ratio: float = _opt(
        0.20, range=(0.0, 1.0), help="chars in duplicate paragraphs / chars"
    )
    max_top_ngram_char_ratio: list[float] = _opt(
        [0.20, 0.18, 0.16], help="top 2-, 3-, 4-gram character fractions"
    )
    max_dup_ngram_char_ratio: list[float] = _opt(
        [0.15, 0.14, 0.13, 0.12, 0.11, 0.10],
        help="duplicate 5- to 10-gram character fractions (all occurrences, overlaps counted once)",
    )


@dataclass
class C4Config:
    min_words_per_line: int = _opt(3, range=(0, 10**6), help="lines with fewer words are removed")
    max_word_length: int = _opt(1000, range=(1, 10**9), help="lines with a longer word are removed")
    remove_citations: bool = _opt(True, help="strip [1], [edit] and [citation needed] marks from lines")
    min_sentences: int = _opt(5, range=(0, 10**6), help="documents with fewer sentences are dropped")
    require_terminal_punctuation: bool = _opt(True, help="remove lines not ending in . ! ? or a quote")
    remove_javascript_lines: bool = _opt(True)
    remove_policy_lines: bool = _opt(True, help="terms of use, cookie and privacy-policy lines")
    drop_lorem_ipsum: bool = _opt(True)
    drop_curly_brace: bool = _opt(True, help="drop documents with { in a kept line (code, not prose)")


@dataclass
class FineWebConfig:
    min_line_punct_ratio: float = _opt(
        0.12, range=(0.0, 1.0), help="non-blank lines ending in punctuation / non-blank lines"
    )
    max_short_line_ratio: float = _opt(
        0.67, range=(0.0, 1.0), help="non-blank lines of at most short_line_chars / non-blank lines"
    )
    short_line_chars: int = _opt(30, range=(0, 10**6))
    max_dup_line_char_ratio: float = _opt(
        0.01, range=(0.0, 1.0), help="chars in repeats of non-blank lines / chars (newlines left out)"
    )
    max_newline_word_ratio: float = _opt(
        0.3, range=(0.0, 100.0), help="line breaks between non-blank lines / words (list-like pages)"
    )


@dataclass
class CodeFilterConfig:
    max_line_length: int = _opt(1000, range=(1, 10**9), help="characters")
    max_mean_line_length: float = _opt(100.0, range=(1.0, 10**9), help="characters")
    min_alnum_ratio: float = _opt(0.25, range=(0.0, 1.0), help="letters and digits / characters")
    min_bytes: int = _opt(0, range=(0, 10**12), help="UTF-8 bytes")
    max_bytes: int = _opt(1_000_000, range=(1, 10**12), help="UTF-8 bytes")
    drop_autogenerated: bool = _opt(True, help="`auto-generated`/`do not edit` markers in the first 5 lines")
    drop_minified: bool = _opt(True, help="*.min.js-style names, or long lines with under 5% whitespace")


@dataclass
class UrlFilterConfig:
    blocklist: str = _opt(
        "", help="file of blocked domains (and their subdomains) or URL regexes, one per line, # comments"
    )


@dataclass
class PiiConfig:
    enabled: bool = _opt(
        True, help="replace PII with typed placeholders: <EMAIL>, <PHONE>, <IP_ADDRESS>, <SECRET>"
    )
    kinds: list[str] = _opt(
        ["email", "phone", "ip", "secret"], help="which kinds to replace: email, phone, ip, secret"
    )


@dataclass
class QualityConfig:
    model: str = _opt("", help="classifier from `smelt curate quality-train` (empty: no quality step)")
    sources: list[str] = _opt([], help="sources the classifier scores (empty: every non-code source)")
    threshold: float = _opt(0.0, range=(0.0, 1.0), help="keep documents scoring at least this")
    top_fraction: float = _opt(
        1.0, range=(0.0, 1.0), help="keep only this top share per source (1: threshold only)"
    )
    positive_sources: list[str] = _opt([], help="quality-train: sources of good documents")
    negative_sources: list[str] = _opt([], help="quality-train: sources of poor documents")
    max_docs: int = _opt(100_000, range=(1, 10**9), help="quality-train: documents per class at most")
    max_chars: int = _opt(
        10_000, range=(100, 10**8), help="quality-train: leading characters of a document it reads"
    )
    buckets: int = _opt(1 << 20, range=(1024, 1 << 26), help="quality-train: hashed feature slots")
    char_ngrams: int = _opt(
        0, range=(0, 8), help="quality-train: also character 3..n-grams of each word, n >= 3 (0: words only)"
    )


@dataclass
class NearDedupConfig:
    enabled: bool = _opt(False, help="MinHash-LSH near-duplicate removal (one representative per cluster)")
    threshold: float = _opt(0.8, range=(0.05, 0.99), help="Jaccard similarity the LSH bands are tuned for")
    ngram: int = _opt(5, range=(1, 50), help="words per shingle")
    num_perm: int = _opt(128, range=(8, 1024), help="MinHash permutations (signature length)")
    verify: str = _opt(
        "signature",
        choices=("none", "signature", "jaccard"),
        help="check LSH candidates: `signature` keeps a pair if its estimated Jaccard >= threshold - 0.05; "
        "`jaccard` if the true Jaccard of its shingle sets (kept on disk) >= threshold",
    )
    scope: str = _opt(
        "global",
        help="`global`, `source`, `dir` (top directory of the file: one crawl dump per folder) or "
        "`field:<meta key>` (e.g. field:dump, with split_unit = field:dump)",
    )
    memory_mb: int = _opt(1024, range=(16, 10**6), help="memory budget for the band buckets (partitions)")


@dataclass
class LineDedupConfig:
    enabled: bool = _opt(False, help="remove lines that occur in more than `max_docs` documents")
    max_docs: int = _opt(100, range=(2, 10**12), help="a line in more documents than this is boilerplate")
    min_chars: int = _opt(20, range=(1, 10**6), help="shorter lines are never removed")


@dataclass
class EvalSetConfig:
    name: str = _opt("", help="benchmark name in the report (e.g. hellaswag)")
    path: str = _opt("", help="benchmark file or directory (relative paths: to the working directory)")
    format: str = _opt(
        "mosaic",
        choices=("mosaic", "olmes", "gsm8k", "mmlu_csv", "jsonl"),
        help="file layout: mosaic jsonl, olmes requests.jsonl.gz, gsm8k jsonl, mmlu csv, jsonl (`fields`)",
    )
    fields: list[str] = _opt([], help="format jsonl: the record fields joined into the item text")


@dataclass
class DecontamConfig:
    evals: list[EvalSetConfig] = _opt([], help="[[data.decontam.evals]] benchmark files (empty: off)")
    ngram: int = _opt(13, range=(3, 100), help="words per n-gram compared with the benchmarks")
    threshold: float = _opt(
        0.5, range=(0.0, 1.0), help="a document matches an item when this share of the item's n-grams occurs"
    )
    action: str = _opt("remove", choices=("remove", "flag"), help="remove matching documents or flag in meta")


@dataclass
class DataConfig:
    sources: list[SourceConfig] = _opt([], help="[[data.sources]] tables")
    min_chars: int = _opt(64, range=(0, 10**9), help="drop documents shorter than this")
    max_chars: int = _opt(1_000_000, range=(1, 10**10), help="drop documents longer than this")
    exact_dedup: bool = _opt(True, help="drop exact duplicates of normalized text")
    val_fraction: float = _opt(0.02, range=(0.0, 0.5), help="share of provenance units sent to val")
    test_fraction: float = _opt(0.0, range=(0.0, 0.5), help="share of provenance units sent to test")
    min_split_docs: int = _opt(
        1, range=(0, 10**9), help="per source, at least this many documents in val and in test (if > 0)"
    )
    docs_per_part: int = _opt(50_000, range=(1, 10**8), help="documents per parquet part")
    workers: int = _opt(0, range=(0, 1024), help="reader processes (0: one per core)")
    shard_bytes: int = _opt(
        64_000_000, range=(1_000, 10**12), help="input bytes per work shard (large files split by records)"
    )
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


@dataclass
class TokenizerConfig:
    vocab_size: int = _opt(8192, range=(1, 1_048_576), help="BPE vocabulary incl. special tokens")
    pad_to_multiple: int = _opt(128, range=(1, 4096), help="embedding rows padded to a multiple of this")
    special_tokens: list[str] = _opt(
        ["<|bos|>", "<|eos|>", "<|pad|>"], help="special tokens; the first three are bos, eos, pad"
    )
    sample_bytes: int = _opt(50_000_000, range=(1_000, 10**13), help="training-sample byte budget")
    min_frequency: int = _opt(2, range=(1, 10**9), help="minimum pair count for a merge")
    pattern: str = _opt("gpt4", help="pre-tokenization regex: `gpt4`, `gpt2`, or a regex")
    fim_tokens: bool = _opt(True, help="add <|fim_prefix|>, <|fim_middle|>, <|fim_suffix|> special tokens")
    chat_tokens: bool = _opt(
        True, help="add chat-role special tokens (<|system|>, <|user|>, <|assistant|>, ...)"
    )
    spare_tokens: int = _opt(64, range=(0, 1_000_000), help="reserved special tokens kept free (at least)")
    source_alpha: float = _opt(
        1.0, range=(0.0, 1.0), help="sample temperature on source sizes (1: proportional, 0: uniform)"
    )
    lang_alpha: float = _opt(
        0.3, range=(0.0, 1.0), help="sample temperature on language sizes within a source (lang column)"
    )
    source_weights: dict = _opt({}, help="extra sample weight per source name (default 1)")
    lang_weights: dict = _opt({}, help="extra sample weight per language code (default 1)")


@dataclass
class StageConfig:
    name: str = _opt("", help="stage name for logs and metrics (empty: stage<N>)")
    tokens: int = _opt(0, range=(0, 10**15), help="this stage's training tokens (or set fraction)")
    fraction: float = _opt(0.0, range=(0.0, 1.0), help="this stage's share of train.tokens (or set tokens)")
    mixture: dict = _opt({}, help="source weights in this stage (empty: tokens.mixture / tokens.epochs)")


# The [tokens] keys that decide the shards (tokenize) and the ones that only decide the loader (train).
SHARD_KEYS = ("shard_tokens", "bos")


@dataclass
class TokensConfig:
    shard_tokens: int = _opt(100_000_000, range=(1_000, 10**11), help="tokens per shard file")
    batch_docs: int = _opt(1024, range=(1, 10**7), help="documents encoded per batch")
    batch_bytes: int = _opt(
        2_000_000, range=(1, 10**10), help="text bytes per batch at most (keeps the encoding processes even)"
    )
    workers: int = _opt(0, range=(0, 1024), help="encoding processes (0: one per CPU core)")
    bos: bool = _opt(False, help="also put BOS before each document (EOS always follows it)")
    mixture: dict = _opt({}, help="weight per source, normalized (empty: natural proportions by tokens)")
    epochs: dict = _opt({}, help="epoch multiplier per source, e.g. {wiki = 6.0} (instead of mixture)")
    allow_repeat: bool = _opt(False, help="let a source run past one epoch (otherwise an error)")
    stages: list[StageConfig] = _opt([], help="[[tokens.stages]] curriculum (empty: one stage)")
    fim_rate: float = _opt(0.0, range=(0.0, 1.0), help="share of code documents turned fill-in-the-middle")
    fim_spm_rate: float = _opt(0.5, range=(0.0, 1.0), help="share of FIM documents in SPM (else PSM) order")
    fim_sources: list[str] = _opt([], help="sources that get FIM (empty: data.sources with code = true)")
    mixture_window: int = _opt(1000, range=(1, 10**9), help="sequences per realized-mixture metric")
    drift_tolerance: float = _opt(
        0.015, range=(0.0, 1.0), help="realized-minus-target share that raises a mixture_drift alert"
    )
    prefetch: int = _opt(2, range=(0, 1024), help="steps the loader prepares ahead in a thread (0: none)")

    def shard_settings(self) -> dict[str, Any]:
        """The keys the token shards depend on: the tokenize stage's cache key."""
        return {key: getattr(self, key) for key in SHARD_KEYS}

    def loader_settings(self) -> dict[str, Any]:
        """The keys only the training loader reads: part of the train stage's cache key."""
        skip = {*SHARD_KEYS, "batch_docs", "batch_bytes", "workers"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class ModelConfig:
    preset: str = _opt("", help="named shape; any key below overrides it")
    d_model: int = _opt(256, range=(8, 65536))
    n_layers: int = _opt(4, range=(1, 1024))
    n_heads: int = _opt(4, range=(1, 1024))
    n_kv_heads: int = _opt(0, range=(0, 1024), help="key/value heads for GQA (0: n_heads)")
    d_ff: int = _opt(0, range=(0, 10**6), help="SwiGLU hidden size (0: 8/3 d rounded)")
    rope_theta: float = _opt(10_000.0, range=(1.0, 1e9))
    norm_eps: float = _opt(1e-5, range=(1e-12, 1e-1))
    qk_norm: bool = _opt(False, help="RMSNorm on queries and keys per head")
    tie_embeddings: bool = _opt(True)
    init_std: float = _opt(0.02, range=(1e-6, 1.0))
    max_seq_len: int = _opt(1024, range=(8, 10**7))
    rope_fraction: float = _opt(
        1.0, range=(0.0, 1.0), help="share of each head's dims that RoPE rotates (0: no RoPE anywhere)"
    )
    nope_every: int = _opt(0, range=(0, 1024), help="every k-th layer (k, 2k, ...) uses no RoPE (0: none)")
    z_loss: float = _opt(0.0, range=(0.0, 1.0), help="z-loss coefficient on log^2 Z (0: off; 1e-4 typical)")
    head_init_std: float = _opt(
        0.0,
        range=(0.0, 1.0),
        help="LM head init std, also the tied embedding's (0: tied min(init_std, 0.32/sqrt(d)), untied min(init_std, 1/d))",
    )
    activation_checkpointing: bool = _opt(False, help="recompute each block in the backward pass")
    attention: str = _opt(
        "auto",
        choices=("auto", "sdpa", "flex"),
        help="document-masked attention kernel: flex (BlockMask), sdpa (dense mask); auto: flex on CUDA",
    )


@dataclass
class TrainConfig:
    seq_len: int = _opt(256, range=(8, 10**7))
    micro_batch: int = _opt(16, range=(1, 10**6), help="sequences per forward/backward per process")
    batch_tokens: int = _opt(
        0, range=(0, 10**10), help="global batch in tokens (0: seq_len x micro_batch x world size)"
    )
    tokens: int = _opt(10_000_000, range=(1, 10**15), help="total training tokens")
    batch_ramp_tokens: int = _opt(
        0, range=(0, 10**15), help="grow the batch linearly over this many tokens (0: no ramp)"
    )
    batch_ramp_start: int = _opt(
        0,
        range=(0, 10**10),
        help="starting global batch in tokens of a ramp (0: seq_len x micro_batch x world)",
    )
    lr: float = _opt(3e-3, range=(0.0, 10.0))
    min_lr_ratio: float = _opt(0.1, range=(0.0, 1.0), help="cosine floor as a fraction of lr")
    warmup_tokens: int = _opt(0, range=(0, 10**15), help="linear warmup (0: 2% of tokens)")
    weight_decay: float = _opt(0.1, range=(0.0, 10.0))
    beta1: float = _opt(0.9, range=(0.0, 1.0))
    beta2: float = _opt(0.95, range=(0.0, 1.0))
    eps: float = _opt(1e-8, range=(0.0, 1.0))
    grad_clip: float = _opt(1.0, range=(0.0, 1e6), help="global-norm clip (0: off)")
    precision: str = _opt(
        "auto",
        choices=("auto", "bf16", "fp16", "fp32"),
        help="auto: bf16 autocast where the hardware has it, else fp32",
    )
    device: str = _opt("auto", help="auto, cpu, cuda or cuda:N")
    threads: int = _opt(0, range=(0, 1024), help="CPU threads for torch (0: one per core)")
    compile: bool = _opt(False, help="torch.compile the model")
    log_every: int = _opt(10, range=(1, 10**9), help="steps between train-metric lines")
    eval_every: int = _opt(100, range=(0, 10**9), help="steps between validation losses (0: end only)")
    eval_tokens: int = _opt(65_536, range=(0, 10**12), help="validation tokens per periodic evaluation")
    doc_masking: bool = _opt(
        True, help="attend only within each document of a packed sequence; positions restart per document"
    )
    parallel: str = _opt(
        "ddp", choices=("ddp", "fsdp"), help="data parallelism under torchrun: DDP or FSDP2 (fully_shard)"
    )
    schedule: str = _opt(
        "cosine",
        choices=("cosine", "wsd", "constant", "multistep"),
        help="LR after warmup: cosine to the floor, warmup-stable-decay, constant, or step drops",
    )
    decay_fraction: float = _opt(0.2, range=(0.0, 1.0), help="wsd: share of the steps spent decaying")
    decay_shape: str = _opt("1-sqrt", choices=("linear", "cosine", "1-sqrt"), help="wsd: decay curve")
    decay_start_step: int = _opt(
        0, range=(0, 10**12), help="wsd: start the decay at this step (0: from decay_fraction); a branch run"
    )
    milestones: list[float] = _opt(
        [0.8, 0.9], help="multistep: fractions of the run where the LR is multiplied by step_gamma"
    )
    step_gamma: float = _opt(0.316, range=(0.0, 1.0), help="multistep: LR factor at each milestone")
    rewarmup_tokens: int = _opt(
        0, range=(0, 10**15), help="linear re-warmup at each curriculum stage boundary (0: none)"
    )
    optimizer: str = _opt(
        "adamw", choices=("adamw", "muon"), help="muon: Muon for 2-D hidden matrices, AdamW for the rest"
    )
    muon_lr: float = _opt(0.02, range=(0.0, 10.0), help="Muon's LR (its updates are orthogonalised)")
    on_nonfinite: str = _opt(
        "skip", choices=("log", "skip", "rollback", "stop"), help="action on a NaN/Inf loss or gradient"
    )
    on_loss_spike: str = _opt(
        "log",
        choices=("log", "skip", "rollback", "stop"),
        help="action on a loss > loss_spike_std above mean",
    )
    on_grad_spike: str = _opt(
        "skip",
        choices=("log", "skip", "rollback", "stop"),
        help="action on a grad norm > grad_spike_factor x its trailing median",
    )
    loss_spike_std: float = _opt(5.0, range=(0.0, 1e6), help="loss alert: rolling standard deviations")
    grad_alert_factor: float = _opt(3.0, range=(1.0, 1e6), help="grad-norm alert (log only) x median")
    grad_spike_factor: float = _opt(5.0, range=(1.0, 1e6), help="grad-norm spike (action) x median")
    alert_window: int = _opt(100, range=(2, 10**7), help="steps of history for the alert statistics")
    alert_min_history: int = _opt(
        20, range=(1, 10**7), help="applied steps after warmup before spike alerts start"
    )
    max_consecutive_skips: int = _opt(
        5, range=(1, 10**7), help="stop the run after this many skipped steps in a row"
    )
    monitor_every: int = _opt(
        0, range=(0, 10**9), help="steps between per-layer update/weight ratios and norms (0: off)"
    )
    tensorboard: bool = _opt(False, help="also write metrics to TensorBoard under RUN/train/tensorboard")
    wandb_project: str = _opt("", help="also log metrics to this W&B project (empty: off)")
    wandb_mode: str = _opt(
        "offline", choices=("offline", "online"), help="offline: sync later with `wandb sync`"
    )
    watchdog_s: float = _opt(
        0.0, range=(0.0, 1e7),
        help="end the run (exit 124, every thread's stack in RUN/train/watchdog.log) when no step, eval or "
        "save finishes for this many seconds (0: off)",
    )  # fmt: skip


@dataclass
class CheckpointConfig:
    every_steps: int = _opt(0, range=(0, 10**9), help="steps between checkpoints (0: final only)")
    keep_last: int = _opt(2, range=(1, 10**6), help="checkpoints kept besides the final one")
    async_save: bool = _opt(True, help="snapshot to host memory, write in the background")
    milestone_every_steps: int = _opt(0, range=(0, 10**9), help="keep every N-th step's checkpoint forever")
    milestone_every_tokens: int = _opt(0, range=(0, 10**18), help="keep a checkpoint every X tokens forever")


@dataclass
class EvalConfig:
    max_bytes: int = _opt(0, range=(0, 10**13), help="held-out bytes to score (0: all)")
    batch_size: int = _opt(8, range=(1, 10**5))
    prompts: list[str] = _opt(["def ", "import ", "class "], help="fixed prompts for samples")
    max_new_tokens: int = _opt(48, range=(1, 10**6))
    temperature: float = _opt(0.8, range=(0.0, 100.0), help="0: greedy")
    top_k: int = _opt(40, range=(0, 10**7), help="0: no top-k cut")
    tasks: list[str] = _opt(
        ["arc_easy", "hellaswag", "copa", "winogrande", "lambada"],
        help="benchmark tasks scored at each checkpoint (see docs/evaluation.md; [] : held-out loss only)",
    )
    tasks_dir: str = _opt("", help="benchmark files (empty: $SMELT_SHARED_DATA/eval or ../shared/data/eval)")
    limit: int = _opt(60, range=(0, 10**9), help="items per task, a fixed seeded subset (0: all)")
    shots: int = _opt(-1, range=(-1, 100), help="few-shot examples per prompt (-1: each task's default)")
    overlong: str = _opt(
        "skip", choices=("error", "skip"), help="an item longer than the context: skip and count it, or stop"
    )
    gallery_tokens: int = _opt(48, range=(0, 10**6), help="greedy tokens per gallery prompt (0: no gallery)")
    every_steps: int = _opt(0, range=(0, 10**9), help="in-loop task evaluation every N steps (0: off)")
    inloop_items: int = _opt(100, range=(1, 10**9), help="items per task scored in the loop")
    inloop_tasks: list[str] = _opt([], help="tasks scored in the loop (empty: `tasks` minus generative ones)")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def section_hash(self, *sections: str) -> str:
        return hash_json({name: dataclasses.asdict(getattr(self, name)) for name in sections})


def hash_json(value: Any) -> str:
    """sha256 of the canonical JSON of a value: the hash of a resolved config."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Loading and validation


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file (or only defaults when `path` is None), apply `a.b=c` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} does not exist. Pass the path of a TOML pipeline file, "
                f"for example configs/quickstart.toml."
            )
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}. Fix the syntax.") from exc
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw, origin=str(path) if path else "<defaults>")


def config_from_dict(raw: dict[str, Any], origin: str = "<dict>") -> Config:
    raw = json.loads(json.dumps(raw))  # deep copy; TOML values are JSON values
    model = raw.get("model")
    if isinstance(model, dict) and model.get("preset"):
        name = model["preset"]
        if name not in MODEL_PRESETS:
            raise ConfigError(
                f"{origin}: model.preset = {name!r} is not a known preset{_suggest(name, MODEL_PRESETS)}. "
                f"Known presets: {', '.join(MODEL_PRESETS)}."
            )
        raw["model"] = {**MODEL_PRESETS[name], **model}
    cfg = _build(Config, raw, "", origin)
    _check_cross_fields(cfg, origin)
    return cfg


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `section.key=value` override; the value is read as TOML, else taken as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} has no '='. Write it as section.key=value, e.g. train.lr=1e-3.")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override key {key!r} must name a section and a key, e.g. train.lr=1e-3.")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    node = raw
    for part in parts[:-1]:
        if part.isdigit() and isinstance(node, list):
            index = int(part)
            if index >= len(node):
                raise ConfigError(
                    f"override {item!r}: index {index} is past the end of the list ({len(node)})."
                )
            node = node[index]
            continue
        node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section.")
    node[parts[-1]] = value


def _suggest(name: str, options: typing.Iterable[str]) -> str:
    options = list(options)
    # A typo usually keeps the real key as a prefix (`lr_typo`, `seq_length`); prefer the longest such key.
    prefixed = [o for o in options if name.startswith(o) and len(o) >= 2]
    close = sorted(prefixed, key=len, reverse=True) or difflib.get_close_matches(
        name, options, n=1, cutoff=0.5
    )
    return f" (did you mean {close[0]!r}?)" if close else ""


def _build(cls: type, raw: Any, prefix: str, origin: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: {where} must be a table, got {type(raw).__name__}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"{origin}: unknown key {prefix}{key}{_suggest(key, fields)}. "
                f"Valid keys in {where}: {', '.join(fields)}."
            )
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        values[name] = _coerce(hints[name], raw[name], f"{prefix}{name}", f.metadata, origin)
    return cls(**values)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        dict: "a table",
    }.get(tp, str(tp))


def _coerce(tp: Any, value: Any, key: str, meta: typing.Mapping, origin: str) -> Any:
    def wrong() -> ConfigError:
        return ConfigError(
            f"{origin}: {key} must be {_type_name(tp)}, got {value!r} ({type(value).__name__}). "
            f"Fix the value in the config or the --set override."
        )

    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".", origin)
    if typing.get_origin(tp) is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise wrong()
        return [_coerce(item_tp, v, f"{key}[{i}]", {}, origin) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong()
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise wrong()
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong()
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise wrong()
    elif tp is dict:
        if not isinstance(value, dict):
            raise wrong()
    lo_hi = meta.get("range") if meta else None
    if lo_hi is not None and not (lo_hi[0] <= value <= lo_hi[1]):
        raise ConfigError(
            f"{origin}: {key} = {value!r} is out of range; it must lie in [{_num(lo_hi[0])}, {_num(lo_hi[1])}]."
        )
    choices = meta.get("choices") if meta else None
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{origin}: {key} = {value!r} is not one of {', '.join(map(repr, choices))}"
            f"{_suggest(str(value), choices)}."
        )
    return value


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _check_cross_fields(cfg: Config, origin: str) -> None:
    m = cfg.model
    kv = m.n_kv_heads or m.n_heads
    if m.d_model % m.n_heads:
        raise ConfigError(
            f"{origin}: model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})."
        )
    if m.n_heads % kv:
        raise ConfigError(
            f"{origin}: model.n_heads ({m.n_heads}) must be a multiple of model.n_kv_heads ({kv}) for GQA."
        )
    if (m.d_model // m.n_heads) % 2:
        raise ConfigError(f"{origin}: the head dimension d_model / n_heads must be even for RoPE.")
    if cfg.train.seq_len > m.max_seq_len:
        raise ConfigError(
            f"{origin}: train.seq_len ({cfg.train.seq_len}) exceeds model.max_seq_len ({m.max_seq_len}); "
            f"raise model.max_seq_len or lower train.seq_len."
        )
    if cfg.data.min_chars > cfg.data.max_chars:
        raise ConfigError(f"{origin}: data.min_chars ({cfg.data.min_chars}) exceeds data.max_chars.")
    names = [s.name for s in cfg.data.sources]
    for i, source in enumerate(cfg.data.sources):
        if not source.name:
            raise ConfigError(f"{origin}: data.sources[{i}].name is empty; give every source a name.")
        if not source.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"{origin}: data.sources[{i}].name = {source.name!r} must use letters, digits, - and _ only "
                f"(it becomes a directory name)."
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{origin}: data.sources names must be unique; repeated: {', '.join(dupes)}.")
    t = cfg.tokenizer
    if len(t.special_tokens) < 3:
        raise ConfigError(f"{origin}: tokenizer.special_tokens needs at least bos, eos and pad.")
    if len(set(t.special_tokens)) != len(t.special_tokens):
        raise ConfigError(f"{origin}: tokenizer.special_tokens repeats a token; list each once.")
    specials = len(t.special_tokens) + 3 * t.fim_tokens + 5 * t.chat_tokens + t.spare_tokens
    smallest = 256 + specials
    if t.vocab_size < smallest:
        raise ConfigError(
            f"{origin}: tokenizer.vocab_size = {t.vocab_size} is too small: a byte-level BPE needs 256 byte "
            f"tokens plus {specials} special and spare tokens (special_tokens, fim_tokens, chat_tokens, "
            f"spare_tokens). Set tokenizer.vocab_size >= {smallest}, or reserve fewer special tokens."
        )


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every key: the reference printed by `smelt config --help`-style output."""
    rows = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((prefix + f.name, json.dumps(default), f.metadata.get("help", "")))
    return rows
