"""Quality scoring: a hashed n-gram logistic regression trained on "good" vs "poor" sources.

Why this model: GPT-3 filtered Common Crawl with exactly this (logistic regression on hashed term
features, curated text as positives, raw crawl as negatives), and DCLM found a fastText bigram
classifier of the same linear kind to beat the other filters it tried. A linear model over hashed
n-grams scores text at several MB/s per core inside the curation workers. fastText itself would do the
same job, but its wheels often break against numpy 2; this module needs only numpy and safetensors.

Features: a document's first `max_chars` characters, lowercased and split at whitespace (punctuation
stays attached, as in fastText); every word unigram and bigram (optionally the character 3..n-grams
of each word) is hashed with CRC-32 into `buckets` slots. The logit is the sum of the weights of all
n-gram occurrences divided by sqrt(number of n-grams) plus a bias, so long and short documents are
on one scale. Weights are trained with mini-batch lazy Adam in numpy (class-balanced log loss plus a
small L2 penalty) from a seeded shuffle, so the same data and seed give byte-identical model files
on one machine.

Files: `train_quality(cfg, out_path)` writes `out_path` (safetensors: the float32 weights and bias,
the hashing settings in its metadata, so the file alone can score) and `out_path` with the suffix
`.json` (settings, sources, metrics, the weights' sha256, timings).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smelt.config import Config, DataConfig, SourceConfig
from smelt.data.ingest.readers import ReadSpec, read_file
from smelt.data.ledger import Doc, Ledger
from smelt.data.normalize import normalize_text
from smelt.data.sources import source_files
from smelt.data.steps import DocStep
from smelt.errors import ConfigError, UserError

FORMAT = "smelt-quality-v1"
METADATA_KEY = "smelt_quality"
HOLDOUT_FRACTION = 0.1
THRESHOLD_REASON = "quality.threshold"

_MIX1 = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constants (golden ratio, splitmix64) for bigrams
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)
_CHAR_SALT = 0x5BD1E995  # CRC-32 start value for character n-grams, so they land apart from words


@dataclass(frozen=True)
class HashSpec:
    """How text becomes feature ids; stored with the weights, so scoring always matches training."""

    buckets: int = 1 << 20
    word_ngrams: int = 2  # 1: unigrams; 2: unigrams and bigrams
    char_ngrams: int = 0  # 0: off; n: character n-grams of length 3..n of each word, as `<word>`
    max_chars: int = 10_000


def features(text: str, spec: HashSpec) -> np.ndarray:
    """The feature ids (uint32, repeats kept) of a text's first `spec.max_chars` characters.

    Words are whitespace-separated and lowercased, punctuation attached (`house,` is its own word),
    as fastText does: `str.split` runs at hundreds of MB/s where a tokenizing regex manages 14."""
    words = text[: spec.max_chars].lower().split()
    if not words:
        return np.zeros(0, dtype=np.uint32)
    hashes = np.array(_word_hashes(words), dtype=np.uint64)
    parts = [hashes]
    if spec.word_ngrams >= 2 and len(words) > 1:
        parts.append(((hashes[:-1] * _MIX1) ^ (hashes[1:] * _MIX2)) >> np.uint64(29))
    if spec.char_ngrams >= 3:
        grams = [
            w[i : i + n]
            for w in (f"<{t}>" for t in dict.fromkeys(words))  # first-seen order: deterministic
            for n in range(3, spec.char_ngrams + 1)
            for i in range(len(w) - n + 1)
        ]
        if grams:
            parts.append(np.array([zlib.crc32(g.encode(), _CHAR_SALT) for g in grams], dtype=np.uint64))
    ids = np.concatenate(parts) if len(parts) > 1 else hashes
    return (ids % np.uint64(spec.buckets)).astype(np.uint32)


_HASH_CACHE: dict[str, int] = {}
_HASH_CACHE_MAX = 1 << 18  # words; about 30 MB at most per process


def _word_hashes(words: list[str]) -> list[int]:
    """CRC-32 of each word, through a per-process cache (most words repeat across documents)."""
    cache = _HASH_CACHE
    try:
        return [cache[w] for w in words]
    except KeyError:
        if len(cache) > _HASH_CACHE_MAX:
            cache.clear()
        for w in words:
            if w not in cache:
                cache[w] = zlib.crc32(w.encode())
        return [cache[w] for w in words]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


class QualityModel:
    """Weights, bias and hashing settings; `score(text)` is P(text is like the positive sources)."""

    def __init__(self, weight: np.ndarray, bias: float, spec: HashSpec):
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        self.bias = float(np.float32(bias))
        self.spec = spec
        if self.weight.shape != (spec.buckets,):
            raise ValueError(f"weight shape {self.weight.shape} does not match {spec.buckets} buckets")

    def logit(self, text: str) -> float:
        ids = features(text, self.spec)
        if len(ids) == 0:
            return self.bias
        return float(self.weight[ids].sum(dtype=np.float64) / math.sqrt(len(ids)) + self.bias)

    def score(self, text: str) -> float:
        return float(_sigmoid(np.float64(self.logit(text))))

    def score_many(self, texts: Sequence[str]) -> np.ndarray:
        return _sigmoid(np.array([self.logit(t) for t in texts], dtype=np.float64))

    def save(self, path: Path) -> None:
        from safetensors.numpy import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"weight": self.weight, "bias": np.array([self.bias], dtype=np.float32)}
        # One metadata entry: safetensors writes a map's keys in random order, so two would break
        # byte-identical files.
        meta = json.dumps({"format": FORMAT, "spec": asdict(self.spec)}, sort_keys=True)
        save_file(tensors, str(path), metadata={METADATA_KEY: meta})

    @classmethod
    def load(cls, path: str | Path, key: str = "data.quality.model") -> QualityModel:
        """Load a model file; a missing or unreadable one is a UserError naming `key`."""
        path = Path(path)
        how = f"Run `smelt curate quality-train CONFIG` to train one, and set {key} to the file it writes."
        if not path.is_file():
            raise UserError(f"{key} = {str(path)!r}: no such file. {how}")
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as handle:
                meta = json.loads((handle.metadata() or {}).get(METADATA_KEY, "{}"))
                if meta.get("format") != FORMAT:
                    raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
                spec = HashSpec(**meta["spec"])
                weight = handle.get_tensor("weight")
                bias = float(handle.get_tensor("bias")[0])
            return cls(weight, bias, spec)
        except Exception as exc:  # a truncated, foreign or older file: every failure means the same fix
            raise UserError(
                f"{key} = {str(path)!r} is not a smelt quality model ({type(exc).__name__}: {exc}). {how}"
            ) from exc


# ---------------------------------------------------------------------------------------------
# Scoring inside curation


class QualityScore(DocStep):
    """Score each document as P(positive) into `doc.meta["quality"]` (4 digits); drop those below
    `threshold` with reason `quality.threshold`. The model loads lazily and is left out of the pickle,
    so the step travels cheaply to worker processes and each worker reads the file once."""

    name = "quality"

    def __init__(self, model_path: str | Path, threshold: float = 0.0, sources: frozenset[str] | None = None):
        self.model_path = str(model_path)
        self.threshold = threshold
        self.sources = sources
        self._model: QualityModel | None = None

    @classmethod
    def from_config(cls, cfg: DataConfig) -> QualityScore | None:
        """The step for `data.quality`, or None when no model is set (or no source is to be scored).
        Loads the model once here, so a missing or corrupt file fails before any worker starts."""
        q = cfg.quality
        if not q.model:
            return None
        if q.sources:
            _check_source_names(cfg, "data.quality.sources", q.sources)
            sources = frozenset(q.sources)
        else:
            sources = frozenset(s.name for s in cfg.sources if not s.code)
        if not sources:
            return None
        step = cls(q.model, q.threshold, sources)
        step._model = _load_cached(q.model)
        return step

    @property
    def model(self) -> QualityModel:
        if self._model is None:
            self._model = _load_cached(self.model_path)
        return self._model

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        score = round(self.model.score(doc.text), 4)
        doc.meta["quality"] = score
        if score < self.threshold:
            ledger.drop(doc, THRESHOLD_REASON, score=score, threshold=self.threshold)
            return None
        return doc


_MODELS: dict[tuple[str, int, int], QualityModel] = {}


def _load_cached(path: str) -> QualityModel:
    """One load per process and file version. Forked workers inherit the parent's entry, so a step
    unpickled for every work shard does not read the file again; a rewritten file (new mtime or
    size) is read afresh."""
    try:
        stat = Path(path).stat()
        key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return QualityModel.load(path)  # raises the UserError for a missing file
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = QualityModel.load(path)
    return _MODELS[key]


def top_fraction_cutoff(scores: Sequence[float], fraction: float) -> float:
    """The score a document needs to be in the top `fraction` of `scores`: keep `score >= cutoff`.

    k = ceil(fraction * n) documents are meant to stay; the cutoff is the k-th highest score. Ties at
    the boundary are all kept (every document with the boundary score stays), so slightly more than
    k documents can survive, and the result never depends on document order. fraction >= 1 (or an
    empty list) keeps everything; fraction <= 0 keeps nothing (the cutoff is +inf)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if len(scores) == 0 or fraction >= 1.0:
        return -math.inf
    k = math.ceil(round(fraction * len(scores), 9))
    if k == 0:
        return math.inf
    ordered = sorted(scores, reverse=True)
    return float(ordered[k - 1])


