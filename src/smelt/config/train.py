"""`[train]`: the trainer's keys (the schedule, batch and optimizer, precision and compile, parallel
layout, monitors, alerts and telemetry). Imported from `smelt.config` like every section."""

from __future__ import annotations

from dataclasses import dataclass

from smelt.config.fields import option

# How the processes of a launch split the work: the parallel degrees and strategy. With the world size
# (never a key) they are the run's layout, not its plan: the global batch (train.batch_tokens), the data
# order and the model are the same under any of them, and DCP reshards a checkpoint onto the new layout,
# so an interrupted run resumes under any layout that fits (docs/distributed.md). train.micro_batch
# stays in the plan: MoE balancing losses and expert capacity are per micro batch, and with
# train.batch_tokens = 0 it sets the global batch.
LAYOUT_KEYS = frozenset(
    {
        "parallel",
        "data_parallel",
        "tensor_parallel",
        "pipeline_parallel",
        "pipeline_schedule",
        "context_parallel",
        "expert_parallel",
    }
)


@dataclass
class TrainConfig:
    seq_len: int = option(256, range=(8, 10**7))
    micro_batch: int = option(16, range=(1, 10**6), help="sequences per forward/backward per process")
    batch_tokens: int = option(
        0, range=(0, 10**10), help="global batch in tokens (0: seq_len x micro_batch x world size)"
    )
    tokens: int = option(10_000_000, range=(1, 10**15), help="total training tokens")
    batch_ramp_tokens: int = option(
        0, range=(0, 10**15), help="grow the batch linearly over this many tokens (0: no ramp)"
    )
    batch_ramp_start: int = option(
        0,
        range=(0, 10**10),
        help="starting global batch in tokens of a ramp (0: seq_len x micro_batch x world)",
    )
    lr: float = option(3e-3, range=(0.0, 10.0))
    min_lr_ratio: float = option(0.1, range=(0.0, 1.0), help="cosine floor as a fraction of lr")
    warmup_tokens: int = option(0, range=(0, 10**15), help="linear warmup (0: 2% of tokens)")
    weight_decay: float = option(0.1, range=(0.0, 10.0))
    beta1: float = option(0.9, range=(0.0, 1.0))
    beta2: float = option(0.95, range=(0.0, 1.0))
    eps: float = option(1e-8, range=(0.0, 1.0))
    grad_clip: float = option(1.0, range=(0.0, 1e6), help="global-norm clip (0: off)")
    precision: str = option(
        "auto",
        choices=("auto", "bf16", "fp16", "fp32"),
        help="auto: bf16 autocast where the hardware has it, else fp32",
    )
    device: str = option("auto", help="auto, cpu, cuda or cuda:N")
    threads: int = option(
        0, range=(0, 1024), help="CPU threads for torch (0: OMP_NUM_THREADS if set, else one per core)"
    )
    compile: bool | str = option(
        "auto",
        choices=(False, True, "auto"),
        help="torch.compile the model: true, false, or auto (on for a dense single-process run long enough "
        "to win back the compile time); compiled kernels are cached in ~/.cache/smelt/inductor",
    )
    deterministic: bool = option(
        False,
        help="deterministic kernels (torch.use_deterministic_algorithms, cuBLAS workspace :4096:8): a resumed "
        "CUDA run then repeats an uninterrupted one bit for bit, at some speed",
    )
    loss_chunk_tokens: int = option(
        0,
        range=(0, 10**9),
        help="LM head + cross-entropy this many tokens at a time, never the whole batch's fp32 logits "
        "(0: the whole batch)",
    )
    keep_host_memory: bool = option(
        True,
        help="keep freed host memory for reuse (glibc malloc settings) instead of returning it to the OS "
        "and faulting it in again every step: a CPU run's large per-step tensors reuse the same pages",
    )
    log_every: int = option(10, range=(1, 10**9), help="steps between train-metric lines")
    eval_every: int = option(100, range=(0, 10**9), help="steps between validation losses (0: end only)")
    eval_tokens: int = option(
        65_536, range=(0, 10**12), help="validation tokens per evaluation, split evenly over the sources (0: all)"
    )  # fmt: skip
    eval_budget: float = option(
        0.1, range=(0.0, 1.0),
        help="share of the training time periodic validation may take; evaluations that would exceed it "
        "are skipped (0: no budget)",
    )  # fmt: skip
    doc_masking: bool = option(
        True, help="attend only within each document of a packed sequence; positions restart per document"
    )
    parallel: str = option(
        "ddp", choices=("ddp", "fsdp"), help="data parallelism under torchrun: DDP or FSDP2 (fully_shard)"
    )
    expert_parallel: int = option(
        1,
        range=(1, 4096),
        help="MoE experts split over this many processes (1: off; else the world size, fsdp)",
    )
    tensor_parallel: int = option(
        1, range=(1, 1024), help='tensor-parallel degree, the "tp" mesh dimension (1: off)'
    )
    data_parallel: int = option(
        0,
        range=(0, 10**6),
        help="data-parallel degree (0: every process left, world / (pipeline x context x tensor parallel))",
    )
    pipeline_parallel: int = option(
        1,
        range=(1, 1024),
        help='pipeline-parallel degree, the "pp" mesh dimension: stages of layers (1: off)',
    )
    pipeline_schedule: str = option(
        "1f1b",
        choices=("gpipe", "1f1b", "interleaved_1f1b"),
        help="pipeline schedule of the micro batches (interleaved: two stages of layers per process)",
    )
    context_parallel: int = option(
        1, range=(1, 1024), help='context-parallel degree, the "cp" mesh dimension: sequence chunks (1: off)'
    )
    schedule: str = option(
        "cosine",
        choices=("cosine", "wsd", "constant", "multistep"),
        help="LR after warmup: cosine to the floor, warmup-stable-decay, constant, or step drops",
    )
    decay_fraction: float = option(0.2, range=(0.0, 1.0), help="wsd: share of the steps spent decaying")
    decay_shape: str = option("1-sqrt", choices=("linear", "cosine", "1-sqrt"), help="wsd: decay curve")
    decay_start_step: int = option(
        0, range=(0, 10**12), help="wsd: start the decay at this step (0: from decay_fraction); a branch run"
    )
    milestones: list[float] = option(
        [0.8, 0.9], help="multistep: fractions of the run where the LR is multiplied by step_gamma"
    )
    step_gamma: float = option(0.316, range=(0.0, 1.0), help="multistep: LR factor at each milestone")
    rewarmup_tokens: int = option(
        0, range=(0, 10**15), help="linear re-warmup at each curriculum stage boundary (0: none)"
    )
    optimizer: str = option(
        "adamw", choices=("adamw", "muon"), help="muon: Muon for the matrices in blocks, AdamW for the rest"
    )
    muon_lr: float = option(0.02, range=(0.0, 10.0), help="Muon's LR (its updates are orthogonalised)")
    on_nonfinite: str = option(
        "skip", choices=("log", "skip", "rollback", "stop"), help="action on a NaN/Inf loss or gradient"
    )
    on_loss_spike: str = option(
        "log",
        choices=("log", "skip", "rollback", "stop"),
        help="action on a loss > loss_spike_std above mean",
    )
    on_grad_spike: str = option(
        "skip",
        choices=("log", "skip", "rollback", "stop"),
        help="action on a grad norm > grad_spike_factor x its trailing median",
    )
    loss_spike_std: float = option(5.0, range=(0.0, 1e6), help="loss alert: rolling standard deviations")
    grad_alert_factor: float = option(3.0, range=(1.0, 1e6), help="grad-norm alert (log only) x median")
    grad_spike_factor: float = option(5.0, range=(1.0, 1e6), help="grad-norm spike (action) x median")
    alert_window: int = option(100, range=(2, 10**7), help="steps of history for the alert statistics")
    alert_min_history: int = option(
        20, range=(1, 10**7), help="applied steps after warmup before spike alerts start"
    )
    max_consecutive_skips: int = option(
        5, range=(1, 10**7), help="stop the run after this many skipped steps in a row"
    )
    spike_triage: str = option(
        "auto", choices=("auto", "side", "end", "off"),
        help="replay each loss or gradient spike from the checkpoint before it and label it data or "
        "nondeterministic/hardware: side (a side process while training), end (when training ends), "
        "auto (side on the CPU, end on a GPU) or off (docs/observability.md)",
    )  # fmt: skip
    init_from: str = option(
        "", help="fork: start from this run's checkpoint (RUN, RUN:STEP or a step_NNNNNNN dir); empty: fresh"
    )
    init_optimizer: bool = option(
        False, help="fork: also load the parent's optimizer moments (default: weights only)"
    )
    fork_data: str = option(
        "continue",
        choices=("continue", "restart"),
        help="fork: continue: read on from where the parent's data stream stood at its checkpoint (each "
        "source's order continued, sources new to the fork from their start); restart: this run's data from "
        "its beginning, reusing what the parent trained on",
    )
    monitor_every: int = option(
        -1, range=(-1, 10**9),
        help="steps between per-parameter update/weight ratios and norms (-1: every train.telemetry_every; 0: off)",
    )  # fmt: skip
    telemetry_every: int = option(
        100, range=(0, 10**9),
        help="steps between activation RMS, kurtosis, max attention and output logits and Adam moment RMS "
        "(docs/observability.md; 0: off)",
    )  # fmt: skip
    alert_val_regression: float = option(
        0.01, range=(0.0, 1e6), help="alert: validation loss this many nats above its best (0: off)"
    )
    alert_domain_rise: float = option(
        0.005, range=(0.0, 1e6),
        help="alert: one source's validation loss up this many nats since the last eval while the total falls (0: off)",
    )  # fmt: skip
    alert_loader_wait: float = option(
        0.03, range=(0.0, 1.0),
        help="alert: the last alert_window steps waited for data this share of their time (0: off)",
    )  # fmt: skip
    alert_clip_rate: float = option(
        0.02, range=(0.0, 1.0), help="alert: this share of the last alert_window steps clipped (0: off)"
    )
    alert_update_ratio_max: float = option(
        1e-2, range=(0.0, 1e6), help="alert: a parameter's update ratio above this after warmup (0: off)"
    )
    alert_update_ratio_min: float = option(
        1e-5, range=(0.0, 1e6), help="alert: a parameter's update ratio below this after warmup (0: off)"
    )
    alert_throughput_drop: float = option(
        0.2, range=(0.0, 1.0),
        help="alert: a log window's tokens/s this fraction below the median over the alert_window steps before (0: off)",
    )  # fmt: skip
    alert_moe_load: float = option(
        1.3, range=(0.0, 1e6), help="alert: an MoE layer's busiest expert over mean load above this (0: off)"
    )
    tensorboard: bool = option(False, help="also write metrics to TensorBoard under RUN/train/tensorboard")
    wandb_project: str = option("", help="also log metrics to this W&B project (empty: off)")
    wandb_mode: str = option(
        "offline", choices=("offline", "online"), help="offline: sync later with `wandb sync`"
    )
    watchdog_s: float = option(
        0.0, range=(0.0, 1e7),
        help="end the run (exit 124, every thread's stack in RUN/train/watchdog.log) when no step, eval or "
        "save finishes for this many seconds (0: off)",
    )  # fmt: skip
    straggler_ratio: float = option(
        1.5, range=(0.0, 1e6),
        help="straggler alert: a rank's own time per step (p50 over a log window) above this x the median "
        "rank's (0: off)",
    )  # fmt: skip
    expect: str = option(
        "", help="a fit.json from `smelt scaling fit --target`: its predicted loss curve is stored in the run's "
        "manifest, and an alert fires when validation leaves its band (empty: off; docs/observability.md)",
    )  # fmt: skip
    expect_tolerance_tokens: int = option(
        0, range=(0, 10**15), help="alert when the smoothed validation loss stays outside the expected band "
        "this many tokens (0: 5% of train.tokens)",
    )  # fmt: skip
