"""A tiny complete run (documents, tokenizer, tokens, two checkpoints) and tiny benchmark files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import tiny_model_config, write_documents
from smelt.config import Config, TokenizerConfig, TokensConfig

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "the",
    "dog",
    "ran",
    "to",
    "the",
    "park",
    "and",
    "a",
    "bird",
    "sang",
    "in",
    "the",
    "tree",
    "so",
    "the",
    "children",
    "laughed",
    "because",
    "water",
    "flowed",
    "from",
    "the",
    "spout",
    "when",
    "she",
    "opened",
    "the",
    "door",
]


def sentences(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "." for _ in range(n)
    ]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_tasks(root: Path) -> Path:
    """Benchmark files in the layouts of the shared data (mosaic, gsm8k), small enough for tests."""
    copa = [
        {
            "query": f"The {w} was tired, therefore",
            "choices": ["it slept.", "it ran to the park."],
            "gold": i % 2,
        }
        for i, w in enumerate(WORDS[:12])
    ]
    write_jsonl(root / "copa" / "mosaic_copa_validation.jsonl", copa)
    wino = [
        {"context_options": [f"The cat and the {w}: the cat", f"The cat and the {w}: the {w}"],
         "continuation": "sat on a mat.", "gold": i % 2}
        for i, w in enumerate(WORDS[:10])
    ]  # fmt: skip
    write_jsonl(root / "winogrande" / "mosaic_winogrande_dev.jsonl", wino)
    lambada = [{"context": s.rsplit(" ", 1)[0], "continuation": s.rsplit(" ", 1)[1]} for s in sentences(8, 5)]
    write_jsonl(root / "lambada" / "mosaic_lambada_openai_test.jsonl", lambada)
    gsm = [
        {"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(6)
    ]
    write_jsonl(root / "gsm8k" / "test.jsonl", gsm)
    return root


def tiny_config(root: Path, tasks_dir: Path) -> Config:
    cfg = Config()
    cfg.run.dir, cfg.run.name = str(root.parent), root.name
    cfg.model = tiny_model_config(max_seq_len=128)
    cfg.train.seq_len = 64
    cfg.eval.tasks = ["copa", "winogrande", "lambada"]
    cfg.eval.tasks_dir = str(tasks_dir)
    cfg.eval.limit = 0
    cfg.eval.prompts = ["The cat", "A dog"]
    cfg.eval.max_new_tokens = 4
    cfg.eval.gallery_tokens = 6
    cfg.eval.batch_size = 4
    return cfg


def save_tiny_checkpoint(root: Path, cfg: Config, vocab_size: int, step: int, seed: int) -> Path:
    from smelt.checkpoint.store import save_checkpoint
    from smelt.model.transformer import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg.model, vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meta = {"model_config": cfg.model, "vocab_size": vocab_size, "tokens": step * 1000}
    return save_checkpoint(root / "train" / "checkpoints", step, model, optimizer, meta)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, Config]:
    """RUN/{documents,tokenizer,tokens,train/checkpoints/step_{1,2}} and a tasks directory."""
    from smelt.tokenizer.load import Tokenizer
    from smelt.tokenizer.train import train_tokenizer
    from smelt.tokens.tokenize import tokenize

    base = tmp_path_factory.mktemp("evalrun")
    root = base / "run"
    documents = root / "documents"
    write_documents(documents, "train", "prose", sentences(300, 0))
    write_documents(documents, "val", "prose", sentences(20, 1))
    train_tokenizer(
        TokenizerConfig(vocab_size=512, sample_bytes=100_000), documents, root / "tokenizer", seed=0
    )
    tokenize(TokensConfig(shard_tokens=5_000), documents, root / "tokenizer", root / "tokens")
    tasks_dir = write_tasks(base / "tasks")
    cfg = tiny_config(root, tasks_dir)
    vocab = Tokenizer.load(root / "tokenizer").vocab_size
    for step, seed in ((1, 0), (2, 1)):
        save_tiny_checkpoint(root, cfg, vocab, step, seed)
    return root, cfg
