"""What a training run is assembled from, apart from the loop: the device, vocabulary and data checks,
the checkpoint to resume from, the LR schedule and alert policy, metric sinks, in-loop evaluation,
the run manifest, and small figures the loop logs."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from smelt.checkpoint.store import latest_valid_checkpoint
from smelt.config import Config, TrainConfig, hash_json
from smelt.errors import ConfigError, UserError
from smelt.manifest import write_json
from smelt.metric_records import METRICS, read_records
from smelt.tokenizer.load import SMELT_JSON, read_info
from smelt.tokens.shards import has_shards
from smelt.train.alerts import AlertPolicy
from smelt.train.batching import BatchPlan
from smelt.train.parallel.distributed import DistContext, rank_seed
from smelt.train.schedule import Schedule, warmup_steps


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


def set_deterministic(enabled: bool) -> None:
    """train.deterministic: kernels that reduce in a fixed order, so that a resumed run repeats an
    uninterrupted one bit for bit on CUDA too. cuBLAS needs its workspace pinned before its first use
    (the variable is read when the handle is created), so this runs before any CUDA work."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)  # a kernel without one warns, once
    torch.backends.cudnn.benchmark = False


def read_vocab_size(tokenizer_dir: Path) -> int:
    path = Path(tokenizer_dir) / SMELT_JSON
    try:
        return int(read_info(tokenizer_dir)["vocab_size"])
    except (KeyError, ValueError) as exc:
        raise UserError(
            f"cannot read the padded vocab size from {path} ({exc}). Train the tokenizer first "
            f"(`smelt tokenizer train CONFIG`) or point the trainer at its directory."
        ) from exc


def check_token_inputs(
    tokens_dir: Path, tokenizer_dir: Path, tokens_meta: dict[str, Any], model_vocab: int
) -> None:
    """Token shards, tokenizer and model must agree on the vocabulary: shards made by another or a
    larger tokenizer would train on the wrong ids (or index past the embedding)."""
    info = read_info(tokenizer_dir, required=False)
    shard_vocab, tok_vocab = tokens_meta.get("vocab_size"), info.get("vocab_size")
    if shard_vocab is not None and tok_vocab is not None and not shard_vocab == tok_vocab == model_vocab:
        raise UserError(
            f"vocabulary mismatch: the token shards in {tokens_dir} were made with {shard_vocab} ids, the "
            f"tokenizer in {tokenizer_dir} has {tok_vocab}, the model embeds {model_vocab}. Re-tokenize with "
            f"the current tokenizer (`smelt tokenize CONFIG`, or `smelt run CONFIG` for the whole chain)."
        )
    made_with, current = tokens_meta.get("tokenizer_hash"), info.get("hash")
    if made_with and current and made_with != current:
        raise UserError(
            f"the token shards in {tokens_dir} were made by another tokenizer ({made_with[:12]}) than the "
            f"one in {tokenizer_dir} ({current[:12]}): the tokenizer was retrained after `smelt tokenize`. "
            f"Run `smelt tokenize CONFIG` (or `smelt run CONFIG`) to refresh the shards."
        )


def has_tokens(split_dir: Path) -> bool:
    return has_shards(split_dir)


