"""`smelt checkpoint list | verify | average`: look at, check and combine a run's checkpoints.

`average` writes a new weights-only checkpoint (meta "weights_only": true, no optimizer state, so it
cannot be resumed) holding the uniform mean of the chosen checkpoints' weights, or their exponential
moving average in step order. It goes outside the run's checkpoints directory (default
RUN/averaged/step_NNNNNNN-avgK), where training's resume and retention never see it; `load_model`,
`smelt eval` and `smelt export hf` read it like any checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from smelt.checkpoint.store import (
    MARKER,
    META,
    SafeReader,
    list_checkpoints,
    read_meta,
    save_checkpoint,
)
from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS, checkpoints_dir, resolve_checkpoints
from smelt.manifest import combined_hash
from smelt.model.transformer import Transformer
from smelt.progress import progress

_STEP_DIR = re.compile(r"^(?:\.tmp-)?step_(\d{7,})$")
# Model keys that change neither the shapes nor the function the weights compute.
_RUNTIME_KEYS = frozenset(
    {"preset", "init_std", "head_init_std", "activation_checkpointing", "attention", "z_loss", "max_seq_len"}
)


def checkpoints_dir_of(path: str | Path) -> Path:
    """RUN, RUN/train or RUN/train/checkpoints (or any folder of step_NNNNNNN dirs) -> the checkpoints dir."""
    path = Path(path)
    for candidate in (checkpoints_dir(path), path / CHECKPOINTS, path):
        if candidate.is_dir() and _checkpoint_dirs(candidate):
            return candidate
    if checkpoints_dir(path).is_dir() or (path / CHECKPOINTS).is_dir():
        raise UserError(f"{path} has no checkpoints yet. Train it first (`smelt train CONFIG`).")
    raise UserError(
        f"{path} is not a run directory with checkpoints (no train/checkpoints/step_NNNNNNN/ inside). "
        f"Pass a run directory such as runs/quickstart, or its train/checkpoints folder."
    )


def _checkpoint_dirs(folder: Path) -> list[Path]:
    """step_NNNNNNN dirs (committed or not, and unfinished .tmp- saves) and any other committed
    checkpoint (an average), ordered by step."""
    found = [
        p
        for p in folder.iterdir()
        if p.is_dir() and (_STEP_DIR.match(p.name) or (p / MARKER).is_file() or (p / META).is_file())
    ]
    return sorted(found, key=lambda p: (_step(p), p.name))


def _step(path: Path) -> int:
    match = _STEP_DIR.match(path.name)
    if match:
        return int(match.group(1))
    try:
        return int(read_meta(path, verify=False)["step"])
    except (UserError, KeyError, TypeError, ValueError):
        return -1


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def describe(checkpoints_dir: Path, verify: bool = False) -> list[dict[str, Any]]:
    """One row per checkpoint directory, committed or not (an unfinished save shows as not committed)."""
    rows = []
    dirs = _checkpoint_dirs(checkpoints_dir)
    for path in progress(dirs, desc="checkpoints", unit="ckpt") if verify else dirs:
        committed = (path / MARKER).is_file()
        row: dict[str, Any] = {
            "name": path.name,
            "step": _step(path),
            "tokens": None,
            "size": _dir_size(path),
            "committed": committed,
            "milestone": False,
            "weights_only": False,
            "verified": None,
        }
        if committed:
            try:
                meta = read_meta(path, verify=verify)
                row.update(
                    tokens=meta.get("tokens"),
                    milestone=bool(meta.get("milestone")),
                    weights_only=bool(meta.get("weights_only")),
                )
                row["verified"] = True if verify else None
            except UserError as exc:
                row["verified"] = str(exc)
        rows.append(row)
    return rows


def list_table(path: str | Path, verify: bool = False) -> str:
    checkpoints_dir = checkpoints_dir_of(path)
    rows = describe(checkpoints_dir, verify)
    header = ("checkpoint", "step", "tokens", "size", "committed", "milestone", "verified")
    lines = [header]
    for r in rows:
        if not r["committed"]:
            committed = "no (unfinished save, ignored)"
        else:
            committed = "yes, weights only" if r["weights_only"] else "yes"
        verified = "-" if r["verified"] is None else "ok" if r["verified"] is True else "CORRUPT"
        tokens = "-" if r["tokens"] is None else f"{r['tokens']:,}"
        lines.append((r["name"], str(r["step"]), tokens, _human(r["size"]), committed,
                      "yes" if r["milestone"] else "", verified))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip
    problems = [f"{r['name']}: {r['verified']}" for r in rows if isinstance(r["verified"], str)]
    footer = f"\n{len(rows)} checkpoint directories in {checkpoints_dir}"
    if not verify:
        footer += " (checksums not checked: add --verify)"
    return text + footer + "".join(f"\n{p}" for p in problems)


def verify(path: str | Path, step: int | None = None, every: bool = False) -> str:
    """Check checksums of the latest (or `step`, or every) committed checkpoint; UserError names the file."""
    lines, failures = verify_lines(path, step, every)
    if failures:
        raise corrupt_error(lines, failures)
    return "\n".join(lines)


def corrupt_error(lines: list[str], failures: list[str]) -> UserError:
    """The error for the corrupt checkpoints alone (the ok ones are not errors), naming each file."""
    corrupt = ", ".join(line.split(":")[0] for line in lines if line.endswith(": CORRUPT"))
    return UserError(
        f"{len(failures)} of {len(lines)} checkpoint(s) corrupt ({corrupt}):\n" + "\n".join(failures)
    )


def verify_lines(
    path: str | Path, step: int | None = None, every: bool = False
) -> tuple[list[str], list[str]]:
    """(one status line per checkpoint checked: `ok` or `CORRUPT`, the error of each corrupt one,
    naming its file)."""
    path = Path(path)
    if (path / MARKER).is_file() or (path / META).is_file():  # a checkpoint directory itself
        targets = [path]
    else:
        which = "all" if every else "latest" if step is None else str(step)
        targets = resolve_checkpoints(checkpoints_dir_of(path), which)
    lines, failures = [], []
    for target in progress(targets, desc="verify", unit="ckpt"):
        try:
            meta = read_meta(target, verify=True)
        except UserError as exc:
            failures.append(str(exc))
            lines.append(f"{target.name}: CORRUPT")
            continue
        listed = set(meta.get("checksums", {}))
        extra = sorted(
            p.relative_to(target).as_posix()
            for p in target.rglob("*")
            if p.is_file() and p.name not in (META, MARKER) and p.relative_to(target).as_posix() not in listed
        )
        note = f" (files not covered by checksums: {', '.join(extra)})" if extra else ""
        lines.append(f"{target.name}: ok, {len(listed)} files and {META} match their sha256{note}")
    return lines, failures


def select(checkpoints_dir: Path, last: int | None = None, steps: list[int] | None = None) -> list[Path]:
    """The training checkpoints to average, in step order (weights-only ones are never picked by --last)."""
    committed = [
        p for p in list_checkpoints(checkpoints_dir) if not read_meta(p, verify=False).get("weights_only")
    ]
    by_step = {int(_STEP_DIR.match(p.name).group(1)): p for p in committed}
    have = ", ".join(map(str, by_step)) or "none"
    if steps:
        missing = [s for s in steps if s not in by_step]
        if missing:
            raise UserError(
                f"--steps {' '.join(map(str, missing))}: no committed checkpoint of that step in "
                f"{checkpoints_dir} (committed steps: {have})."
            )
        return [by_step[s] for s in sorted(set(steps))]
    if last is None or last < 1:
        raise UserError(f"--last {last} must be 1 or more.")
    if last > len(by_step):
        raise UserError(
            f"--last {last}: only {len(by_step)} committed checkpoints in {checkpoints_dir} (steps: {have}). "
            f"Pass --last {max(len(by_step), 1)} or fewer, or keep more with checkpoint.keep_last."
        )
    return committed[-last:]


def ema_weights(n: int, decay: float) -> list[float]:
    """Weight of each of n checkpoints (step order) in ema_k = decay ema_{k-1} + (1 - decay) x_k, ema_1 = x_1."""
    return [decay ** (n - 1)] + [(1 - decay) * decay ** (n - k) for k in range(2, n + 1)]


def _model_key(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (meta.get("model_config") or {}).items() if k not in _RUNTIME_KEYS}


def _check_same_model(paths: list[Path], metas: list[dict[str, Any]]) -> None:
    first, first_key = paths[0], _model_key(metas[0])
    for path, meta in zip(paths[1:], metas[1:], strict=True):
        key = _model_key(meta)
        diffs = [f"model.{k}: {first_key.get(k)!r} vs {key.get(k)!r}" for k in sorted(set(first_key) | set(key))
                 if first_key.get(k) != key.get(k)]  # fmt: skip
        if meta.get("vocab_size") != metas[0].get("vocab_size"):
            diffs.append(f"vocab size: {metas[0].get('vocab_size')} vs {meta.get('vocab_size')}")
        tok_a, tok_b = metas[0].get("tokenizer_hash"), meta.get("tokenizer_hash")
        if tok_a and tok_b and tok_a != tok_b:
            diffs.append(f"tokenizer: {tok_a[:12]} vs {tok_b[:12]}")
        if diffs:
            raise UserError(
                f"cannot average {first} and {path}: they are different models ({'; '.join(diffs)}). "
                f"Average checkpoints of one run (or of runs with the same model config and tokenizer)."
            )


def average_checkpoints(
    sources: list[Path], out: Path, ema_decay: float | None = None, force: bool = False
) -> dict[str, Any]:
    """Write the (uniform or EMA) average of `sources`' weights as a committed weights-only checkpoint."""
    if not sources:
        raise UserError("nothing to average: no checkpoints were chosen.")
    if ema_decay is not None and not 0.0 < ema_decay < 1.0:
        raise UserError(f"--ema {ema_decay} must be between 0 and 1 (exclusive), e.g. 0.9.")
    out = Path(out)
    if out.exists() and not force:
        raise UserError(f"{out} already exists. Pass --force to replace it, or choose another --out.")
    sources = sorted(sources, key=lambda p: int(read_meta(p, verify=False)["step"]))
    metas = [read_meta(p, verify=False) for p in sources]
    _check_same_model(sources, metas)
    n = len(sources)
    weights = ema_weights(n, ema_decay) if ema_decay is not None else [1.0 / n] * n

    # One set of host buffers, loaded in place from each source in turn; the model itself is only
    # built on the meta device, because a real one spends most of a load on random init.
    template = _meta_model(metas[0]).state_dict()
    buffers = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in template.items()}
    sums: dict[str, torch.Tensor] = {}
    for path, weight in zip(progress(sources, desc="average", unit="ckpt"), weights, strict=True):
        _load_weights(path, buffers)
        for name, tensor in buffers.items():
            if not tensor.is_floating_point():
                sums[name] = tensor.clone()  # integer state: the newest checkpoint's
                continue
            # float32 accumulation (float64 for float64 weights): exact enough, half the memory of float64.
            acc = torch.float64 if tensor.dtype == torch.float64 else torch.float32
            if name not in sums:
                sums[name] = torch.zeros(tensor.shape, dtype=acc)
            sums[name].add_(tensor.to(acc), alpha=weight)
    del buffers

    last = metas[-1]
    model = _meta_model(last)
    # assign=True: the averaged tensors become the parameters (no second copy); the meta model's
    # derived buffers (RoPE table) are not part of the state dict, so they are never saved.
    model.load_state_dict({k: v.to(template[k].dtype) for k, v in sums.items()}, assign=True)
    del sums
    method = {"method": "ema", "ema_decay": ema_decay} if ema_decay is not None else {"method": "uniform"}
    meta = {k: v for k, v in last.items() if k not in ("checksums", "step", "loader", "milestone")}
    meta.update(
        weights_only=True,
        optimizer="dropped: an average has no optimizer state, so it can be evaluated or exported, not resumed",
        averaged={
            **method,
            "sources": [
                {
                    "path": str(p),
                    "step": m["step"],
                    "tokens": m.get("tokens"),
                    "weight": w,
                    "checksums_hash": combined_hash(m.get("checksums", {})),
                }
                for p, m, w in zip(sources, metas, weights, strict=True)
            ],  # fmt: skip
        },
    )
    step = int(last["step"])
    _write_weights_only(model, meta, step, out)
    return {"path": str(out), "step": step, "sources": [int(m["step"]) for m in metas], **method}


