"""What every post-training stage shares: start from a parent checkpoint through the fork machinery,
lay out the new run directory, the optimizer and schedule, metrics, checkpoints and the summary.

A stage's output is a run directory like a fork's: RUN/tokenizer (the parent's, copied), RUN/config.json
(the parent's pipeline config, so `smelt eval RUN` and `smelt export hf RUN` work on it),
RUN/train/run.json (the post-training config and the parent record), RUN/train/metrics.jsonl,
RUN/train/checkpoints/step_NNNNNNN (full checkpoints: posttrain/loop.py) and RUN/summary.json. The next
stage names RUN as its parent, so SFT -> DPO -> GRPO is a lineage chain the reports draw.

Under torchrun every rank opens the stage: the model is built on the meta device, sharded by FSDP2 (or
replicated by DDP: run.parallel), and the parent's weights stream from DCP into each rank's shards, so no
rank holds a whole copy under FSDP2. Rank 0 alone writes the run directory's files and metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smelt.chat_template import ChatFormat
from smelt.checkpoint.lineage import Parent, load_parent, resolve_parent
from smelt.checkpoint.store import checkpoint_at_step, latest_valid_checkpoint, read_meta
from smelt.config import ModelConfig, TrainConfig, hash_json
from smelt.errors import UserError
from smelt.layout import checkpoints_dir
from smelt.manifest import code_version, library_versions, write_json
from smelt.metric_records import METRICS, read_records
from smelt.model.transformer import Transformer
from smelt.posttrain.config import PostTrainConfig
from smelt.posttrain.data import Split
from smelt.posttrain.loop import resume_point
from smelt.progress import log
from smelt.run.lifecycle import LOCKS, committed_checkpoints, move_aside, stage_lock
from smelt.tokenizer.load import Tokenizer
from smelt.train.monitors import MetricsLog, supersede_after_resume
from smelt.train.ops.host_memory import host_memory_note
from smelt.train.optim import build_optimizer, set_lr
from smelt.train.parallel.distributed import DistContext, clip_grads_, device_for, env_world, global_grad_norm
from smelt.train.precision import Precision, resolve_precision
from smelt.train.schedule import Schedule


@dataclass
class Stage:
    """A stage in progress: the parent, the model (its weights loaded), where it writes, what it logs."""

    name: str
    cfg: PostTrainConfig
    parent: Parent
    out_dir: Path
    tokenizer: Tokenizer
    chat: ChatFormat
    model: Transformer
    device: torch.device
    precision: Precision
    seq_len: int
    metrics: MetricsLog | None = None
    started: float = field(default_factory=time.time)
    earlier_wall_s: float = 0.0  # wall time of earlier attempts, up to the checkpoint this one resumed from
    tokens: int = 0  # tokens through the model's forward (training only), for tokens/s
    train_seconds: float = 0.0
    force: bool = False  # --force: begin() moves a previous run's train/ aside
    host_memory: str = ""  # how freed host memory is handled (train/ops/host_memory.py)
    ctx: DistContext = field(default_factory=lambda: DistContext(0, 1, 0, owns_group=False))
    resume_from: Path | None = None  # the checkpoint this run continues from (open_stage decides)

    @property
    def train_dir(self) -> Path:
        return self.out_dir / "train"

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def is_main(self) -> bool:
        return self.ctx.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether each rank holds a shard of every weight (FSDP2 over several processes)."""
        return self.ctx.distributed and self.cfg.run.parallel == "fsdp"

    def own(self, index: list[int]) -> list[int]:
        """This rank's share of a global batch (every rank draws the same one): every world_size-th item."""
        return index[self.ctx.rank :: self.world_size]

    def all_sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of `value` over the ranks (itself for one process)."""
        if self.ctx.distributed:
            value = value.detach().clone()
            torch.distributed.all_reduce(value)
        return value

    def log_record(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def wall_seconds(self) -> float:
        """Wall time of this stage over its attempts (each counted up to the checkpoint the next resumed from)."""
        return self.earlier_wall_s + time.time() - self.started

    def timed(self, work: Callable[[], Any]) -> Any:
        """Run one step's work, adding its wall time to the stage's throughput (tokens are added by the
        loop from what the work returns)."""
        begin = time.perf_counter()
        out = work()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.train_seconds += time.perf_counter() - begin
        return out

    def model_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self.model.cfg)

    def tokens_per_s(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else 0.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "run.device = 'cuda' but no CUDA device is visible; use run.device = 'cpu' or 'auto'."
        )
    return torch.device(name)


def load_policy(
    parent: Parent,
    device: torch.device,
    max_seq_len: int = 0,
    ctx: DistContext | None = None,
    parallel: str = "fsdp",
) -> Transformer:
    """The parent's model with its weights (through the fork loader); max_seq_len > 0 overrides the
    context length (RoPE is computed, not stored, so the weights still fit). With a distributed `ctx`
    the model is built on the meta device, wrapped (FSDP2 or DDP) and only then given storage, and
    DCP reads each rank's shards into it."""
    meta = read_meta(parent.checkpoint, verify=False)
    saved = dict(meta["model_config"])
    if max_seq_len:
        saved["max_seq_len"] = max_seq_len
    cfg, vocab = ModelConfig(**saved), int(meta["vocab_size"])
    if ctx is None or not ctx.distributed:
        model = Transformer.for_loading(cfg, vocab, device)
        load_parent(parent, model, None, with_optimizer=False)  # type: ignore[arg-type]
        return model
    from smelt.train.materialize import materialize
    from smelt.train.parallel.distributed import wrap_model

    with torch.device("meta"):
        model = Transformer(cfg, vocab)
    wrapped = wrap_model(model, parallel, ctx, device)
    materialize(model, wrapped, [], [], 0, device)  # storage and the RoPE table only: DCP fills the rest
    load_parent(parent, wrapped, None, with_optimizer=False)  # type: ignore[arg-type]
    return wrapped  # type: ignore[return-value]


