"""A tiny chat-capable tokenizer and a tiny base run (random weights) for post-training tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import tiny_model_config

TEXTS = [
    "What is 12+34? 12+34=46. The answer is #### 46.",
    "Human: how do I bake bread? Assistant: Mix flour, water, salt and yeast, then bake it.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
] * 50 + [f"{a}+{b}={a + b}" for a in range(0, 100, 7) for b in range(0, 100, 9)]


def write_tokenizer(directory: Path, vocab_size: int = 384) -> Path:
    """A byte-level BPE with smelt's special tokens (bos, eos, pad, FIM, chat), padded like train_tokenizer."""
    from tokenizers import AddedToken, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    from smelt.config import TokenizerConfig
    from smelt.tokenizer.train import build_tokenizer, special_tokens

    named = special_tokens(TokenizerConfig())
    tokenizer = build_tokenizer("gpt4")
    trainer = BpeTrainer(
        vocab_size=vocab_size - 8,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in named],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXTS, trainer=trainer)
    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens(
        [AddedToken(f"<|reserved_{i}|>", special=True, normalized=False) for i in range(vocab_size - trained)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in named}
    info = {
        "vocab_size": vocab_size,
        "trained_vocab_size": trained,
        "padded_vocab_size": vocab_size,
        "bos_id": ids[named[0]],
        "eos_id": ids[named[1]],
        "pad_id": ids[named[2]],
        "special_tokens": ids,
    }
    (directory / "smelt.json").write_text(json.dumps(info))
    return directory


def write_base_run(run_dir: Path, tokenizer_dir: Path, seed: int = 0, **model_overrides) -> Path:
    """RUN/tokenizer and RUN/train/checkpoints/step_0000001 holding a tiny random model."""
    import shutil

    from tests.helpers import build_model

    from smelt.checkpoint.store import save_checkpoint

    shutil.copytree(tokenizer_dir, run_dir / "tokenizer")
    cfg = tiny_model_config(**{"max_seq_len": 128, **model_overrides})
    model = build_model(cfg, vocab=384, seed=seed)
    meta = {"model_config": cfg, "vocab_size": 384, "tokens": 1000, "weights_only": True}
    save_checkpoint(run_dir / "train" / "checkpoints", 1, model, None, meta)
    return run_dir


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture()
def base_run(tmp_path, tokenizer_dir) -> Path:
    return write_base_run(tmp_path / "base", tokenizer_dir)
