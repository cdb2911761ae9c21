"""Where smelt's near-dup step and datasketch disagree, scored against the true Jaccard similarity.

On the documents of bench/dedup_speed.py (passages of the shared corpus with planted near-duplicates,
same generator and seed) this runs:
* smelt: the near-dup plan of `smelt curate` (LSH bands x rows for threshold 0.8, candidates verified
  on the signatures, union-find clusters, members not close to their representative detached), and
  the same with `verify = "jaccard"`;
* datasketch: MinHash + MinHashLSH with the same shingles and bands x rows, streamed as
  bench/dedup_speed.py does: a document is removed when the LSH query finds any kept document;
* exact: the true Jaccard similarity of every pair of documents that share a shingle (word 5-grams of
  smelt's normalized words, as both sides hash them), from an inverted index.
For each side it counts the removed documents that have no kept document at Jaccard >= the threshold
(removed wrongly) and the kept documents that have another kept document at >= the threshold (missed),
and it bins the documents only one side removed by their best true Jaccard against what the other side
kept. An exact greedy pass (a document is removed iff a kept earlier one is at >= the threshold) gives
the reference count.

    python bench/dedup_disagreement.py [--docs 30000]   # datasketch needed: pip install -e '.[bench]'
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402
from dedup_speed import generate  # noqa: E402

NGRAM = 5
BINS = (0.0, 0.5, 0.7, 0.75, 0.8, 0.9, 1.01)


def shingles(text: str) -> np.ndarray:
    """Distinct word 5-grams of smelt's normalized words, as 64-bit hashes of their bytes."""
    from smelt.data.dedup.minhash import words

    ws = words(text)
    grams = {b" ".join(ws[j : j + NGRAM]) for j in range(max(1, len(ws) - NGRAM + 1))}
    return np.unique(np.fromiter((hash(g) for g in grams), np.int64, len(grams)))


