"""`smelt eval RUN --contamination`: the contamination meter on a run's checkpoints.

Each checkpoint's figures go to `RUN/eval/contamination/step_NNNNNNN.json` (beside the step files, not
in them: the meter's figures have a key of their own and never make an evaluation stale), keyed like
a step file's parts: the checkpoint's hash, and a key over the tasks' fingerprints, the items per
task, k and the canary record. A file whose checkpoint and key match is reused (`--force` scores
again). The figures are those of `smelt.eval.contamination.ContaminationMeter`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smelt.canaries import read_record
from smelt.config import Config, hash_json
from smelt.eval.results import result_name, section_key
from smelt.layout import STAGE_DIRS
from smelt.manifest import combined_hash, write_json
from smelt.progress import log

if TYPE_CHECKING:
    import torch

METER_VERSION = "contamination-v1"
FOLDER = "contamination"


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every checkpoint's meter figures written by `smelt eval --contamination`, in step order (no torch
    is imported: the report reads them)."""
    out = []
    for path in sorted((Path(run_dir) / STAGE_DIRS["eval"] / FOLDER).glob("*.json")):
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(content, dict) and isinstance(content.get("tasks"), dict):
            out.append(content)
    return sorted(out, key=lambda r: int(r.get("step") or 0))


def meter_key(cfg: Config, tasks: list[str] | None, items: int) -> str:
    from smelt.eval.contamination import meter_specs
    from smelt.eval.tasks import task_fingerprint

    specs, tasks_dir = meter_specs(cfg, tasks)
    canaries = read_record(cfg.run_dir / STAGE_DIRS["curate"])
    return section_key(
        {
            "meter": METER_VERSION,
            "tasks": {s.name: task_fingerprint(s, tasks_dir) for s in specs},
            "items": items,
            "k": cfg.eval.contamination_k,
            "canaries": hash_json(canaries) if canaries else None,
        }
    )


def _reuse(target: Path, checkpoint_hash: str, key: str) -> dict[str, Any] | None:
    try:
        existing = json.loads(target.read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(existing, dict) and existing.get("checkpoint_hash") == checkpoint_hash
    return existing if same and existing.get("key") == key else None


def evaluate_contamination(
    cfg: Config,
    checkpoint: str = "latest",
    tasks: list[str] | None = None,
    items: int | None = None,
    force: bool = False,
    device: torch.device | None = None,
) -> list[dict[str, Any]]:
    """Meter `checkpoint` (latest, all, a step) of the run; write and return each checkpoint's figures."""
    import torch

    from smelt.checkpoint.store import load_model, read_meta
    from smelt.eval.contamination import ContaminationMeter
    from smelt.eval.run import check_tokenizer, resolve_checkpoints
    from smelt.tokenizer.load import Tokenizer

    run_dir = cfg.run_dir
    items = cfg.eval.contamination_items if items is None else items  # 0: every item
    key = meter_key(cfg, tasks, items)
    tokenizer = Tokenizer.load(run_dir / STAGE_DIRS["tokenizer"])
    meters: dict[int, ContaminationMeter] = {}
    out = []
    for path in resolve_checkpoints(run_dir, checkpoint):
        meta = read_meta(path, verify=False)
        target = run_dir / STAGE_DIRS["eval"] / FOLDER / result_name(path, meta)
        checkpoint_hash = combined_hash(meta.get("checksums", {}))
        existing = None if force else _reuse(target, checkpoint_hash, key)
        if existing is not None:
            log(f"[eval] {path.name}: contamination up to date, skipped")
            out.append(existing)
            continue
        check_tokenizer(meta, tokenizer, run_dir, path)
        model, meta = load_model(path, device=device or torch.device("cpu"))
        max_len = model.cfg.max_seq_len
        if max_len not in meters:
            documents = run_dir / STAGE_DIRS["curate"]
            meters[max_len] = ContaminationMeter(cfg, tokenizer, documents, max_len, tasks, items)
        log(f"[eval] {path.name}: scoring contamination ({', '.join(meters[max_len].probes)})")
        figures = meters[max_len](model, device or torch.device("cpu"), cfg.eval.batch_size)
        result = {"step": int(meta["step"]), "tokens_seen": meta.get("tokens"), "checkpoint": str(path),
                  "checkpoint_hash": checkpoint_hash, "key": key, **figures}  # fmt: skip
        write_json(target, result)
        out.append(result)
    return out


def contamination_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The table `smelt eval --contamination` prints for one checkpoint."""
    rows = [("checkpoint", str(result.get("checkpoint")))]
    for name, f in result.get("tasks", {}).items():
        if f.get("t") is None:
            rows.append((f"{name}: contamination", f"{f['items']} items: too few to test"))
            continue
        verdict = f"FLAGGED (t < -{f['k']:g})" if f["flagged"] else "clean"
        rows.append(
            (
                f"{name}: contamination",
                f"{verdict}: t = {f['t']:.2f}, p = {f['p_value']:.2g}; gold {f['gold_bits_per_byte']:.4f} vs "
                f"{f['controls']} {f['control_bits_per_byte']:.4f} bits/byte ({f['items']} items, "
                f"{f['below_share']:.0%} below their controls)",
            )
        )
    canaries = result.get("canaries")
    if canaries:
        c = canaries["controls"]
        rows.append(("canaries: unseen controls", f"{c['bits_per_byte']:.4f} ± {c['sd']:.4f} bits/byte "
                     f"({c['strings']} strings)"))  # fmt: skip
        for level in canaries["levels"]:
            z = "" if level["z"] is None else f", z {level['z']:.2f}"
            rows.append((f"canaries seen x{level['copies']}", f"{level['bits_per_byte']:.4f} bits/byte, "
                         f"memorisation {level['memorisation']:+.4f}{z} ({level['strings']} strings)"))  # fmt: skip
    return rows
