"""The training loop: token shards in, metrics.jsonl and checkpoints out.

One process, or every process of a `torchrun` launch (DDP or FSDP2 by train.parallel; see
distributed.py). The data comes from `smelt.tokens.loader.TokenLoader`: step k's global batch is fixed
by the data plan whatever the world size or micro batch (rank r takes a disjoint slice), each micro
batch carries its document boundaries (fed to the model for intra-document attention when
train.doc_masking is on), and the loader's O(1) state goes into every checkpoint, so `resume`
continues with exactly the batches an uninterrupted run would have seen. `Trainer.train()` is the
loop, as named phases; the step arithmetic (token-weighted accumulation, sync, clipping) is in
step.py; alerts, their policies and what the trainer does about them (skip, rollback, stop,
overflow) in alerts.py; the log window's statistics in window.py; the records before the first step
and the summary in records.py; metrics.jsonl and validation in monitors.py, telemetry in telemetry.py;
batch arithmetic in batching.py; resume choice, schedule, sinks, run manifest in setup.py. Rank 0
alone writes metrics.jsonl: the data plan, stage changes, the realized mixture per window (with drift
alerts), alerts and skips, and the share of step time spent waiting for data.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import torch

from smelt.checkpoint.failures import CheckpointSaveError
from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import (
    rng_state,
    step_dir_name,
)
from smelt.config import Config, hash_json
from smelt.layout import CHECKPOINTS
from smelt.model.moe import router_metrics, update_expert_bias
from smelt.model.transformer import Transformer
from smelt.train.alerts import AlertDispatch, Decision, SpikeMonitor
from smelt.train.batching import BatchPlan
from smelt.train.build import TrainerBuild
from smelt.train.cadence import Every
from smelt.train.evaluation import EvalBudget, Validation, budget_note, rank0_decides, say, skip_note
from smelt.train.monitors import MetricsLog
from smelt.train.ops.watchdog import StopSignals, Watchdog, stop_on_signal
from smelt.train.optim import set_lr
from smelt.train.parallel.distributed import (
    DistContext,
    device_for,
    env_world,
    process_group,
)
from smelt.train.parallel.mesh import TrainMesh
from smelt.train.precision import Precision
from smelt.train.records import announce, mfu_fields, summary
from smelt.train.setup import (
    clipped_norm,
    losses_by_source,
    memory_mb,
    resolve_device,
    set_deterministic,
)
from smelt.train.spike_watch import SpikeTriage
from smelt.train.step import finish_grads, forward_backward
from smelt.train.step_times import clock, timed
from smelt.train.trajectory import Expectation
from smelt.train.window import Window


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
    set_deterministic(tc.deterministic)
    for sized in cfg.sized:  # lr, init std, batch or warmup set far from the model size's rule
        if sized.far_from_rule:
            say(f"warning: {sized.warning()}")
    _, _, local_rank = env_world()
    device = device_for(tc.device, local_rank)
    with process_group(device) as ctx, StopSignals():  # SIGTERM/SIGINT: stop after a step, saved
        return Trainer(cfg, tokens_dir, tokenizer_dir, out_dir, resume, ctx, device, started).train()


class Trainer(TrainerBuild):
    """One training run inside the process group that `train` sets up. `train()` reads as its phases:
    build, resume, then per step: next batch, step (forward, backward, gradients), apply-or-skip,
    log window, evaluate, checkpoint; then finish. The state lives in small objects with state_dict():
    the loader, the spike monitor (alerts.py), the window statistics (window.py), the checkpointer.
    Each periodic part decides when it is due (cadence.py, inloop, telemetry, the checkpointer's poll).
    The parts, made by build() and resume() (build.py):"""

    # the layout and the model
    mesh: TrainMesh
    sharded: bool  # each rank holds a shard of the weights (FSDP2 or TP)
    model: Transformer  # the model itself; `wrapped` is what the step calls (DDP, FSDP2, TP, PP)
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any  # fp16's loss scaler, or None
    precision: Precision
    forward: Any  # the (compiled or not) training forward, speed.py
    # the data
    plan: BatchPlan
    loader: Any  # tokens.loader.TokenLoader
    data_plan: Any
    mixture: Any  # tokens.mixture.MixtureMonitor
    parent: Any  # a fork's parent checkpoint, or None
    schedule: Any  # train/schedule.py
    # what watches the run
    spikes: SpikeMonitor
    alerts: AlertDispatch
    telemetry: Any  # telemetry.py
    triage: SpikeTriage
    window: Window
    validation: Validation | None
    inloop: Any  # eval/inloop.py, or None
    eval_budget: EvalBudget
    log_cadence: Every
    eval_cadence: Every
    save_cadence: Every
    # what it writes
    metrics: MetricsLog
    checkpointer: Checkpointer
    identity: dict[str, Any]  # what a checkpoint must match to be resumed (model, vocab, tokenizer, data)
    start_step: int
    expect: Expectation  # train.expect's predicted curve and its alert (trajectory.py)
    bar: Any
    watchdog: Watchdog
    compile_note: str
    host_memory_note: str

    def __init__(
        self,
        cfg: Config,
        tokens_dir: Path,
        tokenizer_dir: Path,
        out_dir: Path,
        resume: str | Path | None,
        ctx: DistContext,
        device: torch.device,
        started: float,
    ) -> None:
        self.cfg, self.tc = cfg, cfg.train
        self.tokens_dir, self.tokenizer_dir, self.out_dir = tokens_dir, tokenizer_dir, out_dir
        self.resume_arg, self.ctx, self.device, self.started = resume, ctx, device, started
        self.checkpoints_dir = out_dir / CHECKPOINTS

    def train(self) -> dict[str, Any]:
        self.build()
        self.resume()
        self.expect, self.bar, self.watchdog = announce(self)
        self.begin()
        plan, tc = self.plan, self.tc
        try:
            for step in range(self.start_step + 1, plan.steps + 1):
                t0 = time.perf_counter()
                parts = self.next_batch(step)
                wait = time.perf_counter() - t0
                lr = self.schedule(step - 1)
                set_lr(self.optimizer, lr)
                self.telemetry.begin(step, plan.tokens_at(step), parts)
                loss, norm = self.step(parts)
                tokens = plan.tokens_at(step)
                decision = self.alerts.decide(step, tokens, loss, norm)
                self.apply_or_skip(step, tokens, decision, loss, norm, lr)
                self.write_all(self.triage.step(step, tokens, decision))
                clipped = decision.action == "apply" and tc.grad_clip > 0 and norm > tc.grad_clip
                skipped = decision.action in ("skip", "rollback")
                step_tokens = tokens - plan.tokens_at(step - 1)
                self.window.add_step(time.perf_counter() - t0, wait, step_tokens, loss, clipped, skipped)
                self.bar.update(1)
                for part in parts:
                    self.write_all(self.mixture.update(part.step, part.source_counts))
                self.write_all(self.checkpointer.poll())
                if self.log_cadence.due(step):
                    self.log_window(step, tokens, lr, norm, parts[-1].stage.name)
                stop_on_signal(self, step)
                if self.eval_cadence.due(step):
                    self.evaluate(step, self.window.train_time)
                if self.inloop is not None and self.inloop.due(step) and (self.sharded or self.ctx.is_main):
                    self.evaluate_inloop(step, tokens)
                if self.save_cadence.due(step):
                    self.checkpoint(step)
                self.watchdog.beat(step)
            self.finish()
        except CheckpointSaveError as exc:
            with contextlib.suppress(OSError):  # a disk that is still full may refuse even these lines
                self.metrics.write(exc.event(plan.tokens_at(exc.step)))
                self.metrics.write(
                    {
                        "kind": "event",
                        "step": exc.step,
                        "tokens": plan.tokens_at(exc.step),
                        "event": "end",
                        "status": "failed",
                        "error": str(exc),
                    }
                )
            raise
        finally:
            self.close()
        return summary(self)

    def begin(self) -> None:
        """A fork scores its starting point on its own validation data; then training mode, the watchdog."""
        if self.parent is not None and self.resume_from is None:
            self.evaluate(0, 0.0, final=True)
        self.wrapped.train()
        self.watchdog.start()

    # --- one step ---------------------------------------------------------------------------------

    def next_batch(self, step: int) -> list[Any]:
        """The loader steps of optimizer step `step` (several under a batch ramp); a stage change is
        recorded at the step before the stage's first."""
        parts = [self.loader.next_step() for _ in range(self.plan.units_at(step))]
        plan = self.plan
        for part in parts:
            if part.step == part.stage.first_step:
                first, last = part.stage.first_step, part.stage.last_step
                self.metrics.write(
                    {
                        "kind": "event",
                        "step": step - 1,
                        "tokens": plan.tokens_at(step - 1),
                        "event": "stage",
                        "stage": part.stage.name,
                        "index": part.stage.index,
                        "first_step": plan.step_of_loader_step(first),
                        "last_step": plan.step_of_loader_step(last),
                        "weights": part.stage.weights,
                    }
                )
        return parts

    def step(self, parts: list[Any]) -> tuple[float, float]:
        """Forward and backward over every micro batch, then the synced, unscaled, clipped gradients;
        returns the step's loss and pre-clip gradient norm."""
        tc, synced = self.tc, time.perf_counter()  # every collective of the step is in this section
        micro = [m for part in parts for m in part.micro] if len(parts) > 1 else parts[-1].micro
        loss_t, _, source_sums = forward_backward(
            self.wrapped,
            self.forward,
            micro,
            precision=self.precision,
            scaler=self.scaler,
            mode=tc.parallel,
            world_size=self.mesh.layout.dp,
            doc_masking=tc.doc_masking,
            device=self.device,
            sources=self.window.sources,
            group=self.mesh.data_group,
            loss_context=self.mesh.loss_context,
        )
        self.window.add_sources(source_sums)
        norm_t = finish_grads(self.model, self.optimizer, self.scaler, tc.grad_clip, self.sharded)
        loss, norm = (
            float(v) for v in torch.stack([loss_t.float(), norm_t.float().to(loss_t.device)]).tolist()
        )
        self.window.ranks.synced(time.perf_counter() - synced)
        return loss, norm

    def apply_or_skip(
        self, step: int, tokens: int, decision: Decision, loss: float, norm: float, lr: float
    ) -> None:
        """Apply the update, or let the alert dispatch skip it, roll back, or pass an fp16 overflow."""
        action = decision.action
        # A checkpoint's host copy must finish before weights change; the wait is a checkpoint stall.
        self.window.ranks.checkpoint_wait_s += timed(self.checkpointer.before_update)
        if decision.overflow:
            self.alerts.overflow(step, tokens, self.optimizer)
        elif action == "apply":
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            update_expert_bias(self.model)  # MoE auxiliary-loss-free balancing (no-op otherwise)
            self.alerts.applied(step, tokens, decision, loss, norm, lr, self.model)
        elif action == "rollback":
            self.alerts.rollback(step, tokens, decision, self.model, self.optimizer)
        if action in ("skip", "rollback"):
            self.alerts.count_skip(step, tokens, decision, loss, norm, lr)
        self.optimizer.zero_grad(set_to_none=True)

    # --- log window, evaluate, checkpoint ---------------------------------------------------------

    def log_window(self, step: int, tokens: int, lr: float, norm: float, stage: str) -> None:
        """The `kind: train` record of the steps since the last one (and the MoE router figures)."""
        tc, plan, window, scaler = self.tc, self.plan, self.window, self.scaler
        steps_in_window = max(1, window.steps)
        tps = window.tokens_per_s()
        self.last_log_loss = window.mean_loss()
        ranked, stragglers = window.ranks.window_fields(step, tokens, tc.straggler_ratio, self.device)
        self.metrics.write(
            {
                "kind": "train",
                "step": step,
                "tokens": tokens,
                **({"batch_tokens": tokens - plan.tokens_at(step - 1)} if plan.units else {}),
                "loss": self.last_log_loss if window.losses else None,
                "lr": lr,
                "grad_norm": norm if math.isfinite(norm) else None,
                "grad_norm_clipped": clipped_norm(norm, tc.grad_clip),
                "clipped": bool(tc.grad_clip > 0 and norm > tc.grad_clip),
                "clip_fraction": window.clipped / steps_in_window,
                "skipped": window.skipped,
                "tokens_per_s": tps,
                **mfu_fields(self, tps),
                "stage": stage,
                "loader_wait_s": window.wait / steps_in_window,
                "loader_wait_share": window.wait / max(window.time, 1e-9),
                "memory_mb": memory_mb(self.device),
                **({"loss_scale": scaler.get_scale()} if scaler is not None else {}),
                **losses_by_source(window.sources, window.source_sums),
                **ranked,
                **clock(self.started),
            }
        )
        self.write_all(stragglers)  # printed by rank 0 (step_times.RankTimes.window_fields)
        moe_fields = router_metrics(self.model)  # every rank: the loads are summed over ranks
        if moe_fields:
            self.metrics.write({"kind": "moe", "step": step, "tokens": tokens, **moe_fields})
        if window.losses:
            shown = {"val": f"{self.val_record['val_loss']:.3f}"} if self.val_record else {}
            self.bar.set_postfix(
                loss=f"{self.last_log_loss:.3f}", **shown, tok_s=f"{tps:,.0f}", refresh=False
            )
        window.reset()

    def evaluate(self, step: int, train_s: float, final: bool = False) -> float | None:
        """Validation loss at `step`, unless the eval budget says it would cost too large a share."""
        validation, plan, budget = self.validation, self.plan, self.eval_budget
        if validation is None or validation.tokens == 0:
            return None
        tokens_now = plan.tokens_at(step)
        if not final:  # the final evaluation always runs: it is the run's headline
            rate = (tokens_now - plan.tokens_at(self.start_step)) / train_s if train_s > 0 else 0.0
            predicted = budget.predict_s(validation.tokens, rate)
            done = (step - self.start_step) / max(plan.steps - self.start_step, 1)
            if not rank0_decides(budget.allows(predicted, train_s, done), self.device):
                budget.skipped += 1
                if budget.skipped == 1 and self.ctx.is_main:
                    say(skip_note(step, predicted, budget, train_s))
                self.metrics.write(
                    {
                        "kind": "event",
                        "step": step,
                        "tokens": tokens_now,
                        "event": "eval_skipped",
                        "predicted_s": round(predicted, 3),
                        "eval_s": round(budget.eval_s, 3),
                        "train_s": round(train_s, 3),
                        "eval_budget": self.tc.eval_budget,
                    }
                )
                return None
        result = validation.run(self.forward, desc=f"validation at step {step}", show=self.ctx.is_main)
        budget.record(result.seconds, result.tokens)
        self.val_record.clear()
        self.val_record.update(result.fields())
        self.metrics.write(
            {
                "kind": "eval",
                "step": step,
                "tokens": tokens_now,
                **result.fields(),
                "eval_share": budget.share_of(train_s),
            }
        )
        return self.expect.observed(self.metrics, step, tokens_now, result.loss)  # train.expect's alert

    def evaluate_inloop(self, step: int, tokens: int) -> None:
        # FSDP gathers shards in every forward, so all ranks score; otherwise rank 0 alone. At the
        # training precision, as the validation loss is; log-probs are taken in fp32.
        with self.precision.autocast():
            scores = self.inloop(self.model, step)
        self.metrics.write({"kind": "eval", "step": step, "tokens": tokens, "inloop": True, **scores})

    def checkpoint(self, step: int) -> None:
        plan = self.plan
        meta = {
            "tokens": plan.tokens_at(step),
            "loader": self.loader.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "alerts": self.spikes.state_dict(),
            "config": self.config_dict,
            "config_hash": hash_json(self.config_dict),
            **self.identity,
            "precision": self.precision.name,
            "world_size": self.world_size,
            "parallel": self.tc.parallel if self.ctx.distributed else None,
            "metrics_offset": self.metrics.offset,  # where a resume from here cuts metrics.jsonl
        }
        rank_state = {"rng": rng_state(self.device)}
        step_tokens = plan.tokens_at(step) - plan.tokens_at(step - 1)
        self.write_all(
            self.checkpointer.save(step, self.model, self.optimizer, meta, rank_state, step_tokens)
        )

    # --- finish -----------------------------------------------------------------------------------

    def finish(self) -> None:
        """The final validation and checkpoint, and the run's end record; non-finite weights stop here."""
        plan, budget, train_time = self.plan, self.eval_budget, self.window.train_time
        self.alerts.check_weights(plan.steps, plan.tokens, self.model, "at the end of training")
        self.last_val = self.evaluate(plan.steps, train_time, final=True)
        if self.ctx.is_main and self.validation is not None:
            say(budget_note(budget, train_time))
        self.checkpoint(plan.steps)
        self.write_all(self.checkpointer.close())
        self.write_all(self.triage.finish(plan.steps, plan.tokens))
        self.final = self.checkpoints_dir / step_dir_name(plan.steps)
        self.metrics.write(
            {
                "kind": "event",
                "step": plan.steps,
                "tokens": plan.tokens,
                "event": "end",
                "status": "ok",
                "wall_time_s": time.time() - self.started,
                "time": time.time(),
                "skipped_steps": self.alerts.skipped_total,
                "rollbacks": self.alerts.rollbacks,
                "eval_s": round(budget.eval_s, 3),
                "evals": budget.runs,
                "evals_skipped": budget.skipped,
            }
        )

    def close(self) -> None:
        self.watchdog.stop()
        # A save still writing when the run fails is finished (and committed) before the process ends.
        with contextlib.suppress(Exception):
            self.write_all(self.checkpointer.close())
        self.loader.close()
        self.bar.close()
        self.metrics.close()

    def write_all(self, records: Any) -> None:
        for record in records:
            self.metrics.write(record)
