"""`smelt release --verify OUT`: re-hash a release against its manifests and load every revision.

Checks, in order: every file against its sha256 in release.json (and no file release.json does not
list); the copied artifacts against the stage manifests they came from (tokenizer, statistics, eval
results, token shards when included); each data order file against data_order/index.json; then each
revision loads in `transformers` (model and tokenizer) and its logits on the probe input match the
ones smelt computed from the checkpoint when the release was made.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.manifest import hash_file
from smelt.release.build import RELEASE_JSON, REVISIONS
from smelt.release.data_order import read_json
from smelt.tokenizer.load import SMELT_JSON, TOKENIZER_JSON
from smelt.tokens.shards import META_JSON

# The manifest of each stage, and where its outputs went in the release: (stage, output, release path).
CHAIN = (
    ("tokenizer", TOKENIZER_JSON, f"tokenizer/{TOKENIZER_JSON}"),
    ("tokenizer", SMELT_JSON, f"tokenizer/{SMELT_JSON}"),
    ("documents", "stats.json", "data/documents_stats.json"),
    ("documents", "decontamination.json", "data/decontamination.json"),
    ("tokens", "stats.json", "data/tokens_stats.json"),
    ("tokens", "shards.json", "data/shards.json"),
    ("tokens", META_JSON, "data/tokens_meta.json"),
)
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.02}  # of max(1, largest |logit|)


def _hashes(out_dir: Path, release: dict[str, Any]) -> list[str]:
    problems = []
    recorded: dict[str, str] = release.get("files", {})
    for rel, digest in recorded.items():
        path = out_dir / rel
        if not path.is_file():
            problems.append(f"{rel} is missing (release.json lists it)")
        elif hash_file(path) != digest:
            problems.append(f"{rel} does not match its sha256 in release.json (changed or corrupt)")
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir)
        if path.is_file() and rel.as_posix() not in recorded and rel.as_posix() != RELEASE_JSON:
            if ".git" not in rel.parts:
                problems.append(f"{rel.as_posix()} is not listed in release.json (added after the release)")
    return problems


def _chain(out_dir: Path) -> list[str]:
    problems = []
    for stage, output, rel in CHAIN:
        manifest = read_json(out_dir / "manifests" / f"{stage}.json") or {}
        digest = (manifest.get("outputs") or {}).get(output)
        path = out_dir / rel
        if digest and path.is_file() and hash_file(path) != digest:
            problems.append(f"{rel} does not match the sha256 of {stage}/{output} in manifests/{stage}.json")
    evals = (read_json(out_dir / "manifests" / "eval.json") or {}).get("outputs") or {}
    for output, digest in evals.items():
        path = out_dir / "eval" / output
        if path.is_file() and hash_file(path) != digest:
            problems.append(f"eval/{output} does not match its sha256 in manifests/eval.json")
    tokens = (read_json(out_dir / "manifests" / "tokens.json") or {}).get("outputs") or {}
    if (out_dir / "tokens").is_dir():
        for path in sorted((out_dir / "tokens").rglob("*")):
            rel = path.relative_to(out_dir / "tokens").as_posix()
            if path.is_file() and rel in tokens and hash_file(path) != tokens[rel]:
                problems.append(f"tokens/{rel} does not match its sha256 in manifests/tokens.json")
    return problems


def _data_order(out_dir: Path) -> list[str]:
    from smelt.tokens.batches import INDEX, ORDER_DIR

    order_dir = out_dir / ORDER_DIR
    index = read_json(order_dir / INDEX)
    if index is None:
        return [f"{ORDER_DIR}/{INDEX} is missing or unreadable"]
    problems = []
    for entry in index.get("checkpoints", []):
        path = order_dir / entry["file"]
        if not path.is_file():
            problems.append(f"{ORDER_DIR}/{entry['file']} is missing")
        elif hash_file(path) != entry["sha256"]:
            problems.append(f"{ORDER_DIR}/{entry['file']} does not match its sha256 in {ORDER_DIR}/{INDEX}")
    return problems


def _revision_dir(out_dir: Path, release: dict[str, Any], entry: dict[str, Any], scratch: Path) -> Path:
    """The folder of one revision; a git branch is extracted and re-hashed against release.json first."""
    if release.get("layout") != "git-branches":
        return out_dir / REVISIONS / entry["revision"]
    from smelt.release.git import extract_revision

    folder = extract_revision(out_dir, entry["revision"], scratch / entry["revision"])
    for name, digest in entry.get("files", {}).items():
        path = folder / name
        if not path.is_file() or hash_file(path) != digest:
            raise UserError(
                f"release {out_dir} failed verification: {name} of git branch {entry['revision']} does not match "
                f"its sha256 in release.json. Rebuild the release with `smelt release RUN OUT --force`."
            )
    return folder


def load_revision(folder: Path, probe: dict[str, Any], dtype: str) -> float:
    """Load one revision with transformers; the largest logit difference from the recorded probe."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    with torch.no_grad():
        logits = model(torch.tensor([probe["input_ids"]])).logits[0][:, probe["columns"]]
    expected = torch.tensor(probe["logits"])
    scale = max(1.0, float(expected.abs().max()))
    return float((logits - expected).abs().max()) / scale / TOLERANCE.get(dtype, 1e-3)


def verify_release(out_dir: str | Path, load: bool = True) -> list[tuple[str, str]]:
    """(check, result) rows; a UserError naming every damaged file when a check fails."""
    out_dir = Path(out_dir)
    release = read_json(out_dir / RELEASE_JSON)
    if not isinstance(release, dict):
        raise UserError(
            f"{out_dir} is not a smelt release: {RELEASE_JSON} is missing or unreadable. Pass the OUT directory "
            f"of `smelt release RUN OUT`."
        )
    rows = []
    problems = _hashes(out_dir, release)
    rows.append(("files", f"{len(release.get('files', {}))} files re-hashed"))
    problems += _chain(out_dir)
    rows.append(("manifest chain", "tokenizer, statistics and eval results match their stage manifests"))
    problems += _data_order(out_dir)
    rows.append(("data order", "every file matches data_order/index.json"))
    if problems:
        raise UserError(
            f"release {out_dir} failed verification: {problems[0]}"
            + (f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else "")
            + ". Fetch the release again, or rebuild it with `smelt release RUN OUT --force`."
        )
    if load:
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            raise UserError(
                "`smelt release --verify` loads every revision in transformers, which is not installed: "
                "pip install 'smelt[hf]' (or transformers>=4.45), then verify again."
            ) from exc
        with tempfile.TemporaryDirectory() as scratch:
            for entry in release["revisions"]:
                folder = _revision_dir(out_dir, release, entry, Path(scratch))
                try:
                    ratio = load_revision(folder, entry["probe"], release.get("dtype", "float32"))
                except (OSError, ValueError, KeyError) as exc:
                    raise UserError(
                        f"revision {entry['revision']} does not load in transformers: {exc}"
                    ) from exc
                if ratio > 1.0:
                    raise UserError(
                        f"revision {entry['revision']}: transformers' logits differ from smelt's for step "
                        f"{entry['step']} by {ratio:.1f}x the tolerance; its weights do not match the checkpoint."
                    )
                rows.append((entry["revision"], "loads in transformers; logits match smelt's"))
    return rows
