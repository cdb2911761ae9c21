"""MinHash-LSH near-duplicate removal as a curate step: plan between map and reduce, apply in the reduce.

Plan (`plan_near_dedup`): signatures of each map shard's documents are computed on the stage's executor
(a process pool, or Ray tasks) and
written next to the shard (`<key>.minhash.npy`, atomically, so a resumed run reuses them); band keys go
to partitioned bucket files (`lsh.BucketFiles`, memory bounded by `data.near_dedup.memory_mb`);
candidate pairs are verified (`data.near_dedup.verify`: on the signatures, or by true Jaccard of the
shingle sets, which the signature workers then also write next to the shard, `<key>.shingles.npy`, 4
bytes per distinct shingle) and merged by union-find; a member not itself close to its cluster's
representative (joined only through a chain) is detached, and the detached members are clustered
again among themselves (two of them close to each other are still near-duplicates). Documents are numbered in
canonical order (config source order, file order, record order), and a cluster's representative is its
smallest number, so the kept set is the same for any worker count. Only members of clusters with more
than one document are remembered, keyed by (source, id).

Apply (`NearDedup`): the representative keeps `near_dup_cluster` and `near_dup_size` in its meta; the
other members are dropped with reason `near_duplicate`, naming the cluster and the kept copy. Since
every removed member leaves the corpus before the split step, a cluster never straddles splits.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from smelt.config import DataConfig, NearDedupConfig
from smelt.data.dedup.lsh import BucketFiles, UnionFind, band_keys, partition_count, verify_pairs
from smelt.data.dedup.minhash import LshParams, MinHasher, lsh_params
from smelt.data.dedup.stores import ShingleStore, SignatureStore, shingle_files, verify_by_jaccard
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep
from smelt.errors import ConfigError
from smelt.executors import ProcessPool, TaskExecutor

FN_WEIGHT = 0.9  # recall matters more than candidates: verification removes the extra candidates
VERIFY_SLACK = 0.05  # estimator noise at 128 permutations is ~0.03: accept estimates a little below
READ_BATCH = 4096
SCOPES = ("global", "source", "dir")


def check_scope(cfg: NearDedupConfig) -> None:
    scope = cfg.scope
    if scope in SCOPES or (scope.startswith("field:") and len(scope) > len("field:")):
        return
    raise ConfigError(
        f"data.near_dedup.scope = {scope!r} is not a dedup scope. Use {', '.join(SCOPES)}, or "
        f"field:<meta key> (e.g. field:dump for per-crawl-dump dedup; the source's split_unit must be "
        f"field:dump so the reader keeps that field)."
    )


def params_of(cfg: NearDedupConfig) -> LshParams:
    return lsh_params(cfg.threshold, cfg.num_perm, 1 - FN_WEIGHT, FN_WEIGHT)


def cluster_id(source: str, doc_id: str) -> str:
    """A stable name for the cluster: a hash of its representative's (source, id)."""
    return hashlib.blake2b(f"{source}\x00{doc_id}".encode(), digest_size=8).hexdigest()


def _group_hash(value: str) -> int:
    return int.from_bytes(hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest(), "little")


def signature_file(parquet: Path) -> Path:
    return parquet.with_suffix(".minhash.npy")


