"""Checkpoints: `checkpoints/step_NNNNNNN/` written with torch.distributed.checkpoint (DCP).

Layout of one checkpoint directory:
    .metadata, __R_0.distcp   DCP files: {"model": ..., "optimizer": ...}; each rank writes its own
                              shards (FSDP2) or its share of the replicated tensors (DDP), nothing is
                              gathered to rank 0, and DCP reshards on load into any world size
    rank_RRRRR.json           per-rank state: RNG states (Python, NumPy, torch CPU and CUDA)
    meta.json                 step, tokens, loader/scaler/alert state, config + hashes, model config,
                              vocab size, world size, sha256 of every other file
    COMMITTED                 written last: the step and the sha256 of meta.json; a directory
                              without it does not exist, one without the checksum is damaged

Two-phase commit: everything is written into `.tmp-step_NNNNNNN/`; rank 0 checksums every file into
meta.json, fsyncs, renames the directory into place and writes the marker (with meta.json's own
checksum) last. A crash at any moment leaves the previous checkpoints intact and at worst a directory
without its marker, which readers ignore (resume reports it as damaged). A save that fails (a full
disk) removes its unfinished files and raises CheckpointSaveError, a failure while running (exit 1),
not bad input. Loading never unpickles arbitrary objects: tensors come through DCP's weights-only loads,
DCP's own `.metadata` through an unpickler that admits only DCP's metadata classes, and the rest is JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from smelt.checkpoint.failures import SAVE_ERRORS, save_failed, state_nbytes
from smelt.checkpoint.rng import restore_rng, rng_state  # noqa: F401 (re-exported: one checkpoint API)
from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.layout import (  # re-exported: callers of the store see one checkpoint API
    MARKER,
    META,
    latest_checkpoint,
    list_checkpoints,
    step_dir_name,
    step_dirs,
    step_of,
)
from smelt.manifest import hash_file
from smelt.model.transformer import Transformer

# Where checkpoints newer than a resume point go: kept (they took compute), out of the resume chain.
SUPERSEDED = "superseded"
_RANK_FILE = "rank_{:05d}.json"

# A checkpoint written before optimizer groups were flattened lists each group's parameter names:
# "optimizer.param_groups.0.params" (a flattened one has "optimizer.param_groups.<name>.lr" and no list).
_GROUP_LIST_KEY = re.compile(r"^optimizer\.param_groups\.\d+\.params$")


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    # DCP warns on every call that no process group exists; single-process use is intended here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*experimental.*")
        yield


# --- safe loading -------------------------------------------------------------------------------

_SAFE_MODULES = ("torch.distributed.checkpoint.", "torch.distributed.tensor.")
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata dataclasses, dtypes and a few builtins; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_SAFE_MODULES) or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "torch" and name in ("device", "memory_format", "layout"):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


class SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose `.metadata` goes through the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except pickle.UnpicklingError as exc:
            raise UserError(f"checkpoint {self.path}: {exc}; it was not written by smelt.") from exc
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _dcp_load(state: dict[str, Any], checkpoint_dir: Path) -> None:
    with _quiet_dcp():
        dcp.load(state, storage_reader=SafeReader(checkpoint_dir))


# --- per-rank state (JSON only) ---------------------------------------------------------------


# --- writing ----------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_json_synced(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _checksums(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hash_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in (META, MARKER)
    }


def _json_meta(meta: dict[str, Any], step: int) -> dict[str, Any]:
    meta = dict(meta)
    if dataclasses.is_dataclass(meta.get("model_config")):
        meta["model_config"] = dataclasses.asdict(meta["model_config"])
    meta["step"] = step
    return meta


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier(group: Any = None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def prepare_tmp(checkpoints_dir: Path, step: int) -> Path:
    """Rank 0 makes an empty `.tmp-step_N/` (removing leftovers of a crashed save); all ranks wait."""
    tmp = Path(checkpoints_dir) / f".tmp-{step_dir_name(step)}"
    if _is_main():
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    return tmp


def write_rank_state(tmp: Path, rank_state: dict[str, Any]) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    _write_json_synced(tmp / _RANK_FILE.format(rank), rank_state)


def commit(tmp: Path, step: int, meta: dict[str, Any]) -> Path:
    """Rank 0 only, after every rank's files are written: checksum, meta.json, rename, marker."""
    final = tmp.parent / step_dir_name(step)
    for path in tmp.rglob("*"):
        if path.is_file():
            _fsync_file(path)
    meta = _json_meta(meta, step)
    meta["checksums"] = _checksums(tmp)
    _write_json_synced(tmp / META, meta)
    # meta.json cannot list its own checksum; the marker carries it, so an edited meta.json is caught.
    marker = {"step": step, "meta_sha256": hash_file(tmp / META)}
    _fsync_dir(tmp)
    if final.exists():
        (final / MARKER).unlink(missing_ok=True)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    try:
        _write_json_synced(final / MARKER, marker)
    except OSError:
        (final / MARKER).unlink(missing_ok=True)  # a half-written marker must not commit the directory
        raise
    _fsync_dir(final)
    return final