def check_run_section(cfg: PostTrainConfig, name: str) -> None:
    if not cfg.run.init_from:
        raise UserError(
            f"run.init_from is empty: name the checkpoint {name} starts from (a run directory, RUN:STEP or a "
            f"step_NNNNNNN directory), e.g. --set run.init_from=runs/quickstart."
        )
    if not cfg.run.out:
        raise UserError(
            f"run.out is empty: name the run directory {name} writes, e.g. --set run.out=runs/sft."
        )


@contextlib.contextmanager
def guarded(cfg: PostTrainConfig, name: str) -> Iterator[None]:
    """Run a stage under RUN/.locks/<stage>.lock (a second command on the same run.out stops with exit 2).
    On every exit path (done, an error, Ctrl-C, SIGTERM) the lock file goes, and the directories this
    command created go too when nothing but the lock was written in them: input that fails leaves no stub
    run directory. A SIGKILL leaves the lock file, which holds nothing once its process is gone."""
    check_run_section(cfg, name)
    out_dir = Path(cfg.run.out)
    if env_world()[0] != 0:  # under torchrun, rank 0 holds the lock and tidies up for the run
        restore = _exit_on_sigterm()
        try:
            yield
        finally:
            restore()
        return
    created = out_dir
    while not created.parent.exists() and created.parent != created:
        created = created.parent
    created = created if not created.exists() else None  # the first directory this command makes
    restore = _exit_on_sigterm()
    try:
        with stage_lock(out_dir, name):
            try:
                yield
            finally:
                (out_dir / LOCKS / f"{name}.lock").unlink(missing_ok=True)
    finally:
        restore()
        with contextlib.suppress(OSError):
            (out_dir / LOCKS).rmdir()  # only when empty: another stage's lock stays
        if created is not None:
            for folder in [out_dir, *out_dir.parents]:
                if not _remove_empty(folder) or folder == created:
                    break


def _remove_empty(folder: Path) -> bool:
    if not folder.exists():  # gone already (stage_lock removes a run directory it made and left empty)
        return True
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def _exit_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into SystemExit(143) while a stage runs, so its cleanup runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return lambda: None

    def stop(signum: int, frame: Any) -> None:
        log(f"post-training stopped by signal {signum} before its first step: there is nothing to resume")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, previous)


