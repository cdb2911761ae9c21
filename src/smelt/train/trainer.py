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
from smelt.checkpoint.lineage import check_fits, load_parent, resolve_parent
from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import (
    load_training_state,
    restore_rng,
    rng_state,
    set_aside_after,
    step_dir_name,
)
from smelt.config import Config, hash_json
from smelt.errors import UserError
from smelt.eval.heldout import training_mixture
from smelt.layout import CHECKPOINTS, TOKENIZER_JSON
from smelt.model.flops import count_params, flops_conventions
from smelt.model.moe import router_metrics, update_expert_bias
from smelt.tokens.shards import read_meta as read_shards_meta
from smelt.tokens.shards import read_meta_if_any
from smelt.train.alerts import AlertDispatch, Decision, SpikeMonitor
from smelt.train.batching import batch_plan
from smelt.train.evaluation import EvalBudget, Validation, budget_note, rank0_decides, say, skip_note
from smelt.train.goodput import clock, timed
from smelt.train.health import health_alerts
from smelt.train.materialize import build_training_model
from smelt.train.monitors import MetricsLog, supersede_after_resume
from smelt.train.ops.watchdog import StopSignals, stop_on_signal
from smelt.train.optim import build_optimizer, set_lr
from smelt.train.parallel.distributed import (
    DistContext,
    device_for,
    env_world,
    from_main,
    process_group,
    rank_seed,
)
from smelt.train.parallel.mesh import mesh_for
from smelt.train.precision import peak_flops, resolve_precision
from smelt.train.records import announce, mfu_fields, summary
from smelt.train.setup import (
    agreed_resume,
    alert_policy,
    build_schedule,
    check_token_inputs,
    clipped_norm,
    file_hash,
    has_tokens,
    inloop_evaluator,
    losses_by_source,
    memory_mb,
    metric_sinks,
    read_vocab_size,
    resolve_device,
    set_deterministic,
    torch_threads,
)
from smelt.train.speed import training_forward
from smelt.train.spike_watch import SpikeTriage
from smelt.train.step import finish_grads, forward_backward
from smelt.train.telemetry import telemetry_for
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


