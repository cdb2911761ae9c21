"""The training commands: `smelt train` (pilot checks, resume, forks, supervised restarts) and
`smelt anneal` (forks of a stable checkpoint, each on its own mixture)."""

from __future__ import annotations

import argparse

from smelt.cli.arguments import add_config_args


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    from smelt.cli.pipeline import add_fork_and_restart_args

    p = subparsers.add_parser(
        "train",
        help="train the model on the token shards",
        description="Train [model] with [train] on tokens/train; writes train/metrics.jsonl and "
        "train/checkpoints/step_NNNNNNN/.",
    )
    add_config_args(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="pilot checks instead of training: step-0 loss ~ ln V, every parameter gets a "
        "gradient, a fixed batch overfits, two same-seed runs are identical",
    )
    p.add_argument(
        "--resume-from",
        type=int,
        default=None,
        metavar="STEP",
        help="continue an interrupted run from its checkpoint of STEP instead of the newest valid "
        "one; later checkpoints move to train/checkpoints/superseded/ (kept)",
    )
    add_fork_and_restart_args(p)
    p.set_defaults(func=_train)

    p = subparsers.add_parser(
        "anneal",
        help="fork N anneals from a stable checkpoint, each on its own mixture, and compare them",
        description="From RUN[:STEP], train one fork per --variant with the parent's weights and optimizer "
        "moments and the LR decaying linearly to zero over --decay-tokens; evaluate the stable checkpoint "
        "and every anneal; write RUN/anneals/anneal-step_N.{json,html} and a decision record.",
    )
    add_config_args(p)
    p.add_argument("--from", dest="parent", required=True, metavar="RUN[:STEP]", help="stable checkpoint")
    p.add_argument("--decay-tokens", type=int, required=True, metavar="D", help="tokens of each anneal")
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        metavar="NAME [KEY=VALUE ...]",
        help='one anneal: its name, then its overrides, e.g. --variant code "tokens.mixture={code=0.6, prose=0.4}"',
    )
    p.add_argument("--soup", action="store_true", help="also average the endpoints and evaluate the soup")
    p.add_argument(
        "--restart", action="store_true", help="retrain variants whose plan changed (old moved aside)"
    )
    p.set_defaults(func=_anneal)

    p = subparsers.add_parser(
        "launch",
        help="print the torchrun (or Slurm) commands that train CONFIG on N nodes x G GPUs",
        description="Check the [train] mesh keys against --nodes x --gpus-per-node processes, say which mesh "
        "dimensions stay inside a node, and print the torchrun command for every node (c10d rendezvous) or, "
        "with --slurm, an sbatch script.",
    )
    add_config_args(p, force=False)
    p.add_argument("--nodes", type=int, required=True, help="nodes in the launch")
    p.add_argument("--gpus-per-node", type=int, required=True, help="processes (GPUs) per node")
    p.add_argument("--slurm", action="store_true", help="an sbatch script (srun + torchrun) instead")
    p.add_argument("--endpoint", help="HOST:PORT of the c10d rendezvous (default HOST:--port, to fill in)")
    p.add_argument("--port", type=int, default=29500, help="rendezvous port (default 29500)")
    p.add_argument("--rdzv-id", help="rendezvous id shared by the nodes (default smelt-RUN_NAME)")
    p.set_defaults(func=_launch)


def _train(args: argparse.Namespace) -> int:
    from smelt.cli.pipeline import run_stage_command, with_init_from

    overrides = with_init_from(args.overrides, args.init_from)
    if args.check:
        return _train_check(args.config, overrides)
    if args.resume_from is not None and not (args.force or args.restart):
        _check_resume_from_finished(args.config, overrides, args.resume_from)
    if args.max_restarts:
        from smelt.train.ops.supervise import run_supervised

        return run_supervised(
            args.config,
            overrides,
            args.max_restarts,
            args.restart_backoff,
            force=args.force,
            restart=args.restart,
            resume_from=args.resume_from,
        )
    return run_stage_command(
        "train", args.config, overrides, args.force, restart=args.restart, resume_from=args.resume_from
    )


def _check_resume_from_finished(config: str, overrides: list[str], step: int) -> None:
    """`--resume-from STEP` on a finished run, for a STEP without a committed checkpoint: a UserError
    whose suggested fork names a committed step (the nearest at or before STEP), never STEP itself.
    A committed STEP, and any STEP of an interrupted run, are checked by prepare_resume_from."""
    from smelt import layout
    from smelt.config import load_config
    from smelt.errors import UserError
    from smelt.manifest import read_manifest

    cfg = load_config(config, overrides)
    train_dir = layout.stage_dir(cfg.run_dir, "train")
    if read_manifest(train_dir) is None:
        return
    committed = [layout.step_of(p) for p in layout.list_checkpoints(train_dir / layout.CHECKPOINTS)]
    if step in committed:
        return
    if committed:
        nearest = max((s for s in committed if s <= step), default=committed[0])
        fix = (
            f"To train on under a changed plan, fork a new run from a committed checkpoint, e.g. the nearest: "
            f"`smelt train CONFIG --from {cfg.run_dir}:{nearest} --set run.name=NEW_NAME`."
        )
    else:
        fix = "No committed checkpoint is kept to fork from: start over with --restart."
    have = ", ".join(map(str, committed)) or "none"
    raise UserError(
        f"--resume-from {step}: the train stage in {train_dir} is finished, and --resume-from continues an "
        f"interrupted run; nor is step {step} a committed checkpoint (committed steps: {have}). {fix}"
    )


def _train_check(config: str, overrides: list[str]) -> int:
    from smelt.config import load_config
    from smelt.train.check import pilot_checks

    cfg = load_config(config, overrides)
    rows = pilot_checks(cfg, cfg.run_dir / "tokens", cfg.run_dir / "tokenizer")
    width = max(len(name) for name, _, _ in rows)
    for name, passed, detail in rows:
        print(f"{name:<{width}}  {'PASS' if passed else 'FAIL'}  {detail}")
    failed = [name for name, passed, _ in rows if not passed]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks passed")
    return 1 if failed else 0


def _anneal(args: argparse.Namespace) -> int:
    from smelt.run.anneal import parse_variants, run_anneals, table
    from smelt.tables import print_table

    comparison = run_anneals(
        args.config, args.overrides, args.parent, args.decay_tokens, parse_variants(args.variant),
        soup=args.soup, restart=args.restart, force=args.force,
    )  # fmt: skip
    print_table(table(comparison))
    print(f"\ncomparison: {comparison['report']}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    from smelt.config import load_config
    from smelt.train.ops.launch import Cluster, launch_text

    cfg = load_config(args.config, args.overrides)
    cluster = Cluster(args.nodes, args.gpus_per_node)
    print(launch_text(cfg, args.config, args.overrides, cluster, slurm=args.slurm, endpoint=args.endpoint,
                      port=args.port, rdzv_id=args.rdzv_id), end="")  # fmt: skip
    return 0
