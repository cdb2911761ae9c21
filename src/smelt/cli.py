"""The `smelt` command. Each subcommand is a thin call into a stage.

Exit codes: 0 done, 1 failed while running, 2 bad input (config, paths, data) with a message that
names the offending key, file or record and how to fix it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from smelt.config import Config, load_config
from smelt.errors import UserError
from smelt.progress import launch_rank
from smelt.summary import eval_rows, flat, print_summary, print_table, summarize

# (command, --help line, description) of the subcommands that take a pipeline file.
CONFIG_COMMANDS = [
    ("run", "all stages of a pipeline, skipping the ones that are up to date",
     "Run curate, tokenizer, tokenize, train and eval in order."),
    ("curate", "raw files -> documents (and `curate quality-train`)",
     "Read the sources of [data], extract, normalize, identify languages, filter, score, scrub PII, "
     "deduplicate, split, and write documents/<split>/<source>/part-NNNNN.parquet. "
     "`smelt curate quality-train CONFIG` trains the quality classifier that data.quality.model names."),
    ("tokenizer train", "train a byte-level BPE tokenizer on the train split",
     "Train byte-level BPE on a sample of the curated train split."),
    ("tokenize", "documents -> token shards",
     "Encode every split and source into tokens/<split>/<source>/NNNNN.bin + .idx."),
    ("train", "train the model on the token shards",
     "Train [model] with [train] on tokens/train; writes train/metrics.jsonl and "
     "train/checkpoints/step_NNNNNNN/."),
]  # fmt: skip
QUICKSTART_CONFIG = Path(__file__).resolve().parent / "configs" / "quickstart.toml"
RANK_0_GRACE_S = 10.0  # how long other ranks wait for rank 0 to report bad input (see _wait_for_rank_0)


def _add_config_args(
    parser: argparse.ArgumentParser, config_help: str = "pipeline TOML file", force: bool = True
) -> None:
    parser.add_argument("config", help=config_help)
    _add_common(parser, force)


def _add_common(parser: argparse.ArgumentParser, force: bool = True) -> None:
    """`--set` for a command that reads a pipeline config; `--force` only where a cached result
    could be reused (a command that recomputes everything every time has nothing to force)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. --set train.lr=1e-3",
    )
    if force:
        parser.add_argument("--force", action="store_true", help="rerun even when the stage is up to date")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smelt",
        description="From raw text to a trained and evaluated language model, reproducibly.",
    )
    parser.add_argument("--version", action="version", version=f"smelt {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "quickstart",
        help="the whole pipeline on the built-in corpus (Python's stdlib)",
        description="Run configs/quickstart.toml: curate the .py files of this Python's "
        "standard library, train a tokenizer and a small model, evaluate it.",
    )
    _add_common(p)
    p.add_argument("--run-dir", default=None, help="parent directory for the run (default: runs)")

    for name, help_text, description in CONFIG_COMMANDS:
        if name == "tokenizer train":
            tokenizer = sub.add_parser(
                "tokenizer", help="train a tokenizer", description="Tokenizer commands."
            )
            actions = tokenizer.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)
            _add_config_args(actions.add_parser("train", help=help_text, description=description))
            p = actions.add_parser(
                "eval",
                help="bytes per token, fertility and more, per source and language",
                description="Evaluate the run's tokenizer (or several, or one per vocab size) on a documents "
                "split: bytes per token, fertility, continued-word rate, longest and unused tokens; "
                "writes a table, JSON and an SVG plot under RUN/tokenizer_eval/.",
            )
            _add_config_args(p, force=False)
            p.add_argument(
                "--tokenizer",
                action="append",
                default=[],
                metavar="NAME=DIR",
                help="compare this tokenizer directory too (repeatable)",
            )
            p.add_argument(
                "--vocab-sizes",
                default="",
                metavar="N,N,...",
                help="train one tokenizer per vocab size with [tokenizer] and compare them",
            )
            p.add_argument("--split", default="val", help="documents split to measure on (default: val)")
        else:
            p = sub.add_parser(name, help=help_text, description=description)
            _add_config_args(p)
            if name == "train":
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
            if name in ("train", "run"):
                p.add_argument(
                    "--restart",
                    action="store_true",
                    help="start a stage whose plan changed over: its old directory (checkpoints and all) is "
                    "moved to RUN/superseded/, never deleted",
                )
                p.add_argument(
                    "--from",
                    dest="init_from",
                    default=None,
                    metavar="RUN[:STEP]",
                    help="fork: start from that run's checkpoint (newest, or STEP; or a step_NNNNNNN dir) "
                    "under this config's plan (same as --set train.init_from=...)",
                )
                p.add_argument(
                    "--max-restarts",
                    type=int,
                    default=0,
                    metavar="N",
                    help="relaunch after a crash (resuming from the latest checkpoint) up to N times, "
                    "then give up with a summary; restarts go to RUN/restarts.jsonl (default: 0)",
                )
                p.add_argument(
                    "--restart-backoff",
                    type=float,
                    default=5.0,
                    metavar="SECONDS",
                    help="wait before the first restart, doubled for each next one, at most 300 s (default: 5)",
                )
            if name in ("curate", "tokenize"):
                p.add_argument(
                    "--workers", type=int, default=None, help="worker processes (default: the config's)"
                )
    anneal = sub.add_parser(
        "anneal",
        help="fork N anneals from a stable checkpoint, each on its own mixture, and compare them",
        description="From RUN[:STEP], train one fork per --variant with the parent's weights and optimizer "
        "moments and the LR decaying linearly to zero over --decay-tokens; evaluate the stable checkpoint "
        "and every anneal; write RUN/anneals/anneal-step_N.{json,html} and a decision record.",
    )
    _add_config_args(anneal)
    anneal.add_argument(
        "--from", dest="parent", required=True, metavar="RUN[:STEP]", help="stable checkpoint"
    )
    anneal.add_argument("--decay-tokens", type=int, required=True, metavar="D", help="tokens of each anneal")
    anneal.add_argument(
        "--variant",
        nargs="+",
        action="append",
        metavar="NAME [KEY=VALUE ...]",
        help='one anneal: its name, then its overrides, e.g. --variant code "tokens.mixture={code=0.6, prose=0.4}"',
    )
    anneal.add_argument(
        "--soup", action="store_true", help="also average the endpoints and evaluate the soup"
    )
    anneal.add_argument(
        "--restart", action="store_true", help="retrain variants whose plan changed (old moved aside)"
    )
    export = sub.add_parser(
        "export", help="export a checkpoint for other tools", description="Export commands."
    )
    formats = export.add_subparsers(dest="export_format", metavar="FORMAT", required=True)
    p = formats.add_parser(
        "hf",
        help="a Hugging Face folder (config.json, model.safetensors, tokenizer)",
        description="Write RUN/export/hf/, which transformers loads with "
        "AutoModelForCausalLM and AutoTokenizer.",
    )
    p.add_argument("run", help="run directory, e.g. runs/quickstart")
    p.add_argument(
        "--checkpoint", default="latest", help="latest (default), a step number or a checkpoint directory"
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--out", default=None, help="output folder (default: RUN/export/hf)")

    ckpt = sub.add_parser(
        "checkpoint", help="list, verify and average checkpoints", description="Checkpoint commands."
    )
    ckpt_actions = ckpt.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    p = ckpt_actions.add_parser(
        "list",
        help="every checkpoint of a run: step, tokens, size, committed, milestone",
        description="Table of RUN/train/checkpoints: step, tokens seen, size on disk, whether the save "
        "committed, milestone, weights-only; --verify also checks every file's sha256.",
    )
    p.add_argument("run", help="run directory (or its train/checkpoints folder)")
    p.add_argument("--verify", action="store_true", help="check every checksum (reads every file)")
    p = ckpt_actions.add_parser(
        "verify",
        help="check a checkpoint's files against their sha256 (exit 2 naming a damaged file)",
        description="Verify the latest committed checkpoint of RUN (or --step S, or --all, or RUN "
        "itself when it is a checkpoint directory); exit code 2 names the first damaged file.",
    )
    p.add_argument("run", help="run directory, its train/checkpoints folder, or one checkpoint directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="the checkpoint of this step")
    which.add_argument("--all", action="store_true", help="every committed checkpoint")
    p = ckpt_actions.add_parser(
        "average",
        help="average the weights of several checkpoints into a new weights-only checkpoint",
        description="Uniform average (or, with --ema, an exponential moving average in step order) of the "
        "model weights of the last N or the chosen checkpoints, written as a new committed checkpoint "
        "without optimizer state (default: RUN/averaged/step_NNNNNNN-avgN), for eval and export.",
    )
    p.add_argument("run", help="run directory (or its train/checkpoints folder)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="the N newest checkpoints")
    which.add_argument("--steps", type=int, nargs="+", metavar="STEP", help="these steps")
    p.add_argument("--ema", type=float, default=None, metavar="DECAY", help="EMA with this decay, e.g. 0.9")
    p.add_argument("--out", default=None, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    inspect = sub.add_parser("inspect", help="look inside artifacts", description="Inspection commands.")
    looks = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    p = looks.add_parser(
        "shards",
        help="decode a window of a token shard with document boundaries marked",
        description="Decode tokens of one shard, marking where each document begins, and "
        "summarize token frequencies.",
    )
    p.add_argument("tokens", help="tokens directory of a run, e.g. runs/quickstart/tokens")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the run's)")
    p.add_argument("--split", default="train")
    p.add_argument("--source", required=True, help="source name")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--length", type=int, default=256)
    p = looks.add_parser(
        "batches",
        help="decode what the model sees at a training step, with sources and document boundaries",
        description="Rebuild the loader of CONFIG (mixture, curriculum, shuffle, packing) and decode the "
        "global batch of step N: the source of every row and where each document starts.",
    )
    _add_config_args(p, force=False)
    p.add_argument("--step", type=int, required=True, help="optimizer step (1 is the first)")
    p.add_argument("--rows", type=int, default=8, help="rows of the global batch to show (0: all)")
    p = looks.add_parser(
        "documents",
        help="read kept, dropped or quarantined documents with reasons and scores",
        description="Print documents of a curate run: --dropped-by STEP (what a step removed, with "
        "the rule and scores), --quarantined (unreadable records and why), or --kept (a seeded "
        "sample of kept documents with their meta).",
    )
    p.add_argument("documents", help="documents directory or run directory, e.g. runs/quickstart")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--dropped-by", metavar="STEP", help="documents a step dropped")
    what.add_argument("--quarantined", action="store_true", help="quarantined records")
    what.add_argument("--kept", action="store_true", help="a random sample of kept documents")
    p.add_argument("--reason", default=None, help="only this drop or quarantine reason")
    p.add_argument("--source", default=None, help="only this source")
    p.add_argument("--split", default=None, help="--kept: only this split")
    p.add_argument("-n", type=int, default=20, help="how many documents (default: 20)")
    p.add_argument("--chars", type=int, default=2000, help="characters of text shown per document")
    p.add_argument("--seed", type=int, default=0, help="--kept: sample seed")

    plan = sub.add_parser(
        "plan", help="sizes, FLOPs and memory before spending compute", description="Planning commands."
    )
    plans = plan.add_subparsers(dest="plan_command", metavar="WHAT", required=True)
    p = plans.add_parser(
        "model",
        help="parameters, FLOPs per token, KV cache and weight memory of a preset",
        description="Describe a model preset: parameters (total, non-embedding), training "
        "FLOPs per token (6N + 12 L d s), KV-cache bytes per token, weight memory.",
    )
    p.add_argument("preset", help="preset name, e.g. llama-1b")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--vocab-size", type=int, default=32_768, help="vocabulary size (default: 32768)")
    from smelt.plan import commands as plan_commands
    from smelt.report import commands as report_commands

    plan_commands.add_parsers(sub, plans)
    report_commands.add_parsers(sub)

    p = sub.add_parser(
        "eval",
        help="held-out loss, bits-per-byte, benchmark tasks and gallery of checkpoints",
        description="Evaluate a run: RUN is a run directory (e.g. runs/quickstart) or its "
        "pipeline TOML file. Writes RUN/eval/step_NNNNNNN.json per checkpoint, and RUN/eval/curves.jsonl "
        "and RUN/eval/gallery.json across the evaluated checkpoints.",
    )
    p.add_argument("run", help="run directory or pipeline TOML file")
    p.add_argument(
        "--checkpoint",
        default="latest",
        help="latest (default), all (every retained checkpoint not yet evaluated) or a step number",
    )
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: eval.tasks); '' for none")
    p.add_argument("--limit", type=int, default=None, help="items per task (default: eval.limit; 0: all)")
    p.add_argument("--tasks-dir", default=None, help="benchmark files (default: eval.tasks_dir)")
    _add_common(p)
    return parser


def _quality_train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smelt curate quality-train",
        description="Train the quality classifier (hashed word n-gram logistic regression) on the "
        "sources named by data.quality.positive_sources and negative_sources; then set "
        "data.quality.model to the file it writes.",
    )
    _add_config_args(p, force=False)
    p.add_argument("--out", default=None, help="model file (default: RUN/quality/model.safetensors)")
    p.set_defaults(command="curate-quality-train")
    return p


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command that runs something, by its words ("checkpoint verify"), with its parser: the
    leaves of the subcommand tree plus `curate quality-train`. The README's table of which commands
    take `--set` and `--force` is checked against this."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if words and not subs:
            found[" ".join(words)] = parser
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(build_parser(), ())
    found["curate quality-train"] = _quality_train_parser()
    return found


def _version() -> str:
    from smelt import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rank = launch_rank()
    # Under torchrun every rank runs this same command. Rank 0 prints the tables and summaries; the
    # other ranks' stdout would only repeat them (with their own timings), so it goes nowhere, and so
    # do their copies of a usage error.
    with _unless_rank_0(rank, contextlib.redirect_stdout):
        try:
            with _unless_rank_0(rank, contextlib.redirect_stderr):
                if argv[:2] == ["curate", "quality-train"]:  # a verb under `curate` that takes its own config
                    args = _quality_train_parser().parse_args(argv[2:])
                else:
                    args = build_parser().parse_args(argv)
        except SystemExit as exc:
            if rank and exc.code not in (0, None):  # a usage error: rank 0 says it
                _wait_for_rank_0()
            raise
        try:
            _one_process_unless_train(args)
            return _dispatch(args)
        except UserError as exc:
            if _reports_bad_input(rank):
                tag = f"[rank {rank}] " if rank else ""
                print(f"smelt: {tag}error: {exc}", file=sys.stderr)
            else:
                _wait_for_rank_0()
                # Still running: rank 0 did not stop on this input, so this rank found a problem of its own.
                print(f"smelt: [rank {rank}] error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            if rank == 0:
                print("smelt: interrupted", file=sys.stderr)
            return 130
        except Exception:  # a failure while running: show everything, it is a bug or an environment problem
            text = (
                traceback.format_exc()
                + "smelt: failed while running (exit 1); the traceback above says where."
            )
            if rank:  # ranks fail on their own (a device, a file, a collective): say which one it was
                text = "\n".join(f"[rank {rank}] {line}" for line in text.splitlines())
            print(text, file=sys.stderr)
            return 1


def _wait_for_rank_0() -> None:
    """Give rank 0 time to report the bad input every rank found. torchrun stops all ranks as soon as
    one exits, so a rank that exited at once could stop rank 0 before it has said anything; once rank 0
    has exited, torchrun ends this one."""
    time.sleep(RANK_0_GRACE_S)


@contextlib.contextmanager
def _unless_rank_0(rank: int, redirect) -> Iterator[None]:
    """`redirect` (redirect_stdout or redirect_stderr) to the null device on ranks other than 0."""
    if rank == 0:
        yield
        return
    with open(os.devnull, "w") as sink, redirect(sink):
        yield


def _one_process_unless_train(args: argparse.Namespace) -> None:
    """Under torchrun every rank would run the command in full: N copies of curate writing one
    directory, N evaluations of one checkpoint. Only `smelt train` divides its work among ranks."""
    world = os.environ.get("WORLD_SIZE", "1")
    if args.command == "train" or world in ("", "0", "1"):
        return
    command = "curate quality-train" if args.command == "curate-quality-train" else args.command
    raise UserError(
        f"`smelt {command}` runs in one process, but it was started as one of {world} (WORLD_SIZE = {world}, "
        f"set by torchrun). Only `smelt train` runs on several processes. Run `smelt {command} ...` without "
        f"torchrun (curate and tokenize have their own worker pools, data.workers and tokens.workers), then "
        f"`torchrun --nproc-per-node N -m smelt.cli train CONFIG`; see docs/distributed.md."
    )


def _reports_bad_input(rank: int) -> bool:
    """Whether this rank prints a bad-input error. Every rank reads the same config and finds the same
    mistake, so rank 0 reports it; on a node other than rank 0's the files may differ (a data path
    missing there), so that node's first process reports what it found, too."""
    if rank == 0:
        return True
    local_rank, node = os.environ.get("LOCAL_RANK", "0"), os.environ.get("GROUP_RANK", "0")
    return local_rank == "0" and node != "0"


def _dispatch(args: argparse.Namespace) -> int:
    from smelt.pipeline import STAGES, run_stage
    from smelt.plan import commands as plan_commands
    from smelt.report import commands as report_commands

    if getattr(args, "init_from", None):  # `--from X` is `--set train.init_from=X`
        args.overrides = [*args.overrides, f"train.init_from={json.dumps(args.init_from)}"]
    handled = plan_commands.run(args)
    if handled is None:
        handled = report_commands.run(args)
    if handled is not None:
        return handled
    command = args.command
    if command == "anneal":
        from smelt.anneal import parse_variants, run_anneals, table

        comparison = run_anneals(
            args.config, args.overrides, args.parent, args.decay_tokens, parse_variants(args.variant),
            soup=args.soup, restart=args.restart, force=args.force,
        )  # fmt: skip
        print_table(table(comparison))
        print(f"\ncomparison: {comparison['report']}")
        return 0
    if command == "export":
        return _export_hf(args)
    if command == "checkpoint":
        from smelt.checkpoint import tools as checkpoint_tools

        return checkpoint_tools.run(args)
    if command == "curate-quality-train":
        return _quality_train(args)
    if command == "inspect" and args.inspect_command == "documents":
        return _inspect_documents(args)
    if command == "inspect" and args.inspect_command == "batches":
        from smelt.tokens.inspect import describe_batch

        print(describe_batch(load_config(args.config, args.overrides), args.step, rows=args.rows))
        return 0
    if command == "inspect":
        from smelt.tokens.inspect import describe_window

        tokens = Path(args.tokens)
        tokenizer = Path(args.tokenizer) if args.tokenizer else tokens.parent / "tokenizer"
        print(
            describe_window(tokens, args.split, args.source, args.shard, args.start, args.length, tokenizer)
        )
        return 0
    if command == "tokenizer" and args.tokenizer_command == "eval":
        return _tokenizer_eval(args)
    if command == "plan":
        from smelt.model.plan import describe_preset

        print_table(describe_preset(args.preset, seq_len=args.seq_len, vocab_size=args.vocab_size))
        return 0
    if command == "quickstart":
        overrides = list(args.overrides)
        if args.run_dir:
            overrides.append(f"run.dir={json.dumps(args.run_dir)}")
        cfg = load_config(QUICKSTART_CONFIG, overrides)
        return _run_all(cfg, args.force, STAGES)
    if command == "run":
        cfg = load_config(args.config, args.overrides)
        if args.max_restarts:
            return _run_supervised(cfg, args)
        return _run_all(cfg, args.force, STAGES, restart=args.restart)
    if command == "eval":
        cfg = _config_for_run(args.run, args.overrides)
        if args.tasks_dir is not None:
            cfg.eval.tasks_dir = args.tasks_dir
        if args.checkpoint != "latest" or args.tasks is not None or args.limit is not None:
            return _eval_checkpoint(cfg, args.checkpoint, args.tasks, args.limit, args.force)
        from smelt.eval.run import write_views

        outcome = run_stage(cfg, "eval", force=args.force, check_upstream=True)
        write_views(cfg.run_dir / "eval")
        print_table(eval_rows(outcome.result))
        return 0
    if command == "train" and args.check:
        return _train_check(args)
    if command == "train" and args.max_restarts:
        from smelt.train.supervise import run_supervised

        return run_supervised(args)
    stage = {"curate": "curate", "tokenizer": "tokenizer", "tokenize": "tokenize", "train": "train"}[command]
    overrides = list(args.overrides)
    if getattr(args, "workers", None) is not None:
        overrides.append(f"{'data' if stage == 'curate' else 'tokens'}.workers={args.workers}")
    cfg = load_config(args.config, overrides)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if getattr(args, "resume_from", None) is not None:
        from smelt.train.supervise import prepare_resume_from

        prepare_resume_from(cfg, args.resume_from, restart=args.force or getattr(args, "restart", False))
    outcome = run_stage(
        cfg, stage, force=args.force, restart=getattr(args, "restart", False), check_upstream=True
    )
    if stage == "train" and launch_rank() == 0:  # `smelt eval RUN` and reports read the run's config
        from smelt.manifest import write_json

        write_json(cfg.run_dir / "config.json", cfg.to_dict())
    if stage == "curate":
        from smelt.data.stats import retention_table

        print(retention_table(outcome.result))
        print(f"\nper source and reason: {outcome.directory / 'stats.json'}; plot: retention.svg")
    else:
        print_table([(k, v) for k, v in flat(outcome.result).items()][:40])
    print(f"\n{stage}: {'up to date' if outcome.skipped else 'done'} -> {outcome.directory}")
    return 0


def _train_check(args: argparse.Namespace) -> int:
    from smelt.train.check import pilot_checks

    cfg = load_config(args.config, args.overrides)
    rows = pilot_checks(cfg, cfg.run_dir / "tokens", cfg.run_dir / "tokenizer")
    width = max(len(name) for name, _, _ in rows)
    for name, passed, detail in rows:
        print(f"{name:<{width}}  {'PASS' if passed else 'FAIL'}  {detail}")
    failed = [name for name, passed, _ in rows if not passed]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks passed")
    return 1 if failed else 0


def _quality_train(args: argparse.Namespace) -> int:
    from smelt.data.quality import train_quality

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else cfg.run_dir / "quality" / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = train_quality(cfg, out)
    print_table([(k, v) for k, v in flat(result).items()])
    print(f"\nquality classifier -> {out}\nuse it: --set data.quality.model={json.dumps(str(out))}")
    return 0


def _inspect_documents(args: argparse.Namespace) -> int:
    from smelt.data import inspect

    path = Path(args.documents)
    if args.kept:
        text = inspect.kept(path, args.source, args.split, args.n, args.chars, args.seed)
    elif args.quarantined:
        text = inspect.dropped_or_quarantined(
            path, inspect.QUARANTINED, None, args.reason, args.source, args.n, args.chars
        )
    else:
        text = inspect.dropped_or_quarantined(
            path, inspect.DROPPED, args.dropped_by, args.reason, args.source, args.n, args.chars
        )
    print(text)
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    from smelt.checkpoint import latest_checkpoint
    from smelt.model.hf import export_hf

    run = Path(args.run)
    checkpoints = run / "train" / "checkpoints"
    if args.checkpoint == "latest":
        checkpoint = latest_checkpoint(checkpoints)
    elif args.checkpoint.isdigit():
        checkpoint = checkpoints / f"step_{int(args.checkpoint):07d}"
    else:  # a checkpoint directory, e.g. one written by `smelt checkpoint average`
        checkpoint = Path(args.checkpoint)
    if checkpoint is None or not (checkpoint / "COMMITTED").is_file():
        raise UserError(
            f"no committed checkpoint {args.checkpoint!r} under {checkpoints}. Train the run first "
            f"(`smelt run CONFIG`), or pass --checkpoint latest or a step listed there."
        )
    out = Path(args.out) if args.out else run / "export" / "hf"
    summary = export_hf(checkpoint, run / "tokenizer", out, dtype=args.dtype)
    print_table([(k, v) for k, v in flat(summary).items()])
    return 0


def _tokenizer_eval(args: argparse.Namespace) -> int:
    from smelt.tokenizer.evaluate import document_groups, evaluate_tokenizers, train_and_evaluate

    cfg = load_config(args.config, args.overrides)
    documents, out_dir = cfg.run_dir / "documents", cfg.run_dir / "tokenizer_eval"
    if args.vocab_sizes:
        try:
            sizes = [int(x) for x in args.vocab_sizes.split(",") if x.strip()]
        except ValueError as exc:
            raise UserError(
                f"--vocab-sizes {args.vocab_sizes!r} must be integers separated by commas."
            ) from exc
        report = train_and_evaluate(cfg.tokenizer, documents, out_dir, cfg.run.seed, sizes, args.split)
    else:
        tokenizers: dict[str, Path] = {}
        if (cfg.run_dir / "tokenizer" / "tokenizer.json").is_file():
            tokenizers["run"] = cfg.run_dir / "tokenizer"
        for item in args.tokenizer:
            name, sep, directory = item.partition("=")
            if not sep or not name:
                raise UserError(
                    f"--tokenizer {item!r} must be NAME=DIR, e.g. --tokenizer big=runs/x/tokenizer."
                )
            tokenizers[name] = Path(directory)
        report = evaluate_tokenizers(tokenizers, document_groups(documents, args.split), out_dir)
    print(report["table"])
    for kind, path in report.get("paths", {}).items():
        print(f"  {kind:<5} {path}")
    return 0


def _config_for_run(run: str, overrides: list[str]) -> Config:
    path = Path(run)
    if path.is_dir():
        saved = path / "config.json"
        if not saved.is_file():
            raise UserError(
                f"{path} is not a smelt run directory (no config.json). Pass a run directory "
                f"written by `smelt run`, e.g. runs/quickstart, or its pipeline TOML file."
            )
        from smelt.config import apply_override, config_from_dict

        raw = json.loads(saved.read_text())
        for item in overrides:
            apply_override(raw, item)
        cfg = config_from_dict(raw, origin=str(saved))
        if cfg.run_dir.resolve() != path.resolve():  # the run was moved: follow it
            cfg.run.dir, cfg.run.name = str(path.parent), path.name
        return cfg
    return load_config(path, overrides)


def _eval_checkpoint(
    cfg: Config, checkpoint: str, tasks: str | None, limit: int | None, force: bool = False
) -> int:
    from smelt.eval.run import evaluate_checkpoints

    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit} must be 0 (every item) or a positive number of items per task.")
    names = None if tasks is None else [t.strip() for t in tasks.split(",") if t.strip()]
    results = evaluate_checkpoints(cfg, cfg.run_dir, checkpoint, names, limit, force=force)
    for result in results:
        print_table(eval_rows(result))
        print()
    print(f"written: {cfg.run_dir / 'eval'} (step files, curves.jsonl, gallery.json)")
    return 0


def _run_supervised(cfg: Config, args: argparse.Namespace) -> int:
    """`smelt run --max-restarts N`: the stages before training here, training as a supervised child
    (relaunched from its latest checkpoint after a crash), then the rest, which finds training done."""
    from smelt.pipeline import STAGES, run_pipeline
    from smelt.train.supervise import run_supervised

    run_pipeline(cfg, STAGES[: STAGES.index("train")], force=args.force, restart=args.restart)
    code = run_supervised(args)
    return code if code else _run_all(cfg, False, STAGES)


def _run_all(cfg: Config, force: bool, stages: tuple[str, ...], restart: bool = False) -> int:
    from smelt.pipeline import run_pipeline

    started = time.time()
    outcomes = run_pipeline(cfg, stages, force=force, restart=restart)
    summary = summarize(cfg, outcomes, time.time() - started)
    from smelt.manifest import write_json

    write_json(cfg.run_dir / "summary.json", summary)
    print_summary(summary)
    from smelt.report.single import write_run_report

    print(f"  {'report':<10} {write_run_report(cfg.run_dir)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