# ---------------------------------------------------------------------------------------------
# Training


def _check_source_names(cfg: DataConfig, key: str, names: Sequence[str]) -> None:
    valid = [s.name for s in cfg.sources]
    listed = ", ".join(valid) if valid else "(none: add [[data.sources]] tables)"
    if not names:
        raise ConfigError(f"{key} is empty: name at least one source. Valid source names: {listed}.")
    for name in names:
        if name not in valid:
            raise ConfigError(
                f"{key}: {name!r} is not a source in data.sources. Valid source names: {listed}."
            )


def _read_source(source: SourceConfig, index: int) -> Iterator[str]:
    """The normalized texts of one source, in file order; unreadable records are skipped (curate
    reports them; here they only make the class smaller)."""
    root, files = source_files(source)
    spec = ReadSpec.of(source, index, root)
    for path in files:
        for doc in read_file(spec, path, Ledger()):
            text = normalize_text(doc.text, code=source.code)
            if text.strip():
                yield text


def _sample(texts: Iterator[str], k: int, rng: np.random.Generator, max_chars: int) -> tuple[list[str], int]:
    """Reservoir sample of k texts (cut to max_chars) from a stream; (sample in stream order, seen)."""
    kept: list[tuple[int, str]] = []
    seen = 0
    for text in texts:
        if seen < k:
            kept.append((seen, text[:max_chars]))
        else:
            j = int(rng.integers(0, seen + 1))
            if j < k:
                kept[j] = (seen, text[:max_chars])
        seen += 1
    kept.sort()
    return [t for _, t in kept], seen


