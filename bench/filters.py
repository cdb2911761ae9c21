"""Throughput of the per-document curation steps, and language-id accuracy, on the shared corpus.

Usage: python bench/filters.py [--compare-lingua]
(the shared data at ../shared/data or $SMELT_SHARED_DATA; --compare-lingua also measures
lingua-language-detector in low-accuracy mode, which must then be importable)

Figures, all in one process and timed in CPU seconds of this process (time.process_time), so MB/s
is MB/s per core even on a machine shared with other jobs, counting the UTF-8 bytes of each document
as it enters the step:
* `<domain>_<step>_mb_per_s_per_core` for normalize (with and without mojibake repair), language id,
  the URL blocklist and each filter, on prose (Gutenberg books, inaugural and State of the Union
  speeches, as whole files), web (the dolma Common Crawl sample) and code (the CPython stdlib);
* `<domain>_heuristics_mb_per_s_per_core`: normalize -> language id -> the domain's default filters
  (Gopher quality + repetition for prose and web, code rules for code; no language id on code) —
  the "heuristic steps" whose goal is 5 MB/s per core; `web_all_filters_...` adds C4 and FineWeb;
* `<domain>_<step>_kept_fraction`: documents the step keeps;
* language id on the lingua test set (75 languages, labels = file names): accuracy on single
  sentences and on documents of 10 sentences, overall and on the languages the model knows, and
  its speed on each.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import write_result

from smelt.config import DataConfig, SourceConfig, UrlFilterConfig
from smelt.data.filters import FILTER_STEPS
from smelt.data.langid import ALIASES, LanguageId, identify, known_languages
from smelt.data.ledger import Doc, Ledger
from smelt.data.normalize import Normalize, normalize_text

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SMELT_SHARED_DATA", ROOT.parent / "shared" / "data"))
MIN_SECONDS = 2.0  # repeat a measurement until it has run this long


def load_domains() -> dict[str, list[tuple[str, str | None]]]:
    """(text, url) documents per domain, read raw (before normalization)."""
    corpus = SHARED / "corpus"
    prose = []
    for pattern in ("gutenberg/*.txt", "nltk_inaugural/*.txt", "nltk_state_union/*.txt"):
        for path in sorted((corpus / "prose").glob(pattern)):
            if "README" not in path.name:
                prose.append((path.read_bytes().decode("utf-8-sig", errors="replace"), None))
    web = []
    for path in sorted((corpus / "web" / "dolma-cc-sample").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            web.append((record["text"], record["id"]))
    code = []
    with open(corpus / "code" / "cpython_stdlib_lib.jsonl", encoding="utf-8") as handle:
        code = [(json.loads(line)["text"], None) for line in handle]
    return {"prose": prose, "web": web, "code": code}


def make_docs(domain: str, items: list[tuple[str, str | None]]) -> list[Doc]:
    return [
        Doc(domain, 0, f"{domain}:{i}", text, f"{domain}.txt", url=url) for i, (text, url) in enumerate(items)
    ]


def timed(make: Callable[[], list[Doc]], apply: Callable[[Doc, Ledger], Doc | None]) -> tuple[float, float]:
    """(MB/s, kept fraction) of `apply` over fresh documents, repeated for at least MIN_SECONDS."""
    nbytes = seconds = 0.0
    kept = total = 0
    while seconds < MIN_SECONDS:
        docs = make()
        size = sum(len(d.text.encode("utf-8")) for d in docs)
        ledger = Ledger()
        start = time.process_time()
        out = [apply(d, ledger) for d in docs]
        seconds += time.process_time() - start
        nbytes += size
        kept += sum(o is not None for o in out)
        total += len(docs)
    return nbytes / seconds / 1e6, kept / total


def chain(steps: list) -> Callable[[Doc, Ledger], Doc | None]:
    def apply(doc: Doc, ledger: Ledger) -> Doc | None:
        for step in steps:
            if step.sources is not None and doc.source not in step.sources:
                continue
            doc = step.apply(doc, ledger)
            if doc is None:
                return None
        return doc

    return apply


def bench_steps(figures: dict[str, object]) -> None:
    domains = load_domains()
    with tempfile.TemporaryDirectory() as tmp:
        blocklist = Path(tmp) / "block.txt"
        blocklist.write_text("example.com\nspam.test\n/casino/\n^https?://[^/]*\\.xxx/\n")
        all_filters = ["url_blocklist", "gopher_quality", "gopher_repetition", "c4", "fineweb", "code"]
        cfg = DataConfig(
            sources=[
                SourceConfig(name="prose", filters=all_filters),
                SourceConfig(name="web", filters=all_filters),
                SourceConfig(name="code", code=True, filters=all_filters),
            ],
            url_filter=UrlFilterConfig(str(blocklist)),
        )
        filters = {cls.filter_name: cls.from_config(cfg) for cls in FILTER_STEPS}
    for domain, items in domains.items():
        code = domain == "code"
        raw = make_docs(domain, items)
        normalized = [
            Doc(d.source, 0, d.id, normalize_text(d.text, code=code), d.file, url=d.url) for d in raw
        ]

        def fresh(docs: list[Doc] = normalized) -> list[Doc]:
            return [Doc(d.source, 0, d.id, d.text, d.file, url=d.url) for d in docs]

        def fresh_raw(docs: list[Doc] = raw) -> list[Doc]:
            return fresh(docs)

        prefix = f"{domain}_"
        figures[f"{prefix}documents"] = len(raw)
        figures[f"{prefix}mb"] = round(sum(len(d.text.encode("utf-8")) for d in raw) / 1e6, 3)
        norm = Normalize.from_config(DataConfig(sources=[SourceConfig(name=domain, code=code)]))
        moji = Normalize.from_config(
            DataConfig(sources=[SourceConfig(name=domain, code=code, mojibake=True)])
        )
        figures[f"{prefix}normalize_mb_per_s_per_core"] = round(timed(fresh_raw, norm.apply)[0], 2)
        figures[f"{prefix}normalize_mojibake_mb_per_s_per_core"] = round(timed(fresh_raw, moji.apply)[0], 2)
        langid = LanguageId.from_config(DataConfig(sources=[SourceConfig(name=domain)]))
        if not code:
            figures[f"{prefix}language_id_mb_per_s_per_core"] = round(timed(fresh, langid.apply)[0], 2)
        for name, step in filters.items():
            rate, kept = timed(fresh, step.apply)
            figures[f"{prefix}{name}_mb_per_s_per_core"] = round(rate, 2)
            figures[f"{prefix}{name}_kept_fraction"] = round(kept, 3)
        default = ["code"] if code else ["gopher_quality", "gopher_repetition"]
        steps = [norm] + ([] if code else [langid]) + [filters[n] for n in default]
        rate, kept = timed(fresh_raw, chain(steps))
        figures[f"{prefix}heuristics_mb_per_s_per_core"] = round(rate, 2)
        figures[f"{prefix}heuristics_kept_fraction"] = round(kept, 3)
        if domain == "web":
            every = [norm, langid] + [filters[n] for n in all_filters if n != "code"]
            rate, kept = timed(fresh_raw, chain(every))
            figures["web_all_filters_mb_per_s_per_core"] = round(rate, 2)
            figures["web_all_filters_kept_fraction"] = round(kept, 3)


def lingua_sets(
    per_language: int = 200, per_doc: int = 10
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sentences, documents of `per_doc` sentences), each as (label, text), from the first
    `per_language` sentences of every language."""
    root = SHARED / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    sentences, documents = [], []
    for path in sorted(root.glob("*.txt")):
        lines = [s for s in path.read_text(encoding="utf-8").splitlines() if s.strip()][:per_language]
        sentences += [(path.stem, s) for s in lines]
        documents += [(path.stem, " ".join(lines[i : i + per_doc])) for i in range(0, len(lines), per_doc)]
    return sentences, documents


