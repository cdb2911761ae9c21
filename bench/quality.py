"""Quality classifier and PII scrubbing on the shared corpus: accuracy, training time, throughput.

Usage: python bench/quality.py   (the shared data at ../shared/data or $SMELT_SHARED_DATA)

Quality: positives are Gutenberg books (without their first and last tenth, the licence boilerplate)
in 2,000-character paragraph blocks plus WikiText paragraphs; negatives are all visible text of half
of the 181 article-extraction-benchmark pages (navigation included, what a crawler without extraction
keeps) in blocks, plus 20 Common Crawl documents. `smelt`'s `train_quality` trains on them (all
documents, 10% held out) with words only (the default) and with character 3..5-grams. On the other
half of the pages it checks that the clean article text (the benchmark's ground truth) scores above the
same page's raw text (`pairwise_clean_over_raw`). Scoring speed is one process over the training
blocks (every character read) and over whole files (stdlib modules and books, of which the classifier
reads the first `max_chars` = 10,000 characters).

PII: `scrub` over prose (every prose text file), code (CPython stdlib, RustPython crates) and web text
(benchmark ground truth and raw page text, Common Crawl sample): MB/s in one process and replacements
per kind.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import write_result

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
SHARED = Path(os.environ.get("SMELT_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = SHARED / "corpus"

from smelt.config import Config, DataConfig, QualityConfig, RunConfig, SourceConfig  # noqa: E402
from smelt.data.pii import KINDS, scrub  # noqa: E402
from smelt.data.quality import QualityModel, train_quality  # noqa: E402


def blocks(text: str, size: int = 2000) -> list[str]:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if p.strip()]
    out, current = [], ""
    for paragraph in paragraphs:
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= size:
            out.append(current)
            current = ""
    return out


def quality_sets() -> tuple[list[str], list[str], dict, dict, list[str]]:
    positives = []
    for path in sorted((CORPUS / "prose" / "gutenberg").glob("*.txt")):
        book = blocks(path.read_bytes().decode("utf-8-sig"))
        positives += book[len(book) // 10 : len(book) - len(book) // 10]
    wiki = (CORPUS / "prose" / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    positives += [line.strip() for line in wiki.splitlines() if len(line.strip()) >= 500]
    bench = CORPUS / "web" / "article-extraction-benchmark"
    raw = json.loads((bench / "output" / "html-text.json").read_text(encoding="utf-8"))["output"]
    truth = json.loads((bench / "ground-truth.json").read_text(encoding="utf-8"))
    pages = sorted(raw)
    negatives = [b for page in pages[: len(pages) // 2] for b in blocks(raw[page]["articleBody"])]
    for path in sorted((CORPUS / "web" / "dolma-cc-sample").glob("*.jsonl")):
        negatives += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    return positives, negatives, raw, truth, pages[len(pages) // 2 :]


def write_jsonl(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")


def code_texts() -> list[str]:
    texts = []
    for name in ("cpython_stdlib_lib.jsonl", "rustpython_stdlib_crate_rs.jsonl"):
        with open(CORPUS / "code" / name, encoding="utf-8") as handle:
            texts += [json.loads(line)["text"] for line in handle]
    return texts


def mb(texts: list[str]) -> float:
    return sum(len(t.encode("utf-8")) for t in texts) / 1e6


def best_rate(fn, texts: list[str], repeats: int = 3) -> float:
    """MB/s of fn over texts in this process, best of `repeats` (the machine may be shared)."""
    size = mb(texts)
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        for text in texts:
            fn(text)
        best = max(best, size / (time.perf_counter() - started))
    return round(best, 1)


def bench_quality(figures: dict) -> None:
    positives, negatives, raw, truth, test_pages = quality_sets()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_jsonl(root / "good.jsonl", positives)
        write_jsonl(root / "poor.jsonl", negatives)
        sources = [
            SourceConfig(name=name, format="jsonl", root=str(root), include=[f"{name}.jsonl"])
            for name in ("good", "poor")
        ]
        for label, char_ngrams in (("", 0), ("char5_", 5)):
            quality = QualityConfig(
                positive_sources=["good"], negative_sources=["poor"], char_ngrams=char_ngrams
            )
            cfg = Config(run=RunConfig(seed=0), data=DataConfig(sources=sources, quality=quality))
            out = root / f"{label}model.safetensors"
            started = time.perf_counter()
            metrics = train_quality(cfg, out)
            total = time.perf_counter() - started
            model = QualityModel.load(out)
            wins = [
                model.score(truth[p]["articleBody"]) > model.score(raw[p]["articleBody"]) for p in test_pages
            ]
            figures[f"quality_{label}holdout_auc"] = metrics["holdout_auc"]
            figures[f"quality_{label}holdout_accuracy"] = metrics["holdout_accuracy"]
            figures[f"quality_{label}pairwise_clean_over_raw"] = round(float(np.mean(wins)), 4)
            figures[f"quality_{label}train_seconds"] = metrics["train_seconds"]
            figures[f"quality_{label}train_total_seconds"] = round(total, 2)
            if not label:
                figures["quality_docs_positive"] = metrics["docs_positive"]
                figures["quality_docs_negative"] = metrics["docs_negative"]
                figures["quality_holdout_docs"] = metrics["holdout_positive"] + metrics["holdout_negative"]
                figures["quality_pairwise_pages"] = len(test_pages)
                figures["quality_model_mb"] = round(out.stat().st_size / 1e6, 2)
            # blocks of about 2,000 characters: every character is read
            figures[f"quality_{label}score_blocks_mb_per_s_per_core"] = best_rate(
                model.score, positives + negatives
            )
            if not label:
                # whole files (stdlib modules, books): the classifier reads the first max_chars of each
                texts = code_texts() + [
                    p.read_text(encoding="utf-8-sig")
                    for p in sorted((CORPUS / "prose" / "gutenberg").glob("*.txt"))
                ]
                figures["quality_score_whole_docs_mb_per_s_per_core"] = best_rate(model.score, texts)
                figures["quality_score_whole_docs_mb"] = round(mb(texts), 1)


def bench_pii(figures: dict) -> None:
    prose = []
    for path in sorted((CORPUS / "prose").rglob("*")):
        if path.is_file() and path.suffix in (".txt", ".raw", ".tex", ""):
            prose.append(path.read_bytes().decode("utf-8", errors="replace"))
    bench = CORPUS / "web" / "article-extraction-benchmark"
    web = [v["articleBody"] for v in json.loads((bench / "ground-truth.json").read_text()).values()]
    web += [
        v["articleBody"]
        for v in json.loads((bench / "output" / "html-text.json").read_text())["output"].values()
    ]
    for path in sorted((CORPUS / "web" / "dolma-cc-sample").glob("*.jsonl")):
        web += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    for name, texts in (("prose", prose), ("code", code_texts()), ("web", web)):
        figures[f"pii_{name}_mb"] = round(mb(texts), 1)
        figures[f"pii_{name}_mb_per_s_per_core"] = best_rate(scrub, texts)
        totals = dict.fromkeys(KINDS, 0)
        for text in texts:
            for kind, n in scrub(text)[1].items():
                totals[kind] += n
        for kind, n in totals.items():
            figures[f"pii_{name}_{kind}_replacements"] = n


def main() -> None:
    figures: dict[str, object] = {}
    bench_quality(figures)
    bench_pii(figures)
    write_result("quality", figures)


if __name__ == "__main__":
    main()