def _split_holdout(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    n_hold = max(1, round(n * HOLDOUT_FRACTION))
    return np.sort(order[n_hold:]), np.sort(order[:n_hold])


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); nan with one class."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclass(frozen=True)
class TrainSpec:
    """Optimizer settings (fixed; recorded in the model's json)."""

    epochs: int = 6
    batch_size: int = 64
    learning_rate: float = 0.05
    l2: float = 1e-6


def fit(
    rows: list[np.ndarray], labels: np.ndarray, spec: HashSpec, seed: int, train: TrainSpec = TrainSpec()
) -> QualityModel:
    """Class-balanced logistic regression on hashed n-gram counts scaled by 1/sqrt(n-grams), trained
    by mini-batch lazy Adam (moments and L2 decay updated only on the features a batch touches, as
    torch's SparseAdam does: a dense update of a million weights per batch would cost 20x more).

    Deterministic: a seeded shuffle per epoch and single-threaded numpy reductions (bincount), so the
    same inputs give the same weights bit for bit."""
    labels = np.asarray(labels, dtype=np.float64)
    n = len(rows)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate(rows).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    scale = 1.0 / np.sqrt(np.maximum(lengths, 1))
    n_pos = labels.sum()
    class_weight = np.where(labels > 0, n / (2.0 * max(n_pos, 1.0)), n / (2.0 * max(n - n_pos, 1.0)))

    w = np.zeros(spec.buckets, dtype=np.float64)
    m_w, v_w = np.zeros_like(w), np.zeros_like(w)
    b = m_b = v_b = 0.0
    beta1, beta2, eps, lr = 0.9, 0.999, 1e-8, train.learning_rate
    step = 0
    rng = np.random.default_rng(seed)
    for _ in range(train.epochs):
        order = rng.permutation(n)
        for start in range(0, n, train.batch_size):
            batch = order[start : start + train.batch_size]
            idx = np.concatenate([indices[indptr[r] : indptr[r + 1]] for r in batch])
            row = np.repeat(np.arange(len(batch)), lengths[batch])
            z = np.bincount(row, weights=w[idx], minlength=len(batch)) * scale[batch] + b
            g = (_sigmoid(z) - labels[batch]) * class_weight[batch] / len(batch)
            touched, inverse = np.unique(idx, return_inverse=True)
            grad = np.bincount(inverse, weights=(g * scale[batch])[row], minlength=len(touched))
            grad += train.l2 * w[touched]
            step += 1
            c1, c2 = 1 - beta1**step, 1 - beta2**step
            m = m_w[touched] * beta1 + (1 - beta1) * grad
            v = v_w[touched] * beta2 + (1 - beta2) * grad * grad
            m_w[touched], v_w[touched] = m, v
            w[touched] -= lr * (m / c1) / (np.sqrt(v / c2) + eps)
            grad_b = float(g.sum())
            m_b = beta1 * m_b + (1 - beta1) * grad_b
            v_b = beta2 * v_b + (1 - beta2) * grad_b * grad_b
            b -= lr * (m_b / c1) / (math.sqrt(v_b / c2) + eps)
    return QualityModel(w.astype(np.float32), b, spec)


