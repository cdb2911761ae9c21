"""The training loop: token shards in, metrics.jsonl and checkpoints out.

One process, or every process of a `torchrun` launch (DDP or FSDP2 by train.parallel; see
distributed.py). The data comes from `smelt.tokens.loader.TokenLoader`: step k's global batch is fixed
by the data plan whatever the world size or micro batch (rank r takes a disjoint slice), each micro
batch carries its document boundaries (fed to the model for intra-document attention when
train.doc_masking is on), and the loader's O(1) state goes into every checkpoint, so `resume`
continues with exactly the batches an uninterrupted run would have seen. The step arithmetic
(token-weighted accumulation, sync, clipping) is in step.py; alerts and their policies (skip,
rollback, stop) in alerts.py; metrics.jsonl, validation and per-layer update ratios in monitors.py;
batch arithmetic and the batch ramp in batching.py; the run's other parts (resume choice, schedule,
sinks, run manifest) in setup.py; checkpoints in smelt.checkpoint.
metrics.jsonl gets the data plan, stage changes, the realized mixture per window (with drift alerts),
alerts and skips, and the share of step time spent waiting for data. Rank 0 alone writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from smelt.checkpoint.failures import CheckpointSaveError
from smelt.checkpoint.lineage import check_fits, load_parent, resolve_parent
from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import (
    latest_checkpoint,
    load_training_state,
    restore_rng,
    rng_state,
    set_aside_after,
    step_dir_name,
)
from smelt.config import Config, hash_json
from smelt.errors import UserError
from smelt.eval.heldout import training_mixture
from smelt.manifest import write_json
from smelt.model.flops import count_params, flops_per_token
from smelt.model.moe import router_metrics, update_expert_bias
from smelt.model.moe_parallel import setup_expert_parallel
from smelt.model.transformer import Transformer
from smelt.progress import log, progress
from smelt.train.alerts import SpikeMonitor
from smelt.train.batching import batch_plan
from smelt.train.distributed import (
    DistContext,
    device_for,
    env_world,
    from_main,
    init_distributed,
    rank_seed,
    shutdown,
    wrap_model,
)
from smelt.train.evaluation import EvalBudget, Validation, budget_note, rank0_decides, say, skip_note
from smelt.train.monitors import MetricsLog, UpdateRatioMonitor, supersede_after_resume
from smelt.train.optim import build_optimizer, set_lr
from smelt.train.precision import peak_flops, resolve_precision
from smelt.train.setup import (
    agreed_resume,
    alert_policy,
    build_schedule,
    check_token_inputs,
    clipped_norm,
    file_hash,
    has_tokens,
    inloop_evaluator,
    last_logged_loss,
    losses_by_source,
    memory_mb,
    metric_sinks,
    read_vocab_size,
    resolve_device,
    write_run_manifest,
)
from smelt.train.step import finish_grads, forward_backward
from smelt.train.watchdog import Watchdog


def train(
    cfg: Config, tokens_dir: Path, tokenizer_dir: Path, out_dir: Path, resume: str | Path | None = None
) -> dict[str, Any]:
    """Train cfg.model on tokens_dir/train; write out_dir/metrics.jsonl and out_dir/checkpoints/step_NNNNNNN/.

    `resume`: None starts fresh; "auto" continues from the latest committed checkpoint under
    out_dir/checkpoints when there is one; a checkpoint directory continues from it. A resumed run
    restores weights, optimizer, RNG and loader state and appends to metrics.jsonl. Returns a summary.
    Under torchrun every rank calls this; rank 0 alone writes metrics.
    """
    started = time.time()
    tokens_dir, tokenizer_dir, out_dir = Path(tokens_dir), Path(tokenizer_dir), Path(out_dir)
    tc = cfg.train
    resolve_device(tc.device)  # validates the name with a clear message
    _, _, local_rank = env_world()
    device = device_for(tc.device, local_rank)
    ctx = init_distributed(device)
    try:
        return _train(cfg, tokens_dir, tokenizer_dir, out_dir, resume, ctx, device, started)
    finally:
        shutdown(ctx)


def _train(
    cfg: Config,
    tokens_dir: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    resume: str | Path | None,
    ctx: DistContext,
    device: torch.device,
    started: float,
) -> dict[str, Any]:
    """The run itself, inside the process group that `train` sets up and always tears down."""
    from smelt.tokens.loader import TokenLoader  # lazy: tokens/ is a sibling stage
    from smelt.tokens.mixture import MixtureMonitor

    tc = cfg.train
    rank, world_size = ctx.rank, ctx.world_size
    sharded = ctx.distributed and tc.parallel == "fsdp"
    plan = batch_plan(tc, world_size)
    precision = resolve_precision(tc.precision, device)
    torch.set_num_threads(tc.threads or os.cpu_count() or 1)
    vocab_size = read_vocab_size(tokenizer_dir)
    if not has_tokens(tokens_dir / "train"):
        raise UserError(
            f"no training tokens under {tokens_dir / 'train'} (no non-empty .bin shard). "
            f"Run `smelt tokenize CONFIG` first, or check the tokens directory."
        )
    have_val = has_tokens(tokens_dir / "val")
    val_sources = sorted(d.name for d in (tokens_dir / "val").iterdir() if has_tokens(d)) if have_val else []
    eos_id = int(json.loads((tokens_dir / "meta.json").read_text())["eos_id"]) if tc.doc_masking else None

    # Every rank builds the same initial weights from the run seed; per-rank randomness after that
    # comes from a derived seed (see distributed.rank_seed).
    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model, vocab_size).to(device)
    torch.manual_seed(rank_seed(cfg.run.seed, rank, "train"))
    setup_expert_parallel(model, cfg, world_size, device)  # MoE experts split over processes (or no-op)
    wrapped = wrap_model(model, tc.parallel, ctx, device)
    forward = torch.compile(wrapped) if tc.compile else wrapped
    optimizer = build_optimizer(model, tc, device)
    scaler = precision.grad_scaler()
    # With a batch ramp the loader's step is the starting batch; an optimizer step takes several.
    loader_cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(tc, batch_tokens=plan.loader_batch_tokens)
    )
    loader = TokenLoader.from_config(loader_cfg, tokens_dir, tokenizer_dir, rank, world_size)
    data_plan = loader.plan
    assert data_plan.steps == plan.loader_steps and loader.per_rank // loader.micro_batch == plan.grad_accum
    mixture = MixtureMonitor(data_plan, cfg.tokens.mixture_window, cfg.tokens.drift_tolerance)
    ratios = UpdateRatioMonitor(model, sharded) if tc.monitor_every else None

    params = count_params(cfg.model, vocab_size)
    flops_tok = flops_per_token(cfg.model, vocab_size, tc.seq_len)
    peak = from_main(ctx, device, lambda: peak_flops(device, precision))  # one figure for every rank
    peak_total = peak * world_size if peak else None
    schedule = build_schedule(
        tc, plan, [plan.step_of_loader_step(stage.first_step) for stage in data_plan.stages]
    )
    spikes = SpikeMonitor(alert_policy(tc, schedule.warmup))
    checkpoints_dir = out_dir / "checkpoints"
    config_dict = cfg.to_dict()
    tokens_meta = (
        json.loads((tokens_dir / "meta.json").read_text()) if (tokens_dir / "meta.json").is_file() else {}
    )
    identity = {
        "model_config": cfg.model.__dict__.copy(),
        "vocab_size": vocab_size,
        "tokenizer_hash": tokens_meta.get("tokenizer_hash") or file_hash(tokenizer_dir / "tokenizer.json"),
        "data_hash": file_hash(tokens_dir / "shards.json"),
    }
    check_token_inputs(tokens_dir, tokenizer_dir, tokens_meta, vocab_size)
    parent = resolve_parent(tc.init_from) if tc.init_from else None
    if parent is not None:
        check_fits(parent, identity["model_config"], vocab_size)
        identity["parent"] = parent.record()

    start_step = 0
    resume_from, resume_warnings = agreed_resume(resume, checkpoints_dir, ctx)
    rank_state: dict[str, Any] | None = None
    ckpt_meta: dict[str, Any] = {}
    if resume_from is not None:
        ckpt_meta, rank_state = load_training_state(resume_from, model, optimizer, expected=identity)
        start_step = int(ckpt_meta["step"])
        # "auto" finding the final checkpoint: the process ended between that save and the end of the
        # stage (a crash, a kill); finish the bookkeeping instead of training. A checkpoint named
        # explicitly at the end is a request to continue a finished run, which cannot be done exactly.
        if start_step >= plan.steps and str(resume) != "auto":
            raise UserError(
                f"checkpoint {resume_from} is at step {start_step}, the end of this run ({plan.steps} steps): "
                f"the run is complete. Train again without resume or into another directory (a longer run "
                f"is a new data plan and learning-rate schedule, so it cannot continue this one exactly)."
            )
        loader.load_state_dict(ckpt_meta["loader"])
        if rank_state is not None:
            restore_rng(rank_state["rng"], device)
        if scaler is not None and ckpt_meta.get("scaler"):
            scaler.load_state_dict(ckpt_meta["scaler"])
        if ckpt_meta.get("alerts"):
            spikes.load_state_dict(ckpt_meta["alerts"])
        mixture.resume(loader.step + 1, loader.source_counts)
    elif parent is not None:  # a fork's first step starts from the parent's exact weights
        load_parent(parent, model, optimizer, tc.init_optimizer)
    # What this run writes again is moved aside, never overwritten: the checkpoints after its starting
    # step (damaged ones passed over, newer ones than --resume-from) and the metrics records after it.
    set_aside = set_aside_after(checkpoints_dir, start_step) if ctx.is_main else []
    superseded = 0
    if resume_from is not None and ctx.is_main:
        own = resume_from.resolve().parent == checkpoints_dir.resolve()  # its offset is into this file
        superseded = supersede_after_resume(
            out_dir / "metrics.jsonl", start_step, ckpt_meta.get("metrics_offset") if own else None,
            rerun_final=start_step >= plan.steps,
        )  # fmt: skip
    checkpointer = Checkpointer(
        checkpoints_dir, cfg.checkpoint.keep_last, cfg.checkpoint.async_save,
        cfg.checkpoint.milestone_every_steps, cfg.checkpoint.milestone_every_tokens,
    )  # fmt: skip

    metrics = MetricsLog(
        out_dir / "metrics.jsonl", enabled=ctx.is_main, append=resume_from is not None,
        sinks=metric_sinks(cfg, out_dir) if ctx.is_main else None,
    )  # fmt: skip
    inloop = inloop_evaluator(cfg, tokenizer_dir, device)
    start_tokens = plan.tokens_at(start_step)
    metrics.write({
        "kind": "event", "step": start_step, "tokens": start_tokens,
        "event": "start" if resume_from is None else "resume", "steps": plan.steps,
        "batch_tokens": plan.batch_tokens, "grad_accum": plan.grad_accum, "warmup_steps": schedule.warmup,
        **({"batch_ramp": {"start_tokens": plan.unit_tokens, "ramp_tokens": tc.batch_ramp_tokens,
                           "full_at_step": plan.units.index(max(plan.units)) + 1}} if plan.units else {}),
        "schedule": schedule.kind, "precision": precision.name, "device": str(device),
        "params_total": params["total"], "params_non_embedding": params["non_embedding"],
        "flops_per_token": flops_tok, "peak_flops": peak_total, "world_size": world_size,
        "parallel": tc.parallel if ctx.distributed else None, "config_hash": hash_json(config_dict),
        "doc_masking": tc.doc_masking, **({"from": str(resume_from)} if resume_from is not None else {}),
        **({"parent": identity["parent"]} if parent is not None else {}),
        **({"world_size_changed": True} if resume_from is not None and rank_state is None else {}),
        **({"superseded_records": superseded} if resume_from is not None else {}),
    })  # fmt: skip
    if ctx.is_main:
        write_run_manifest(
            out_dir, cfg, identity, resume_from, start_step, world_size, device, precision.name
        )
    for warning in resume_warnings:
        if ctx.is_main:
            log(f"warning: {warning}")
        metrics.write({"kind": "event", "step": start_step, "tokens": start_tokens, "event": "alert",
                       "alert": "damaged_checkpoint", "action": "fallback" if resume_from else "start_over",
                       "message": warning})  # fmt: skip
    kept = [f"{len(set_aside)} checkpoint directories after step {start_step} were moved to "
            f"{checkpoints_dir / 'superseded'}"] if set_aside else []  # fmt: skip
    if metrics.set_aside is not None:
        kept.append(f"the previous metrics.jsonl was kept as {metrics.set_aside.name}")
    for note in kept:
        if ctx.is_main:
            log(f"note: {note}")
        metrics.write({"kind": "event", "step": start_step, "tokens": start_tokens, "event": "note",
                       "message": note})  # fmt: skip
    if resume_from is None:
        if ctx.is_main:
            log(data_plan.table())
        metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "data_plan", **data_plan.summary()})
        for warning in data_plan.warnings:
            if ctx.is_main:
                log(f"warning: {warning}")
            metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "warning", "message": warning})

    # Each validation source is scored once; the headline weighs their losses by the training mixture
    # (an aggregate can fall while one domain regresses, so the per-source losses are logged too).
    validation = Validation(
        tokens_dir, val_sources, tc.seq_len, tc.eval_tokens, tc.micro_batch, precision, device, eos_id,
        training_mixture(cfg, tokens_dir),
    ) if have_val else None  # fmt: skip
    eval_budget = EvalBudget(tc.eval_budget)
    val_record: dict[str, Any] = {}  # the figures of the last evaluation that ran

    def run_eval(step: int, train_s: float, final: bool = False) -> float | None:
        if validation is None or validation.tokens == 0:
            return None
        tokens_now = plan.tokens_at(step)
        if not final:  # the final evaluation always runs: it is the run's headline
            rate = (tokens_now - plan.tokens_at(start_step)) / train_s if train_s > 0 else 0.0
            predicted = eval_budget.predict_s(validation.tokens, rate)
            done = (step - start_step) / max(plan.steps - start_step, 1)
            if not rank0_decides(eval_budget.allows(predicted, train_s, done), device):
                eval_budget.skipped += 1
                if eval_budget.skipped == 1 and ctx.is_main:
                    say(skip_note(step, predicted, eval_budget, train_s))
                metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "eval_skipped",
                               "predicted_s": round(predicted, 3), "eval_s": round(eval_budget.eval_s, 3),
                               "train_s": round(train_s, 3), "eval_budget": tc.eval_budget})  # fmt: skip
                return None
        result = validation.run(forward, desc=f"validation at step {step}", show=ctx.is_main)
        eval_budget.record(result.seconds, result.tokens)
        val_record.clear()
        val_record.update(result.fields())
        metrics.write({"kind": "eval", "step": step, "tokens": tokens_now, **result.fields(),
                       "eval_share": eval_budget.share_of(train_s)})  # fmt: skip
        return result.loss

    def checkpoint(step: int) -> None:
        meta = {
            "tokens": plan.tokens_at(step),
            "loader": loader.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "alerts": spikes.state_dict(),
            "config": config_dict,
            "config_hash": hash_json(config_dict),
            **identity,
            "precision": precision.name,
            "world_size": world_size,
            "parallel": tc.parallel if ctx.distributed else None,
            "metrics_offset": metrics.offset,  # where a resume from here cuts metrics.jsonl
        }
        rank_state = {"rng": rng_state(device)}
        step_tokens = plan.tokens_at(step) - plan.tokens_at(step - 1)
        for event in checkpointer.save(step, model, optimizer, meta, rank_state, step_tokens):
            metrics.write(event)

    def fail(step: int, message: str) -> RuntimeError:
        metrics.write({"kind": "event", "step": step, "tokens": plan.tokens_at(step),
                       "event": "end", "status": "failed", "error": message})  # fmt: skip
        return RuntimeError(message)

    if not have_val and resume_from is None:
        note = f"no validation tokens under {tokens_dir / 'val'}; skipping validation"
        if ctx.is_main:
            log(note)
        metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "note", "message": note})

    bar = progress(total=plan.steps, unit="step") if ctx.is_main else tqdm(disable=True)
    bar.update(start_step)
    if parent is not None and resume_from is None:  # the fork point, scored on this run's own val data
        run_eval(0, 0.0, final=True)
    window_losses: list[float] = []
    train_sources = list(data_plan.sources)
    window_source_sums = torch.zeros((len(train_sources), 2), dtype=torch.float64)
    window_clipped = window_skipped = window_steps = 0
    window_time, window_wait, train_time, total_wait = 0.0, 0.0, 0.0, 0.0
    window_tokens = 0
    last_log_loss = last_logged_loss(out_dir) if start_step >= plan.steps else float("nan")
    last_val: float | None = None
    final: Path | None = None
    skipped_total = rollbacks = 0
    wrapped.train()
    # A hung collective or a stuck filesystem never raises; the watchdog turns it into a crash
    # (with every thread's stack) that a supervisor can restart from the last checkpoint.
    watchdog = Watchdog(
        tc.watchdog_s, out_dir / ("watchdog.log" if rank == 0 else f"watchdog_rank{rank}.log")
    )
    watchdog.start()
    try:
        for step in range(start_step + 1, plan.steps + 1):
            t0 = time.perf_counter()
            parts = [loader.next_step() for _ in range(plan.units_at(step))]
            wait = time.perf_counter() - t0
            data = parts[-1]
            micro = [m for part in parts for m in part.micro] if len(parts) > 1 else data.micro
            stage = data.stage
            for part in parts:
                if part.step == part.stage.first_step:
                    first, last = part.stage.first_step, part.stage.last_step
                    metrics.write({"kind": "event", "step": step - 1, "tokens": plan.tokens_at(step - 1),
                                   "event": "stage", "stage": part.stage.name, "index": part.stage.index,
                                   "first_step": plan.step_of_loader_step(first),
                                   "last_step": plan.step_of_loader_step(last),
                                   "weights": part.stage.weights})  # fmt: skip
            lr = schedule(step - 1)
            set_lr(optimizer, lr)
            loss_t, _, source_sums = forward_backward(
                wrapped, forward, micro, precision=precision, scaler=scaler, mode=tc.parallel,
                world_size=world_size, doc_masking=tc.doc_masking, device=device, sources=train_sources,
            )  # fmt: skip
            if source_sums is not None:
                window_source_sums += source_sums.cpu()
            norm_t = finish_grads(model, optimizer, scaler, tc.grad_clip, sharded)
            loss_value, norm_value = (
                float(v) for v in torch.stack([loss_t.float(), norm_t.float().cpu()]).tolist()
            )
            tokens_now = plan.tokens_at(step)
            window_tokens += tokens_now - plan.tokens_at(step - 1)
            overflow = scaler is not None and math.isfinite(loss_value) and not math.isfinite(norm_value)
            alerts = [] if overflow else spikes.check(loss_value, norm_value)
            action = SpikeMonitor.action(alerts)
            for alert in alerts:
                metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "alert",
                               "alert": alert.kind, "action": alert.action, "message": alert.message,
                               "value": alert.value if math.isfinite(alert.value) else str(alert.value),
                               "threshold": alert.threshold})  # fmt: skip
            if action == "rollback":
                for event in checkpointer.wait():  # the newest checkpoint may still be writing
                    metrics.write(event)
            if action == "rollback" and latest_checkpoint(checkpoints_dir) is None:
                metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "note",
                               "message": "rollback requested but no checkpoint to roll back to: skipping"})  # fmt: skip
                action = "skip"
            if action == "stop":
                raise fail(step, f"training stopped by alert at step {step}: {alerts[-1].message}")
            if ratios is not None and action == "apply" and not overflow and step % tc.monitor_every == 0:
                ratios.snapshot()
            checkpointer.before_update()  # a checkpoint's host copy must finish before weights change
            if overflow:
                assert scaler is not None
                scaler.step(optimizer)  # sees the inf gradients and skips the update
                scaler.update()
                metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "overflow",
                               "loss_scale": scaler.get_scale()})  # fmt: skip
            elif action == "apply":
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                update_expert_bias(model)  # MoE auxiliary-loss-free balancing (no-op otherwise)
                spikes.applied(loss_value, norm_value)
            elif action == "rollback":
                target = latest_checkpoint(checkpoints_dir)
                assert target is not None
                back_meta, _ = load_training_state(target, model, optimizer)
                if scaler is not None and back_meta.get("scaler"):
                    scaler.load_state_dict(back_meta["scaler"])
                rollbacks += 1
                # The loader is not rewound: the steps between the checkpoint and this one are the
                # data window that is skipped (the PaLM recipe). The LR schedule keeps following the step.
                metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "rollback",
                               "to_step": int(back_meta["step"]), "path": str(target),
                               "skipped_steps": [int(back_meta["step"]) + 1, step]})  # fmt: skip
            if action in ("skip", "rollback"):
                skipped_total += 1
                window_skipped += 1
                if action == "skip":
                    metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "skip",
                                   "loss": loss_value if math.isfinite(loss_value) else str(loss_value),
                                   "grad_norm": norm_value if math.isfinite(norm_value) else str(norm_value)})  # fmt: skip
                if spikes.skipped():
                    raise fail(step, (
                        f"training stopped: {spikes.consecutive_skips} consecutive steps skipped or rolled back "
                        f"(train.max_consecutive_skips); the last at step {step}: {alerts[-1].message} "
                        f"(lr {lr:.3g}). Lower train.lr, raise train.warmup_tokens or check the data; then continue "
                        f"from the last good checkpoint as a fork (`smelt train CONFIG --from {out_dir.parent} "
                        f"--set run.name=NEW_NAME`) or start over with --restart (the old train/ is moved "
                        f"to superseded/, not deleted)."
                    ))  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            if ratios is not None and ratios.before is not None:
                metrics.write(
                    {"kind": "layers", "step": step, "tokens": tokens_now, "layers": ratios.measure()}
                )
            dt = time.perf_counter() - t0
            window_time += dt
            window_wait += wait
            window_steps += 1
            train_time += dt
            total_wait += wait
            if math.isfinite(loss_value):
                window_losses.append(loss_value)
            window_clipped += int(action == "apply" and tc.grad_clip > 0 and norm_value > tc.grad_clip)
            bar.update(1)
            for part in parts:
                for event in mixture.update(part.step, part.source_counts):
                    metrics.write(event)
            for event in checkpointer.poll():
                metrics.write(event)

            if step == 1 or step % tc.log_every == 0 or step == plan.steps:
                steps_in_window = max(1, window_steps)
                tps = window_tokens / max(window_time, 1e-9)
                last_log_loss = sum(window_losses) / len(window_losses) if window_losses else float("nan")
                metrics.write({
                    "kind": "train", "step": step, "tokens": tokens_now,
                    **({"batch_tokens": tokens_now - plan.tokens_at(step - 1)} if plan.units else {}),
                    "loss": last_log_loss if window_losses else None, "lr": lr,
                    "grad_norm": norm_value if math.isfinite(norm_value) else None,
                    "grad_norm_clipped": clipped_norm(norm_value, tc.grad_clip),
                    "clipped": bool(tc.grad_clip > 0 and norm_value > tc.grad_clip),
                    "clip_fraction": window_clipped / steps_in_window, "skipped": window_skipped,
                    "tokens_per_s": tps, "mfu": flops_tok * tps / peak_total if peak_total else None,
                    "stage": stage.name, "loader_wait_s": window_wait / steps_in_window,
                    "loader_wait_share": window_wait / max(window_time, 1e-9),
                    "memory_mb": memory_mb(device),
                    **({"loss_scale": scaler.get_scale()} if scaler is not None else {}),
                    **losses_by_source(train_sources, window_source_sums),
                    "elapsed_s": time.time() - started,
                })  # fmt: skip
                window_source_sums.zero_()
                moe_fields = router_metrics(model)  # every rank: the loads are summed over ranks
                if moe_fields:
                    metrics.write({"kind": "moe", "step": step, "tokens": tokens_now, **moe_fields})
                if window_losses:
                    shown = {"val": f"{val_record['val_loss']:.3f}"} if val_record else {}
                    bar.set_postfix(loss=f"{last_log_loss:.3f}", **shown, tok_s=f"{tps:,.0f}", refresh=False)
                window_losses, window_time, window_wait, window_tokens = [], 0.0, 0.0, 0
                window_clipped = window_skipped = window_steps = 0
            if step < plan.steps and tc.eval_every and step % tc.eval_every == 0:
                run_eval(step, train_time)
            if inloop is not None and inloop.due(step) and (sharded or ctx.is_main):
                # FSDP gathers shards in every forward, so all ranks score; otherwise rank 0 alone.
                # At the training precision, as the validation loss is; log-probs are taken in fp32.
                with precision.autocast():
                    scores = inloop(model, step)
                metrics.write({"kind": "eval", "step": step, "tokens": tokens_now, "inloop": True, **scores})
            if step < plan.steps and cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                checkpoint(step)
            watchdog.beat(step)
        last_val = run_eval(plan.steps, train_time, final=True)
        if ctx.is_main and validation is not None:
            say(budget_note(eval_budget, train_time))
        checkpoint(plan.steps)
        for event in checkpointer.close():
            metrics.write(event)
        final = checkpoints_dir / step_dir_name(plan.steps)
        summary_tps = (plan.tokens - plan.tokens_at(start_step)) / max(train_time, 1e-9)
        metrics.write({"kind": "event", "step": plan.steps, "tokens": plan.tokens, "event": "end",
                       "status": "ok", "wall_time_s": time.time() - started, "skipped_steps": skipped_total,
                       "rollbacks": rollbacks, "eval_s": round(eval_budget.eval_s, 3), "evals": eval_budget.runs,
                       "evals_skipped": eval_budget.skipped})  # fmt: skip
    except CheckpointSaveError as exc:
        with contextlib.suppress(OSError):  # a disk that is still full may refuse even these lines
            metrics.write(exc.event(plan.tokens_at(exc.step)))
            metrics.write({"kind": "event", "step": exc.step, "tokens": plan.tokens_at(exc.step),
                           "event": "end", "status": "failed", "error": str(exc)})  # fmt: skip
        raise
    finally:
        watchdog.stop()
        # A save still writing when the run fails is finished (and committed) before the process ends.
        with contextlib.suppress(Exception):
            for event in checkpointer.close():
                metrics.write(event)
        loader.close()
        bar.close()
        metrics.close()

    summary = {
        "steps": plan.steps,
        "tokens": plan.tokens,
        "params_total": params["total"],
        "params_non_embedding": params["non_embedding"],
        "final_train_loss": last_log_loss,
        "final_val_loss": last_val,
        "val_loss_weighting": val_record.get("val_loss_weighting"),
        "val_loss_by_source": val_record.get("val_loss_by_source"),
        "eval_time_s": round(eval_budget.eval_s, 3),
        "eval_share": eval_budget.share_of(train_time),
        "evals_skipped": eval_budget.skipped,
        "tokens_per_s": summary_tps,
        "mfu": flops_tok * summary_tps / peak_total if peak_total else None,
        "loader_wait_share": total_wait / max(train_time, 1e-9),
        "stages": [stage.name for stage in data_plan.stages],
        "resumed_from_step": start_step if resume_from is not None else None,
        "skipped_steps": skipped_total,
        "rollbacks": rollbacks,
        "flops_per_token": flops_tok,
        "peak_flops": peak_total,
        "precision": precision.name,
        "device": str(device),
        "world_size": world_size,
        "rank": rank,
        "checkpoint": str(final) if final is not None else None,
        "wall_time_s": time.time() - started,
    }
    if ctx.is_main:
        write_json(out_dir / "summary.json", summary)
    return summary