def resolve_resume(resume: str | Path | None, checkpoints_dir: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from and warnings: None (fresh run), "auto" or a checkpoint directory.

    "auto" takes the newest checkpoint whose files match their checksums, passing over damaged ones
    with a warning each; none at all means a fresh start.
    """
    if resume is None:
        return None, []
    if str(resume) == "auto":
        return latest_valid_checkpoint(checkpoints_dir)
    path = Path(resume)
    if not path.is_dir():
        raise UserError(
            f"cannot resume from {path}: no such checkpoint directory. Pass 'auto' or a step_NNNNNNN dir."
        )
    return path, []


def agreed_resume(
    resume: str | Path | None, checkpoints_dir: Path, ctx: DistContext
) -> tuple[Path | None, list[str]]:
    # Rank 0 verifies and chooses; every rank must load the same checkpoint.
    choice: list[Any] = [resolve_resume(resume, checkpoints_dir) if ctx.is_main else None]
    if ctx.distributed:
        torch.distributed.broadcast_object_list(choice, src=0)
    return choice[0]


def file_hash(path: Path) -> str | None:
    from smelt.manifest import hash_file

    return hash_file(path) if path.is_file() else None


def alert_policy(tc: TrainConfig, warmup: int) -> AlertPolicy:
    # Grad norms grow and swing while the learning rate ramps and the model leaves its init; spike
    # statistics start only after warmup, or early learning would be skipped as "spikes".
    return AlertPolicy(
        window=tc.alert_window,
        min_history=tc.alert_min_history + warmup,
        loss_std=tc.loss_spike_std,
        grad_alert_factor=tc.grad_alert_factor,
        grad_spike_factor=tc.grad_spike_factor,
        on_nonfinite=tc.on_nonfinite,
        on_loss_spike=tc.on_loss_spike,
        on_grad_spike=tc.on_grad_spike,
        max_consecutive_skips=tc.max_consecutive_skips,
    )


def build_schedule(tc: TrainConfig, plan: BatchPlan, stage_first_steps: list[int]) -> Schedule:
    """The run's LR schedule; stage_first_steps are the 1-based first steps of every stage."""
    warmup = (
        plan.step_at_tokens(tc.warmup_tokens or 0.02 * tc.tokens)
        if plan.units
        else warmup_steps(tc.warmup_tokens, tc.tokens, plan.batch_tokens, plan.steps)
    )
    rewarmup = round(tc.rewarmup_tokens / plan.batch_tokens) if tc.rewarmup_tokens else 0
    try:
        return Schedule(
            kind=tc.schedule, lr=tc.lr, warmup=warmup, total_steps=plan.steps, min_lr_ratio=tc.min_lr_ratio,
            decay_fraction=tc.decay_fraction, decay_shape=tc.decay_shape, decay_start=tc.decay_start_step,
            milestones=tuple(tc.milestones), gamma=tc.step_gamma, rewarmup=max(rewarmup, 1 if rewarmup else 0),
            stage_starts=tuple(first - 1 for first in stage_first_steps if first > 1),
        )  # fmt: skip
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def write_run_manifest(
    out_dir: Path,
    cfg: Config,
    identity: dict[str, Any],
    resume_from: Path | None,
    start_step: int,
    world_size: int,
    device: torch.device,
    precision: str,
    expected: dict[str, Any] | None = None,
) -> None:
    """out_dir/run.json: what this run is (config, data, tokenizer, code, environment, devices, seeds,
    the pre-registered loss trajectory of train.expect); every resume appends where and how it
    continued (and a trajectory first registered at a resume, or another one)."""
    import platform

    from smelt.manifest import code_version, library_versions

    launch = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": start_step,
        "checkpoint": str(resume_from) if resume_from is not None else None, "world_size": world_size,
        "device": str(device), "precision": precision, "code": code_version(),
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if device.type == "cuda" else [platform.processor() or platform.machine()],
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "hostname": platform.node()},
    }  # fmt: skip
    path = out_dir / "run.json"
    if resume_from is not None and path.is_file():
        manifest = json.loads(path.read_text())
        if expected is not None and manifest.get("expected_trajectory") != expected:
            launch["expected_trajectory"] = expected
        manifest.setdefault("resumes", []).append(launch)
    else:
        config = cfg.to_dict()
        manifest = {
            "config": config, "config_hash": hash_json(config), **identity,
            "libraries": library_versions(),
            "seeds": {"run": cfg.run.seed, "rank_train": [rank_seed(cfg.run.seed, r, "train") for r in range(world_size)]},
            "launch": launch, **({"expected_trajectory": expected} if expected is not None else {}),
        }  # fmt: skip
    write_json(path, manifest)


def last_logged_loss(out_dir: Path) -> float:
    """The train loss of the last record already in metrics.jsonl (a run resumed at its end)."""
    loss = float("nan")
    for record in read_records(out_dir / METRICS):
        if record.get("kind") == "train" and record.get("loss") is not None:
            loss = float(record["loss"])
    return loss


def metric_sinks(cfg: Config, out_dir: Path) -> list:
    """TensorBoard and W&B writers the config asks for (rank 0 only)."""
    from smelt.train.sinks import TensorBoardSink, WandbSink

    sinks: list = []
    if cfg.train.tensorboard:
        sinks.append(TensorBoardSink(out_dir / "tensorboard"))
    if cfg.train.wandb_project:
        sinks.append(
            WandbSink(
                cfg.train.wandb_project, cfg.run.name, out_dir / "wandb", cfg.train.wandb_mode, cfg.to_dict()
            )
        )
    return sinks


def inloop_evaluator(cfg: Config, tokenizer_dir: Path, device: torch.device, last_step: int = 0) -> Any:
    """Benchmark subsets scored during training when eval.every_steps is set, and the contamination
    meter at checkpoints with eval.contamination_inloop (tasks read once, here)."""
    if not cfg.eval.every_steps and not cfg.eval.contamination_inloop:
        return None
    from smelt.eval.inloop import InLoopEval

    return InLoopEval(cfg, tokenizer_dir, device, last_step)


def losses_by_source(sources: list[str], sums: torch.Tensor) -> dict[str, Any]:
    """{"loss_by_source": {source: token-mean cross-entropy}} over a logging window (several sources only)."""
    if len(sources) < 2:
        return {}
    return {"loss_by_source": {s: ce / n for s, (ce, n) in zip(sources, sums.tolist(), strict=True) if n > 0}}


def clipped_norm(norm: float, clip: float) -> float | None:
    if not math.isfinite(norm):
        return None
    return min(norm, clip) if clip > 0 else norm


def memory_mb(device: torch.device) -> float | None:
    """Peak accelerator memory on CUDA, else this process's peak RSS (what limits a CPU run)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except ImportError:  # not on POSIX
        return None


def torch_threads() -> int:
    """train.threads = 0: OMP_NUM_THREADS where set (torchrun sets 1 per process, a test runner one per
    worker), else one per core. Threads that add up to more than the cores slow each other far more than
    their share."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)
