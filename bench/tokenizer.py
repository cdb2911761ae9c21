"""Tokenizer training and encoding throughput on the shared corpus (prose, code, multilingual).

Usage: python bench/tokenizer.py [VOCAB]   (default 8192; the shared data at ../shared/data or $SMELT_SHARED_DATA)

Figures: training MB/s (BPE on the whole corpus as the sample), encoding MB/s in one process on one
core for the GPT-4 and GPT-2 pre-tokenization regexes with Hugging Face's `encode_batch` and
`encode_batch_fast`, smelt's compiled encoder (`native`, the default) and its tiktoken backend, and
`smelt tokenize` end to end (documents -> shards) with 1 and all workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from common import write_result

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SMELT_SHARED_DATA", ROOT.parent / "shared" / "data"))


def corpus_documents() -> dict[str, list[str]]:
    corpus = SHARED / "corpus"
    prose = []
    for path in sorted((corpus / "prose").rglob("*")):
        if path.is_file() and path.suffix in (".txt", ".tex", ".raw", "") and path.stat().st_size > 1000:
            text = path.read_bytes().decode("utf-8", errors="replace")
            prose += [text[i : i + 20_000] for i in range(0, len(text), 20_000)]
    code = []
    for path in sorted((corpus / "code").glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            code += [json.loads(line)["text"] for line in handle]
    multi = []
    for path in sorted((corpus / "multilingual" / "lingua-testdata-A" / "sentences").glob("*.txt")):
        lines = path.read_text(encoding="utf-8").splitlines()
        multi += ["\n".join(lines[i : i + 20]) for i in range(0, len(lines), 20)]
    for path in sorted((corpus / "multilingual" / "nltk_udhr2").glob("*.txt")):
        multi.append(path.read_bytes().decode("utf-8", errors="replace"))
    return {"prose": prose, "code": code, "multilingual": multi}


def write_corpus(root: Path, docs: dict[str, list[str]]) -> int:
    total = 0
    for source, texts in docs.items():
        directory = root / "train" / source
        directory.mkdir(parents=True)
        n = len(texts)
        table = pa.table({"id": [f"{source}:{i}" for i in range(n)], "text": texts, "source": [source] * n})
        pq.write_table(table, directory / "part-00000.parquet", row_group_size=2048)
        total += sum(len(t.encode("utf-8")) for t in texts)
    return total


ENCODE_ONE_CORE = """
import os, sys, time, json
os.environ["RAYON_NUM_THREADS"] = "1"
from pathlib import Path
import pyarrow.parquet as pq
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.train import build_tokenizer
docs_dir, tok_dir, pattern, method = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
texts = [t for p in sorted(docs_dir.glob("train/*/part-*.parquet")) for t in pq.read_table(p).column("text").to_pylist()]
size = sum(len(t.encode()) for t in texts)
tokenizer = Tokenizer.load(tok_dir)
inner = tokenizer.inner
if pattern != "gpt4":  # same merges, another pre-tokenization regex
    inner.pre_tokenizer = build_tokenizer(pattern).pre_tokenizer
if method in ("native", "tiktoken"):  # smelt's backends, each forced through $SMELT_TOKENIZER_BACKEND
    os.environ["SMELT_TOKENIZER_BACKEND"] = method
    assert tokenizer.backend == method, tokenizer.backend
    encode = lambda batch, add_special_tokens: tokenizer.encode_flat(batch)  # noqa: E731
else:
    encode = getattr(inner, method)
encode(["warm up: load the compiled kernels"], add_special_tokens=False)
started = time.perf_counter()
for i in range(0, len(texts), 1024):
    encode(texts[i : i + 1024], add_special_tokens=False)
print(json.dumps({"mb_per_s": size / 1e6 / (time.perf_counter() - started)}))
"""


def encode_one_core(docs: Path, tok: Path, pattern: str, method: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", ENCODE_ONE_CORE, str(docs), str(tok), pattern, method],
        check=True,
        capture_output=True,
        text=True,
    )
    return round(json.loads(out.stdout.strip().splitlines()[-1])["mb_per_s"], 2)


def main() -> None:
    os.environ.setdefault("SMELT_QUIET", "1")
    from smelt.config import TokenizerConfig, TokensConfig
    from smelt.tokenizer.train import train_tokenizer
    from smelt.tokens.tokenize import tokenize

    vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    root = Path(tempfile.mkdtemp())
    docs = root / "documents"
    total = write_corpus(docs, corpus_documents())
    cores = os.cpu_count() or 1

    started = time.perf_counter()
    stats = train_tokenizer(
        TokenizerConfig(vocab_size=vocab, sample_bytes=total + 1), docs, root / "tok", seed=0
    )
    train_s = time.perf_counter() - started
    figures: dict[str, object] = {
        "corpus_mb": round(total / 1e6, 2),
        "vocab_size": vocab,
        "train_sample_mb": round(stats["sample_bytes"] / 1e6, 2),
        "train_s": round(train_s, 2),
        "train_mb_per_s": round(stats["sample_bytes"] / 1e6 / train_s, 2),
    }
    for pattern in ("gpt4", "gpt2"):
        for method in (
            "encode_batch",
            "encode_batch_fast",
            "native",
            *(["tiktoken"] if pattern == "gpt4" else []),
        ):
            figures[f"encode_mb_per_s_per_core_{pattern}_{method}"] = encode_one_core(
                docs, root / "tok", pattern, method
            )
    for workers in sorted({1, cores}):
        out = root / f"tokens_{workers}"
        started = time.perf_counter()
        result = tokenize(TokensConfig(), docs, root / "tok", out, workers=workers)
        wall = time.perf_counter() - started
        figures[f"tokenize_{workers}_workers_s"] = round(wall, 2)
        figures[f"tokenize_{workers}_workers_mb_per_s"] = round(total / 1e6 / wall, 2)
        figures[f"tokenize_{workers}_workers_mb_per_s_per_core"] = round(total / 1e6 / wall / workers, 2)
        figures["tokens_total"] = result["tokens"]
        figures["bytes_per_token"] = result["bytes_per_token"]
    write_result("tokenizer", figures)


if __name__ == "__main__":
    main()