class Trainer:
    """One training run inside the process group that `train` sets up. `train()` reads as its phases:
    build, resume, then per step: next batch, step (forward, backward, gradients), apply-or-skip,
    log window, evaluate, checkpoint; then finish. The state lives in small objects with state_dict():
    the loader, the spike monitor (alerts.py), the window statistics (window.py), the checkpointer."""

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
        announce(self)
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
                if step == 1 or step % tc.log_every == 0 or step == plan.steps:
                    self.log_window(step, tokens, lr, norm, parts[-1].stage.name)
                stop_on_signal(self, step)
                if step < plan.steps and tc.eval_every and step % tc.eval_every == 0:
                    self.evaluate(step, self.window.train_time)
                if self.inloop is not None and self.inloop.due(step) and (self.sharded or self.ctx.is_main):
                    self.evaluate_inloop(step, tokens)
                every = self.cfg.checkpoint.every_steps
                if step < plan.steps and every and step % every == 0:
                    self.checkpoint(step)
                self.watchdog.beat(step)
            self.finish()
        except CheckpointSaveError as exc:
            with contextlib.suppress(OSError):  # a disk that is still full may refuse even these lines
                self.metrics.write(exc.event(plan.tokens_at(exc.step)))
                self.metrics.write({"kind": "event", "step": exc.step, "tokens": plan.tokens_at(exc.step),
                                    "event": "end", "status": "failed", "error": str(exc)})  # fmt: skip
            raise
        finally:
            self.close()
        return summary(self)

    # --- build ------------------------------------------------------------------------------------

    def build(self) -> None:
        """Model, optimizer, loader, schedule, monitors and the run's identity; checks the inputs."""
        from smelt.tokens.loader import TokenLoader  # lazy: tokens/ is a sibling stage
        from smelt.tokens.mixture import MixtureMonitor

        cfg, tc, ctx, device = self.cfg, self.tc, self.ctx, self.device
        tokens_dir, tokenizer_dir = self.tokens_dir, self.tokenizer_dir
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.mesh = mesh_for(
            cfg, ctx.rank, ctx.world_size, device
        )  # TP ranks share rows: train/parallel/mesh.py
        self.sharded = ctx.distributed and (tc.parallel == "fsdp" or self.mesh.tensor_parallel)
        self.plan = plan = batch_plan(tc, self.mesh.layout.dp)
        self.precision = resolve_precision(tc.precision, device)
        torch.set_num_threads(tc.threads or torch_threads())
        self.vocab_size = vocab_size = read_vocab_size(tokenizer_dir)
        if not has_tokens(tokens_dir / "train"):
            raise UserError(
                f"no training tokens under {tokens_dir / 'train'} (no non-empty .bin shard). "
                f"Run `smelt tokenize CONFIG` first, or check the tokens directory."
            )
        self.have_val = has_tokens(tokens_dir / "val")
        val_dirs = (tokens_dir / "val").iterdir() if self.have_val else ()
        val_sources = sorted(d.name for d in val_dirs if has_tokens(d))
        eos_id = int(read_shards_meta(tokens_dir)["eos_id"]) if tc.doc_masking else None

        # Every rank builds the same initial weights from the run seed, then seeds itself (rank_seed).
        # Whole, or on the meta device and then only this rank's shards (train/materialize.py).
        self.model, self.wrapped, _ = build_training_model(cfg, vocab_size, ctx, device, self.mesh)
        model = self.model
        torch.manual_seed(rank_seed(cfg.run.seed, self.rank, "train"))
        self.optimizer = build_optimizer(model, tc, device)
        self.scaler = self.precision.grad_scaler()
        self.parent = resolve_parent(tc.init_from) if tc.init_from else None  # a fork reads on from its data
        self.loader = TokenLoader.from_config(
            cfg, tokens_dir, tokenizer_dir, self.mesh.data_rank, self.mesh.layout.dp, plan=plan,
            parent=self.parent.checkpoint if self.parent is not None else None,
        )  # fmt: skip
        self.data_plan = data_plan = self.loader.plan
        self.mixture = MixtureMonitor(data_plan, cfg.tokens.mixture_window, cfg.tokens.drift_tolerance)
        self.telemetry = telemetry_for(self)  # activations, logits, Adam moments, update ratios

        self.params = count_params(cfg.model, vocab_size)
        self.flops_tok, self.model_flops_tok = flops_conventions(cfg.model, vocab_size, tc.seq_len)
        peak = from_main(ctx, device, lambda: peak_flops(device, self.precision))  # one figure for every rank
        self.peak_total = peak * self.world_size if peak else None
        self.forward = training_forward(self)  # compiled or not (train.compile), the loss chunks
        self.schedule = build_schedule(
            tc, plan, [plan.step_of_loader_step(stage.first_step) for stage in data_plan.stages]
        )
        self.spikes = SpikeMonitor(alert_policy(tc, self.schedule.warmup))
        self.config_dict = cfg.to_dict()
        tokens_meta = read_meta_if_any(tokens_dir)
        self.identity = {
            "model_config": cfg.model.__dict__.copy(),
            "vocab_size": vocab_size,
            "tokenizer_hash": tokens_meta.get("tokenizer_hash") or file_hash(tokenizer_dir / TOKENIZER_JSON),
            "data_hash": file_hash(tokens_dir / "shards.json"),
        }
        check_token_inputs(tokens_dir, tokenizer_dir, tokens_meta, vocab_size)
        if self.parent is not None:
            check_fits(self.parent, self.identity["model_config"], vocab_size)
            self.identity["parent"] = self.parent.record()
        # Each validation source is scored once; the headline weighs their losses by the training
        # mixture (an aggregate can fall while one domain regresses, so per-source losses are logged too).
        self.validation = Validation(
            tokens_dir, val_sources, tc.seq_len, tc.eval_tokens, tc.micro_batch, self.precision, device,
            eos_id, training_mixture(cfg, tokens_dir),
        ) if self.have_val else None  # fmt: skip
        self.eval_budget = EvalBudget(tc.eval_budget)
        self.val_record: dict[str, Any] = {}  # the figures of the last evaluation that ran
        self.window = Window(list(data_plan.sources))

    # --- resume -----------------------------------------------------------------------------------

    def resume(self) -> None:
        """Continue from a checkpoint (weights, optimizer, RNG, loader, scaler, alert history) or start a
        fork from its parent's weights; set aside what this run will write again; open metrics.jsonl."""
        ctx, plan, resume = self.ctx, self.plan, self.resume_arg
        self.start_step = 0
        self.resume_from, self.resume_warnings = agreed_resume(resume, self.checkpoints_dir, ctx)
        self.rank_state: dict[str, Any] | None = None
        ckpt_meta: dict[str, Any] = {}
        if self.resume_from is not None:
            ckpt_meta, self.rank_state = load_training_state(
                self.resume_from, self.model, self.optimizer, expected=self.identity
            )
            self.start_step = int(ckpt_meta["step"])
            # "auto" finding the final checkpoint: the process ended between that save and the end of
            # the stage (a crash, a kill); finish the bookkeeping instead of training. A checkpoint named
            # explicitly at the end is a request to continue a finished run, which cannot be done exactly.
            if self.start_step >= plan.steps and str(resume) != "auto":
                raise UserError(
                    f"checkpoint {self.resume_from} is at step {self.start_step}, the end of this run "
                    f"({plan.steps} steps): the run is complete. Train again without resume or into another "
                    f"directory (a longer run is a new data plan and learning-rate schedule, so it cannot "
                    f"continue this one exactly)."
                )
            self.loader.load_state_dict(ckpt_meta["loader"])
            if self.rank_state is not None:
                restore_rng(self.rank_state["rng"], self.device)
            if self.scaler is not None and ckpt_meta.get("scaler"):
                self.scaler.load_state_dict(ckpt_meta["scaler"])
            if ckpt_meta.get("alerts"):
                self.spikes.load_state_dict(ckpt_meta["alerts"])
            self.mixture.resume(self.loader.step + 1, self.loader.source_counts)
        elif self.parent is not None:  # a fork's first step starts from the parent's exact weights
            load_parent(self.parent, self.model, self.optimizer, self.tc.init_optimizer)
        # What this run writes again is moved aside, never overwritten: the checkpoints after its
        # starting step (damaged ones passed over, newer ones than --resume-from) and the metrics
        # records after it.
        self.set_aside = set_aside_after(self.checkpoints_dir, self.start_step) if ctx.is_main else []
        self.superseded = 0
        if self.resume_from is not None and ctx.is_main:
            own = self.resume_from.resolve().parent == self.checkpoints_dir.resolve()  # offset into this file
            self.superseded = supersede_after_resume(
                self.out_dir / "metrics.jsonl", self.start_step,
                ckpt_meta.get("metrics_offset") if own else None, rerun_final=self.start_step >= plan.steps,
            )  # fmt: skip
        checkpoint = self.cfg.checkpoint
        self.checkpointer = Checkpointer(
            self.checkpoints_dir, checkpoint.keep_last, checkpoint.async_save,
            checkpoint.milestone_every_steps, checkpoint.milestone_every_tokens,
        )  # fmt: skip
        self.metrics = MetricsLog(
            self.out_dir / "metrics.jsonl", enabled=ctx.is_main, append=self.resume_from is not None,
            sinks=metric_sinks(self.cfg, self.out_dir) if ctx.is_main else None,
            watch=health_alerts(self.tc, say) if ctx.is_main else None,  # run-health alerts: health.py
        )  # fmt: skip
        self.alerts = AlertDispatch(
            self.spikes, self.checkpointer, self.metrics, self.scaler, self.out_dir.parent
        )
        self.inloop = inloop_evaluator(self.cfg, self.tokenizer_dir, self.device, plan.steps)
        self.triage = SpikeTriage.of(self)

    # --- one step ---------------------------------------------------------------------------------

    def next_batch(self, step: int) -> list[Any]:
        """The loader steps of optimizer step `step` (several under a batch ramp); a stage change is
        recorded at the step before the stage's first."""
        parts = [self.loader.next_step() for _ in range(self.plan.units_at(step))]
        plan = self.plan
        for part in parts:
            if part.step == part.stage.first_step:
                first, last = part.stage.first_step, part.stage.last_step
                self.metrics.write({"kind": "event", "step": step - 1, "tokens": plan.tokens_at(step - 1),
                                    "event": "stage", "stage": part.stage.name, "index": part.stage.index,
                                    "first_step": plan.step_of_loader_step(first),
                                    "last_step": plan.step_of_loader_step(last),
                                    "weights": part.stage.weights})  # fmt: skip
        return parts

    def step(self, parts: list[Any]) -> tuple[float, float]:
        """Forward and backward over every micro batch, then the synced, unscaled, clipped gradients;
        returns the step's loss and pre-clip gradient norm."""
        tc, synced = self.tc, time.perf_counter()  # every collective of the step is in this section
        micro = [m for part in parts for m in part.micro] if len(parts) > 1 else parts[-1].micro
        loss_t, _, source_sums = forward_backward(
            self.wrapped, self.forward, micro, precision=self.precision, scaler=self.scaler, mode=tc.parallel,
            world_size=self.mesh.layout.dp, doc_masking=tc.doc_masking, device=self.device,
            sources=self.window.sources, group=self.mesh.data_group, loss_context=self.mesh.loss_context,
        )  # fmt: skip
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
        self.metrics.write({
            "kind": "train", "step": step, "tokens": tokens,
            **({"batch_tokens": tokens - plan.tokens_at(step - 1)} if plan.units else {}),
            "loss": self.last_log_loss if window.losses else None, "lr": lr,
            "grad_norm": norm if math.isfinite(norm) else None,
            "grad_norm_clipped": clipped_norm(norm, tc.grad_clip),
            "clipped": bool(tc.grad_clip > 0 and norm > tc.grad_clip),
            "clip_fraction": window.clipped / steps_in_window, "skipped": window.skipped,
            "tokens_per_s": tps, **mfu_fields(self, tps),
            "stage": stage, "loader_wait_s": window.wait / steps_in_window,
            "loader_wait_share": window.wait / max(window.time, 1e-9),
            "memory_mb": memory_mb(self.device),
            **({"loss_scale": scaler.get_scale()} if scaler is not None else {}),
            **losses_by_source(window.sources, window.source_sums),
            **ranked, **clock(self.started),
        })  # fmt: skip
        self.write_all(stragglers)  # printed by rank 0 (goodput.RankTimes.window_fields)
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
                self.metrics.write({"kind": "event", "step": step, "tokens": tokens_now, "event": "eval_skipped",
                                    "predicted_s": round(predicted, 3), "eval_s": round(budget.eval_s, 3),
                                    "train_s": round(train_s, 3), "eval_budget": self.tc.eval_budget})  # fmt: skip
                return None
        result = validation.run(self.forward, desc=f"validation at step {step}", show=self.ctx.is_main)
        budget.record(result.seconds, result.tokens)
        self.val_record.clear()
        self.val_record.update(result.fields())
        self.metrics.write({"kind": "eval", "step": step, "tokens": tokens_now, **result.fields(),
                            "eval_share": budget.share_of(train_s)})  # fmt: skip
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
        self.metrics.write({"kind": "event", "step": plan.steps, "tokens": plan.tokens, "event": "end",
                            "status": "ok", "wall_time_s": time.time() - self.started, "time": time.time(),
                            "skipped_steps": self.alerts.skipped_total, "rollbacks": self.alerts.rollbacks,
                            "eval_s": round(budget.eval_s, 3), "evals": budget.runs,
                            "evals_skipped": budget.skipped})  # fmt: skip

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
