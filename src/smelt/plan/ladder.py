"""`smelt ladder CONFIG`: a proxy ladder of small models, trained here or launched on a cluster,
whose final losses feed `smelt scaling fit`.

Two designs: a Chinchilla ladder (4-6 sizes, each trained on ~20 tokens per parameter, optionally at
several multiples of that budget so that the fit can tell the N term from the D term), or an IsoFLOP grid
(a few compute levels, several sizes each, D = C / 6N). Sizes keep the base model's head dimension,
GQA group and depth-to-width ratio; N counts non-embedding parameters, as the fit does.

Every rung is a run directory under RUN/ladder/ that trains on the base run's data: its documents,
tokenizer and tokens directories are links to the base run's, so the data stages run once and each rung's
train stage is cached and reproducible like any other (`smelt eval RUNG` works on it too).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt.config import Config, ModelConfig
from smelt.errors import UserError
from smelt.manifest import read_manifest, write_json
from smelt.model.flops import count_params
from smelt.tokenizer.load import read_info

DATA_STAGES = ("curate", "tokenizer", "tokenize")
LINKED = ("documents", "tokenizer", "tokens")
LADDER_DIR = "ladder"


@dataclass(frozen=True)
class Rung:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    params: int  # non-embedding
    tokens: int

    @property
    def compute(self) -> float:
        return 6.0 * self.params * self.tokens

    def overrides(self) -> dict[str, Any]:
        """The config keys this rung changes, as `section.key` -> value."""
        return {
            "model.d_model": self.d_model,
            "model.n_layers": self.n_layers,
            "model.n_heads": self.n_heads,
            "model.n_kv_heads": self.n_kv_heads,
            "model.d_ff": 0,
            "train.tokens": self.tokens,
        }


def _model_for(base: ModelConfig, d: int, layers: int, head_dim: int, group: int) -> ModelConfig:
    heads = max(1, d // head_dim)
    kv = heads // group if heads % group == 0 and heads >= group else heads
    return dataclasses.replace(
        base, preset="", d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv, d_ff=0
    )


def shape_for(base: ModelConfig, target: float, vocab_size: int) -> ModelConfig:
    """The shape nearest `target` non-embedding parameters with the base's head size, GQA group and
    width-to-depth ratio (log distance in N, plus a quarter of the log distance in d / L)."""
    head_dim = base.d_model // base.n_heads
    group = base.n_heads // (base.n_kv_heads or base.n_heads)
    ratio = base.d_model / base.n_layers
    best: tuple[float, ModelConfig] | None = None
    for k in range(1, 513):
        d = k * head_dim
        one = _non_embedding(_model_for(base, d, 1, head_dim, group), vocab_size)
        if one > 4 * target and best is not None:
            break
        two = _non_embedding(_model_for(base, d, 2, head_dim, group), vocab_size)
        per_layer, fixed = two - one, 2 * one - two
        guess = max(1, round((target - fixed) / per_layer))
        for layers in sorted({max(1, guess - 1), guess, guess + 1}):
            n = fixed + layers * per_layer
            score = abs(math.log(n / target)) + 0.25 * abs(math.log((d / layers) / ratio))
            if best is None or score < best[0]:
                best = (score, _model_for(base, d, layers, head_dim, group))
    assert best is not None
    return best[1]


def _non_embedding(cfg: ModelConfig, vocab_size: int) -> int:
    """Non-embedding parameters as the trainer reports them (an untied output head counts)."""
    return count_params(cfg, vocab_size)["non_embedding"]


def _round_tokens(tokens: float, batch_tokens: int) -> int:
    return max(batch_tokens, int(math.ceil(tokens / batch_tokens)) * batch_tokens)


def _rung(cfg: ModelConfig, tokens: float, vocab: int, batch: int, index: int) -> Rung:
    params = _non_embedding(cfg, vocab)
    d = _round_tokens(tokens, batch)
    name = f"r{index:02d}-n{_short(params)}-d{_short(d)}"
    return Rung(name, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads or cfg.n_heads, params, d)


def _short(x: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.0f}"


def chinchilla_ladder(
    base: ModelConfig,
    vocab_size: int,
    batch_tokens: int,
    *,
    sizes: int = 5,
    min_params: float | None = None,
    max_params: float | None = None,
    tokens_per_param: float = 20.0,
    multipliers: tuple[float, ...] = (1.0,),
) -> list[Rung]:
    """`sizes` log-spaced sizes from min to max params (default: the base model and 1/32 of it), each
    at tokens_per_param x N tokens times every multiplier."""
    if not 2 <= sizes <= 12:
        raise UserError(f"--sizes must be between 2 and 12 (4-6 is the usual ladder); got {sizes}.")
    if tokens_per_param <= 0 or any(m <= 0 for m in multipliers):
        raise UserError("--tokens-per-param and every --token-multipliers value must be positive.")
    top = max_params or _non_embedding(base, vocab_size)
    bottom = min_params or top / 32.0
    if not 0 < bottom < top:
        raise UserError(f"--min-params ({bottom:g}) must be positive and below --max-params ({top:g}).")
    targets = [bottom * (top / bottom) ** (i / (sizes - 1)) for i in range(sizes)]
    rungs: list[Rung] = []
    seen: set[tuple[int, int, int]] = set()
    for target in targets:
        shape = shape_for(base, target, vocab_size)
        params = _non_embedding(shape, vocab_size)
        for m in multipliers:
            tokens = _round_tokens(tokens_per_param * m * params, batch_tokens)
            key = (shape.d_model, shape.n_layers, tokens)
            if key in seen:
                continue
            seen.add(key)
            rungs.append(_rung(shape, tokens_per_param * m * params, vocab_size, batch_tokens, len(rungs)))
    return rungs


def isoflop_ladder(
    base: ModelConfig,
    vocab_size: int,
    batch_tokens: int,
    *,
    computes: list[float],
    sizes: int = 5,
    spread: float = 4.0,
) -> list[Rung]:
    """For each compute C, `sizes` models log-spaced from N*/spread to N* x spread around the Chinchilla
    size N* = sqrt(C / 120), each trained on D = C / (6 N)."""
    if not computes or any(c <= 0 for c in computes):
        raise UserError("--computes needs one or more positive FLOP budgets, e.g. --computes 1e14,3e14,1e15.")
    if sizes < 3:
        raise UserError(f"an IsoFLOP profile needs at least 3 sizes per compute; got --sizes {sizes}.")
    rungs: list[Rung] = []
    for compute in sorted(computes):
        center = math.sqrt(compute / 120.0)
        shapes: set[tuple[int, int]] = set()
        for i in range(sizes):
            target = center / spread * (spread * spread) ** (i / (sizes - 1))
            shape = shape_for(base, target, vocab_size)
            if (shape.d_model, shape.n_layers) in shapes:  # tiny sizes can round to the same shape
                continue
            shapes.add((shape.d_model, shape.n_layers))
            params = _non_embedding(shape, vocab_size)
            rungs.append(_rung(shape, compute / (6.0 * params), vocab_size, batch_tokens, len(rungs)))
    return rungs


def ladder_dir(cfg: Config) -> Path:
    return cfg.run_dir / LADDER_DIR


def rung_config(cfg: Config, rung: Rung) -> Config:
    """The base config with this rung's shape, token budget and run directory."""
    warmup = cfg.train.warmup_tokens
    if warmup:  # keep the base run's warmup share of the schedule
        warmup = int(round(warmup / cfg.train.tokens * rung.tokens))
    # ... and its number of validations, so every rung logs a curve (`smelt scaling fit --target`)
    every = cfg.train.eval_every and max(1, round(cfg.train.eval_every * rung.tokens / cfg.train.tokens))
    model = dataclasses.replace(
        cfg.model,
        preset="",
        d_model=rung.d_model,
        n_layers=rung.n_layers,
        n_heads=rung.n_heads,
        n_kv_heads=rung.n_kv_heads,
        d_ff=0,
    )
    train = dataclasses.replace(cfg.train, tokens=rung.tokens, warmup_tokens=warmup, eval_every=every)
    run = dataclasses.replace(cfg.run, dir=str(ladder_dir(cfg)), name=rung.name)
    return dataclasses.replace(cfg, model=model, train=train, run=run)