def shard_signatures(parquet: str, num_perm: int, ngram: int, scope: str, sets: bool = False) -> int:
    """Worker: signatures (+ group hashes, + shingle sets if `sets`) of one map shard, written
    atomically, the signatures last; returns the row count."""
    path = Path(parquet)
    out = signature_file(path)
    if out.exists() and (not sets or shingle_files(out)[1].exists()):
        return len(np.load(out, mmap_mode="r"))
    hasher = MinHasher(num_perm, ngram)
    values, offsets = [], [np.zeros(1, np.int64)]
    grouped = scope == "dir" or scope.startswith("field:")
    columns = ["text", "meta" if scope.startswith("field:") else "file"] if grouped else ["text"]
    sigs, groups = [], []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH, columns=columns):
        rows = batch.to_pydict()
        sig, vals, offs = hasher.sketch(rows["text"], sets)
        sigs.append(sig)
        if sets:
            offsets.append(offs[1:] + offsets[-1][-1])
            values.append(vals)
        if scope.startswith("field:"):
            key = scope.removeprefix("field:")
            groups.extend(_group_hash(str(json.loads(m).get(key, ""))) for m in rows["meta"])
        elif scope == "dir":
            groups.extend(_group_hash(f.partition("/")[0] if "/" in f else "") for f in rows["file"])
    sig = np.concatenate(sigs) if sigs else np.zeros((0, num_perm), np.uint32)
    if sets:
        for target, array in zip(shingle_files(out), (values, offsets), strict=True):
            tmp = target.with_name(target.name + ".tmp.npy")
            np.save(tmp, np.concatenate(array) if array else np.zeros(0, np.uint32))
            os.replace(tmp, target)
    if grouped:  # before the signatures: their file marks the shard as done
        gtmp = path.with_suffix(".groups.tmp.npy")
        np.save(gtmp, np.array(groups, np.uint64))
        os.replace(gtmp, path.with_suffix(".groups.npy"))
    tmp = out.with_name(out.name + ".tmp.npy")
    np.save(tmp, sig)
    os.replace(tmp, out)
    return len(sig)


@dataclass
class NearDupPlan:
    """The decisions: (source, id) -> (cluster id, cluster size, kept (source, id) or None if kept)."""

    members: dict[tuple[str, str], tuple[str, int, tuple[str, str] | None]] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def plan_near_dedup(
    cfg: DataConfig,
    parquets: list[tuple[str, Path]],
    work: Path,
    workers: int,
    start_method: str,
    executor: TaskExecutor | None = None,
) -> NearDupPlan:
    """Cluster the documents of the map shards (`(source name, parquet)` in canonical order); the
    signatures are computed on `executor`, or else on a process pool of `workers`."""
    nd = cfg.near_dedup
    params = params_of(nd)
    sets = nd.verify == "jaccard"
    jobs = [(str(p), nd.num_perm, nd.ngram, nd.scope, sets) for _, p in parquets]
    runner = executor or ProcessPool(min(workers, max(1, len(jobs))), start_method)
    counts = [0] * len(jobs)
    try:
        for index, count in runner.run(shard_signatures, jobs):
            counts[index] = count
    finally:
        if executor is None:
            runner.close()
    n = sum(counts)
    lsh_dir = work / "lsh"
    partitions = partition_count(n, params.bands, nd.memory_mb << 20)
    buckets = BucketFiles(lsh_dir, partitions)
    sig_paths = [signature_file(p) for _, p in parquets]
    all_sigs = SignatureStore(sig_paths, counts, nd.num_perm)
    shingles = ShingleStore(sig_paths, counts) if sets else None
    first = 0
    for (source, parquet), count in zip(parquets, counts, strict=True):
        sig = np.load(signature_file(parquet))
        if nd.scope == "source":
            groups = np.full(count, _group_hash(source), np.uint64)
        elif nd.scope == "dir" or nd.scope.startswith("field:"):
            groups = np.load(parquet.with_suffix(".groups.npy"))
        else:
            groups = None
        buckets.add(band_keys(sig, params, groups), first)
        first += count
    uf = UnionFind(n)
    candidates = verified = 0
    edges = []
    for pairs in buckets.candidate_pairs():
        candidates += len(pairs)
        pairs = _verify(pairs, nd, all_sigs, shingles)
        verified += len(pairs)
        uf.union_pairs(pairs)
        edges.append(pairs)
    roots = uf.roots()
    detached = regrouped = 0
    if nd.verify != "none":
        edges_all = np.concatenate(edges) if edges else np.zeros((0, 2), np.int64)
        detached, regrouped = _settle(roots, edges_all, nd, all_sigs, shingles)
    sizes = np.bincount(roots, minlength=n)
    in_cluster = np.flatnonzero(sizes[roots] > 1)
    plan = NearDupPlan()
    plan.report = {
        "bands": params.bands,
        "rows": params.rows,
        "partitions": partitions,
        "candidate_pairs": candidates,
        "verified_pairs": verified,
        "detached_from_cluster": detached,
        "regrouped_after_detach": regrouped,
        "clusters": int(np.count_nonzero(sizes > 1)),
        "documents_in_clusters": len(in_cluster),
        "s_curve_false_positive": round(params.false_positive, 5),
        "s_curve_false_negative": round(params.false_negative, 5),
    }
    if len(in_cluster):
        names = _names_of(parquets, counts, in_cluster)
        for index in in_cluster.tolist():
            root = int(roots[index])
            rep = names[root]
            decision = (cluster_id(*rep), int(sizes[root]), None if root == index else rep)
            plan.members.setdefault(names[index], decision)
    for p in lsh_dir.glob("bucket-*.bin"):
        p.unlink()
    return plan


