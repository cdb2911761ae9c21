"""Train a byte-level BPE tokenizer on a seeded sample of the documents' train split.

Output (the tokenizer artifact): `tokenizer.json` in the Hugging Face `tokenizers` format (loads in
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` unchanged) and `smelt.json` with the
special-token ids and the padded vocabulary size.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from smelt.config import TokenizerConfig
from smelt.documents import document_parts
from smelt.errors import UserError
from smelt.progress import log
from smelt.tokenizer.load import SMELT_JSON, TOKENIZER_JSON
from smelt.tokenizer.load import Tokenizer as SmeltTokenizer
from smelt.tokenizer.patterns import compile_pattern, resolve_pattern
from smelt.tokenizer.sample import Sample, Weighting, sample_texts

VAL_SAMPLE_BYTES = 1_000_000


def build_tokenizer(pattern: str) -> Tokenizer:
    """An untrained byte-level BPE pipeline: NFC, regex split, byte-level mapping, byte-level decoder."""
    regex = resolve_pattern(pattern)
    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(compile_pattern(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end_of_turn|>")


def special_tokens(cfg: TokenizerConfig) -> list[str]:
    """The named special tokens in id order: the configured ones (bos, eos, pad first), FIM, chat roles."""
    tokens = list(cfg.special_tokens)
    extra = (list(FIM_TOKENS) if cfg.fim_tokens else []) + (list(CHAT_TOKENS) if cfg.chat_tokens else [])
    return tokens + [t for t in extra if t not in tokens]


def _check_config(cfg: TokenizerConfig) -> None:
    specials = list(cfg.special_tokens)
    if len(specials) < 3:
        raise UserError(
            f"tokenizer.special_tokens = {specials!r} needs at least three tokens: bos, eos and pad, in that "
            f"order."
        )
    if len(set(specials)) != len(specials):
        raise UserError("tokenizer.special_tokens repeats a token; list each once.")
    named = special_tokens(cfg)
    smallest = 256 + len(named) + cfg.spare_tokens
    if cfg.vocab_size < smallest:
        raise UserError(
            f"tokenizer.vocab_size = {cfg.vocab_size} is too small: a byte-level BPE needs 256 byte tokens "
            f"plus {len(named)} special tokens plus tokenizer.spare_tokens = {cfg.spare_tokens} reserved ones. "
            f"Set tokenizer.vocab_size >= {smallest} (or lower tokenizer.spare_tokens, or turn off "
            f"tokenizer.fim_tokens / tokenizer.chat_tokens)."
        )
    if cfg.pad_to_multiple < 1:
        raise UserError(f"tokenizer.pad_to_multiple = {cfg.pad_to_multiple} must be at least 1.")
    if cfg.spare_tokens < 0:
        raise UserError(f"tokenizer.spare_tokens = {cfg.spare_tokens} must be at least 0.")
    for name in ("source_alpha", "lang_alpha"):
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise UserError(f"tokenizer.{name} = {value} must lie in [0, 1] (1: proportional, 0: uniform).")


def train_tokenizer(cfg: TokenizerConfig, documents_dir: Path, out_dir: Path, seed: int) -> dict[str, Any]:
    """Train byte-level BPE on a sample of the train split; write out_dir/tokenizer.json and out_dir/smelt.json.

    Returns the stats: trained and padded vocabulary size, sample documents and bytes, bytes per token
    on (at most 1 MB of) the val split, and the wall time.
    """
    started = time.time()
    documents_dir, out_dir = Path(documents_dir), Path(out_dir)
    _check_config(cfg)
    tokenizer = build_tokenizer(cfg.pattern)

    if not document_parts(documents_dir, "train"):
        raise UserError(
            f"no training documents: {documents_dir / 'train'} has no <source>/part-*.parquet files. "
            f"Run `smelt curate CONFIG` first (or check data.sources and data.val_fraction)."
        )
    weighting = Weighting.from_config(cfg)
    named = special_tokens(cfg)
    sample = Sample()
    trainer = BpeTrainer(
        vocab_size=cfg.vocab_size - cfg.spare_tokens,
        min_frequency=cfg.min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in named],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    log(f"[tokenizer] training BPE (vocab {cfg.vocab_size}) on up to {cfg.sample_bytes / 1e6:.1f} MB")
    texts = sample_texts(documents_dir, "train", cfg.sample_bytes, seed, sample, weighting=weighting)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if sample.documents == 0:
        raise UserError(
            f"the train split under {documents_dir / 'train'} holds no non-empty documents to train the "
            f"tokenizer on. Run `smelt curate CONFIG --force` with sources that produce text."
        )

    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    multiple = cfg.pad_to_multiple
    padded = -(-(trained + cfg.spare_tokens) // multiple) * multiple
    reserved = [
        AddedToken(f"<|reserved_{i}|>", special=True, normalized=False) for i in range(padded - trained)
    ]
    if reserved:
        tokenizer.add_special_tokens(reserved)
    if tokenizer.get_vocab_size(with_added_tokens=True) != padded:  # pragma: no cover - a reserved name clash
        raise UserError(
            "a token named <|reserved_N|> is already in tokenizer.special_tokens; rename it so the "
            "vocabulary can be padded."
        )
    special_ids = {t: tokenizer.token_to_id(t) for t in named}
    for i, token in enumerate(named):
        assert special_ids[token] == i, (token, special_ids[token])

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / TOKENIZER_JSON), pretty=True)
    info = {
        "vocab_size": padded,
        "trained_vocab_size": trained,
        "padded_vocab_size": padded,
        "bos_id": special_ids[cfg.special_tokens[0]],
        "eos_id": special_ids[cfg.special_tokens[1]],
        "pad_id": special_ids[cfg.special_tokens[2]],
        "special_tokens": special_ids,
        "reserved_tokens": len(reserved),
        "pattern": cfg.pattern,
        "sample_bytes_used": sample.bytes,
        "sample_documents": sample.documents,
        "sample_weighting": {
            "source_alpha": weighting.source_alpha,
            "lang_alpha": weighting.lang_alpha,
            "source_weights": dict(weighting.source_weights),
            "lang_weights": dict(weighting.lang_weights),
        },
        "sample_units": {
            unit: {k: int(v) for k, v in row.items()} for unit, row in sorted(sample.units.items())
        },
    }
    (out_dir / SMELT_JSON).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    stats: dict[str, Any] = {
        "trained_vocab_size": trained,
        "padded_vocab_size": padded,
        "sample_documents": sample.documents,
        "sample_bytes": sample.bytes,
        "train_time_s": round(time.time() - started, 3),
    }
    if trained < cfg.vocab_size - cfg.spare_tokens:
        stats["note"] = (
            f"the sample supported only {trained} of the requested {cfg.vocab_size - cfg.spare_tokens} "
            f"trained tokens "
            f"(no pair left with frequency >= {cfg.min_frequency})"
        )
    stats.update(evaluate_split(SmeltTokenizer.load(out_dir), documents_dir, "val", seed))
    stats["wall_time_s"] = round(time.time() - started, 3)
    log(
        f"[tokenizer] vocab {trained} (padded {padded}) from {sample.documents} documents, "
        f"{sample.bytes / 1e6:.2f} MB in {stats['train_time_s']:.1f} s"
    )
    return stats


def evaluate_split(
    tokenizer: SmeltTokenizer, documents_dir: Path, split: str, seed: int, max_bytes: int = VAL_SAMPLE_BYTES
) -> dict[str, Any]:
    """Bytes per token (and tokens per document) on a sample of a split; empty when the split is absent."""
    if not document_parts(documents_dir, split):
        return {}
    sample = Sample()
    tokens = 0
    for batch in sample_texts(documents_dir, split, max_bytes, seed, sample):
        tokens += sum(len(ids) for ids in tokenizer.encode_batch(batch))
    if tokens == 0:
        return {}
    return {
        f"{split}_documents": sample.documents,
        f"{split}_bytes": sample.bytes,
        f"{split}_tokens": tokens,
        f"{split}_bytes_per_token": round(sample.bytes / tokens, 4),
    }
