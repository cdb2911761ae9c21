"""Near-dedup quality against planted near-duplicates of real documents.

Base documents are disjoint passages of the shared corpus (books, speeches, essays, Wikipedia, web
pages; `corpus/` of the shared data set: $SMELT_SHARED_DATA, else ../shared/data beside the
repository). Each gets 0-3 variants made with known edits: word substitutions,
insertions, deletions, line reordering and added boilerplate lines, at an intensity drawn so that
true Jaccard (word 5-grams) spreads over about 0.5-0.95. Everything goes through the curate code path
(`plan_near_dedup` over parquet shards). Reported: pair precision over the reported pairs (each removed
document with its cluster's kept copy; one with true Jaccard < 0.7 is a false positive; also over all
pairs inside clusters), pair recall for planted pairs with Jaccard >= 0.85 (and per Jaccard band),
and cluster precision/recall.

    python bench/dedup_quality.py [--docs 3000] [--verify signature|jaccard|none]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.config import DataConfig, NearDedupConfig
from smelt.data.dedup.minhash import jaccard
from smelt.data.dedup.near import plan_near_dedup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import shared_data, write_result  # noqa: E402

BOILERPLATE = [
    "We use cookies to improve your experience. By continuing you accept our cookie policy.",
    "Home | About us | Contact | Privacy policy | Terms of service",
    "Subscribe to our newsletter for the latest updates and offers.",
    "Share this article on Facebook Twitter LinkedIn Email",
]


def real_lines(root: Path | None = None) -> list[str]:
    """Non-empty lines of the shared corpus' English prose and web text, in a fixed order. Without a
    root, the corpus of the shared data set (exits with status 2, saying where it looked, when absent)."""
    if root is None:
        root = shared_data("corpus/prose", "corpus/web/dolma-cc-sample") / "corpus"
    lines: list[str] = []
    for path in sorted((root / "prose").rglob("*")):
        if path.is_file() and path.suffix in (".txt", ".raw", ""):
            text = path.read_text(encoding="utf-8", errors="replace")
            lines.extend(line.strip() for line in text.splitlines() if len(line.split()) >= 4)
    for path in sorted((root / "web" / "dolma-cc-sample").glob("*.jsonl")):
        for record in path.read_text(encoding="utf-8").splitlines():
            text = json.loads(record).get("text", "")
            lines.extend(line.strip() for line in text.splitlines() if len(line.split()) >= 4)
    truth = root / "web" / "article-extraction-benchmark" / "ground-truth.json"
    if truth.exists():
        for item in json.loads(truth.read_text(encoding="utf-8")).values():
            body = item.get("articleBody", "") if isinstance(item, dict) else ""
            lines.extend(line.strip() for line in body.splitlines() if len(line.split()) >= 4)
    if not lines:
        print(
            f"error: no text lines under {root / 'prose'} or {root / 'web'}: the benchmark builds its "
            f"documents from them. Point SMELT_SHARED_DATA at the shared data set.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return lines


def passages(lines: list[str], n: int, rng: random.Random, words: tuple[int, int] = (120, 400)) -> list[str]:
    """n passages of consecutive lines, disjoint and in corpus order, each of about `words` words."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        if i >= len(lines):
            i = rng.randrange(len(lines) // 2)  # more passages than the corpus holds: reuse, offset
        target = rng.randint(*words)
        chunk: list[str] = []
        count = 0
        while i < len(lines) and count < target:
            chunk.append(lines[i])
            count += len(lines[i].split())
            i += 1
        out.append("\n".join(chunk))
    return out


def perturb(text: str, rng: random.Random, strength: float, vocab: list[str]) -> str:
    """Edit about `strength` of the words (substitute, insert, delete), maybe reorder lines and add
    boilerplate: the known edits of a near-duplicate."""
    lines = [line.split() for line in text.split("\n")]
    n_words = sum(len(line) for line in lines)
    for _ in range(max(1, int(strength * n_words))):
        line = lines[rng.randrange(len(lines))]
        op = rng.random()
        if op < 0.4 and line:
            line[rng.randrange(len(line))] = rng.choice(vocab)
        elif op < 0.7:
            line.insert(rng.randrange(len(line) + 1), rng.choice(vocab))
        elif line:
            del line[rng.randrange(len(line))]
    if len(lines) > 2 and rng.random() < 0.3:
        i, j = rng.sample(range(len(lines)), 2)
        lines[i], lines[j] = lines[j], lines[i]
    if rng.random() < 0.3:
        lines.append(rng.choice(BOILERPLATE).split())
    return "\n".join(" ".join(line) for line in lines if line)


def build(n_base: int, seed: int) -> tuple[list[str], list[int]]:
    """Texts and the ground-truth group of each (the index of the base it comes from)."""
    rng = random.Random(seed)
    lines = real_lines()
    vocab = sorted({w for line in lines[:20000] for w in line.split()})
    base = passages(lines, n_base, rng)
    texts, group = list(base), list(range(n_base))
    for b, text in enumerate(base):
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            texts.append(perturb(text, rng, rng.uniform(0.005, 0.09), vocab))
            group.append(b)
    return texts, group


def write_shards(texts: list[str], directory: Path, per_shard: int = 2000) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for s, lo in enumerate(range(0, len(texts), per_shard)):
        path = directory / f"shard-{s:05d}.parquet"
        chunk = texts[lo : lo + per_shard]
        ids = [f"{lo + i:09d}" for i in range(len(chunk))]
        pq.write_table(pa.table({"id": ids, "text": chunk}), path)
        shards.append(("bench", path))
    return shards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=3000, help="base documents")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", default="signature", choices=("signature", "jaccard", "none"))
    parser.add_argument("--name", default="", help="result name (default dedup_quality[_VERIFY])")
    args = parser.parse_args()
    texts, group = build(args.docs, args.seed)
    nd = NearDedupConfig(enabled=True, verify=args.verify)
    with tempfile.TemporaryDirectory() as tmp:
        shards = write_shards(texts, Path(tmp) / "map")
        start = time.perf_counter()
        plan = plan_near_dedup(DataConfig(near_dedup=nd), shards, Path(tmp), 1, "fork")
        seconds = time.perf_counter() - start
    clusters: dict[str, list[int]] = {}
    for (_, doc_id), (cid, _, _) in plan.members.items():
        clusters.setdefault(cid, []).append(int(doc_id))
    found = {frozenset(p) for members in clusters.values() for p in combinations(sorted(members), 2)}

    def true_j(pair) -> float:
        a, b = sorted(pair)
        return jaccard(texts[a], texts[b], nd.ngram)

    reported_j = {p: true_j(p) for p in found}
    # The decisions smelt reports: each removed document with the kept copy of its cluster.
    rep_of = {cid: min(members) for cid, members in clusters.items()}
    decisions = {frozenset((int(i), rep_of[c])) for (_, i), (c, _, kept) in plan.members.items() if kept}
    false_pos = sum(1 for p in decisions if reported_j[p] < 0.7)
    all_pairs_fp = sum(1 for j in reported_j.values() if j < 0.7)
    planted = {}
    members_of: dict[int, list[int]] = {}
    for i, g in enumerate(group):
        members_of.setdefault(g, []).append(i)
    for members in members_of.values():
        for p in combinations(members, 2):
            planted[frozenset(p)] = true_j(p)
    bands = [(0.5, 0.7), (0.7, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 0.95), (0.95, 1.01)]
    figures: dict[str, object] = {
        "documents": len(texts),
        "planted_pairs": len(planted),
        "reported_pairs": len(found),
        "removed_pairs": len(decisions),
        "pair_precision": round(1 - false_pos / max(1, len(decisions)), 4),
        "all_cluster_pairs_precision": round(1 - all_pairs_fp / max(1, len(found)), 4),
        "pair_recall_j_ge_0_85": round(
            sum(1 for p, j in planted.items() if j >= 0.85 and p in found)
            / max(1, sum(1 for j in planted.values() if j >= 0.85)),
            4,
        ),
        "pair_recall_j_ge_0_8": round(
            sum(1 for p, j in planted.items() if j >= 0.8 and p in found)
            / max(1, sum(1 for j in planted.values() if j >= 0.8)),
            4,
        ),
    }
    for lo, hi in bands:
        inside = [p for p, j in planted.items() if lo <= j < hi]
        key = f"found_share_j_{lo:.2f}_{min(hi, 1.0):.2f}".replace(".", "_")
        figures[key] = round(sum(1 for p in inside if p in found) / max(1, len(inside)), 4)
        figures[key.replace("found_share", "planted_pairs")] = len(inside)
    # Clusters: a reported cluster is pure when every pair in it has true Jaccard >= 0.7; a true cluster
    # (base + variants at Jaccard >= 0.85 to it) is recovered when one reported cluster holds it all.
    pure = sum(
        1 for m in clusters.values() if all(reported_j[frozenset(p)] >= 0.7 for p in combinations(m, 2))
    )
    cluster_of = {doc: cid for cid, members in clusters.items() for doc in members}
    true_clusters = []
    for g, members in members_of.items():
        close = [m for m in members if m == g or planted[frozenset((g, m))] >= 0.85]
        if len(close) > 1:
            true_clusters.append(close)
    recovered = sum(
        1 for c in true_clusters if len({cluster_of.get(m) for m in c}) == 1 and c[0] in cluster_of
    )
    figures["cluster_precision"] = round(pure / max(1, len(clusters)), 4)
    figures["cluster_recall_j_ge_0_85"] = round(recovered / max(1, len(true_clusters)), 4)
    figures["reported_clusters"] = len(clusters)
    figures["near_dedup_s"] = round(seconds, 2)
    figures.update({f"lsh_{k}": v for k, v in plan.report.items() if k in ("bands", "rows")})
    figures["verify"] = args.verify
    figures["candidate_pairs"] = plan.report["candidate_pairs"]
    figures["verified_pairs"] = plan.report["verified_pairs"]
    figures["detached_from_cluster"] = plan.report["detached_from_cluster"]
    default = "dedup_quality" if args.verify == "signature" else f"dedup_quality_{args.verify}"
    write_result(args.name or default, figures)


if __name__ == "__main__":
    main()
