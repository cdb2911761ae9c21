"""`smelt plan rehearse CONFIG --gpus N` (its parser sits under `smelt plan`, cli/plan.py); the rehearsal
itself is smelt/rehearse.py's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from smelt.cli.arguments import add_config_args
from smelt.errors import UserError
from smelt.numbers import number
from smelt.plan.ladder import ladder_vocab
from smelt.plan.memory import Cluster, ModelShape
from smelt.rehearse import describe, global_batch, plan_rehearsal, run_rehearsal
from smelt.tables import print_table


def rehearse_command(args: argparse.Namespace) -> int:
    """`smelt plan rehearse`: plan, both launches, the table; exit 0 when the two layouts agree."""
    from smelt.config import load_config
    from smelt.manifest import write_json
    from smelt.plan.budget import GPUS

    if args.procs < 1 or args.steps < 2:
        raise UserError(
            "smelt plan rehearse needs --procs 1 or more and --steps 2 or more (it resumes at half)."
        )
    cfg = load_config(args.config, args.overrides)
    vocab = ladder_vocab(cfg)  # the trained tokenizer's, else the config's padded size
    shape = ModelShape.from_config(cfg.model, vocab, cfg.model.preset or Path(args.config).stem)
    capacity = args.gpu_memory or (GPUS[args.gpu][1] if args.gpu else 80.0)
    batch = int(global_batch(cfg, args.global_batch_tokens))
    plan, rec = plan_rehearsal(cfg, shape, Cluster(args.gpus, args.gpus_per_node, capacity), batch, args.procs,
                               args.steps)  # fmt: skip
    print_table(describe(plan, rec))
    figures = run_rehearsal(Path(args.config), list(args.overrides), cfg, plan)
    rows = [
        ("first launch", f"{figures['first_processes']} processes, killed (SIGKILL) after step "
                         f"{figures['killed_after_step']}, {figures['first_s']} s"),
        ("resharded launch", f"{figures['resharded_processes']} processes, resumed from step "
                             f"{figures['resumed_from_step']}, to step {figures['finished_steps']} of {plan.steps}, "
                             f"{figures['resharded_s']} s"),
        ("same steps, two layouts", f"{figures['steps_compared']} steps, largest relative loss difference "
                                    f"{figures['max_rel_loss_diff']:.2e} ({'agree' if figures['agree'] else 'DISAGREE'})"),
        ("runs", figures["run"]),
    ]  # fmt: skip
    print_table(rows)
    if args.json_out:
        write_json(Path(args.json_out), {"plan": plan.__dict__, **figures})
    return 0 if figures["agree"] else 1


def add_rehearse_parser(plan_sub: Any, gpus: list[str]) -> None:
    """`smelt plan rehearse` under `smelt plan` (cli/plan.py)."""
    p = plan_sub.add_parser(
        "rehearse",
        help="run the recommended layout for a big plan in miniature: train, checkpoint, reshard, resume",
        description="The layout `smelt plan memory --gpus N` recommends for CONFIG's model, launched on this "
        "machine (torchrun on gloo) with its TP, PP and DP degrees kept where they fit (each at most 2, at "
        "most --procs processes) and the model scaled down to a few narrow layers: a few steps on CONFIG's "
        "token shards with checkpoints, then a relaunch under another layout that resumes from the middle "
        "checkpoint. Writes RUN/rehearsal/; exit 0 when both layouts agree on the steps both trained.",
    )
    add_config_args(p, "pipeline TOML of the big run (its tokenize stage must have run)", force=False)
    p.add_argument("--gpus", type=int, required=True, help="GPUs of the big run's cluster")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu", choices=gpus, help="device, for its memory")
    p.add_argument("--gpu-memory", type=float, help="GB per GPU (default: --gpu's, else 80)")
    p.add_argument("--global-batch-tokens", type=number, help="the big run's global batch (default: the "
                   "config's train.batch_tokens, else ~4M tokens)")  # fmt: skip
    p.add_argument("--procs", type=int, default=8, help="processes on this machine at most (default 8)")
    p.add_argument("--steps", type=int, default=6, help="steps of the rehearsal (default 6, resumed at half)")
    p.add_argument("--json", dest="json_out", help="also write the result as JSON to this path")
    p.set_defaults(func=rehearse_command)