class ExactIndex:
    """Every document's true Jaccard similarity to every other document it shares a shingle with."""

    def __init__(self, sets: list[np.ndarray]):
        self.sizes = np.array([len(s) for s in sets], np.int64)
        docs = np.repeat(np.arange(len(sets)), self.sizes)
        values = np.concatenate(sets)
        order = np.argsort(values, kind="stable")
        self.values, self.docs = values[order], docs[order]
        self.sets = sets

    def neighbours(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(other documents, their Jaccard with document i), for those sharing at least one shingle."""
        lo = np.searchsorted(self.values, self.sets[i], "left")
        hi = np.searchsorted(self.values, self.sets[i], "right")
        counts = hi - lo
        starts = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        others, overlap = np.unique(self.docs[starts], return_counts=True)
        keep = others != i
        others, overlap = others[keep], overlap[keep]
        union = self.sizes[i] + self.sizes[others] - overlap
        return others, overlap / union


def run_smelt(paths: list[Path], work: Path, verify: str) -> set[int]:
    from smelt.config import DataConfig, NearDedupConfig
    from smelt.data.dedup.near import plan_near_dedup

    cfg = DataConfig(near_dedup=NearDedupConfig(enabled=True, verify=verify), workers=1)
    plan = plan_near_dedup(cfg, [("bench", p) for p in paths], work, 1, "fork")
    return {int(doc_id) for (_, doc_id), decision in plan.members.items() if decision[2] is not None}


def smelt_band_keys(texts: list[str]) -> np.ndarray:
    """The LSH bucket keys smelt gives each document (global scope)."""
    from smelt.config import NearDedupConfig
    from smelt.data.dedup.lsh import band_keys
    from smelt.data.dedup.minhash import MinHasher
    from smelt.data.dedup.near import params_of

    nd = NearDedupConfig(enabled=True)
    return band_keys(MinHasher(nd.num_perm, nd.ngram).signatures(texts), params_of(nd))


def run_datasketch(texts: list[str]) -> set[int]:
    from datasketch import MinHash, MinHashLSH

    from smelt.config import NearDedupConfig
    from smelt.data.dedup.minhash import words
    from smelt.data.dedup.near import params_of

    nd = NearDedupConfig(enabled=True)
    params = params_of(nd)
    lsh = MinHashLSH(num_perm=nd.num_perm, params=(params.bands, params.rows))
    removed = set()
    for i, text in enumerate(texts):
        ws = words(text)
        grams = {b" ".join(ws[j : j + NGRAM]) for j in range(max(1, len(ws) - NGRAM + 1))}
        m = MinHash(num_perm=nd.num_perm)
        m.update_batch(list(grams))
        if lsh.query(m):
            removed.add(i)
            continue
        lsh.insert(str(i), m)
    return removed


def best_against(neighbours: list[tuple[np.ndarray, np.ndarray]], i: int, kept: np.ndarray) -> float:
    """Document i's highest Jaccard with a kept document other than itself (0 if none shares a shingle)."""
    others, jac = neighbours[i]
    mask = kept[others]
    return float(jac[mask].max()) if mask.any() else 0.0


def histogram(values: list[float], prefix: str, figures: dict) -> None:
    counts, _ = np.histogram(values, bins=BINS)
    names = ("below_0_5", "0_5_to_0_7", "0_7_to_0_75", "0_75_to_0_8", "0_8_to_0_9", "0_9_and_above")
    for name, count in zip(names, counts, strict=True):
        figures[f"{prefix}_best_jaccard_{name}"] = int(count)


def score(
    name: str,
    removed: set[int],
    n: int,
    neighbours: list,
    threshold: float,
    figures: dict,
    band_keys: np.ndarray | None = None,
) -> None:
    """How right one side's removals are; with smelt's `band_keys`, how many of its missed pairs the
    LSH bands never proposed (the S-curve's misses, which no verification can recover)."""
    kept = np.ones(n, bool)
    kept[list(removed)] = False
    best = [best_against(neighbours, i, kept) for i in removed]
    missed_docs = missed_pairs = not_candidates = 0
    for i in np.flatnonzero(kept):
        others, jac = neighbours[i]
        close = others[(jac >= threshold) & kept[others]]
        missed_docs += bool(len(close))
        later = close[close > i]
        missed_pairs += len(later)
        if band_keys is not None:
            not_candidates += sum(not (band_keys[i] == band_keys[j]).any() for j in later)
    figures[f"{name}_removed"] = len(removed)
    figures[f"{name}_removed_without_kept_match_at_threshold"] = sum(b < threshold for b in best)
    histogram(best, f"{name}_removed", figures)
    figures[f"{name}_kept_docs_with_kept_match_at_threshold"] = missed_docs
    figures[f"{name}_kept_pairs_at_threshold"] = missed_pairs
    if band_keys is not None:
        figures[f"{name}_kept_pairs_at_threshold_not_lsh_candidates"] = int(not_candidates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=30_000)
    parser.add_argument("--threshold", type=float, default=0.8)
    args = parser.parse_args()
    figures: dict[str, object] = {"documents": args.docs, "threshold": args.threshold}
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate(args.docs, Path(tmp) / "data")
        texts = [t for p in paths for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()]
        assert len(texts) == args.docs
        start = time.perf_counter()
        smelt = run_smelt(paths, Path(tmp) / "work", "signature")
        figures["smelt_s"] = round(time.perf_counter() - start, 1)
        smelt_jaccard = run_smelt(paths, Path(tmp) / "work_j", "jaccard")
    start = time.perf_counter()
    sketch = run_datasketch(texts)
    figures["datasketch_s"] = round(time.perf_counter() - start, 1)

    start = time.perf_counter()
    index = ExactIndex([shingles(t) for t in texts])
    neighbours = [index.neighbours(i) for i in range(len(texts))]
    figures["exact_s"] = round(time.perf_counter() - start, 1)
    greedy_kept = np.ones(len(texts), bool)
    for i in range(len(texts)):
        others, jac = neighbours[i]
        earlier = others < i
        if ((jac[earlier] >= args.threshold) & greedy_kept[others[earlier]]).any():
            greedy_kept[i] = False
    greedy = set(np.flatnonzero(~greedy_kept).tolist())
    with_match = sum(bool((jac >= args.threshold).any()) for _, jac in neighbours)
    figures["docs_with_any_match_at_threshold"] = with_match

    keys = smelt_band_keys(texts)
    for name, removed, bands in (
        ("exact_greedy", greedy, None),
        ("smelt", smelt, keys),
        ("smelt_verify_jaccard", smelt_jaccard, keys),
        ("datasketch", sketch, None),
    ):
        score(name, removed, len(texts), neighbours, args.threshold, figures, bands)

    kept_by = {}
    for name, removed in (("smelt", smelt), ("datasketch", sketch)):
        kept_by[name] = np.ones(len(texts), bool)
        kept_by[name][list(removed)] = False
    only_sketch, only_smelt = sorted(sketch - smelt), sorted(smelt - sketch)
    figures["removed_by_both"] = len(sketch & smelt)
    figures["removed_only_by_datasketch"] = len(only_sketch)
    figures["removed_only_by_smelt"] = len(only_smelt)
    # each side's extra removals, by their best true Jaccard with a document the *other* side kept:
    # >= threshold means the other side kept a near-duplicate (it missed one); below, this side was wrong
    histogram(
        [best_against(neighbours, i, kept_by["smelt"]) for i in only_sketch], "only_datasketch", figures
    )
    histogram([best_against(neighbours, i, kept_by["datasketch"]) for i in only_smelt], "only_smelt", figures)
    histogram(
        [best_against(neighbours, i, kept_by["datasketch"]) for i in only_sketch],
        "only_datasketch_vs_own_kept",
        figures,
    )
    figures["greedy_vs_smelt_symmetric_difference"] = len(greedy ^ smelt)
    figures["greedy_vs_datasketch_symmetric_difference"] = len(greedy ^ sketch)
    write_result("dedup_disagreement", figures)


if __name__ == "__main__":
    main()