def _settle(
    roots: np.ndarray,
    edges: np.ndarray,
    nd: NearDedupConfig,
    sigs: SignatureStore,
    shingles: ShingleStore | None,
) -> tuple[int, int]:
    """Keep in each cluster only the members close to its representative (`roots`, changed in place).

    Union-find is transitive: a chain of close pairs can join documents far apart. A member is removed
    only when it is itself close to the copy that is kept; the others are detached, and clustered
    again over the verified pairs among them (`edges`), round after round: two detached documents
    close to each other are still near-duplicates, one of which must go. Returns (documents left on
    their own after being detached, detached documents that joined a new cluster)."""
    n = len(roots)
    members = np.flatnonzero(roots != np.arange(n))
    detached = np.zeros(n, bool)
    while len(members):
        close = _verify(np.stack([roots[members], members], axis=1), nd, sigs, shingles)
        far = np.setdiff1d(members, close[:, 1])
        roots[far] = far
        detached[far] = True
        among = edges[np.isin(edges, far).all(axis=1)] if len(far) > 1 else edges[:0]
        if not len(among):
            break
        uf = UnionFind(n)
        uf.union_pairs(among)
        regroup = uf.roots()[far]
        roots[far] = regroup
        members = far[regroup != far]
    alone = detached & (np.bincount(roots, minlength=n)[roots] == 1)
    return int(alone.sum()), int((detached & ~alone).sum())


def _verify(
    pairs: np.ndarray, nd: NearDedupConfig, sigs: SignatureStore, shingles: ShingleStore | None
) -> np.ndarray:
    """The candidate pairs that pass `data.near_dedup.verify`: estimated Jaccard (signatures) >=
    threshold - VERIFY_SLACK, or true Jaccard of the shingle sets >= threshold, or all of them."""
    if nd.verify == "signature":
        return verify_pairs(pairs, sigs, nd.threshold - VERIFY_SLACK)
    if nd.verify == "jaccard":
        assert shingles is not None
        return verify_by_jaccard(pairs, shingles, nd.threshold)
    return pairs


def _names_of(
    parquets: list[tuple[str, Path]], counts: list[int], wanted: np.ndarray
) -> dict[int, tuple[str, str]]:
    """(source, id) of the wanted global document numbers, read shard by shard."""
    names: dict[int, tuple[str, str]] = {}
    first = 0
    for (source, parquet), count in zip(parquets, counts, strict=True):
        lo, hi = np.searchsorted(wanted, [first, first + count])
        if hi > lo:
            ids = pq.read_table(parquet, columns=["id"]).column("id").to_pylist()
            for index in wanted[lo:hi].tolist():
                names[index] = (source, ids[index - first])
        first += count
    return names


class NearDedup(CorpusStep):
    """Apply a `NearDupPlan`: keep each cluster's representative (with its cluster id and size in meta),
    drop the other members with reason `near_duplicate`."""

    name = "near_dedup"

    def __init__(self) -> None:
        self.plan = NearDupPlan()

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        members = self.plan.members
        for doc in docs:
            decision = members.get((doc.source, doc.id))
            if decision is not None:
                cid, size, kept = decision
                if kept is not None:
                    ledger.drop(
                        doc,
                        "near_duplicate",
                        step=self.name,
                        cluster=cid,
                        kept_source=kept[0],
                        kept_id=kept[1],
                    )
                    continue
                doc.meta["near_dup_cluster"] = cid
                doc.meta["near_dup_size"] = size
            yield doc
