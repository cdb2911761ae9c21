"""`smelt plan rehearse CONFIG --gpus N`: the layout `smelt plan memory` recommends for a big run,
launched for real on this machine before the cluster is booked.

The plan's tensor, pipeline and data-parallel degrees are kept where this machine allows (each at most
2, their product at most --procs processes: TP2 x PP2 x DP2 = 8 on a CPU, on gloo); the model keeps its
kind (dense or MoE, GQA, untied head under PP) at a width and depth scaled down to a few layers of 64
wide, so the ranks exchange what the big run's ranks exchange, in miniature. On the config's own token
shards (its tokenize stage must have run) it then:

1. trains a few steps under the rehearsed layout (torchrun, one process per rank), with checkpoints;
2. relaunches under another layout (tensor and data parallelism swapped, or one process), resumes from
   the middle checkpoint (`--resume-from`, resharding it through DCP) and trains to the end;
3. compares the steps both launches trained: the same data and weights under two layouts agree to
   rounding.

Everything goes under RUN/rehearsal/ (RUN being the config's run directory); nothing of the run itself
is touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt.config import Config
from smelt.errors import UserError
from smelt.layout import STAGE_DIRS, checkpoints_dir, list_checkpoints
from smelt.metric_records import METRICS
from smelt.plan.memory import Cluster, ModelShape, Recommendation, recommend

HEAD_DIM = 16
TOLERANCE = 1e-3  # relative, between the two layouts' losses of the same step (fp32 on CPU: ~1e-6)


@dataclass
class Rehearsal:
    planned: dict[str, int]  # the recommended degrees at full size
    rehearsed: dict[str, int]  # what this machine runs
    resharded: dict[str, int]  # the second launch's layout
    model: dict[str, Any]
    steps: int
    resume_at: int
    zero: int  # the plan's ZeRO stage: FSDP2 from 1 up, DDP at 0


def scaled_layout(rec: Recommendation, procs: int) -> dict[str, int]:
    """The plan's degrees, each at most 2, within `procs` processes (TP first, then PP, then DP)."""
    tp = min(rec.layout.tp, 2)
    pp = min(rec.layout.pp, 2, max(1, procs // tp))
    dp = min(rec.layout.dp, 2, max(1, procs // (tp * pp)))
    return {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": dp}


def resharded_layout(layout: dict[str, int]) -> dict[str, int]:
    """Another layout of the same run: TP and DP swapped where they differ, else everything in one process
    but the pipeline stages."""
    tp, pp, dp = layout["tensor_parallel"], layout["pipeline_parallel"], layout["data_parallel"]
    if tp != dp:
        return {"tensor_parallel": dp, "pipeline_parallel": pp, "data_parallel": tp}
    if tp > 1:  # the same processes, all data-parallel
        return {"tensor_parallel": 1, "pipeline_parallel": pp, "data_parallel": tp * dp}
    if pp > 1:
        return {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1}
    return {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 2}


def plan_rehearsal(cfg: Config, shape: ModelShape, cluster: Cluster, batch_tokens: int, procs: int,
                   steps: int) -> tuple[Rehearsal, Recommendation]:  # fmt: skip
    rec = recommend(shape, cluster, seq_len=cfg.train.seq_len, global_batch_tokens=batch_tokens)
    layout = scaled_layout(rec, procs)
    tp, pp = layout["tensor_parallel"], layout["pipeline_parallel"]
    heads = 4 if tp <= 2 else 2 * tp
    kv = max(tp, heads * (cfg.model.n_kv_heads or cfg.model.n_heads) // cfg.model.n_heads)
    while heads % kv:
        kv += 1
    model = {
        "d_model": heads * HEAD_DIM, "n_heads": heads, "n_kv_heads": kv, "n_layers": 2 * pp,
        "d_ff": 0, "max_seq_len": 64, "tie_embeddings": cfg.model.tie_embeddings and pp == 1,
    }  # fmt: skip
    if cfg.model.moe_experts:  # an MoE keeps its routing: 4 experts, top-2
        model.update({"moe_experts": 4, "moe_top_k": 2})
    planned = {
        "tensor_parallel": rec.layout.tp,
        "pipeline_parallel": rec.layout.pp,
        "data_parallel": rec.layout.dp,
    }
    return Rehearsal(
        planned, layout, resharded_layout(layout), model, steps, steps // 2, rec.layout.zero
    ), rec


def rehearsal_sets(cfg: Config, plan: Rehearsal, layout: dict[str, int], name: str) -> list[str]:
    """--set overrides that train the rehearsal run NAME under `layout`."""
    dp = plan.rehearsed["data_parallel"] * plan.rehearsed["tensor_parallel"]  # the larger DP of the two
    micro, seq = 2, 32
    per_rank = micro * 2 * plan.rehearsed["pipeline_parallel"]  # micro batches for the pipeline to fill
    batch = per_rank * seq * dp
    keys: dict[str, Any] = {
        "run.dir": str(cfg.run_dir / "rehearsal"), "run.name": name,
        **{f"model.{k}": v for k, v in plan.model.items()}, "model.preset": "",
        "train.parallel": "fsdp" if plan.zero else "ddp", **{f"train.{k}": v for k, v in layout.items()},
        "train.seq_len": seq, "train.micro_batch": micro, "train.batch_tokens": batch,
        "train.tokens": batch * plan.steps, "train.warmup_tokens": batch, "train.lr": 1e-3,
        "train.precision": "fp32", "train.compile": False, "train.threads": 1, "train.log_every": 1,
        "train.eval_every": 0, "train.device": "cpu", "train.eps": 1e-6,
        "checkpoint.every_steps": plan.resume_at, "checkpoint.keep_last": 3, "checkpoint.async_save": False,
    }  # fmt: skip
    out: list[str] = []
    for key, value in keys.items():
        out += ["--set", f"{key}={json.dumps(value)}"]
    return out


def link_inputs(cfg: Config, run: Path) -> None:
    """The rehearsal run reads the config's documents, tokenizer and tokens (symlinks, never copies)."""
    run.mkdir(parents=True, exist_ok=True)
    for stage in ("curate", "tokenizer", "tokenize"):
        source = cfg.run_dir / STAGE_DIRS[stage]
        if not (source / "manifest.json").is_file():
            raise UserError(
                f"smelt plan rehearse trains on the config's token shards, and {source} has no manifest.json. "
                f"Run `smelt run CONFIG` (or `smelt tokenize CONFIG`) first."
            )
        link = run / STAGE_DIRS[stage]
        if not link.exists():
            link.symlink_to(source.resolve(), target_is_directory=True)


def launch(
    config: Path, sets: list[str], world: int, log: Path, stop_after: tuple[Path, int] | None = None
) -> None:
    """torchrun of `smelt train CONFIG` on `world` processes. `stop_after` (run, step): kill the whole
    launch once that run has committed a checkpoint and logged `step` after it, as a failure would."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node", str(world), "-m", "smelt", "train",
               str(config), *sets]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        while stop_after is not None and proc.poll() is None:
            run, step = stop_after
            logged = losses(run)
            if logged and max(logged) >= step and list_checkpoints(checkpoints_dir(run)):
                os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank: nothing saves on the way out
                proc.wait()
                return
            time.sleep(0.05)
        proc.wait()
    if stop_after is not None:
        raise RuntimeError(
            f"the first launch ended (exit {proc.returncode}) before step {stop_after[1]}; see {log}"
        )
    if proc.returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if "smelt: " in line]
        said = "\n".join(lines[-3:]) or log.read_text(errors="replace")[-1500:]
        message = f"the rehearsal launch stopped (exit {proc.returncode}); its log is {log}. It said:\n{said}"
        if "error:" in said:  # the config or its inputs: the user's to fix
            raise UserError(message)
        raise RuntimeError(message)


def losses(run: Path) -> dict[int, float]:
    """Each step's last logged loss (a resumed launch logs the steps it trained again after the first)."""
    from smelt.metric_records import read_records  # here: `smelt --help` builds this parser without torch

    return {r["step"]: r["loss"] for r in read_records(run / "train" / METRICS) if r.get("kind") == "train"}


def run_rehearsal(config: Path, overrides: list[str], cfg: Config, plan: Rehearsal) -> dict[str, Any]:
    """Both launches of CONFIG with the user's `overrides` (--set), then the rehearsal's; returns their
    figures (raises when a launch fails)."""
    name = f"{cfg.run.name}-rehearsal-{time.strftime('%Y%m%d-%H%M%S')}"
    run = cfg.run_dir / "rehearsal" / name
    link_inputs(cfg, run)
    figures: dict[str, Any] = {"run": str(run)}
    trained: dict[str, dict[int, float]] = {}
    for label, layout, stop_after in (
        ("first", plan.rehearsed, (run, plan.resume_at + 2)),  # killed two steps past its middle checkpoint
        ("resharded", plan.resharded, None),  # resumes from it (train's --resume auto) and trains to the end
    ):
        world = layout["tensor_parallel"] * layout["pipeline_parallel"] * layout["data_parallel"]
        started = time.perf_counter()
        sets = [arg for item in overrides for arg in ("--set", item)] + rehearsal_sets(
            cfg, plan, layout, name
        )
        launch(config, sets, world, run / f"{label}.log", stop_after)
        figures[f"{label}_s"] = round(time.perf_counter() - started, 1)
        figures[f"{label}_processes"] = world
        trained[label] = losses(run)
    first, second = trained["first"], trained["resharded"]
    redone = [s for s in first if s > plan.resume_at]  # trained by both launches, from the same checkpoint
    diffs = [abs(first[s] - second[s]) / max(abs(first[s]), 1e-12) for s in redone]
    summary = json.loads((run / "train" / "summary.json").read_text())
    figures.update({
        "steps": plan.steps, "killed_after_step": max(first), "resumed_from_step": summary.get("resumed_from_step"),
        "finished_steps": max(second), "losses_first": first, "losses_resharded": {s: second[s] for s in redone},
        "steps_compared": len(redone), "max_rel_loss_diff": max(diffs),
        "agree": max(diffs) <= TOLERANCE and max(second) == plan.steps,
    })  # fmt: skip
    return figures


def global_batch(cfg: Config, given: int | None) -> int:
    seq = cfg.train.seq_len
    if given:
        return given
    if cfg.train.batch_tokens:
        return cfg.train.batch_tokens
    return max(1, round(4 * 2**20 / seq)) * seq


def layout_text(layout: dict[str, int]) -> str:
    return f"TP {layout['tensor_parallel']} x PP {layout['pipeline_parallel']} x DP {layout['data_parallel']}"


def describe(plan: Rehearsal, rec: Recommendation) -> list[tuple[str, str]]:
    kind = "FSDP2" if rec.layout.zero >= 1 else "DDP"
    return [
        ("planned layout", f"{layout_text(plan.planned)} ({kind}), micro batch {rec.layout.micro_batch}"),
        ("rehearsed layout", f"{layout_text(plan.rehearsed)} ({kind}) on gloo"),
        ("then resharded to", f"{layout_text(plan.resharded)}, resuming at step {plan.resume_at} of {plan.steps}"),
        ("rehearsal model", ", ".join(f"{k} {v}" for k, v in plan.model.items())),
    ]  # fmt: skip