def discard_partial(tmp: Path, step: int) -> None:
    """Remove what a failed save left: its `.tmp-` directory, and its final directory if the rename
    happened but the marker did not (never a committed checkpoint)."""
    shutil.rmtree(tmp, ignore_errors=True)
    final = tmp.parent / step_dir_name(step)
    if final.is_dir() and not (final / MARKER).is_file():
        shutil.rmtree(final, ignore_errors=True)


def model_optim_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, flat: bool = True
) -> dict[str, Any]:
    """The DCP state: keyed by parameter name (not position), the form that survives DDP/FSDP2 and resharding.

    The optimizer's hyperparameters are flattened per parameter too ("param_groups.<name>.lr", as
    torchtitan saves them): kept as a list of groups, a rank reading a checkpoint of another layout got
    the groups another rank wrote, which under pipeline parallelism name other parameters (a resume
    from TP2 x PP2 x DP2 into PP2 x DP4 stopped with KeyError: 'betas'). `flat=False` reads checkpoints
    written before (optimizer_is_flat says which a checkpoint is)."""
    if optimizer is None:
        return {"model": get_state_dict(model, [])[0]}
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optimizer": optim_sd}


def optimizer_is_flat(checkpoint_dir: Path) -> bool:
    """Whether the checkpoint's optimizer groups are flattened per parameter (see model_optim_state)."""
    keys = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata().state_dict_metadata
    return not any(_GROUP_LIST_KEY.match(key) for key in keys)


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, Any],
    rank_state: dict[str, Any] | None = None,
    process_group: Any = None,
) -> Path:
    """Write checkpoints_dir/step_{step:07d}/ synchronously and return its path (every rank calls this).

    `meta` must be JSON-safe (a ModelConfig dataclass is converted) and should carry "model_config" and
    "vocab_size" so that load_model can rebuild the model; `rank_state` is this rank's JSON state
    (RNG, ...). An optimizer of None writes weights only.
    """
    checkpoints_dir = Path(checkpoints_dir)
    tmp = prepare_tmp(checkpoints_dir, step)
    state = model_optim_state(model, optimizer)
    try:
        write_rank_state(tmp, rank_state or {})
        with _quiet_dcp():
            dcp.save(state, checkpoint_id=tmp, process_group=process_group)
        final = commit(tmp, step, meta) if _is_main() else tmp.parent / step_dir_name(step)
    except SAVE_ERRORS as exc:
        discard_partial(tmp, step)
        raise save_failed(
            exc, step, checkpoints_dir, state_nbytes(state), latest_checkpoint(checkpoints_dir)
        ) from exc
    _barrier()
    return final


# --- reading ----------------------------------------------------------------------------------


