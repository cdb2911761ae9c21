"""`smelt release RUN OUT`: a run packaged for others, laid out like a model hub repository.

    OUT/
      README.md, DATA_CARD.md        the model card and the data card (from the manifests)
      config.json, model.safetensors, generation_config.json, tokenizer files
                                     the final checkpoint in Hugging Face format
      revisions/step_NNNNNNN/        every released checkpoint in Hugging Face format (the final one too)
      data_order/                    per released checkpoint, the token ranges of every batch since the
                                     previous one (index.json + step_NNNNNNN.jsonl.gz)
      logs/metrics.jsonl             the training log (+ train_summary.json, restarts.jsonl if any)
      eval/                          eval results per step, curves.jsonl, gallery.json
      manifests/                     the chain: documents, tokenizer, tokens, train, eval manifest.json
      data/                          curation and tokenization statistics, shards.json
      tokenizer/                     smelt's tokenizer artifact (tokenizer.json + smelt.json)
      smelt_config.json              the run's resolved smelt config
      decisions.jsonl, report.html   the decisions that name this run, the run report
      tokens/                        the training token shards (only with --include-tokens)
      release.json                   what was released and the sha256 of every file above

With OUT a git repository, each revision is a branch `step_NNNNNNN` holding that checkpoint's Hugging
Face files at its top (as hub repositories keep them) instead of a folder under revisions/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.layout import STAGE_DIRS, checkpoints_dir, list_checkpoints, step_dir_name, step_of
from smelt.manifest import code_version, hash_file, read_manifest, write_json
from smelt.metric_records import METRICS
from smelt.release.data_order import read_json, tokens_per_source, write_data_order
from smelt.tokenizer.load import SMELT_JSON, TOKENIZER_JSON
from smelt.tokens.shards import META_JSON, SHARDS_JSON

RELEASE_JSON = "release.json"
REVISIONS = "revisions"
PROBE_TOKENS = 32
PROBE_COLUMNS = 16
HF_TOP_FILES = (
    "config.json", "model.safetensors", "generation_config.json", TOKENIZER_JSON, "tokenizer_config.json",
    "special_tokens_map.json",
)  # fmt: skip


def revision_name(step: int) -> str:
    """A revision is named like the checkpoint directory it comes from."""
    return step_dir_name(step)


def committed_steps(run_dir: Path) -> list[int]:
    return [step_of(p) for p in list_checkpoints(checkpoints_dir(run_dir))]


def select_checkpoints(run_dir: Path, every: bool = False) -> list[Path]:
    """The checkpoints to release: the milestones and the final one (every committed one with `every`)."""
    from smelt.checkpoint.store import read_meta

    committed = list_checkpoints(checkpoints_dir(run_dir))
    if not committed:
        raise UserError(
            f"{run_dir} has no committed checkpoint under {checkpoints_dir(run_dir)}: there is nothing to release. "
            f"Pass a run directory that `smelt run` or `smelt train` finished (e.g. runs/quickstart)."
        )
    if every:
        return committed
    chosen = [p for p in committed[:-1] if read_meta(p, verify=False).get("milestone")]
    return [*chosen, committed[-1]]


def probe_ids(vocab_size: int, max_len: int) -> list[int]:
    """A fixed input for the logits probe: spread over the vocabulary, the same for every release."""
    return [(7919 * i + 3) % vocab_size for i in range(min(PROBE_TOKENS, max_len))]


def probe_logits(model: Any, vocab_size: int) -> dict[str, Any]:
    """smelt's logits on the probe input at a few columns, which `--verify` compares transformers' with."""
    import torch

    ids = probe_ids(vocab_size, model.cfg.max_seq_len)
    with torch.no_grad():
        logits, _ = model.float().eval()(torch.tensor([ids]))
        logits = logits[0]
    columns = ids[:PROBE_COLUMNS]
    return {"input_ids": ids, "columns": columns, "logits": logits[:, columns].tolist()}


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # the final weights are in revisions/ and at the top: one copy on disk
    except OSError:
        shutil.copy2(source, target)


def _copy_tree(source: Path, target: Path, skip: tuple[str, ...] = ()) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.name not in skip and not path.name.endswith((".tmp", ".lock")):
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)


def _prepare_out(out_dir: Path, force: bool) -> bool:
    """Make OUT ready; returns whether it is a git repository (revisions become branches)."""
    is_git = (out_dir / ".git").exists()
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"release output {out_dir} is a file; pass a directory to create (or an empty one).")
    existing = [p for p in out_dir.iterdir() if p.name != ".git"] if out_dir.is_dir() else []
    if existing and not force:
        raise UserError(
            f"release output {out_dir} is not empty ({existing[0].name} is there). Pass a new directory, or "
            f"--force to replace what is in it."
        )
    if existing and not (out_dir / RELEASE_JSON).is_file():
        # --force replaces an earlier release, never a directory that holds something else
        raise UserError(
            f"release output {out_dir} is not empty and is not an earlier release (it has no {RELEASE_JSON}), "
            f"so --force does not delete what is there ({existing[0].name}, ...). Pass a new or empty directory."
        )
    for path in existing:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    return is_git


def _decisions(run_dir: Path) -> list[dict[str, Any]]:
    from smelt.report.decisions import decisions_for
    from smelt.report.run import load_run

    try:
        return decisions_for(load_run(run_dir))
    except UserError:
        return []


def release_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    every_checkpoint: bool = False,
    licenses: dict[str, str] | None = None,
    model_license: str = "",
    include_tokens: bool = False,
    dtype: str = "float32",
    force: bool = False,
) -> dict[str, Any]:
    """Write the release of `run_dir` into `out_dir` (see the module docstring). Returns release.json."""
    import torch

    from smelt.checkpoint.store import load_model, read_meta
    from smelt.model.hf import check_exportable, export_model, hf_config
    from smelt.release.cards import data_card, model_card

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise UserError(
            f"run directory {run_dir} does not exist; pass a run directory such as runs/quickstart."
        )
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise UserError(f"--dtype {dtype!r} is not one of {', '.join(dtypes)}.")
    licenses = dict(licenses or {})
    checkpoints = select_checkpoints(run_dir, every_checkpoint)
    metas = [read_meta(p, verify=True) for p in checkpoints]  # a damaged checkpoint stops the release here
    check_exportable(_model_config(metas[-1]))
    sources = [s.get("name") for s in (metas[-1].get("config", {}).get("data", {}).get("sources") or [])]
    unknown = sorted(set(licenses) - set(sources))
    if unknown:
        raise UserError(
            f"--license names source {unknown[0]!r}, which this run does not have (sources: "
            f"{', '.join(sources)}); use SOURCE=LICENSE with one of those names."
        )
    run_path, out_path = run_dir.resolve(), out_dir.resolve()
    if out_path == run_path or run_path in out_path.parents or out_path in run_path.parents:
        raise UserError(
            f"release output {out_dir} and the run {run_dir} overlap (one holds the other); write the release "
            f"to a directory outside the run."
        )
    is_git = _prepare_out(out_dir, force)
    tokenizer_dir = run_dir / "tokenizer"
    # The data order first: a run whose plan no longer matches its checkpoints stops before any export.
    shards_json = read_json(run_dir / "tokens" / "shards.json") or {}
    steps = [(int(meta["step"]), meta) for meta in metas]
    order = write_data_order(run_dir, steps, out_dir, shards_json)

    revisions = []
    for path, meta in zip(checkpoints, metas, strict=True):
        step = int(meta["step"])
        model, _ = load_model(path)
        target = out_dir / REVISIONS / revision_name(step)
        export_model(model, target, tokenizer_dir, dtypes[dtype])
        revisions.append(
            {
                "revision": revision_name(step),
                "step": step,
                "tokens": meta.get("tokens"),
                "milestone": bool(meta.get("milestone")),
                "checkpoint": str(path.resolve()),
                "checkpoint_sha256": dict(meta.get("checksums", {})),
                "config_hash": meta.get("config_hash"),
                "probe": probe_logits(model, int(meta["vocab_size"])),
                "files": {p.name: hash_file(p) for p in sorted(target.iterdir()) if p.is_file()},
            }
        )
        del model
    final = out_dir / REVISIONS / revisions[-1]["revision"]
    for name in HF_TOP_FILES:
        if (final / name).is_file():
            _link_or_copy(final / name, out_dir / name)

    _copy_artifacts(run_dir, out_dir, include_tokens)
    decisions = _decisions(run_dir)
    if decisions:
        lines = "".join(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n" for record in decisions)
        (out_dir / "decisions.jsonl").write_text(lines, encoding="utf-8")

    facts = {
        "run": run_dir.name,
        "run_dir": str(run_dir.resolve()),
        "model_license": model_license,
        "licenses": licenses,
        "revisions": revisions,
        "meta": metas[-1],
        "hf_config": hf_config(_model_config(metas[-1]), int(metas[-1]["vocab_size"]), dtypes[dtype]),
        "tokens_per_source": tokens_per_source(order),
        "data_order": order,
        "out_dir": out_dir,
        "decisions": decisions,
    }
    (out_dir / "README.md").write_text(model_card(run_dir, facts))
    (out_dir / "DATA_CARD.md").write_text(data_card(run_dir, facts))

    if is_git:
        from smelt.release.git import commit_revisions

        commit_revisions(out_dir, [r["revision"] for r in revisions])
    release = {
        "format": 1,
        "run": run_dir.name,
        "source_run": str(run_dir.resolve()),
        "code": code_version(),
        "dtype": dtype,
        "layout": "git-branches" if is_git else "folders",
        "revisions": revisions,
        "final": revisions[-1]["revision"],
        # committed checkpoints left out (neither milestones nor the final one): --all-checkpoints adds them
        "not_released": sorted(set(committed_steps(run_dir)) - {r["step"] for r in revisions}),
        "files": _hash_tree(out_dir),
    }
    write_json(out_dir / RELEASE_JSON, release)
    return release


def _model_config(meta: dict[str, Any]) -> Any:
    from smelt.config import ModelConfig

    return ModelConfig(**meta["model_config"])


def _copy_artifacts(run_dir: Path, out_dir: Path, include_tokens: bool) -> None:
    """Logs, eval results, the manifest chain, statistics, the tokenizer and the run's config."""
    train = run_dir / "train"
    for name, target in ((METRICS, METRICS), ("summary.json", "train_summary.json"),
                         ("restarts.jsonl", "restarts.jsonl")):  # fmt: skip
        if (train / name).is_file():  # copied, never linked: a resumed run appends to its metrics.jsonl
            (out_dir / "logs").mkdir(exist_ok=True)
            shutil.copy2(train / name, out_dir / "logs" / target)
    if (run_dir / "restarts.jsonl").is_file():
        shutil.copy2(run_dir / "restarts.jsonl", out_dir / "logs" / "restarts.jsonl")
    if (run_dir / "eval").is_dir():
        _copy_tree(run_dir / "eval", out_dir / "eval", skip=("manifest.json",))
    for stage in STAGE_DIRS.values():
        manifest = read_manifest(run_dir / stage)
        if manifest is not None:
            write_json(out_dir / "manifests" / f"{stage}.json", manifest)
    for source, target in (
        ("documents/stats.json", "data/documents_stats.json"),
        ("documents/decontamination.json", "data/decontamination.json"),
        ("tokens/stats.json", "data/tokens_stats.json"),
        ("tokens/shards.json", "data/shards.json"),
        ("tokens/meta.json", "data/tokens_meta.json"),
    ):
        if (run_dir / source).is_file():
            (out_dir / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / source, out_dir / target)
    (out_dir / "tokenizer").mkdir(exist_ok=True)
    for name in (TOKENIZER_JSON, SMELT_JSON):
        shutil.copy2(run_dir / "tokenizer" / name, out_dir / "tokenizer" / name)
    config = read_json(run_dir / "config.json")
    if config is not None:
        write_json(out_dir / "smelt_config.json", config)
    if (run_dir / "report.html").is_file():
        shutil.copy2(run_dir / "report.html", out_dir / "report.html")
    if include_tokens:
        (out_dir / "tokens").mkdir(exist_ok=True)
        for name in (META_JSON, SHARDS_JSON):
            shutil.copy2(run_dir / "tokens" / name, out_dir / "tokens" / name)
        _copy_tree(run_dir / "tokens" / "train", out_dir / "tokens" / "train")


def _hash_tree(out_dir: Path) -> dict[str, str]:
    """sha256 of every file of the release but release.json and git's own files."""
    return {
        path.relative_to(out_dir).as_posix(): hash_file(path)
        for path in sorted(out_dir.rglob("*"))
        if path.is_file() and path.name != RELEASE_JSON and ".git" not in path.relative_to(out_dir).parts
    }
