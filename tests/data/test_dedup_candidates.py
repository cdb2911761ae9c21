"""LSH candidate pairs: every pair of a small bucket is compared, so two close documents are found even
when their shared bucket opens with a document far from both."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smelt.config import DataConfig, NearDedupConfig
from smelt.data.dedup import near
from smelt.data.dedup.lsh import ALL_PAIRS_MAX, BucketFiles


def pairs_of(buckets: BucketFiles) -> set[tuple[int, int]]:
    return {tuple(p) for chunk in buckets.candidate_pairs() for p in chunk.tolist()}


def test_a_small_bucket_yields_every_pair(tmp_path):
    buckets = BucketFiles(tmp_path, 3)
    keys = np.array([[7, 100], [7, 101], [7, 102], [8, 103], [8, 104]], np.uint64)
    buckets.add(keys[:2], 0)
    buckets.add(keys[2:], 2)  # added in two calls, as shards are
    assert pairs_of(buckets) == {(0, 1), (0, 2), (1, 2), (3, 4)}


def test_a_large_bucket_stays_linear(tmp_path):
    buckets = BucketFiles(tmp_path, 1)
    n = ALL_PAIRS_MAX + 36
    keys = np.stack([np.full(n, 5, np.uint64), np.arange(1000, 1000 + n, dtype=np.uint64)], axis=1)
    buckets.add(keys, 0)
    assert pairs_of(buckets) == {(0, d) for d in range(1, n)}


def words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice("abcdefghijklmnopqrstuvwxyz") + str(rng.randrange(10_000)) for _ in range(n)]


def test_close_documents_behind_a_far_first_member_are_clustered(tmp_path, monkeypatch):
    """Document 0 shares a band with documents 1 and 2 by chance (forced here); 1 and 2 are near-copies.
    With (first member, other) pairs only, 1 and 2 were never compared and both were kept."""
    rng = random.Random(3)
    far, base = words(rng, 300), words(rng, 300)
    copy = list(base)
    copy[150] = "changed"
    texts = [" ".join(far), " ".join(base), " ".join(copy)]
    shard = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": texts}), shard)

    def one_shared_band(sigs, params, groups=None):
        keys = np.arange(len(sigs) * params.bands, dtype=np.uint64).reshape(len(sigs), params.bands) + 10
        keys[:, 0] = 1  # every document in one bucket of band 0, the far one first
        return keys

    monkeypatch.setattr(near, "band_keys", one_shared_band)
    cfg = DataConfig(near_dedup=NearDedupConfig(enabled=True, verify="jaccard"))
    plan = near.plan_near_dedup(cfg, [("web", shard)], tmp_path / "work", 1, "fork")
    assert set(plan.members) == {("web", "b"), ("web", "c")}
    assert plan.members[("web", "c")][2] == ("web", "b") and plan.members[("web", "b")][2] is None


def test_detached_members_close_to_each_other_form_their_own_cluster(tmp_path, monkeypatch):
    """A chain R ~ X ~ D1 ~ D2 where D1 and D2 are far from R: D1 and D2 leave R's cluster, and since
    they are near-copies of each other, one of them must still go (both were kept before)."""
    rng = random.Random(5)
    base = words(rng, 300)

    def edited(text: list[str], positions: range) -> list[str]:
        out = list(text)
        for i in positions:
            out[i] = f"edit{i}"
        return out

    r = base
    x = edited(r, range(20, 280, 52))  # 5 substitutions: Jaccard(r, x) about 0.84
    d1 = edited(x, range(45, 300, 52))  # 5 more: about 0.84 with x, 0.71 with r
    d2 = edited(d1, range(150, 151))  # one more: about 0.97 with d1
    shard = tmp_path / "shard.parquet"
    ids = ["r", "x", "d1", "d2"]
    pq.write_table(pa.table({"id": ids, "text": [" ".join(t) for t in (r, x, d1, d2)]}), shard)

    def one_shared_band(sigs, params, groups=None):
        keys = np.arange(len(sigs) * params.bands, dtype=np.uint64).reshape(len(sigs), params.bands) + 10
        keys[:, 0] = 1
        return keys

    monkeypatch.setattr(near, "band_keys", one_shared_band)
    cfg = DataConfig(near_dedup=NearDedupConfig(enabled=True, verify="jaccard"))
    plan = near.plan_near_dedup(cfg, [("web", shard)], tmp_path / "work", 1, "fork")
    kept_copy = {doc_id: decision[2] for (_, doc_id), decision in plan.members.items()}
    assert kept_copy == {"r": None, "x": ("web", "r"), "d1": None, "d2": ("web", "d1")}
    assert plan.report["regrouped_after_detach"] == 2 and plan.report["detached_from_cluster"] == 0