def latest_valid_checkpoint(checkpoints_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose files all match their checksums, and a warning per one passed over:
    a step directory without its marker (a save that never finished) or with a damaged file."""
    warnings_: list[str] = []
    for path in reversed(step_dirs(checkpoints_dir)):
        if not (path / MARKER).is_file():
            warnings_.append(
                f"skipping damaged checkpoint {path.name}: it has no {MARKER} marker (its save never finished)"
            )
            continue
        try:
            read_meta(path, verify=True)
        except UserError as exc:
            warnings_.append(f"skipping damaged checkpoint {path.name}: {exc}")
            continue
        return path, warnings_
    return None, warnings_


def checkpoint_at_step(checkpoints_dir: Path, step: int) -> Path:
    """The committed, verified checkpoint of `step` (for `--resume-from STEP`); a UserError naming the
    steps that exist otherwise."""
    checkpoints_dir = Path(checkpoints_dir)
    path = checkpoints_dir / step_dir_name(step)
    if not (path / MARKER).is_file():
        have = ", ".join(str(step_of(p)) for p in list_checkpoints(checkpoints_dir)) or "none"
        raise UserError(
            f"--resume-from {step}: no committed checkpoint of step {step} under {checkpoints_dir} "
            f"(committed steps: {have}). Pass one of those steps, or leave --resume-from out to continue "
            f"from the newest valid one."
        )
    read_meta(path, verify=True)
    return path


def set_aside_after(checkpoints_dir: Path, step: int) -> list[Path]:
    """Move every step directory after `step` (committed, damaged or unfinished) into
    `checkpoints_dir/superseded/`: a run continuing from `step` rewrites those steps, and what took
    compute to make is kept rather than overwritten or pruned. Returns where each one went."""
    checkpoints_dir = Path(checkpoints_dir)
    moved = []
    for path in step_dirs(checkpoints_dir):
        if step_of(path) <= step:
            continue
        target = checkpoints_dir / SUPERSEDED / path.name
        number = 1
        while target.exists():
            number += 1
            target = checkpoints_dir / SUPERSEDED / f"{path.name}.{number}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    if moved:
        _fsync_dir(checkpoints_dir)
    return moved


def prune_checkpoints(checkpoints_dir: Path, keep_last: int, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Delete committed checkpoints beyond the keep_last newest; never milestones or those in `protect`."""
    protected = {Path(p).resolve() for p in protect}
    candidates = [
        p for p in list_checkpoints(checkpoints_dir) if p.resolve() not in protected and not _is_milestone(p)
    ]
    doomed = candidates[: max(0, len(candidates) - keep_last)]
    for path in doomed:
        # Remove the marker first: a half-deleted directory must not look like a checkpoint.
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path)
    return doomed


def _is_milestone(path: Path) -> bool:
    try:
        return bool(json.loads((path / META).read_text()).get("milestone"))
    except (OSError, json.JSONDecodeError):
        return False


def read_meta(checkpoint_dir: Path, verify: bool = True) -> dict[str, Any]:
    """meta.json of a committed checkpoint, after checking every file against its checksum."""
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / MARKER).is_file():
        raise UserError(
            f"{checkpoint_dir} is not a committed checkpoint (no {MARKER} marker): it was never finished "
            f"or is not a checkpoint directory. Pick another one, e.g. the latest under its parent."
        )
    if verify:  # the marker holds {"step", "meta_sha256"}
        try:
            marker = json.loads((checkpoint_dir / MARKER).read_text())
        except (OSError, ValueError):
            marker = None
        expected = marker.get("meta_sha256") if isinstance(marker, dict) else None
        if not isinstance(expected, str) or not expected:  # `: > COMMITTED` must not switch the check off
            raise UserError(
                f"checkpoint {checkpoint_dir}: its {MARKER} marker is empty, unreadable or of an older format "
                f"(no sha256 of {META}), so {META} cannot be checked; the checkpoint counts as damaged. Use an "
                f"earlier checkpoint (resume falls back to one on its own)."
            )
        if (checkpoint_dir / META).is_file() and hash_file(checkpoint_dir / META) != expected:
            raise UserError(
                f"checkpoint {checkpoint_dir}: {META} does not match its sha256 in {MARKER}; it was edited "
                f"or is corrupt. Use an earlier checkpoint (resume falls back to one on its own)."
            )
    try:
        meta = json.loads((checkpoint_dir / META).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"checkpoint {checkpoint_dir}: {META} is missing or unreadable ({exc}).") from exc
    if verify:
        for rel, digest in meta.get("checksums", {}).items():
            path = checkpoint_dir / rel
            if not path.is_file():
                raise UserError(
                    f"checkpoint {checkpoint_dir}: file {rel} is missing; the checkpoint is damaged."
                )
            if hash_file(path) != digest:
                raise UserError(
                    f"checkpoint {checkpoint_dir}: file {rel} does not match its sha256 in {META}; the "
                    f"checkpoint is corrupt. Use an earlier checkpoint or retrain from it."
                )
    return meta