def open_stage(cfg: PostTrainConfig, name: str, force: bool = False) -> Stage:
    """Resolve the parent, load its tokenizer and weights. Nothing is written: `begin` lays out the run
    directory once the stage's input has been read."""
    check_run_section(cfg, name)
    parent = resolve_parent(cfg.run.init_from)
    out_dir = Path(cfg.run.out)
    if out_dir.resolve() == parent.run_dir.resolve():
        raise UserError(
            f"run.out = {cfg.run.out!r} is the parent run itself; a {name} stage writes a new run."
        )
    meta = read_meta(parent.checkpoint, verify=False)
    resolve_lr(cfg, name, meta["model_config"])
    resume_from = None
    if committed_checkpoints(out_dir / "train") and not force:
        latest, _ = latest_valid_checkpoint(checkpoints_dir(out_dir))
        resume_from, why_not = resume_point(latest, hash_json(cfg.to_dict()))
        if resume_from is None:
            raise UserError(
                f"{out_dir} already holds committed {name} checkpoints, and the latest cannot be resumed: "
                f"{why_not or 'none is valid'}. Pass --force to move that run to {out_dir / 'superseded'} "
                f"and start again, or choose another run.out."
            )
    resolve_device(cfg.run.device)  # the user error for a missing CUDA device
    local_rank = env_world()[2]
    device = device_for(cfg.run.device, local_rank)
    from smelt.train.parallel.distributed import init_distributed

    ctx = init_distributed(device)
    host_memory = host_memory_note(True, device.type)  # as pretraining's default: train/ops/host_memory.py
    torch.manual_seed(cfg.run.seed)
    tokenizer = Tokenizer.load(parent.run_dir / "tokenizer")
    if int(meta["vocab_size"]) != tokenizer.vocab_size:
        raise UserError(
            f"{parent.checkpoint} has vocab size {meta['vocab_size']} but {parent.run_dir / 'tokenizer'} has "
            f"{tokenizer.vocab_size}: the checkpoint was not trained with that tokenizer."
        )
    max_len = int(meta["model_config"]["max_seq_len"])
    seq_len = cfg.optim.seq_len or max_len
    if cfg.optim.batch_size % ctx.world_size:
        raise UserError(
            f"optim.batch_size = {cfg.optim.batch_size} does not divide over {ctx.world_size} processes: each "
            f"rank takes an equal share of every batch. Set a multiple of {ctx.world_size}."
        )
    model = load_policy(parent, device, max(seq_len, max_len), ctx, cfg.run.parallel)
    return Stage(
        name, cfg, parent, out_dir, tokenizer, ChatFormat(tokenizer), model, device,
        resolve_precision(cfg.run.precision, device), seq_len, force=force, host_memory=host_memory,
        ctx=ctx, resume_from=resume_from,
    )  # fmt: skip


def resolve_lr(cfg: PostTrainConfig, name: str, model_config: dict[str, Any]) -> None:
    """optim.lr = 0 takes the stage's rule for the parent's width (config/size_rules.py), said in the log."""
    if cfg.optim.lr:
        return
    from smelt.config.size_rules import posttrain_lr_rule, rule_posttrain_lr

    cfg.optim.lr = rule_posttrain_lr(name, int(model_config["d_model"]))
    log(f"[{name}] optim.lr = {cfg.optim.lr:.3g}, by the rule {posttrain_lr_rule(name)} for d_model "
        f"{model_config['d_model']} (set optim.lr to choose another)")  # fmt: skip


def begin(stage: Stage, split: Split) -> None:
    """Lay out the run directory (once the input is read): a previous run's train/ moved aside under
    --force, the parent's tokenizer and config, train/run.json, train/dropped.jsonl (the input records
    dropped, with reasons) and the metrics log."""
    cfg, name, out_dir, device = stage.cfg, stage.name, stage.out_dir, stage.device
    if not stage.is_main:  # rank 0 writes the run directory; the others wait for it
        _barrier(stage)
        return
    if committed_checkpoints(out_dir / "train") and stage.force:
        moved = move_aside(out_dir / "train", out_dir)
        log(f"[{name}] the previous {out_dir / 'train'} was moved to {moved}")
    parent, tokenizer = stage.parent, stage.tokenizer
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(parent.run_dir / "tokenizer", out_dir / "tokenizer", dirs_exist_ok=True)
    if (parent.run_dir / "config.json").is_file():
        shutil.copyfile(parent.run_dir / "config.json", out_dir / "config.json")
    stage.train_dir.mkdir(parents=True, exist_ok=True)
    write_json(stage.train_dir / "run.json", {
        "stage": name, "posttrain_config": cfg.to_dict(), "config_hash": hash_json(cfg.to_dict()),
        "parent": parent.record(), "model_config": stage.model_config(), "vocab_size": tokenizer.vocab_size,
        "tokenizer_hash": tokenizer.hash, "code": code_version(), "libraries": library_versions(),
        "device": str(device), "precision": stage.precision.name, "host_memory": stage.host_memory,
        **split.stats(),
    })  # fmt: skip
    (stage.train_dir / "dropped.jsonl").unlink(missing_ok=True)  # an earlier attempt's
    if split.dropped_records:
        with open(stage.train_dir / "dropped.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in split.dropped_records)
        log(f"[{name}] {sum(split.dropped.values())} input records teach nothing and were dropped "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(split.dropped.items()))}); see "
            f"{stage.train_dir / 'dropped.jsonl'}")  # fmt: skip
    if split.contaminated:
        log(
            f"[{name}] {split.contaminated} held-out items whose prompt the training data contains were dropped"
        )
    metrics = stage.train_dir / METRICS
    if stage.resume_from is not None:
        meta = read_meta(stage.resume_from, verify=False)
        step = int(meta["step"])
        moved = supersede_after_resume(metrics, step, meta.get("metrics_offset"), step >= cfg.optim.steps)
        log(f"[{name}] resuming from {stage.resume_from} (step {step})"
            + (f"; {moved} later records moved to metrics.superseded.jsonl" if moved else ""))  # fmt: skip
    else:
        announce_restart(stage)
    stage.metrics = MetricsLog(metrics, append=stage.resume_from is not None)
    _barrier(stage)


