"""Shared by bench/effects*.py: running smelt, the seed statistics and the rule for "shown"."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import REPO, smelt_env

from smelt.tokenizer.patterns import GPT4_PATTERN

SEEDS = (0, 1, 2)

# The parts of the generated pipeline configs the effects share (format fields: {shared}).
PROSE = """\
[data]
min_chars = 200
max_chars = 2_000_000
val_fraction = 0.05

[[data.sources]]
name = "prose"
format = "text"
root = "{shared}/corpus/prose"
include = ["gutenberg/*.txt", "tinyshakespeare/*.txt", "paulgraham/*.txt", "wikitext-2-raw/*.raw"]

"""
CODE = """\
[[data.sources]]
name = "code"
format = "jsonl"
root = "{shared}/corpus/code"
include = ["*.jsonl"]
id_field = "path"
split_unit = "field:path"
code = true

"""
TOKENIZER = """\
[tokenizer]
vocab_size = 2048
sample_bytes = 2_000_000
"""
# Prose and code 70/30 into the tiny-1m shape at 128 tokens: the head of the MoE, Muon, anneal and
# averaging configs (format fields: {shared}; a model block may follow).
MIXED_TINY = (
    PROSE
    + CODE
    + TOKENIZER
    + """

[tokens]
mixture = {{ prose = 0.7, code = 0.3 }}
workers = 1

[model]
preset = "tiny-1m"
max_seq_len = 128
"""
)
# The [eval] block every generated pipeline config ends with: held-out loss only, no tasks or prompts.
EVAL = """[eval]
max_bytes = 50_000
tasks = []
prompts = []
max_new_tokens = 8
"""
# GPT-4's pre-tokenization with one digit per piece (as Llama's tokenizer splits numbers): every number is
# a sequence of digit tokens, so arithmetic and copying work digit by digit instead of on a table of
# 1-3 digit tokens.
DIGIT_PATTERN = GPT4_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
THREADS = os.environ.get("OMP_NUM_THREADS", "1")


def smelt(*argv: str) -> None:
    """One smelt command in a child process (the public CLI), its output kept to the last lines."""
    env = smelt_env(OMP_NUM_THREADS=THREADS)
    proc = subprocess.run([sys.executable, "-m", "smelt", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True)  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"smelt {' '.join(argv[:4])} ... exited {proc.returncode}:\n{tail}")


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def records(run: Path, kind: str) -> list[dict]:
    """The records of one kind in RUN/train/metrics.jsonl."""
    lines = (Path(run) / "train" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(None, lines)) if r.get("kind") == kind]


def stats(values: list[float]) -> dict:
    """Mean, spread (the sample standard deviation over seeds) and the per-seed values."""
    return {
        "per_seed": [round(v, 4) for v in values],
        "mean": round(statistics.fmean(values), 4),
        "spread": round(statistics.stdev(values), 4) if len(values) > 1 else None,
    }


def effect(metric: str, seeds: list[int], before: list[float], after: list[float], threshold: float,
           better: str = "higher", **extra) -> dict:  # fmt: skip
    """The figures of one effect. `difference` is after - before when higher is better, else before -
    after, so a positive difference is the effect; it is shown when its mean exceeds both the threshold
    and twice its spread over seeds."""
    sign = 1.0 if better == "higher" else -1.0
    diffs = [sign * (a - b) for b, a in zip(before, after, strict=True)]
    d = stats(diffs)
    spread = d["spread"] or 0.0
    shown = d["mean"] > threshold and d["mean"] > 2 * spread
    return {
        "metric": metric,
        "better": better,
        "seeds": list(seeds),
        "before": stats(before),
        "after": stats(after),
        "difference": d,
        "threshold": threshold,
        "rule": "shown when mean difference > threshold and > 2 x spread (sample std over seeds)",
        "shown": bool(shown),
        **extra,
    }
