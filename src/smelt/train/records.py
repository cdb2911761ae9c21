"""The records of a training run around its steps: what it starts with (the start or resume record,
notes, the data plan, the run manifest; the progress bar and the watchdog) and the summary it ends
with. Functions of the Trainer (trainer.py), whose fields they read."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from smelt.config import hash_json
from smelt.manifest import write_json
from smelt.model.flops import mfu
from smelt.progress import log, progress
from smelt.train.ops.watchdog import Watchdog
from smelt.train.precision import peak_source
from smelt.train.setup import write_run_manifest
from smelt.train.step_times import StepMarker
from smelt.train.trajectory import Expectation


def announce(t: Any) -> tuple[Expectation, Any, Watchdog]:
    """Write the records before the first step (start or resume, notes, the data plan) and the run
    manifest; returns the run's expected trajectory (train.expect), its progress bar and its watchdog
    (not started)."""
    ctx, tc, plan, schedule = t.ctx, t.tc, t.plan, t.schedule
    resume_from, start_step, parent = t.resume_from, t.start_step, t.parent
    expect = Expectation.load(t)  # train.expect: a bad fit file stops here, before any record
    start_tokens = plan.tokens_at(start_step)
    # How far the process this one resumes from got (goodput's redone steps), before this one's marker.
    reached = StepMarker.read(t.out_dir) if resume_from is not None and ctx.is_main else None
    if ctx.is_main:
        t.window.ranks.marker = StepMarker(t.out_dir, start_step)
    t.metrics.write({
        "kind": "event", "step": start_step, "tokens": start_tokens,
        "event": "start" if resume_from is None else "resume", "steps": plan.steps,
        "batch_tokens": plan.batch_tokens, "grad_accum": plan.grad_accum, "warmup_steps": schedule.warmup,
        **({"batch_ramp": {"start_tokens": plan.unit_tokens, "ramp_tokens": tc.batch_ramp_tokens,
                           "full_at_step": plan.units.index(max(plan.units)) + 1}} if plan.units else {}),
        "schedule": schedule.kind, "precision": t.precision.name, "device": str(t.device),
        "params_total": t.params["total"], "params_non_embedding": t.params["non_embedding"],
        "flops_per_token": t.flops_tok, "model_flops_per_token": t.model_flops_tok,
        "peak_flops": t.peak_total, "peak_flops_source": peak_source(), "world_size": t.world_size,
        "compile": t.compile_note,
        "host_memory": t.host_memory_note, "telemetry": t.telemetry.note(),
        "parallel": tc.parallel if ctx.distributed else None, "config_hash": hash_json(t.config_dict),
        "doc_masking": tc.doc_masking, **({"from": str(resume_from)} if resume_from is not None else {}),
        **({"parent": t.identity["parent"]} if parent is not None else {}),
        **({"world_size_changed": True} if resume_from is not None and t.rank_state is None else {}),
        **({"superseded_records": t.superseded} if resume_from is not None else {}),
        **({"reached_step": reached} if reached is not None else {}),
    })  # fmt: skip
    if ctx.is_main:
        write_run_manifest(
            t.out_dir, t.cfg, t.identity, resume_from, start_step, t.world_size, t.device,
            t.precision.name, expect.manifest(),
        )  # fmt: skip
        expect.announce(t.metrics, start_step, start_tokens)
    for warning in t.resume_warnings:
        note(t, "alert", start_step, f"warning: {warning}", {
            "alert": "damaged_checkpoint", "action": "fallback" if resume_from else "start_over",
            "message": warning})  # fmt: skip
    kept = [f"{len(t.set_aside)} checkpoint directories after step {start_step} were moved to "
            f"{t.checkpoints_dir / 'superseded'}"] if t.set_aside else []  # fmt: skip
    if t.metrics.set_aside is not None:
        kept.append(f"the previous metrics.jsonl was kept as {t.metrics.set_aside.name}")
    for message in kept:
        note(t, "note", start_step, f"note: {message}", {"message": message})
    if resume_from is None:
        if ctx.is_main:
            log(t.data_plan.table())
        t.metrics.write({"kind": "event", "step": 0, "tokens": 0, "event": "data_plan",
                            **t.data_plan.summary()})  # fmt: skip
        for warning in t.data_plan.warnings:
            note(t, "warning", 0, f"warning: {warning}", {"message": warning})
    if not t.have_val and resume_from is None:
        message = f"no validation tokens under {t.tokens_dir / 'val'}; skipping validation"
        note(t, "note", 0, message, {"message": message})

    bar = progress(total=plan.steps, unit="step") if ctx.is_main else tqdm(disable=True)
    bar.update(start_step)
    # A hung collective or a stuck filesystem never raises; the watchdog turns it into a crash
    # (with every thread's stack) that a supervisor can restart from the last checkpoint.
    name = "watchdog.log" if t.rank == 0 else f"watchdog_rank{t.rank}.log"
    return expect, bar, Watchdog(tc.watchdog_s, t.out_dir / name)


def note(t: Any, event: str, step: int, shown: str, fields: dict[str, Any]) -> None:
    """An event that rank 0 also prints."""
    if t.ctx.is_main:
        log(shown)
    tokens = t.plan.tokens_at(step) if step else 0
    t.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": event, **fields})


def mfu_fields(t: Any, tokens_per_s: float) -> dict[str, float | None]:
    """MFU in both conventions (model/flops.py): "mfu" is PaLM's 6N + 12 L d s with the head counted,
    "mfu_model" the matmuls alone with causal attention at half the score matrix."""
    return {
        "mfu": mfu(t.flops_tok, tokens_per_s, t.peak_total),
        "mfu_model": mfu(t.model_flops_tok, tokens_per_s, t.peak_total),
    }


def summary(t: Any) -> dict[str, Any]:
    plan, train_time, budget = t.plan, t.window.train_time, t.eval_budget
    tps = (plan.tokens - plan.tokens_at(t.start_step)) / max(train_time, 1e-9)
    summary = {
        "steps": plan.steps,
        "tokens": plan.tokens,
        "params_total": t.params["total"],
        "params_non_embedding": t.params["non_embedding"],
        "final_train_loss": t.last_log_loss,
        "final_val_loss": t.last_val,
        "val_loss_weighting": t.val_record.get("val_loss_weighting"),
        "val_loss_by_source": t.val_record.get("val_loss_by_source"),
        "eval_time_s": round(budget.eval_s, 3),
        "eval_share": budget.share_of(train_time),
        "evals_skipped": budget.skipped,
        "tokens_per_s": tps,
        **mfu_fields(t, tps),
        "loader_wait_share": t.window.total_wait / max(train_time, 1e-9),
        "stages": [stage.name for stage in t.data_plan.stages],
        "resumed_from_step": t.start_step if t.resume_from is not None else None,
        "skipped_steps": t.alerts.skipped_total,
        "rollbacks": t.alerts.rollbacks,
        "flops_per_token": t.flops_tok,
        "model_flops_per_token": t.model_flops_tok,
        "peak_flops": t.peak_total,
        "peak_flops_source": peak_source(),  # rank 0's: env, table, cached DATE or measured-now
        "precision": t.precision.name,
        "device": str(t.device),
        "world_size": t.world_size,
        "rank": t.rank,
        "checkpoint": str(t.final) if t.final is not None else None,
        "wall_time_s": time.time() - t.started,
    }
    if t.ctx.is_main:  # the train stage adds goodput to it (run/training.py)
        write_json(t.out_dir / "summary.json", summary)
    return summary
