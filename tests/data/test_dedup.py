import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from smelt.config import LineDedupConfig, NearDedupConfig
from smelt.data.curate import curate
from smelt.data.dedup.lsh import BucketFiles, UnionFind, band_keys, partition_count, verify_pairs
from smelt.data.dedup.minhash import MinHasher, estimated_jaccard, jaccard, lsh_params, shingle_hashes
from smelt.data.dedup.near import FN_WEIGHT, check_scope
from smelt.errors import ConfigError

WORD_LIST = (
    "river stone garden window thunder market silver candle forest engine harbor pencil meadow "
    "lantern violin castle orbit basket canyon feather glacier hammer island jacket kettle ladder "
    "marble needle ocean pepper quartz saddle tunnel velvet wagon yellow zebra anchor bridge "
    "copper desert eagle falcon goblet honey ivory jungle kayak lemon mirror nickel onion"
)
WORDS = WORD_LIST.split()


def random_text(rng: random.Random, n: int = 120) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(n))


def edit(rng: random.Random, text: str, n: int) -> str:
    words = text.split()
    for _ in range(n):
        words[rng.randrange(len(words))] = "changed" + str(rng.randrange(10**6))
    return " ".join(words)


def test_signature_estimates_jaccard_and_is_deterministic():
    rng = random.Random(0)
    a = random_text(rng, 300)
    b = edit(rng, a, 10)
    hasher = MinHasher(num_perm=256, ngram=5)
    sigs = hasher.signatures([a, b, "", a])
    assert sigs.shape == (4, 256) and sigs.dtype == np.uint32
    assert np.array_equal(sigs[0], sigs[3])
    assert np.all(sigs[2] == np.uint32(0xFFFFFFFF))
    true = jaccard(a, b)
    assert 0.6 < true < 0.95
    assert abs(estimated_jaccard(sigs[0], sigs[1]) - true) < 0.1
    # Case and punctuation do not make a near-duplicate different.
    assert np.array_equal(shingle_hashes(a.upper() + "!!", 5), shingle_hashes(a, 5))
    assert np.array_equal(MinHasher(256, 5).signatures([b])[0], sigs[1])


def test_lsh_params_trade_recall_for_candidates():
    balanced = lsh_params(0.8, 128)
    recall = lsh_params(0.8, 128, 1 - FN_WEIGHT, FN_WEIGHT)
    assert balanced.bands * balanced.rows <= 128 and recall.bands * recall.rows <= 128
    assert recall.probability(0.85) > balanced.probability(0.85)
    assert recall.probability(0.85) > 0.95 and recall.probability(0.3) < 0.01
    assert "bands" in recall.describe() and "false positive" in recall.describe()


def test_buckets_find_pairs_across_partitions(tmp_path):
    rng = random.Random(1)
    base = [random_text(rng) for _ in range(40)]
    texts = base + [edit(rng, t, 1) for t in base[:10]]
    params = lsh_params(0.8, 128, 0.1, 0.9)
    sigs = MinHasher(128, 5).signatures(texts)
    found = []
    for partitions in (1, 7):
        buckets = BucketFiles(tmp_path / str(partitions), partitions)
        buckets.add(band_keys(sigs[:25], params), 0)
        buckets.add(band_keys(sigs[25:], params), 25)
        pairs = np.concatenate(list(buckets.candidate_pairs()))
        pairs = verify_pairs(pairs, sigs, 0.75)
        uf = UnionFind(len(texts))
        uf.union_pairs(pairs)
        found.append(uf.roots())
    assert np.array_equal(found[0], found[1])
    roots = found[0]
    assert all(roots[40 + i] == i for i in range(10))
    assert all(roots[i] == i for i in range(40))


def test_groups_keep_buckets_apart():
    sigs = MinHasher(128, 5).signatures(["same words here in a row for the test"] * 2)
    params = lsh_params(0.8, 128)
    same = band_keys(sigs, params, np.array([1, 1], np.uint64))
    apart = band_keys(sigs, params, np.array([1, 2], np.uint64))
    assert np.array_equal(same[0], same[1]) and not np.any(apart[0] == apart[1])


def test_union_find_root_is_smallest_member_in_any_order():
    pairs = np.array([[5, 3], [3, 9], [9, 1], [7, 8]])
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        uf = UnionFind(10)
        uf.union_pairs(pairs[order])
        assert uf.roots().tolist() == [0, 1, 2, 1, 4, 1, 6, 7, 7, 1]


def test_partition_count_follows_budget():
    assert partition_count(1000, 10, 1 << 30) == 1
    assert partition_count(1_000_000, 14, 64 << 20) == 21


def test_bad_scope_is_a_config_error():
    with pytest.raises(ConfigError, match=r"data.near_dedup.scope = 'dump'.*field:dump"):
        check_scope(NearDedupConfig(scope="dump"))