def _barrier(stage: Stage) -> None:
    if stage.ctx.distributed:
        torch.distributed.barrier()


def announce_restart(stage: Stage) -> None:
    """Say plainly that an earlier attempt stopped before its first checkpoint is not resumed: this one
    starts over from step 0 (the earlier records move to metrics.jsonl.1)."""
    metrics = stage.train_dir / METRICS
    if not metrics.is_file() or committed_checkpoints(stage.train_dir):
        return
    steps = [r.get("step", 0) for r in read_records(metrics) if r.get("kind") == "train"]
    reached = f"after step {max(steps)}" if steps else "before its first logged step"
    log(f"[{stage.name}] an earlier attempt in {stage.train_dir} stopped {reached}, before its first "
        f"checkpoint: this one starts over from step 0, and the earlier records move to {metrics.name}.1 "
        f"(optim.checkpoint_every sets how often a stage saves).")  # fmt: skip


def make_optimizer(stage: Stage, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
    """AdamW (the pretraining optimizer: decay on matmul weights only, betas 0.9/0.95)."""
    o = stage.cfg.optim
    train = TrainConfig(lr=o.lr, weight_decay=o.weight_decay, grad_clip=o.grad_clip)
    return build_optimizer(model or stage.model, train, stage.device)


def make_schedule(stage: Stage) -> Schedule:
    o = stage.cfg.optim
    warmup = o.warmup_steps or max(1, round(0.05 * o.steps))
    return Schedule(kind=o.schedule, lr=o.lr, warmup=min(warmup, o.steps), total_steps=o.steps,
                    min_lr_ratio=o.min_lr_ratio, decay_shape="linear")  # fmt: skip


def optimizer_step(
    stage: Stage, optimizer: torch.optim.Optimizer, lr: float, params: list[torch.nn.Parameter] | None = None
) -> float:
    """Clip to optim.grad_clip by the global norm (the pretraining rule), step, zero; returns the norm."""
    params = [p for p in (params or list(stage.model.parameters())) if p.grad is not None]
    norm = global_grad_norm(params, stage.sharded)
    clip = stage.cfg.optim.grad_clip
    if clip > 0 and bool(torch.isfinite(norm)):
        clip_grads_(params, norm, clip)
    set_lr(optimizer, lr)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def start_event(stage: Stage, steps: int, **extra: Any) -> None:
    params = sum(p.numel() for p in stage.model.parameters())
    if stage.resume_from is not None:
        return  # the start event is in metrics.jsonl already, before the resume's checkpoint
    stage.log_record({
        "kind": "event", "event": "start", "step": 0, "tokens": 0, "stage": stage.name, "steps": steps,
        "parent": stage.parent.record(), "params_total": params, "device": str(stage.device),
        "precision": stage.precision.name, "config_hash": hash_json(stage.cfg.to_dict()), **extra,
    })  # fmt: skip


def finish(stage: Stage, loop: Any, step: int, summary: dict[str, Any]) -> dict[str, Any]:
    """Save the final checkpoint (kept when a resume found it written), write RUN/summary.json and the end
    event; returns the summary."""
    try:
        checkpoint = checkpoint_at_step(loop.checkpoints_dir, step)
    except UserError:
        checkpoint = loop.save(step)
    out = {
        "stage": stage.name, "run_dir": str(stage.out_dir), "checkpoint": str(checkpoint),
        "parent": str(stage.parent.checkpoint), "steps": step, "tokens": stage.tokens,
        "tokens_per_s": round(stage.tokens_per_s(), 1), "train_time_s": round(stage.train_seconds, 2),
        "wall_time_s": round(stage.wall_seconds(), 2), "world_size": stage.world_size,
        "resumed_from_step": loop.start_step or None, **summary,
    }  # fmt: skip
    stage.log_record({"kind": "event", "event": "end", "step": step, "tokens": stage.tokens,
                      "wall_time_s": out["wall_time_s"]})  # fmt: skip
    if stage.metrics is not None:
        stage.metrics.close()
    if stage.is_main:
        from smelt.posttrain.report import write_report

        write_json(stage.out_dir / "summary.json", out)
        out["report"] = str(write_report(stage.out_dir))
        write_json(stage.out_dir / "summary.json", out)
    return out


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}