def hash_spec(cfg: DataConfig) -> HashSpec:
    """The hashing settings `data.quality` asks for."""
    q = cfg.quality
    if 0 < q.char_ngrams < 3:
        raise ConfigError(
            f"data.quality.char_ngrams = {q.char_ngrams}: character n-grams start at length 3; "
            f"set 0 (words only) or 3 to 8."
        )
    return HashSpec(buckets=q.buckets, word_ngrams=2, char_ngrams=q.char_ngrams, max_chars=q.max_chars)


def train_quality(cfg: Config, out_path: Path) -> dict[str, Any]:
    """Train the quality classifier of `cfg.data.quality` and write it to `out_path` (+ `.json`).

    Reads every document of the positive and negative sources (normalized as curate does), samples up
    to `max_docs` per class with a reservoir seeded by `run.seed`, holds out 10% per class, trains,
    and evaluates on the held-out part. Returns the metrics (also in the json)."""
    out_path = Path(out_path)
    if out_path.suffix == ".json":
        raise UserError(
            f"quality model path {str(out_path)!r} ends in .json, where the model's metrics go; "
            f"name the model file like model.safetensors."
        )
    data = cfg.data
    q = data.quality
    _check_source_names(data, "data.quality.positive_sources", q.positive_sources)
    _check_source_names(data, "data.quality.negative_sources", q.negative_sources)
    both = sorted(set(q.positive_sources) & set(q.negative_sources))
    if both:
        raise ConfigError(
            f"data.quality.positive_sources and data.quality.negative_sources both name {', '.join(both)}; "
            f"a source can only be one class."
        )
    spec = hash_spec(data)
    started = time.perf_counter()
    index = {s.name: i for i, s in enumerate(data.sources)}
    by_name = {s.name: s for s in data.sources}
    classes: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    for label, names in (("positive", q.positive_sources), ("negative", q.negative_sources)):
        rng = np.random.default_rng([cfg.run.seed, 1 if label == "positive" else 0])
        stream = (t for name in names for t in _read_source(by_name[name], index[name]))
        classes[label], seen[label] = _sample(stream, q.max_docs, rng, spec.max_chars)
        if len(classes[label]) < 2:
            raise UserError(
                f"data.quality.{label}_sources ({', '.join(names)}) gave {len(classes[label])} non-empty "
                f"document(s); training needs at least 2 per class (one to train on, one to evaluate). "
                f"Add sources or files to that class."
            )
    read_s = time.perf_counter() - started

    split_rng = np.random.default_rng([cfg.run.seed, 2])
    train_rows, train_y, hold_rows, hold_y = [], [], [], []
    for label, y in (("positive", 1.0), ("negative", 0.0)):
        rows = [features(t, spec) for t in classes[label]]
        tr, ho = _split_holdout(len(rows), split_rng)
        train_rows += [rows[i] for i in tr]
        train_y += [y] * len(tr)
        hold_rows += [rows[i] for i in ho]
        hold_y += [y] * len(ho)
    fit_started = time.perf_counter()
    model = fit(train_rows, np.array(train_y), spec, cfg.run.seed)
    fit_s = time.perf_counter() - fit_started

    hold_scores = _scores(model, hold_rows)
    train_scores = _scores(model, train_rows)
    hold_labels = np.array(hold_y) > 0
    metrics: dict[str, Any] = {
        "holdout_accuracy": round(float(((hold_scores >= 0.5) == hold_labels).mean()), 6),
        "holdout_auc": round(roc_auc(hold_scores, hold_labels), 6),
        "train_accuracy": round(float(((train_scores >= 0.5) == (np.array(train_y) > 0)).mean()), 6),
        "docs_positive": len(classes["positive"]),
        "docs_negative": len(classes["negative"]),
        "docs_seen_positive": seen["positive"],
        "docs_seen_negative": seen["negative"],
        "holdout_positive": int(hold_labels.sum()),
        "holdout_negative": int((~hold_labels).sum()),
        "read_seconds": round(read_s, 3),
        "train_seconds": round(fit_s, 3),
    }
    model.save(out_path)
    info = {
        "format": FORMAT,
        "model": out_path.name,
        "weights_sha256": hashlib.sha256(out_path.read_bytes()).hexdigest(),
        "hash_spec": asdict(spec),
        "train_spec": asdict(TrainSpec()),
        "seed": cfg.run.seed,
        "positive_sources": list(q.positive_sources),
        "negative_sources": list(q.negative_sources),
        "max_docs": q.max_docs,
        "metrics": metrics,
    }
    out_path.with_suffix(".json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return metrics


def _scores(model: QualityModel, rows: list[np.ndarray]) -> np.ndarray:
    """Scores from precomputed feature ids (the same arithmetic as QualityModel.logit)."""
    w = model.weight
    logits = [(w[r].sum(dtype=np.float64) / math.sqrt(len(r)) if len(r) else 0.0) + model.bias for r in rows]
    return _sigmoid(np.array(logits, dtype=np.float64))
