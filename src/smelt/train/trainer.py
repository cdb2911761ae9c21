"""The training loop: token shards in, metrics.jsonl and checkpoints out.

Single process for now. The pieces that will change under torchrun (rank/world size, gradient
synchronisation on the last micro step, rank-0-only writes) are marked, so DDP/FSDP can be added
without restructuring. The data comes from `smelt.tokens.loader.TokenLoader`: step k's global batch
is fixed by the data plan whatever the world size or micro batch, each micro batch carries its
document boundaries (fed to the model for intra-document attention when train.doc_masking is on),
and the loader's O(1) state goes into every checkpoint, so `resume` continues with exactly the
batches an uninterrupted run would have seen. metrics.jsonl gets the data plan, stage changes, the
realized mixture per window (with drift alerts) and the share of step time spent waiting for data.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smelt.checkpoint.store import latest_checkpoint, load_training_state, prune_checkpoints, save_checkpoint
from smelt.config import Config, TrainConfig, hash_json
from smelt.errors import ConfigError, UserError
from smelt.model.flops import count_params, flops_per_token
from smelt.model.transformer import IGNORE_INDEX, Transformer, doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.progress import log, progress
from smelt.train.optim import build_optimizer
from smelt.train.precision import Precision, peak_flops, resolve_precision
from smelt.train.schedule import lr_at, warmup_steps


@dataclass(frozen=True)
class BatchPlan:
    seq_len: int
    micro_batch: int
    world_size: int
    batch_tokens: int  # global tokens per optimizer step
    grad_accum: int  # micro steps per optimizer step, per process
    steps: int

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens


def batch_plan(cfg: TrainConfig, world_size: int = 1) -> BatchPlan:
    """Resolve batch_tokens into gradient-accumulation steps and the number of optimizer steps."""
    per_micro = cfg.seq_len * cfg.micro_batch * world_size
    batch_tokens = cfg.batch_tokens or per_micro
    if batch_tokens % per_micro:
        lower = batch_tokens // per_micro * per_micro
        valid = [v for v in (lower, lower + per_micro) if v > 0]
        raise ConfigError(
            f"train.batch_tokens = {batch_tokens} is not a multiple of seq_len x micro_batch x world size = "
            f"{cfg.seq_len} x {cfg.micro_batch} x {world_size} = {per_micro}. Nearest valid values: "
            f"{' or '.join(map(str, valid))} (or 0 for exactly {per_micro})."
        )
    return BatchPlan(
        seq_len=cfg.seq_len,
        micro_batch=cfg.micro_batch,
        world_size=world_size,
        batch_tokens=batch_tokens,
        grad_accum=batch_tokens // per_micro,
        steps=math.ceil(cfg.tokens / batch_tokens),
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"train.device = {name!r} is not a device; use auto, cpu, cuda or cuda:N.") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but this machine has no CUDA GPU; use 'auto' or 'cpu'.")
    return device


def read_vocab_size(tokenizer_dir: Path) -> int:
    path = Path(tokenizer_dir) / "smelt.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as exc:
        raise UserError(
            f"cannot read the padded vocab size from {path} ({exc}). Train the tokenizer first "
            f"(`smelt tokenizer train CONFIG`) or point the trainer at its directory."
        ) from exc


def has_tokens(split_dir: Path) -> bool:
    return split_dir.is_dir() and any(p.stat().st_size > 0 for p in split_dir.rglob("*.bin"))


class MetricsLog:
    """Append-only metrics.jsonl; each line is flushed so a crash loses nothing already logged."""

    def __init__(self, path: Path, enabled: bool = True, append: bool = False) -> None:
        self.enabled = enabled
        self.file = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    windows: Iterable[np.ndarray],
    seq_len: int,
    batch_size: int,
    precision: Precision,
    device: torch.device,
    eos_id: int | None = None,
) -> tuple[float, int]:
    """Mean next-token loss over windows of up to seq_len + 1 tokens, and the number of tokens scored.

    Short windows (the tail of the split) are padded; padded targets are ignored. With `eos_id` the
    model attends within documents only, with positions restarting at each (as trained with
    train.doc_masking).
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0

    def score(batch: list[np.ndarray]) -> None:
        nonlocal total, count
        x = torch.zeros(len(batch), seq_len, dtype=torch.long)
        y = torch.full((len(batch), seq_len), IGNORE_INDEX, dtype=torch.long)
        for i, w in enumerate(batch):
            w = torch.from_numpy(np.asarray(w, dtype=np.int64))
            x[i, : len(w) - 1] = w[:-1]
            y[i, : len(w) - 1] = w[1:]
        x, y = x.to(device), y.to(device)
        docs = {}
        if eos_id is not None:
            doc_ids = doc_ids_from_tokens(x, eos_id)
            docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}
        with precision.autocast():
            _, losses = model(x, y, reduction="none", **docs)
        total += losses.double().sum().item()
        count += int((y != IGNORE_INDEX).sum())

    batch: list[np.ndarray] = []
    for window in windows:
        if len(window) < 2:
            continue
        batch.append(window)
        if len(batch) == batch_size:
            score(batch)
            batch = []
    if batch:
        score(batch)
    model.train(was_training)
    return (total / count if count else float("nan")), count