def _meta_model(meta: dict[str, Any]) -> Transformer:
    with torch.device("meta"):
        return Transformer(ModelConfig(**meta["model_config"]), int(meta["vocab_size"]))


def _load_weights(path: Path, buffers: dict[str, torch.Tensor]) -> None:
    """Load a checkpoint's model weights in place into `buffers`, after verifying every checksum."""
    read_meta(path, verify=True)  # never average a damaged checkpoint
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            # SafeReader: DCP's .metadata goes through the store's restricted unpickler.
            dcp.load({"model": buffers}, storage_reader=SafeReader(path))
    except (CheckpointException, RuntimeError, ValueError, KeyError) as exc:
        raise UserError(
            f"cannot read the weights of {path}: {exc}. Its tensors do not match the model its meta.json "
            f"describes; leave it out of the average."
        ) from exc


def _write_weights_only(model: torch.nn.Module, meta: dict[str, Any], step: int, out: Path) -> None:
    # save_checkpoint commits step_N/ inside a folder (tmp dir, checksums, rename, marker last); it is
    # written into a hidden staging folder next to `out` and then renamed, so `out` is either absent
    # or complete.
    staging = out.parent / f".tmp-average-{out.name}"
    if staging.exists():
        shutil.rmtree(staging)
    written = save_checkpoint(staging, step, model, None, meta)
    if out.exists():
        (out / MARKER).unlink(missing_ok=True)
        shutil.rmtree(out)
    os.replace(written, out)
    shutil.rmtree(staging)


def default_out(checkpoints_dir: Path, sources: list[Path], ema_decay: float | None) -> Path:
    run = checkpoints_dir.parent.parent if checkpoints_dir.parent.name == "train" else checkpoints_dir.parent
    last = sources[-1].name
    label = f"ema{ema_decay:g}x{len(sources)}" if ema_decay is not None else f"avg{len(sources)}"
    return run / "averaged" / f"{last}-{label}"


def average_run(
    run: str | Path,
    last: int | None,
    steps: list[int] | None,
    ema_decay: float | None,
    out: str | Path | None,
    force: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """`smelt checkpoint average RUN`: average the chosen checkpoints of RUN into `out` (default:
    RUN/averaged/<last step>-avgN); returns where it went and the summary."""
    checkpoints_dir = checkpoints_dir_of(run)
    sources = select(checkpoints_dir, last=last, steps=steps)
    target = Path(out) if out else default_out(checkpoints_dir, sources, ema_decay)
    return target, average_checkpoints(sources, target, ema_decay=ema_decay, force=force)
