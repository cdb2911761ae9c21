"""Language id per language: py3langid against lingua (high- and low-accuracy modes) on unseen text.

Two evaluation sets from the shared data, labelled by file name:
* `sentences`: the lingua test set (`corpus/multilingual/lingua-testdata-A/sentences`, 75 languages,
  Leipzig web and news sentences): lines 200-399 of each file (100-299 for the two shorter files, ja
  and zh). The tests use lines 0-199 and 400-409. The set comes from lingua's own repository, so it may
  favour lingua;
* `udhr`: the Universal Declaration of Human Rights (`corpus/multilingual/nltk_udhr2`), the
  paragraphs of at least 40 characters (up to 50) of the file for each of the 75 languages that has
  one: text neither detector was built from.
Texts are normalized as `smelt curate` does before language id (NFC: some files are decomposed). Each
backend runs in its own process through smelt's `identify` (as `smelt curate` calls it), which
reports its load time, classification CPU time and peak RSS. Accuracy is per language; `macro` is their
mean. Writes bench/results/langid.json; `--markdown` prints the table of docs/curation.md from it.

    python bench/langid.py                      # all three backends (lingua: pip install -e '.[langid-lingua]')
    python bench/langid.py --backends py3langid
    python bench/langid.py --markdown
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, shared_data, write_result  # noqa: E402

from smelt.data.normalize import normalize_text  # noqa: E402

SENTENCES = "corpus/multilingual/lingua-testdata-A/sentences"
UDHR = "corpus/multilingual/nltk_udhr2"
BACKENDS = ("py3langid", "lingua", "lingua_low")
PER_LANGUAGE = 200
UDHR_PARAGRAPHS = 50
# The UDHR file of each lingua language (ISO 639-3 names, a variant where the file has several).
UDHR_FILES = {
    "af": "afr", "ar": "arb", "az": "azj_latn", "be": "bel", "bg": "bul", "bn": "ben", "bs": "bos_latn",
    "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan", "de": "deu", "el": "ell_monotonic", "en": "eng",
    "eo": "epo", "es": "spa", "et": "est", "eu": "eus", "fa": "pes_1", "fi": "fin", "fr": "fra",
    "ga": "gle", "gu": "guj", "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun", "hy": "hye",
    "id": "ind", "is": "isl", "it": "ita", "ja": "jpn", "ka": "kat", "kk": "kaz", "ko": "kor",
    "la": "lat", "lg": "lug", "lt": "lit", "lv": "lav", "mi": "mri", "mk": "mkd", "mn": "khk",
    "mr": "mar", "ms": "mly_latn", "nb": "nob", "nl": "nld", "nn": "nno", "pa": "pan", "pl": "pol",
    "pt": "por_PT", "ro": "ron", "ru": "rus", "sk": "slk", "sl": "slv", "sn": "sna", "so": "som",
    "sq": "als", "sr": "srp_cyrl", "st": "sot", "sv": "swe", "sw": "swh", "ta": "tam", "th": "tha",
    "tl": "tgl", "tn": "tsn", "tr": "tur", "ts": "tso_MZ", "uk": "ukr", "ur": "urd", "vi": "vie",
    "xh": "xho", "yo": "yor", "zh": "cmn_hans", "zu": "zul",
}  # fmt: skip


def sentence_set() -> list[tuple[str, str]]:
    items = []
    for path in sorted((shared_data(SENTENCES) / SENTENCES).glob("*.txt")):
        lines = [s for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
        start = 200 if len(lines) >= 400 else 100
        items += [(path.stem, normalize_text(s)) for s in lines[start : start + PER_LANGUAGE]]
    return items


def udhr_set() -> list[tuple[str, str]]:
    items = []
    for lang, stem in sorted(UDHR_FILES.items()):
        path = shared_data(UDHR) / UDHR / f"{stem}.txt"
        if path.exists():
            lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines()]
            items += [(lang, normalize_text(s)) for s in lines if len(s) >= 40][:UDHR_PARAGRAPHS]
    return items


def classify(backend: str) -> dict:
    """In a worker process: every item of both sets classified by `backend`; answers and costs."""
    from smelt.data.langid import identify

    start = time.perf_counter()
    identify("A first sentence loads the models.", backend=backend)
    load_s = time.perf_counter() - start
    out: dict = {"load_s": round(load_s, 2)}
    for name, items in (("sentences", sentence_set()), ("udhr", udhr_set())):
        cpu = time.process_time()
        out[name] = [identify(text, backend=backend)[0] for _, text in items]
        seconds = time.process_time() - cpu
        out[f"{name}_mb_per_s_per_core"] = round(sum(len(t.encode()) for _, t in items) / seconds / 1e6, 3)
        out[f"{name}_items_per_s_per_core"] = round(len(items) / seconds, 1)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def right(label: str, answer: str, backend: str) -> bool:
    """py3langid says `no` for Norwegian Bokmal (the lingua files' `nb`)."""
    return answer == label or (backend == "py3langid" and label == "nb" and answer == "no")


def score(backend: str, name: str, items: list[tuple[str, str]], answers: list[str], figures: dict) -> None:
    per_lang: dict[str, list[bool]] = {}
    wrong: Counter = Counter()
    for (label, _), answer in zip(items, answers, strict=True):
        ok = right(label, answer, backend)
        per_lang.setdefault(label, []).append(ok)
        if not ok:
            wrong[(label, answer)] += 1
    accuracy = {lang: sum(v) / len(v) for lang, v in per_lang.items()}
    figures[f"{backend}_{name}_macro_accuracy"] = round(sum(accuracy.values()) / len(accuracy), 4)
    figures[f"{backend}_{name}_languages_below_90pct"] = ",".join(
        sorted(k for k, v in accuracy.items() if v < 0.9)
    )
    figures[f"{backend}_{name}_top_confusions"] = ", ".join(
        f"{label}->{answer} {n / len(per_lang[label]):.0%}" for (label, answer), n in wrong.most_common(8)
    )
    for lang, value in sorted(accuracy.items()):
        figures[f"{backend}_{name}_accuracy_{lang}"] = round(value, 4)


def markdown(result: dict) -> str:
    backends = [b for b in BACKENDS if f"{b}_sentences_macro_accuracy" in result]
    langs = sorted(k.rsplit("_", 1)[1] for k in result if k.startswith(f"{backends[0]}_sentences_accuracy_"))
    head = " | ".join(f"{b} {s}" for s in ("sentences", "UDHR") for b in backends)
    lines = [f"| language | {head} |", "|---" * (1 + 2 * len(backends)) + "|"]

    def cell(backend: str, name: str, lang: str) -> str:
        value = result.get(f"{backend}_{name}_accuracy_{lang}")
        return "" if value is None else f"{100 * value:.1f}"

    for lang in langs:
        cells = [cell(b, s, lang) for s in ("sentences", "udhr") for b in backends]
        lines.append(f"| {lang} | " + " | ".join(cells) + " |")
    macro = [
        f"**{100 * result[f'{b}_{s}_macro_accuracy']:.1f}**" for s in ("sentences", "udhr") for b in backends
    ]
    lines.append("| **macro** | " + " | ".join(macro) + " |")
    # the same mean without the languages py3langid cannot label (it scores 0 on them)
    unknown = {lang for lang in langs if result.get(f"py3langid_sentences_accuracy_{lang}") == 0}
    known = []
    for s in ("sentences", "udhr"):
        for b in backends:
            prefix = f"{b}_{s}_accuracy_"
            values = [
                v for k, v in result.items() if k.startswith(prefix) and k[len(prefix) :] not in unknown
            ]
            known.append(f"{100 * sum(values) / len(values):.1f}")
    lines.append(f"| macro without {', '.join(sorted(unknown))} | " + " | ".join(known) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated: " + ", ".join(BACKENDS)
    )
    parser.add_argument("--markdown", action="store_true", help="print the docs table from the last result")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(classify(args.worker)))
        return
    if args.markdown:
        print(markdown(json.loads((RESULTS / "langid.json").read_text())))
        return
    shared_data(SENTENCES, UDHR)  # before any work: say where the shared data was looked for
    sets = {"sentences": sentence_set(), "udhr": udhr_set()}
    figures: dict[str, object] = {
        "sentences_items": len(sets["sentences"]),
        "sentences_languages": len({label for label, _ in sets["sentences"]}),
        "udhr_items": len(sets["udhr"]),
        "udhr_languages": len({label for label, _ in sets["udhr"]}),
    }
    for backend in args.backends.split(","):
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", backend], capture_output=True, text=True, check=False
        )
        if proc.returncode:
            sys.exit(f"error: backend {backend} failed:\n{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        for key in ("load_s", "peak_rss_mb"):
            figures[f"{backend}_{key}"] = out[key]
        for name, items in sets.items():
            score(backend, name, items, out[name], figures)
            for key in ("mb_per_s_per_core", "items_per_s_per_core"):
                figures[f"{backend}_{name}_{key}"] = out[f"{name}_{key}"]
        print(f"{backend}: sentences {figures[f'{backend}_sentences_macro_accuracy']:.4f}, "
              f"udhr {figures[f'{backend}_udhr_macro_accuracy']:.4f}", file=sys.stderr)  # fmt: skip
    write_result("langid", figures)


if __name__ == "__main__":
    main()