def prepare_rung(cfg: Config, rung: Rung) -> Config:
    """Create the rung's run directory, with relative links to the base run's data stages."""
    rcfg = rung_config(cfg, rung)
    directory = rcfg.run_dir
    directory.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = directory / name
        target = Path(os.path.relpath(cfg.run_dir / name, directory))
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                continue
            link.unlink()
        elif link.exists():
            raise UserError(f"{link} exists and is not a link to the base run's {name}; remove it and rerun.")
        link.symlink_to(target, target_is_directory=True)
    write_json(directory / "config.json", rcfg.to_dict())
    return rcfg


RDZV_PORT = 29500


def launcher(gpus_per_run: int, gpus_per_node: int, rdzv_id: str, slurm: bool = False) -> str:
    """torchrun for one rung: standalone when it fits one node, else one agent per node meeting over a c10d
    rendezvous at the first node ($MASTER_ADDR: set it on every node, or let the Slurm script set it)."""
    if gpus_per_run <= gpus_per_node:
        return f"torchrun --standalone --nproc-per-node {gpus_per_run} -m smelt.cli"
    if gpus_per_run % gpus_per_node:
        raise UserError(
            f"--gpus-per-run {gpus_per_run} spans nodes of --gpus-per-node {gpus_per_node} but is not a multiple "
            f"of it; use whole nodes ({gpus_per_run // gpus_per_node * gpus_per_node} or "
            f"{(gpus_per_run // gpus_per_node + 1) * gpus_per_node})."
        )
    nodes = '"$SLURM_NNODES"' if slurm else str(gpus_per_run // gpus_per_node)
    endpoint = f'"$MASTER_ADDR:{RDZV_PORT}"' if slurm else f'"${{MASTER_ADDR:?the first node}}:{RDZV_PORT}"'
    rdzv_id = '"$SLURM_JOB_ID"' if slurm else shlex.quote(rdzv_id)
    return (
        f"{'srun ' if slurm else ''}torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint {endpoint} --rdzv-id {rdzv_id} -m smelt.cli"
    )


def train_commands(
    cfg: Config,
    config_path: str,
    overrides: list[str],
    rungs: list[Rung],
    gpus_per_run: int,
    gpus_per_node: int = 8,
    slurm: bool = False,
) -> list[str]:
    """One `torchrun ... smelt.cli train` line per rung (run after the data stages and `--prepare`); a rung
    on more GPUs than a node has runs on every node of its launch (see `launcher`)."""
    lines = []
    for rung in rungs:
        command = launcher(gpus_per_run, gpus_per_node, f"smelt-{rung.name}", slurm)
        rcfg = rung_config(cfg, rung)
        sets = [*overrides, f"run.dir={json.dumps(rcfg.run.dir)}", f"run.name={json.dumps(rung.name)}"]
        sets += [f"{k}={v}" for k, v in rung.overrides().items()]
        tc = rcfg.train
        sets += [
            f"train.warmup_tokens={tc.warmup_tokens}",
            f"train.eval_every={tc.eval_every}",
            'model.preset=""',
        ]
        sets += batch_for_ranks(rcfg, gpus_per_run)
        args = " ".join(f"--set {shlex.quote(s)}" for s in sets)
        lines.append(f"{command} train {shlex.quote(config_path)} {args}")
    return lines


def batch_for_ranks(cfg: Config, ranks: int) -> list[str]:
    """Overrides that keep the rung's global batch on `ranks` processes: the same batch_tokens, with a
    micro batch small enough that every data-parallel rank gets whole micro batches (accumulation makes up
    the rest). The ranks of one model replica (tensor x context x pipeline parallel) share their rows.
    Rungs compared in a fit must see the same batch, whatever the hardware they ran on."""
    tc = cfg.train
    replica = tc.tensor_parallel * tc.context_parallel * tc.pipeline_parallel
    if ranks % replica:
        raise UserError(
            f"--gpus-per-run {ranks} is not a multiple of the {replica} processes of one model replica "
            f"(train.tensor_parallel x context_parallel x pipeline_parallel)."
        )
    data_ranks = ranks // replica
    if data_ranks <= 1:
        return []
    seq, micro = tc.seq_len, tc.micro_batch
    batch = tc.batch_tokens or seq * micro
    for size in range(micro, 0, -1):
        if batch % (seq * size * data_ranks) == 0:
            return [f"train.batch_tokens={batch}", f"train.micro_batch={size}"]
    raise UserError(
        f"--gpus-per-run {ranks}: train.batch_tokens = {batch} cannot be split into {data_ranks} data-parallel "
        f"ranks of whole sequences of train.seq_len = {seq}. Use a --gpus-per-run that divides {batch // seq} "
        f"or raise train.batch_tokens."
    )


def data_commands(config_path: str, overrides: list[str]) -> list[str]:
    args = " ".join(f"--set {shlex.quote(s)}" for s in overrides)
    tail = f" {args}" if args else ""
    path = shlex.quote(config_path)
    return [
        f"smelt curate {path}{tail}",
        f"smelt tokenizer train {path}{tail}",
        f"smelt tokenize {path}{tail}",
        f"smelt ladder {path}{tail} --prepare",
    ]


def slurm_script(
    cfg: Config,
    config_path: str,
    overrides: list[str],
    rungs: list[Rung],
    gpus_per_run: int,
    gpus_per_node: int = 8,
) -> str:
    """An sbatch array job, one task per rung, each task on as many nodes as a rung needs. Submit it after
    the data stages have run."""
    commands = train_commands(cfg, config_path, overrides, rungs, gpus_per_run, gpus_per_node, slurm=True)
    nodes = max(1, gpus_per_run // gpus_per_node)
    out_dir = ladder_dir(cfg)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=smelt-ladder-{cfg.run.name}",
        f"#SBATCH --array=0-{len(rungs) - 1}",
        f"#SBATCH --nodes={nodes}",
        *(["#SBATCH --ntasks-per-node=1"] if nodes > 1 else []),
        f"#SBATCH --gpus-per-node={min(gpus_per_run, gpus_per_node)}",
        f"#SBATCH --output={out_dir}/slurm-%A_%a.out",
        "# Before submitting: the data stages and rung directories (see commands.sh, first four lines).",
        "# After the array finishes: smelt scaling fit " + shlex.quote(str(out_dir)),
        "set -euo pipefail",
    ]
    if nodes > 1:  # one torchrun per node (srun), meeting at the first node of the task's allocation
        lines += [
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "export MASTER_ADDR",
        ]
    lines.append('case "$SLURM_ARRAY_TASK_ID" in')
    for i, command in enumerate(commands):
        lines.append(f"  {i}) {command} ;;")
    lines += ['  *) echo "no rung $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    return "\n".join(lines) + "\n"


def available_train_tokens(cfg: Config) -> int | None:
    manifest = read_manifest(cfg.run_dir / "tokens")
    if manifest is None:
        return None
    try:
        return int(manifest["result"]["splits"]["train"]["tokens"])
    except (KeyError, TypeError, ValueError):
        return None


def ladder_warnings(rungs: list[Rung], unique_tokens: int | None, isoflop: bool = False) -> list[str]:
    """Rungs that repeat the data past ~4 epochs, or a design whose fit cannot separate N from D."""
    out = []
    if unique_tokens:
        worst = max(rungs, key=lambda r: r.tokens)
        epochs = worst.tokens / unique_tokens
        if epochs > 4:
            out.append(
                f"rung {worst.name} trains on {worst.tokens:,} tokens, {epochs:.1f} epochs of the "
                f"{unique_tokens:,} unique training tokens: past ~4 epochs the losses no longer follow a "
                f"fresh-data law. Use more data or a smaller ladder (--max-params)."
            )
    levels: dict[float, tuple[float, set[int]]] = {}
    for r in rungs:
        levels.setdefault(round(math.log10(r.compute), 1), (r.compute, set()))[1].add(r.params)
    if isoflop:
        thin = [f"{compute:.3g}" for compute, sizes in levels.values() if len(sizes) < 3]
        if thin:
            out.append(
                f"compute {', '.join(thin)} has fewer than 3 distinct sizes (small shapes round to the same "
                "one), so its IsoFLOP parabola is undetermined: raise those computes or --spread."
            )
    ratios = [r.tokens / r.params for r in rungs]
    if not isoflop and max(ratios) / min(ratios) < 1.5:
        out.append(
            "every rung has the same tokens per parameter, so a fit cannot tell the N term from the D term; "
            "add --token-multipliers (e.g. 0.5,1,2) or use --isoflop for a fit of L(N, D)."
        )
    return out


def plan_table(rungs: list[Rung]) -> str:
    header = (
        f"{'rung':<24} {'d_model':>7} {'layers':>6} {'heads':>5} {'params':>9} {'tokens':>10} "
        f"{'tok/param':>9} {'FLOPs':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in rungs:
        lines.append(
            f"{r.name:<24} {r.d_model:>7} {r.n_layers:>6} {r.n_heads:>5} {r.params:>9,} {r.tokens:>10,} "
            f"{r.tokens / r.params:>9.1f} {r.compute:>10.3g}"
        )
    return "\n".join(lines)


def run_ladder(cfg: Config, rungs: list[Rung], run_stage: Any, force: bool = False) -> list[dict[str, Any]]:
    """Data stages once in the base run, then each rung's train stage; returns each rung's result.
    `run_stage(cfg, stage, force=...)` is the pipeline's (passed in: the planner sits below it)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    write_json(cfg.run_dir / "config.json", cfg.to_dict())
    for stage in DATA_STAGES:
        run_stage(cfg, stage)
    results = []
    for rung in rungs:
        rcfg = prepare_rung(cfg, rung)
        outcome = run_stage(rcfg, "train", force=force)
        result = outcome.result
        results.append(
            {
                "rung": rung.name,
                "params": result.get("params_non_embedding"),
                "tokens": result.get("tokens"),
                "final_val_loss": result.get("final_val_loss"),
                "final_train_loss": result.get("final_train_loss"),
                "skipped": outcome.skipped,
                "wall_time_s": outcome.wall_time_s,
            }
        )
    return results


def write_plan(cfg: Config, rungs: list[Rung], extra: dict[str, Any]) -> Path:
    path = ladder_dir(cfg) / "ladder.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"base_run": str(cfg.run_dir), "rungs": [dataclasses.asdict(r) for r in rungs], **extra})
    return path


def results_table(results: list[dict[str, Any]]) -> str:
    """The table `smelt ladder --run` prints: each rung's size, tokens, losses and time."""
    header = f"{'rung':<24} {'params':>9} {'tokens':>11} {'val loss':>9} {'train loss':>10} {'time':>7}"
    lines = ["", header, "-" * len(header)]
    for r in results:
        val = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "-"
        time_s = "cached" if r["skipped"] else f"{r['wall_time_s']:.0f}s"
        lines.append(
            f"{r['rung']:<24} {r['params'] or 0:>9,} {r['tokens'] or 0:>11,} {val:>9} "
            f"{r['final_train_loss']:>10.4f} {time_s:>7}"
        )
    return "\n".join(lines)


def ladder_vocab(cfg: Config) -> int:
    """The vocabulary of the base run: its trained tokenizer's, else the config's padded size."""
    info = read_info(cfg.run_dir / "tokenizer", required=False)
    if "vocab_size" in info:
        return int(info["vocab_size"])
    pad = cfg.tokenizer.pad_to_multiple
    return int(math.ceil(cfg.tokenizer.vocab_size / pad) * pad)
