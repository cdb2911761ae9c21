"""The planning commands: `smelt plan model|budget|memory|batch|rehearse`, `smelt scaling fit`, `smelt ladder`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from smelt.cli.arguments import group
from smelt.cli.rehearse import add_rehearse_parser
from smelt.errors import UserError
from smelt.numbers import number, number_list, number_pair
from smelt.tables import print_table


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """`plan model|budget|memory|batch` under `plan`, and the top-level `scaling fit` and `ladder`."""
    from smelt.plan.budget import GPUS

    sub = subparsers  # `smelt plan rehearse` is smelt/rehearse.py's
    what = "sizes, FLOPs and memory before spending compute"
    plan_sub = group(sub, "plan", what, "Planning commands.", "plan_command", "WHAT")
    p = plan_sub.add_parser(
        "model",
        help="parameters, FLOPs per token, KV cache and weight memory of a preset",
        description="Describe a model preset: parameters (total, non-embedding), training "
        "FLOPs per token (6N + 12 L d s), KV-cache bytes per token, weight memory.",
    )
    p.add_argument("preset", help="preset name, e.g. llama-1b")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--vocab-size", type=int, default=32_768, help="vocabulary size (default: 32768)")
    p.set_defaults(func=_model)

    gpu_names = ", ".join(GPUS)
    p = plan_sub.add_parser(
        "budget",
        help="model size, tokens and days for a budget; inference-aware alternatives",
        description="From dollars and a price per GPU-hour, GPU-hours, or FLOPs (with the device's peak and "
        "the expected MFU) to compute C; the Chinchilla-optimal N and D (C = 6ND, D = 20N, or a fitted law's "
        "split); the training time on G GPUs; and smaller models trained longer to the same loss, with the "
        "inference FLOPs they save.",
    )
    p.add_argument("--dollars", type=number, help="budget in dollars (with --price-per-gpu-hour)")
    p.add_argument("--price-per-gpu-hour", type=number, help="dollars per GPU-hour")
    p.add_argument("--gpu-hours", type=number, help="budget in GPU-hours")
    p.add_argument("--flops", type=number, help="budget in FLOPs")
    p.add_argument("--gpu", choices=list(GPUS), help=f"device, for its dense BF16 peak ({gpu_names})")
    p.add_argument("--peak-tflops", type=number, help="device peak in TFLOP/s (instead of --gpu)")
    p.add_argument("--mfu", type=float, help="expected model FLOPs utilization, e.g. 0.35")
    p.add_argument("--gpus", type=int, help="GPUs the run will use (for the training time)")
    p.add_argument("--tokens-per-param", type=float, default=20.0, help="D / N (default 20, Chinchilla)")
    p.add_argument("--law", default="epoch", help="loss law: epoch (default), chinchilla, or a fit.json")
    p.add_argument("--law-split", action="store_true", help="size N and D by the law's optimum, not D = kN")
    p.add_argument("--inference-tokens", type=number, default=0.0, help="tokens the model will serve")
    p.add_argument("--unique-tokens", type=number, help="unique tokens in the data (warns past 4 epochs)")
    p.add_argument("--batch-tokens", type=number, help="planned global batch (warns far above critical)")
    p.add_argument("--json", dest="json_out", help="also write the plan as JSON to this path")
    p.add_argument(
        "--preset", help="also what the budget buys for this model preset (total vs active params)"
    )
    p.set_defaults(func=_budget)

    p = plan_sub.add_parser(
        "memory",
        help="per-GPU memory of a layout, or a TP/PP/DP layout for a cluster",
        description="Per-GPU memory (weights, gradients, optimizer state, activations, overhead) of a preset "
        "or config under DDP, ZeRO-1/2/3, tensor and pipeline parallelism and activation recompute. With "
        "--gpus it recommends TP, PP, DP, micro batch and accumulation for the cluster.",
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument("--preset", help="model preset, e.g. llama-8b")
    model.add_argument("--config", help="pipeline TOML whose [model] to use")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override the model, e.g. --set model.n_layers=48 (on a preset, a config, or the defaults)",
    )
    p.add_argument("--vocab-size", type=int, help="vocabulary (default: the config's, else 32768)")
    p.add_argument("--seq-len", type=int, help="sequence length (default: the config's or preset's)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro batch (layout mode)")
    p.add_argument("--tp", type=int, help="tensor-parallel size")
    p.add_argument("--pp", type=int, help="pipeline stages")
    p.add_argument("--dp", type=int, help="data-parallel size (default: --gpus / (tp x pp), else 1)")
    p.add_argument("--zero", type=int, default=None, help="0 DDP, 1, 2, 3 = FSDP (default 1 when DP > 1)")
    p.add_argument("--recompute", default="selective", help="none, selective (default) or full")
    p.add_argument("--precision", default="mixed", help="mixed (bf16 + fp32 master, default) or fp32")
    p.add_argument("--no-sequence-parallel", action="store_true", help="TP without sequence parallelism")
    p.add_argument("--overhead-gb", type=float, default=2.0, help="CUDA context, NCCL, allocator (GB)")
    p.add_argument("--gpus", type=int, help="GPUs in the cluster: recommend a layout")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu", choices=list(GPUS), help="device, for its memory")
    p.add_argument("--gpu-memory", type=float, help="GB per GPU (default: --gpu's, else 80)")
    p.add_argument("--global-batch-tokens", type=number, help="target global batch (default ~4M tokens)")
    p.add_argument("--headroom", type=float, default=0.10, help="memory kept free (default 0.10)")
    p.add_argument("--json", dest="json_out", help="also write the result as JSON to this path")
    p.set_defaults(func=_memory)

    add_rehearse_parser(plan_sub, list(GPUS))
    p = plan_sub.add_parser(
        "batch",
        help="learning rate for a new batch size (x sqrt(k)); critical batch",
        description="Rescale the peak learning rate by sqrt(k) when the global batch grows k times, and "
        "compare batches with Kaplan et al.'s critical-batch estimate at a given loss.",
    )
    p.add_argument("--batch-tokens", type=number, required=True, help="current global batch in tokens")
    p.add_argument("--new-batch-tokens", type=number, help="new global batch in tokens")
    p.add_argument("--lr", type=float, help="current peak learning rate")
    p.add_argument("--loss", type=float, help="current (or expected) loss in nats/token")
    p.set_defaults(func=_batch)

    scaling = sub.add_parser("scaling", help="fit scaling laws", description="Scaling-law commands.")
    actions = scaling.add_subparsers(dest="scaling_command", metavar="ACTION", required=True)
    p = actions.add_parser(
        "fit",
        help="fit L(N, D) = E + A/N^alpha + B/D^beta to runs or a CSV",
        description="Fit L(N, D) = E + A/N^alpha + B/D^beta by Huber loss (delta 1e-3) on log-loss with "
        "L-BFGS from Hoffmann et al.'s grid of starts (Approach 3), with bootstrap 95% intervals; "
        "optionally IsoFLOP profiles (Approach 2). Input: a CSV (columns N/params, D/tokens or C/flops, "
        "loss) or smelt run directories (a ladder directory works). Writes fit.json and SVG plots.",
    )
    p.add_argument("inputs", nargs="+", metavar="FILE", help="a CSV file, or run / ladder directories")
    p.add_argument("--drop-highest", type=int, default=0, help="drop the K highest-loss points first")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (0: none; default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isoflop", action="store_true", help="also fit IsoFLOP profiles (Approach 2)")
    p.add_argument("--isoflop-tolerance", type=float, default=0.1, help="log10 C width of a group")
    p.add_argument("--min-sizes", type=int, default=3, help="sizes an IsoFLOP group needs (default 3)")
    p.add_argument("--compute", type=number, action="append", help="report N*(C), D*(C) here (repeatable)")
    p.add_argument("--predict", type=number_pair, action="append", metavar="N,D", help="predict a run's loss")
    p.add_argument("--params", choices=("non-embedding", "total"), default="non-embedding", help="N of runs")
    p.add_argument("--target", metavar="N,D|CONFIG", help="predicted loss curve of this run (N,D or a pipeline "
                   "config's model and train.tokens; fit on every evaluation of the runs; for train.expect)")  # fmt: skip
    p.add_argument("--min-fraction", type=float, default=0.2, help="with --target: evaluations from here on")
    for col in ("n", "d", "c", "loss", "group"):
        p.add_argument(
            f"--{col}-column", help=f"CSV column holding {col.upper() if col != 'loss' else 'loss'}"
        )
    p.add_argument(
        "--out", help="output directory (default: DIR/scaling_fit for one directory, else ./scaling_fit)"
    )
    p.set_defaults(func=_scaling_fit)

    p = sub.add_parser(
        "ladder",
        help="proxy ladder of small models for a scaling fit",
        description="Generate a proxy ladder from a pipeline config: 4-6 sizes at ~20 tokens per parameter "
        "(or an IsoFLOP grid with --isoflop). --run trains it here (data stages once, then each rung) and "
        "fits the results; --emit writes torchrun and Slurm commands for a cluster instead.",
    )
    p.add_argument("config", help="pipeline TOML file (its model is the largest rung by default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--sizes", type=int, default=5, help="model sizes (per compute with --isoflop)")
    p.add_argument("--min-params", type=number, help="smallest non-embedding size (default max / 32)")
    p.add_argument("--max-params", type=number, help="largest non-embedding size (default: the config's)")
    p.add_argument("--tokens-per-param", type=float, default=20.0)
    p.add_argument("--token-multipliers", type=number_list, default=[1.0], help="e.g. 0.5,1,2")
    p.add_argument("--isoflop", action="store_true", help="an IsoFLOP grid over --computes instead")
    p.add_argument("--computes", type=number_list, help="FLOP budgets for --isoflop, e.g. 1e15,3e15,1e16")
    p.add_argument("--spread", type=float, default=4.0, help="--isoflop sizes span N*/spread..N* x spread")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--run", action="store_true", help="train every rung here, then fit")
    action.add_argument("--prepare", action="store_true", help="create the rung run directories only")
    action.add_argument("--emit", choices=("torchrun", "slurm"), help="write cluster commands")
    p.add_argument("--gpus-per-run", type=int, default=1, help="GPUs per rung in emitted commands")
    p.add_argument("--gpus-per-node", type=int, default=8, help="a rung on more GPUs runs on several nodes")
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples of the fit after --run")
    p.add_argument("--force", action="store_true", help="retrain rungs that are up to date")
    p.set_defaults(func=_ladder)


def _model(args: argparse.Namespace) -> int:
    from smelt.model.sizing import describe_preset

    print_table(describe_preset(args.preset, seq_len=args.seq_len, vocab_size=args.vocab_size))
    return 0


def _write_json(path: str | None, value: Any) -> None:
    if path:
        from smelt.manifest import write_json

        write_json(Path(path), value)  # makes the parent directories
        print(f"\nwritten: {path}")


def _budget(args: argparse.Namespace) -> int:
    from smelt.plan.budget import GPUS, budget_rows, options_table, plan_budget, resolve_compute
    from smelt.plan.laws import load_law

    peak = args.peak_tflops * 1e12 if args.peak_tflops else (GPUS[args.gpu][0] if args.gpu else None)
    compute = resolve_compute(
        dollars=args.dollars,
        price_per_gpu_hour=args.price_per_gpu_hour,
        gpu_hours=args.gpu_hours,
        flops=args.flops,
        peak_flops=peak,
        mfu=args.mfu,
    )
    plan = plan_budget(
        compute,
        tokens_per_param=args.tokens_per_param,
        law=load_law(args.law),
        law_for_split=args.law_split,
        gpus=args.gpus,
        inference_tokens=args.inference_tokens,
        unique_tokens=args.unique_tokens,
        batch_tokens=args.batch_tokens,
    )
    print_table(budget_rows(plan))
    title = "same expected loss, smaller models trained longer"
    if args.inference_tokens:
        title += f" (serving {args.inference_tokens:.3g} tokens at 2N FLOPs each)"
    print(f"\n{title}:\n{options_table(plan)}")
    if args.preset:
        from smelt.model.sizing import preset_budget_rows

        print(f"\nwith the shape of model preset {args.preset}:")
        print_table(preset_budget_rows(args.preset, compute.flops))
    for warning in plan.warnings:
        print(f"\nwarning: {warning}")
    _write_json(args.json_out, plan.to_dict())
    return 0


def _model_shape(args: argparse.Namespace) -> tuple[Any, int]:
    """(ModelShape, default sequence length) from --preset, --config or --set model.* keys alone."""
    from smelt.config import load_config
    from smelt.model.sizing import DEFAULT_VOCAB
    from smelt.plan.memory import ModelShape

    overrides = list(args.overrides)
    if args.preset:
        overrides.insert(0, f"model.preset={json.dumps(args.preset)}")
    cfg = load_config(args.config, overrides)
    if args.config:
        pad = cfg.tokenizer.pad_to_multiple
        vocab = args.vocab_size or -(-cfg.tokenizer.vocab_size // pad) * pad
        name = cfg.model.preset or Path(args.config).stem
        return ModelShape.from_config(cfg.model, vocab, name), cfg.train.seq_len
    vocab = args.vocab_size or DEFAULT_VOCAB
    return ModelShape.from_config(cfg.model, vocab, args.preset or "custom"), cfg.model.max_seq_len


def _memory(args: argparse.Namespace) -> int:
    from smelt.plan.budget import GPUS
    from smelt.plan.layout_keys import print_train_keys
    from smelt.plan.memory import GB, Cluster, given_layout, memory, model_state_bytes, recommend
    from smelt.plan.memory_table import alternatives_table, memory_rows

    shape, default_seq = _model_shape(args)
    seq_len = args.seq_len or default_seq
    capacity = args.gpu_memory or (GPUS[args.gpu][1] if args.gpu else 80.0)
    described = (
        f"{shape.name}: {shape.params_total:,} parameters, {shape.n_layers} layers, d {shape.d_model}, "
        f"{shape.n_heads} heads, vocab {shape.vocab_size:,}"
    )
    state = model_state_bytes(shape.params_total, args.precision) / GB
    rows: list[tuple[str, Any]] = [
        ("model", described),
        (
            f"model state ({args.precision}, Adam)",
            f"{state:.1f} GB (16 bytes per parameter, before any sharding)",
        ),
    ]
    layout_given = args.tp is not None or args.pp is not None or args.dp is not None
    if args.gpus and not layout_given:
        batch = int(args.global_batch_tokens or _default_batch(seq_len))
        rec = recommend(
            shape,
            Cluster(args.gpus, args.gpus_per_node, capacity),
            seq_len=seq_len,
            global_batch_tokens=batch,
            recompute=args.recompute,
            zero=1 if args.zero is None else args.zero,
            precision=args.precision,
            headroom=args.headroom,
            overhead_gb=args.overhead_gb,
        )
        layout = rec.layout
        zero = f", ZeRO-{layout.zero}" if layout.zero else ""
        steps = (
            f"{layout.micro_batch} x {layout.microbatches} per replica = {batch // seq_len} sequences of "
            f"{seq_len} ({batch:,} tokens) per step"
        )
        rows += [
            ("cluster", f"{args.gpus} GPUs, {args.gpus_per_node} per node, {capacity:g} GB each"),
            ("recommended", f"TP {layout.tp}, PP {layout.pp}, DP {layout.dp}{zero}"),
            ("micro batch x accumulation", steps),
            ("per GPU at micro batch 1", f"{rec.memory_at_micro_batch_1.peak.total / GB:.1f} GB"),
        ]
        rows += memory_rows(rec.memory)
        print_table(rows)
        print("\nwhy:")
        for reason in rec.reasons:
            print(f"  - {reason}")
        print(f"\nlayouts of {args.gpus} GPUs at micro batch 1 ({rec.budget_gb:.0f} GB usable per GPU):")
        print(alternatives_table(rec))
        keys = print_train_keys(layout, batch)
        for warning in rec.warnings:
            print(f"\nwarning: {warning}")
        _write_json(args.json_out, {"model": shape.__dict__, **rec.to_dict(), **keys})
        return 0
    layout = given_layout(args.tp, args.pp, args.dp, args.gpus, args.zero, args.recompute, args.micro_batch,
                          seq_len, args.precision, sequence_parallel=not args.no_sequence_parallel)  # fmt: skip
    mem = memory(shape, layout, args.overhead_gb)
    rows += memory_rows(mem)
    usable = capacity * (1 - args.headroom)
    verdict = "fits" if mem.peak.total / GB <= usable else "does NOT fit"
    rows.append(
        (
            f"on {capacity:g} GB GPUs",
            f"{verdict} ({usable:.0f} GB usable with {100 * args.headroom:.0f}% headroom)",
        )
    )
    print_table(rows)
    _write_json(args.json_out, {"model": shape.__dict__, **mem.to_dict()})
    return 0


def _default_batch(seq_len: int) -> int:
    """About 4M tokens (Llama-scale), a whole number of sequences."""
    return max(1, round(4 * 2**20 / seq_len)) * seq_len


def _batch(args: argparse.Namespace) -> int:
    from smelt.plan.batch import batch_rows

    rows, warnings = batch_rows(args.lr, args.batch_tokens, args.new_batch_tokens, args.loss)
    print_table(rows)
    for warning in warnings:
        print(f"\nwarning: {warning}")
    return 0


def _scaling_fit(args: argparse.Namespace) -> int:
    from smelt.plan.points import read_points
    from smelt.plan.scaling import report_text, scaling_fit
    from smelt.plan.trajectory import target_curves

    if args.bootstrap < 0:
        raise UserError(f"--bootstrap must be >= 0, got {args.bootstrap}.")
    columns = {f"{c}_column": getattr(args, f"{c}_column") for c in ("n", "d", "c", "loss", "group")}
    params = args.params.replace("-", "_")
    curves = target_curves(args) if args.target else None  # every evaluation of the runs
    points = curves.points if curves else read_points([Path(p) for p in args.inputs], params, **columns)
    points = points.drop_highest(args.drop_highest)
    if args.out:
        out = Path(args.out)
    elif len(args.inputs) == 1 and Path(args.inputs[0]).is_dir():
        out = Path(args.inputs[0]) / "scaling_fit"
    else:
        out = Path("scaling_fit")
    report = scaling_fit(
        points,
        out,
        bootstrap_samples=args.bootstrap,
        seed=args.seed,
        isoflop=args.isoflop,
        isoflop_tolerance=args.isoflop_tolerance,
        min_sizes=args.min_sizes,
        computes=args.compute,
        predictions=args.predict,
        curves=curves,
        target=curves.target if curves else None,
    )
    print(report_text(report))
    return 0


def _ladder(args: argparse.Namespace) -> int:
    from smelt.config import load_config
    from smelt.plan import ladder as L

    cfg = load_config(args.config, args.overrides)
    vocab = L.ladder_vocab(cfg)
    batch = cfg.train.batch_tokens or cfg.train.seq_len * cfg.train.micro_batch
    if args.isoflop:
        if not args.computes:
            raise UserError("--isoflop needs --computes, e.g. --computes 1e15,3e15,1e16.")
        rungs = L.isoflop_ladder(
            cfg.model, vocab, batch, computes=args.computes, sizes=args.sizes, spread=args.spread
        )
    else:
        rungs = L.chinchilla_ladder(
            cfg.model,
            vocab,
            batch,
            sizes=args.sizes,
            min_params=args.min_params,
            max_params=args.max_params,
            tokens_per_param=args.tokens_per_param,
            multipliers=tuple(args.token_multipliers),
        )
    print(f"ladder of {len(rungs)} runs from {args.config} (base run {cfg.run_dir}, vocab {vocab:,}):")
    print(L.plan_table(rungs))
    total = sum(r.compute for r in rungs)
    print(f"\ntotal {total:.3g} FLOPs; rung runs under {L.ladder_dir(cfg)}/")
    warnings = L.ladder_warnings(rungs, L.available_train_tokens(cfg), args.isoflop)
    plan_path = L.write_plan(
        cfg, rungs, {"config": str(args.config), "overrides": list(args.overrides), "vocab_size": vocab}
    )
    if args.prepare:
        for rung in rungs:
            L.prepare_rung(cfg, rung)
        print(f"prepared {len(rungs)} rung directories (links to {cfg.run_dir}'s data stages)")
    elif args.emit:
        from smelt.plan.ladder_run import emit_scripts

        written = emit_scripts(cfg, args.config, args.overrides, rungs, args.gpus_per_run, args.gpus_per_node,
                               slurm=args.emit == "slurm")  # fmt: skip
        print(f"\nwritten: {written[0]}")
        if len(written) > 1:
            print(f"written: {written[1]} (sbatch after the first four lines of commands.sh)")
    elif args.run:
        from smelt.plan.ladder_run import MIN_RUNS_TO_FIT, run_and_fit
        from smelt.plan.scaling import report_text
        from smelt.run.pipeline import run_stage

        plan = {"config": str(args.config), "overrides": list(args.overrides), "vocab_size": vocab}
        results, report = run_and_fit(cfg, rungs, plan, run_stage, args.force, args.bootstrap, args.isoflop)
        warnings = L.ladder_warnings(rungs, L.available_train_tokens(cfg), args.isoflop)
        print(L.results_table(results))
        if report is not None:
            print()
            print(report_text(report))
        else:
            print(f"\nfewer than {MIN_RUNS_TO_FIT} runs: not enough for a 5-parameter fit of L(N, D).")
    for warning in warnings:
        print(f"\nwarning: {warning}")
    print(f"\nwritten: {plan_path}")
    return 0