def _rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def resolve_resume(resume: str | Path | None, checkpoints_dir: Path) -> Path | None:
    """The checkpoint to resume from: None (fresh run), "auto" (the latest one, if any) or a path."""
    if resume is None:
        return None
    if str(resume) == "auto":
        return latest_checkpoint(checkpoints_dir)
    path = Path(resume)
    if not path.is_dir():
        raise UserError(
            f"cannot resume from {path}: no such checkpoint directory. Pass 'auto' or a step_NNNNNNN dir."
        )
    return path


def train(
    cfg: Config, tokens_dir: Path, tokenizer_dir: Path, out_dir: Path, resume: str | Path | None = None
) -> dict[str, Any]:
    """Train cfg.model on tokens_dir/train; write out_dir/metrics.jsonl and out_dir/checkpoints/step_NNNNNNN/.

    `resume`: None starts fresh; "auto" continues from the latest committed checkpoint under
    out_dir/checkpoints when there is one; a checkpoint directory continues from it. A resumed run
    restores weights, optimizer, RNG and loader state and appends to metrics.jsonl. Returns a summary.
    """
    from smelt.tokens.loader import TokenLoader, eval_windows  # lazy: tokens/ is a sibling stage
    from smelt.tokens.mixture import MixtureMonitor

    started = time.time()
    tokens_dir, tokenizer_dir, out_dir = Path(tokens_dir), Path(tokenizer_dir), Path(out_dir)
    tc = cfg.train
    # Under torchrun these come from the launcher; process groups are set up by the distributed issue.
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    is_main = rank == 0

    plan = batch_plan(tc, world_size)
    device = resolve_device(tc.device)
    precision = resolve_precision(tc.precision, device)
    torch.set_num_threads(tc.threads or os.cpu_count() or 1)
    vocab_size = read_vocab_size(tokenizer_dir)
    if not has_tokens(tokens_dir / "train"):
        raise UserError(
            f"no training tokens under {tokens_dir / 'train'} (no non-empty .bin shard). "
            f"Run `smelt tokenize CONFIG` first, or check the tokens directory."
        )
    have_val = has_tokens(tokens_dir / "val")
    eos_id = int(json.loads((tokens_dir / "meta.json").read_text())["eos_id"]) if tc.doc_masking else None

    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model, vocab_size).to(device)
    forward = torch.compile(model) if tc.compile else model
    optimizer = build_optimizer(model, tc, device)
    scaler = precision.grad_scaler()
    loader = TokenLoader.from_config(cfg, tokens_dir, tokenizer_dir, rank, world_size)
    data_plan = loader.plan
    assert data_plan.steps == plan.steps and loader.per_rank // loader.micro_batch == plan.grad_accum
    monitor = MixtureMonitor(data_plan, cfg.tokens.mixture_window, cfg.tokens.drift_tolerance)

    params = count_params(cfg.model, vocab_size)
    flops_tok = flops_per_token(cfg.model, vocab_size, tc.seq_len)
    peak = peak_flops(device, precision)
    warmup = warmup_steps(tc.warmup_tokens, tc.tokens, plan.batch_tokens, plan.steps)
    checkpoints_dir = out_dir / "checkpoints"
    config_dict = cfg.to_dict()

    start_step = 0
    resume_from = resolve_resume(resume, checkpoints_dir)
    if resume_from is not None:
        ckpt_meta, train_state = load_training_state(resume_from, model, optimizer)
        start_step = int(ckpt_meta["step"])
        if start_step >= plan.steps:
            raise UserError(
                f"checkpoint {resume_from} is at step {start_step}, the end of this run ({plan.steps} steps): "
                f"the run is complete. Train again without resume or into another directory (a longer run "
                f"is a new data plan and learning-rate schedule, so it cannot continue this one exactly)."
            )
        loader.load_state_dict(train_state["loader"])
        _restore_rng(train_state["rng"], device)
        if scaler is not None and train_state.get("scaler"):
            scaler.load_state_dict(train_state["scaler"])
        monitor.resume(start_step + 1, loader.source_counts)

    metrics = MetricsLog(out_dir / "metrics.jsonl", enabled=is_main, append=resume_from is not None)
    start_tokens = start_step * plan.batch_tokens
    metrics.write({
        "kind": "event", "step": start_step, "tokens": start_tokens,
        "event": "start" if resume_from is None else "resume", "steps": plan.steps,
        "batch_tokens": plan.batch_tokens, "grad_accum": plan.grad_accum, "warmup_steps": warmup,
        "precision": precision.name, "device": str(device), "params_total": params["total"],
        "params_non_embedding": params["non_embedding"], "flops_per_token": flops_tok, "peak_flops": peak,
        "world_size": world_size, "config_hash": hash_json(config_dict), "doc_masking": tc.doc_masking,
        **({"from": str(resume_from)} if resume_from is not None else {}),
    })  # fmt: skip
    if resume_from is None:
        log(data_plan.table())
        metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "data_plan", **data_plan.summary()})
        for warning in data_plan.warnings:
            log(f"warning: {warning}")
            metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "warning", "message": warning})

    def run_eval(step: int) -> float | None:
        if not have_val:
            return None
        windows = eval_windows(tokens_dir, "val", tc.seq_len, max_tokens=tc.eval_tokens)
        val_loss, scored = evaluate(forward, windows, tc.seq_len, tc.micro_batch, precision, device, eos_id)
        if scored == 0:
            return None
        metrics.write({"kind": "eval", "step": step, "tokens": step * plan.batch_tokens,
                       "val_loss": val_loss, "val_tokens": scored})  # fmt: skip
        return val_loss

    def checkpoint(step: int) -> Path:
        loader_state = loader.state_dict()
        meta = {
            "tokens": step * plan.batch_tokens,
            "loader": loader_state if _json_safe(loader_state) else None,
            "config": config_dict,
            "config_hash": hash_json(config_dict),
            "model_config": cfg.model,
            "vocab_size": vocab_size,
            "precision": precision.name,
            "world_size": world_size,
        }
        train_state = {
            "rng": _rng_state(device),
            "loader": loader_state,
            "scaler": scaler.state_dict() if scaler is not None else None,
        }
        path = save_checkpoint(checkpoints_dir, step, model, optimizer, meta, train_state)
        metrics.write({"kind": "event", "step": step, "tokens": step * plan.batch_tokens,
                       "event": "checkpoint", "path": str(path)})  # fmt: skip
        return path

    if not have_val and resume_from is None:
        note = f"no validation tokens under {tokens_dir / 'val'}; skipping validation"
        log(note)
        metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "note", "message": note})

    bar = progress(total=plan.steps, unit="step")
    bar.update(start_step)
    window_losses: list[float] = []
    window_time, window_wait, train_time, total_wait = 0.0, 0.0, 0.0, 0.0
    last_log_loss = float("nan")
    last_val: float | None = None
    summary_tps = 0.0
    model.train()
    try:
        for step in range(start_step + 1, plan.steps + 1):
            t0 = time.perf_counter()
            data = loader.next_step()
            wait = time.perf_counter() - t0
            stage = data.stage
            if step == stage.first_step:
                metrics.write({"kind": "event", "step": step - 1, "tokens": (step - 1) * plan.batch_tokens,
                               "event": "stage", "stage": stage.name, "index": stage.index,
                               "first_step": stage.first_step, "last_step": stage.last_step,
                               "weights": stage.weights})  # fmt: skip
            lr = lr_at(
                step - 1, lr=tc.lr, warmup=warmup, total_steps=plan.steps, min_lr_ratio=tc.min_lr_ratio
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in data.micro:
                # Under DDP: no_sync() on all but the last micro step.
                batch = micro.to(device, non_blocking=True)
                docs = (
                    {"doc_ids": batch.doc_ids, "position_ids": batch.position_ids} if tc.doc_masking else {}
                )
                with precision.autocast():
                    _, parts = forward(batch.inputs, batch.targets, loss_parts=True, **docs)
                # Equal token counts per micro batch, so the mean of means is the batch mean. The logged
                # loss is the cross-entropy; the optimized one adds the z-loss when model.z_loss > 0.
                loss = parts["loss"] / plan.grad_accum
                loss_sum += parts["ce"].detach() / plan.grad_accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            if tc.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            else:
                grad_norm = torch.nn.utils.get_total_norm(
                    [p.grad for p in model.parameters() if p.grad is not None]
                )
            loss_value, norm_value = loss_sum.item(), grad_norm.item()  # one host sync per step
            # fp16's scaler skips steps with inf gradients by design; otherwise a non-finite norm is fatal.
            if not math.isfinite(loss_value) or (scaler is None and not math.isfinite(norm_value)):
                what = (
                    f"loss is {loss_value}" if not math.isfinite(loss_value) else f"grad norm is {norm_value}"
                )
                metrics.write({"kind": "event", "step": step, "tokens": step * plan.batch_tokens,
                               "event": "end", "status": "failed", "error": f"{what} at step {step}"})  # fmt: skip
                raise RuntimeError(
                    f"training diverged: {what} at step {step} (lr {lr:.3g}). Lower train.lr, raise "
                    f"train.warmup_tokens or keep train.grad_clip on, then rerun."
                )
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            window_time += dt
            window_wait += wait
            train_time += dt
            total_wait += wait
            window_losses.append(loss_value)
            bar.update(1)
            for event in monitor.update(step, data.source_counts):
                metrics.write(event)

            if step == 1 or step % tc.log_every == 0 or step == plan.steps:
                tps = len(window_losses) * plan.batch_tokens / max(window_time, 1e-9)
                last_log_loss = sum(window_losses) / len(window_losses)
                metrics.write({
                    "kind": "train", "step": step, "tokens": step * plan.batch_tokens, "loss": last_log_loss,
                    "lr": lr, "grad_norm": norm_value, "clipped": bool(tc.grad_clip > 0 and norm_value > tc.grad_clip),
                    "tokens_per_s": tps, "mfu": flops_tok * tps / peak if peak else None,
                    "stage": stage.name, "loader_wait_s": window_wait / len(window_losses),
                    "loader_wait_share": window_wait / max(window_time, 1e-9),
                    "elapsed_s": time.time() - started,
                })  # fmt: skip
                bar.set_postfix(loss=f"{last_log_loss:.3f}", tok_s=f"{tps:,.0f}", refresh=False)
                window_losses, window_time, window_wait = [], 0.0, 0.0
            if step < plan.steps and tc.eval_every and step % tc.eval_every == 0:
                last_val = run_eval(step)
            if step < plan.steps and cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                checkpoint(step)
                prune_checkpoints(checkpoints_dir, cfg.checkpoint.keep_last)
        last_val = run_eval(plan.steps)
        final = checkpoint(plan.steps)
        prune_checkpoints(checkpoints_dir, cfg.checkpoint.keep_last, protect=(final,))
        summary_tps = (plan.steps - start_step) * plan.batch_tokens / max(train_time, 1e-9)
        metrics.write({"kind": "event", "step": plan.steps, "tokens": plan.tokens, "event": "end",
                       "status": "ok", "wall_time_s": time.time() - started})  # fmt: skip
    finally:
        loader.close()
        bar.close()
        metrics.close()

    return {
        "steps": plan.steps,
        "tokens": plan.tokens,
        "params_total": params["total"],
        "params_non_embedding": params["non_embedding"],
        "final_train_loss": last_log_loss,
        "final_val_loss": last_val,
        "tokens_per_s": summary_tps,
        "mfu": flops_tok * summary_tps / peak if peak else None,
        "loader_wait_share": total_wait / max(train_time, 1e-9),
        "stages": [stage.name for stage in data_plan.stages],
        "resumed_from_step": start_step if resume_from is not None else None,
        "flops_per_token": flops_tok,
        "peak_flops": peak,
        "precision": precision.name,
        "device": str(device),
        "checkpoint": str(final),
        "wall_time_s": time.time() - started,
    }