def _near_corpus(tmp_path, write, rng, n_base=30):
    base = [random_text(rng) for _ in range(n_base)]
    records = []
    for i, text in enumerate(base):
        records.append({"id": f"a{i:03d}", "text": text, "dump": "d1"})
    for i, text in enumerate(base[:10]):
        records.append({"id": f"b{i:03d}", "text": edit(rng, text, 2), "dump": "d2" if i < 5 else "d1"})
    lines = "".join(json.dumps(r) + "\n" for r in records)
    return write(tmp_path / "in", {"x.jsonl": lines})


def _kept(out):
    rows = []
    for path in sorted(out.glob("*/*/part-*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def test_curate_near_dedup_keeps_one_per_cluster(tmp_path, write, source, config):
    root = _near_corpus(tmp_path, write, random.Random(2))
    src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id")
    stats = curate(config(src, near_dedup=NearDedupConfig(enabled=True)), tmp_path / "out")
    kept = _kept(tmp_path / "out")
    assert sorted(r["id"] for r in kept) == [f"a{i:03d}" for i in range(30)]
    clustered = [json.loads(r["meta"]) for r in kept if r["id"] < "a010"]
    assert all(m["near_dup_size"] == 2 for m in clustered)
    assert stats["dropped"]["near_duplicate"] == 10
    assert stats["near_dedup"]["clusters"] == 10
    entries = [json.loads(line) for line in (tmp_path / "out" / "quarantine" / "s.jsonl").open()]
    removed = [e for e in entries if e["reason"] == "near_duplicate"]
    assert {e["id"] for e in removed} == {f"b{i:03d}" for i in range(10)}
    assert all(e["kept_id"] == "a" + e["id"][1:] and e["cluster"] for e in removed)
    by_id = {r["id"]: json.loads(r["meta"]) for r in kept}
    assert {by_id["a" + e["id"][1:]]["near_dup_cluster"] for e in removed} == {e["cluster"] for e in removed}


def test_curate_near_dedup_scope_by_field(tmp_path, write, source, config):
    root = _near_corpus(tmp_path, write, random.Random(2))
    src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id", split_unit="field:dump")
    cfg = config(src, near_dedup=NearDedupConfig(enabled=True, scope="field:dump"))
    stats = curate(cfg, tmp_path / "out")
    # The copies in dump d2 have no original in their dump: they stay.
    assert stats["dropped"]["near_duplicate"] == 5
    assert {r["id"] for r in _kept(tmp_path / "out")} >= {f"b{i:03d}" for i in range(5)}


@pytest.mark.slow
def test_kept_set_is_identical_for_1_2_and_4_workers(tmp_path, write, source, config):
    rng = random.Random(3)
    files = {}
    base = [random_text(rng) for _ in range(24)]
    for f in range(6):
        rows = [{"id": f"f{f}-{i}", "text": edit(rng, base[(f * 5 + i) % 24], 1)} for i in range(12)]
        files[f"p{f}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows)
    root = write(tmp_path / "in", files)
    results = []
    for workers in (1, 2, 4):
        src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id")
        cfg = config(src, near_dedup=NearDedupConfig(enabled=True), workers=workers, shard_bytes=2000)
        out = tmp_path / f"out{workers}"
        stats = curate(cfg, out)
        kept = sorted((r["id"], r["meta"]) for r in _kept(out))
        results.append((kept, stats["documents_kept"]))
    assert results[0][1] < 72
    assert results[0] == results[1] == results[2]


def test_line_dedup_removes_lines_in_more_than_k_documents(tmp_path, write, source, config):
    banner = "We use cookies to improve your experience on this site."
    records = [
        {"id": f"p{i}", "text": f"Page {i} has its own story number {i * 7}.\n{banner}"} for i in range(5)
    ]
    records.append({"id": "only", "text": banner})
    records.append({"id": "dup", "text": records[0]["text"]})  # an exact copy counts once
    root = write(tmp_path / "in", {"x.jsonl": "".join(json.dumps(r) + "\n" for r in records)})
    src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id")
    stats = curate(config(src, line_dedup=LineDedupConfig(enabled=True, max_docs=5)), tmp_path / "out")
    kept = {r["id"]: r for r in _kept(tmp_path / "out")}
    assert set(kept) == {f"p{i}" for i in range(5)}
    assert all(banner not in r["text"] for r in kept.values())
    assert json.loads(kept["p0"]["meta"])["boilerplate_lines_removed"] == 1
    assert stats["dropped"]["boilerplate_only"] == 1 and stats["dropped"]["exact_duplicate"] == 1
    stats = curate(config(src, line_dedup=LineDedupConfig(enabled=True, max_docs=6)), tmp_path / "out2")
    assert stats["documents_kept"] == 6