def score(classify: Callable[[str], str], items: list[tuple[str, str]], known: set[str]) -> dict[str, float]:
    start = time.process_time()
    answers = [classify(text) for _, text in items]
    seconds = time.process_time() - start
    right = [ALIASES.get(label, label) == got for (label, _), got in zip(items, answers, strict=True)]
    on_known = [r for (label, _), r in zip(items, right, strict=True) if ALIASES.get(label, label) in known]
    size = sum(len(text.encode("utf-8")) for _, text in items)
    return {
        "accuracy": round(sum(right) / len(right), 4),
        "accuracy_known_languages": round(sum(on_known) / len(on_known), 4),
        "mb_per_s_per_core": round(size / seconds / 1e6, 3),
    }


def bench_langid(figures: dict[str, object], compare_lingua: bool) -> None:
    sentences, documents = lingua_sets()
    labels = {label for label, _ in sentences}
    known = set(known_languages())
    figures["langid_test_languages"] = len(labels)
    figures["langid_test_languages_unknown_to_model"] = ",".join(sorted(labels - known - set(ALIASES)))
    for name, items in (("sentence", sentences), ("document", documents)):
        for key, value in score(lambda t: identify(t)[0], items, known).items():
            figures[f"langid_{name}_{key}"] = value
    if compare_lingua:
        from lingua import LanguageDetectorBuilder

        detector = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()

        def lingua(text: str) -> str:
            lang = detector.detect_language_of(text)
            code = lang.iso_code_639_1.name.lower() if lang is not None else "und"
            return ALIASES.get(code, code)

        for name, items in (("sentence", sentences), ("document", documents)):
            for key, value in score(lingua, items, known).items():
                figures[f"lingua_low_{name}_{key}"] = value


def main() -> None:
    figures: dict[str, object] = {}
    bench_steps(figures)
    bench_langid(figures, "--compare-lingua" in sys.argv[1:])
    write_result("filters", figures)


if __name__ == "__main__":
    main()
