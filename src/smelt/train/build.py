"""How a Trainer's parts are made: `build()` (the model under its layout, the optimizer, the loader, the
schedule, monitors, validation and the run's identity) and `resume()` (a checkpoint or a fork's parent
loaded, what the run writes again set aside, metrics.jsonl opened). The parts themselves are listed,
typed, at the top of `Trainer` (trainer.py), whose `train()` is the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from smelt.checkpoint.lineage import check_fits, load_parent, resolve_parent
from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import load_training_state, restore_rng, set_aside_after
from smelt.errors import UserError
from smelt.eval.heldout import training_mixture
from smelt.layout import TOKENIZER_JSON
from smelt.metric_records import METRICS
from smelt.model.flops import count_params, flops_conventions
from smelt.tokens.shards import read_meta as read_shards_meta
from smelt.tokens.shards import read_meta_if_any
from smelt.train.alerts import AlertDispatch, SpikeMonitor
from smelt.train.batching import batch_plan
from smelt.train.cadence import Every
from smelt.train.evaluation import EvalBudget, Validation, say
from smelt.train.health import health_alerts
from smelt.train.materialize import build_training_model
from smelt.train.monitors import MetricsLog, supersede_after_resume
from smelt.train.optim import build_optimizer
from smelt.train.parallel.distributed import from_main, rank_seed
from smelt.train.parallel.mesh import mesh_for
from smelt.train.precision import peak_flops, resolve_precision
from smelt.train.setup import (
    agreed_resume,
    alert_policy,
    build_schedule,
    check_token_inputs,
    file_hash,
    has_tokens,
    inloop_evaluator,
    last_logged_loss,
    metric_sinks,
    read_vocab_size,
    torch_threads,
)
from smelt.train.speed import training_forward
from smelt.train.spike_watch import SpikeTriage
from smelt.train.telemetry import telemetry_for
from smelt.train.window import Window


class TrainerBuild:
    """`build()` and `resume()` of the Trainer (its fields are declared in trainer.py)."""

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
            cfg,
            tokens_dir,
            tokenizer_dir,
            self.mesh.data_rank,
            self.mesh.layout.dp,
            plan=plan,
            parent=self.parent.checkpoint if self.parent is not None else None,
        )
        self.data_plan = data_plan = self.loader.plan
        self.mixture = MixtureMonitor(data_plan, cfg.tokens.mixture_window, cfg.tokens.drift_tolerance)
        self.telemetry = telemetry_for(self)  # activations, logits, Adam moments, update ratios

        self.params = count_params(cfg.model, vocab_size)
        self.flops_tok, self.model_flops_tok = flops_conventions(cfg.model, vocab_size, tc.seq_len)
        peak = from_main(ctx, device, lambda: peak_flops(device, self.precision))  # one figure for every rank
        self.peak_total = peak * self.world_size if peak else None
        forward = training_forward(self)  # compiled or not (train.compile), the loss chunks
        self.forward, self.compile_note, self.host_memory_note = (
            forward.call,
            forward.compile_note,
            forward.host_memory_note,
        )
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
        self.validation = (
            Validation(
                tokens_dir,
                val_sources,
                tc.seq_len,
                tc.eval_tokens,
                tc.micro_batch,
                self.precision,
                device,
                eos_id,
                training_mixture(cfg, tokens_dir),
            )
            if self.have_val
            else None
        )
        self.eval_budget = EvalBudget(tc.eval_budget)
        self.val_record: dict[str, Any] = {}  # the figures of the last evaluation that ran
        self.window = Window(list(data_plan.sources))
        # When the loop logs, validates and checkpoints (the final step's validation and save are finish()'s).
        self.log_cadence = Every(tc.log_every, plan.steps, first=True, at_last=True)
        self.eval_cadence = Every(tc.eval_every, plan.steps)
        self.save_cadence = Every(cfg.checkpoint.every_steps, plan.steps)

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
                self.out_dir / METRICS,
                self.start_step,
                ckpt_meta.get("metrics_offset") if own else None,
                rerun_final=self.start_step >= plan.steps,
            )
        checkpoint = self.cfg.checkpoint
        self.checkpointer = Checkpointer(
            self.checkpoints_dir,
            checkpoint.keep_last,
            checkpoint.async_save,
            checkpoint.milestone_every_steps,
            checkpoint.milestone_every_tokens,
        )
        self.metrics = MetricsLog(
            self.out_dir / METRICS,
            enabled=ctx.is_main,
            append=self.resume_from is not None,
            sinks=metric_sinks(self.cfg, self.out_dir) if ctx.is_main else None,
            watch=health_alerts(self.tc, say) if ctx.is_main else None,  # run-health alerts: health.py
        )
        self.alerts = AlertDispatch(
            self.spikes, self.checkpointer, self.metrics, self.scaler, self.out_dir.parent
        )
        self.inloop = inloop_evaluator(self.cfg, self.tokenizer_dir, self.device, plan.steps)
        self.triage = SpikeTriage.of(self)
        # A run resumed at its end logs the loss it had already logged; validation figures come later.
        self.last_log_loss = last_logged_loss(self.out_dir) if self.start_step >= plan.steps else float("nan")
        self.last_val: float | None = None
        self.final: Path | None = None