# What makes a checkpoint's weights mean something; kernels, init and checkpointing may change on resume.
_ARCHITECTURE_KEYS = (
    "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "qk_norm", "tie_embeddings", "rope_theta",
    "rope_fraction", "nope_every", "norm_eps", "mlp", "value_embeddings",
)  # fmt: skip


def check_compatible(meta: dict[str, Any], checkpoint_dir: Path, expected: dict[str, Any]) -> None:
    """A UserError naming every key where the checkpoint differs from the run loading it.

    `expected` holds the run's "model_config" (dict), "vocab_size" and optionally "tokenizer_hash".
    """
    problems = []
    saved_model = meta.get("model_config") or {}
    for key, value in (expected.get("model_config") or {}).items():
        if key in _ARCHITECTURE_KEYS and key in saved_model and saved_model[key] != value:
            problems.append(f"model.{key}: checkpoint {saved_model[key]!r}, this run {value!r}")
    if "vocab_size" in expected and meta.get("vocab_size") != expected["vocab_size"]:
        problems.append(f"vocab size: checkpoint {meta.get('vocab_size')}, this run {expected['vocab_size']}")
    saved_tok, tok = meta.get("tokenizer_hash"), expected.get("tokenizer_hash")
    if saved_tok and tok and saved_tok != tok:
        problems.append(f"tokenizer: checkpoint {saved_tok[:12]}, this run {tok[:12]}")
    if problems:
        raise UserError(
            f"checkpoint {checkpoint_dir} does not fit this run: "
            + "; ".join(problems)
            + ". Resume with the "
            "model config and tokenizer it was trained with, or start a fresh run in another run.dir."
        )


def load_model(
    checkpoint_dir: Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, dict[str, Any]]:
    """Rebuild the model from a checkpoint's meta.json and load its weights (checksums verified).

    The model is built on the meta device and given empty storage on `device` (Transformer.for_loading),
    and DCP reads the weights straight into that storage: one copy of the weights, no random init, and
    no staging copy on the CPU for a GPU."""
    checkpoint_dir = Path(checkpoint_dir)
    meta = read_meta(checkpoint_dir)
    model = Transformer.for_loading(ModelConfig(**meta["model_config"]), int(meta["vocab_size"]), device)
    _dcp_load({"model": model.state_dict()}, checkpoint_dir)  # in place into the module's tensors
    return model, meta


def load_training_state(
    checkpoint_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    expected: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load weights and optimizer state into existing (possibly DDP/FSDP2-wrapped) objects.

    Every rank calls this; DCP reads whatever shards each rank needs, so a checkpoint written by any
    world size and strategy loads here. Returns (meta, this rank's saved state), the latter None when
    the checkpoint had no such rank (a different world size).
    """
    checkpoint_dir = Path(checkpoint_dir)
    meta = read_meta(checkpoint_dir, verify=_is_main())
    if expected is not None:
        check_compatible(meta, checkpoint_dir, expected)
    if meta.get("weights_only"):
        raise UserError(
            f"checkpoint {checkpoint_dir} holds weights only (e.g. an average), no optimizer state: it cannot "
            f"be resumed. Use it for eval or export, or resume from a training checkpoint."
        )
    flat = optimizer_is_flat(checkpoint_dir)
    state = model_optim_state(model, optimizer, flat)
    _dcp_load(state, checkpoint_dir)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(flatten_optimizer_state_dict=flat))  # fmt: skip
    rank = dist.get_rank() if dist.is_initialized() else 0
    rank_file = checkpoint_dir / _RANK_FILE.format(rank)
    rank_state = json.loads(rank_file.read_text()) if rank_file.is_file() else None
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if rank_state is not None and meta.get("world_size", 1) != world_size:
        rank_state = None  # another world size: per-rank RNG streams do not carry over
    return meta, rank_state
