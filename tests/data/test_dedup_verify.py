import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.config import DataConfig, NearDedupConfig, load_config
from smelt.data.curate import curate
from smelt.data.dedup.minhash import MinHasher, jaccard, set_values, shingle_hashes
from smelt.data.dedup.near import plan_near_dedup, shard_signatures, signature_file
from smelt.data.dedup.stores import ShingleStore, SignatureStore, jaccard_of_pairs, verify_by_jaccard
from smelt.errors import ConfigError

from .test_dedup import _kept, _near_corpus, edit, random_text


def _shards(tmp_path, texts: list[str], per_shard: int) -> list[tuple[str, object]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = []
    for s, lo in enumerate(range(0, len(texts), per_shard)):
        path = tmp_path / f"shard-{s}.parquet"
        chunk = texts[lo : lo + per_shard]
        pq.write_table(pa.table({"id": [f"{lo + i:05d}" for i in range(len(chunk))], "text": chunk}), path)
        out.append(("s", path))
    return out


def test_stored_shingle_sets_give_true_jaccard(tmp_path):
    rng = random.Random(4)
    base = [random_text(rng, 80) for _ in range(6)]
    texts = [*base, *(edit(rng, t, k) for t, k in zip(base, (1, 3, 6, 10, 20, 0), strict=True))]
    texts += ["", "too short", "x"]  # no words; fewer words than the n-gram: one shingle
    shards = _shards(tmp_path, texts, 4)
    counts = [shard_signatures(str(p), 64, 5, "global", True) for _, p in shards]
    assert sum(counts) == len(texts)
    store = ShingleStore([signature_file(p) for _, p in shards], counts)
    values, offsets = store.sets(np.arange(len(texts)))
    for i, text in enumerate(texts):
        expected = np.unique(set_values(shingle_hashes(text, 5)))
        assert np.array_equal(values[offsets[i] : offsets[i + 1]], expected)
    pairs = np.array([[i, 6 + i] for i in range(6)] + [[0, 1], [12, 12], [13, 14]])
    got = jaccard_of_pairs(pairs, store)
    want = [jaccard(texts[a], texts[b]) for a, b in pairs.tolist()]
    assert np.allclose(got, want, atol=1e-3)
    assert got[5] == 1.0 and got[6] < 0.05 and got[7] == 1.0 and got[8] == 0.0
    assert verify_by_jaccard(pairs, store, 0.8).tolist() == [[0, 6], [5, 11], [12, 12]]
    # The signatures written beside them are the hasher's, read back by global number.
    sigs = SignatureStore([signature_file(p) for _, p in shards], counts, 64)
    assert np.array_equal(
        sigs[np.array([13, 2, 7])], MinHasher(64, 5).signatures([texts[i] for i in (13, 2, 7)])
    )


def _signature_collision(rng: random.Random) -> tuple[str, str]:
    """Two texts whose 8-permutation signatures are equal although their true Jaccard is below 0.6:
    at Jaccard ~0.45 each of the 8 minima agrees with probability ~0.45, all 8 about once in 600 pairs."""
    pairs = []
    for _ in range(3000):
        a = random_text(rng, 60)
        pairs.append((a, edit(rng, a, 6)))
    sigs = MinHasher(8, 5).signatures([t for pair in pairs for t in pair])
    for i in np.flatnonzero((sigs[0::2] == sigs[1::2]).all(axis=1)).tolist():
        if jaccard(*pairs[i]) < 0.6:
            return pairs[i]
    raise AssertionError("no signature collision among 3000 pairs")


@pytest.mark.slow
def test_jaccard_verification_splits_a_pair_the_signatures_join(tmp_path):
    rng = random.Random(5)
    a, b = _signature_collision(rng)
    close = random_text(rng, 60)
    texts = [a, b, close, edit(rng, close, 1)]
    assert jaccard(a, b) < 0.6 and jaccard(close, texts[3]) > 0.8
    kept_pairs = {}
    for verify in ("none", "signature", "jaccard"):
        work = tmp_path / verify
        shards = _shards(work, texts, 2)
        nd = NearDedupConfig(enabled=True, num_perm=8, threshold=0.8, verify=verify)
        plan = plan_near_dedup(DataConfig(near_dedup=nd), shards, work, 1, "fork")
        kept_pairs[verify] = sorted(i for (_, i), (_, _, kept) in plan.members.items() if kept)
    assert kept_pairs["none"] == kept_pairs["signature"] == ["00001", "00003"]
    assert kept_pairs["jaccard"] == ["00003"]


@pytest.mark.slow
def test_curate_with_jaccard_verification(tmp_path, write, source, config):
    root = _near_corpus(tmp_path, write, random.Random(2))
    src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id")
    results = []
    for verify in ("signature", "jaccard"):
        out = tmp_path / verify
        stats = curate(config(src, near_dedup=NearDedupConfig(enabled=True, verify=verify), workers=2), out)
        results.append(sorted((r["id"], json.loads(r["meta"]).get("near_dup_size")) for r in _kept(out)))
        assert stats["dropped"]["near_duplicate"] == 10
    assert results[0] == results[1]


def test_unknown_verify_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[data.near_dedup]\nverify = "jacard"\n')
    with pytest.raises(ConfigError, match=r"data.near_dedup.verify = 'jacard'.*jaccard"):
        load_config(path)
