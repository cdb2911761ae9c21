"""A tiny real run to release: two sources (prose and code with FIM), every stage, 3 milestones."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from smelt.config import Config, SourceConfig

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dog",
    "ran",
    "to",
    "park",
    "and",
    "bird",
    "sang",
    "in",
    "tree",
    "so",
    "children",
    "laughed",
]


def _prose(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"p{seed}-{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) + "."}
        for i in range(n)
    ]


def _code(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        names = [rng.choice(WORDS) + str(k) for k in range(rng.randint(4, 12))]
        body = "\n".join(
            f"    {a} = {b} + {k}" for k, (a, b) in enumerate(zip(names, names[1:], strict=False))
        )
        docs.append({"id": f"c{seed}-{i}", "text": f"def f_{i}(x):\n{body}\n    return x\n"})
    return docs


def tiny_release_config(root: Path) -> Config:
    raw = root / "raw"
    raw.mkdir(parents=True)
    for name, records in (("prose.jsonl", _prose(160, 0)), ("code.jsonl", _code(200, 1))):
        (raw / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = Config()
    cfg.run.dir, cfg.run.name, cfg.run.seed = str(root / "runs"), "tiny", 3
    cfg.data.sources = [
        SourceConfig(name="prose", format="jsonl", root=str(raw), include=["prose.jsonl"], id_field="id"),
        SourceConfig(
            name="code", format="jsonl", root=str(raw), include=["code.jsonl"], id_field="id", code=True
        ),
    ]
    cfg.data.min_chars = 20
    cfg.data.val_fraction = 0.05
    cfg.data.workers = 1
    cfg.tokenizer.vocab_size = 512
    cfg.tokenizer.sample_bytes = 200_000
    cfg.tokens.workers = 1
    cfg.tokens.mixture = {"prose": 0.6, "code": 0.4}
    cfg.tokens.fim_rate = 0.5
    cfg.tokens.prefetch = 0
    cfg.model.preset = ""
    for key, value in dict(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=32).items():
        setattr(cfg.model, key, value)
    cfg.train.seq_len = 32
    cfg.train.micro_batch = 8
    cfg.train.batch_tokens = 256
    cfg.train.tokens = 256 * 6
    cfg.train.warmup_tokens = 256
    cfg.train.eval_every = 0
    cfg.train.log_every = 1
    cfg.checkpoint.every_steps = 2
    cfg.checkpoint.milestone_every_steps = 2
    cfg.checkpoint.keep_last = 1
    cfg.checkpoint.async_save = False
    cfg.eval.tasks = []
    cfg.eval.prompts = ["the cat"]
    cfg.eval.max_new_tokens = 4
    cfg.eval.max_bytes = 4000
    return cfg


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, Config]:
    from smelt.run.pipeline import STAGES, run_pipeline

    root = tmp_path_factory.mktemp("release")
    cfg = tiny_release_config(root)
    run_pipeline(cfg, STAGES)
    (cfg.run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    return cfg.run_dir, cfg


@pytest.fixture(scope="session")
def released(tiny_run, tmp_path_factory) -> Path:
    from smelt.release.build import release_run

    run_dir, _ = tiny_run
    out = tmp_path_factory.mktemp("out") / "release"
    release_run(run_dir, out, licenses={"prose": "CC-BY-4.0"}, model_license="apache-2.0")
    return out
