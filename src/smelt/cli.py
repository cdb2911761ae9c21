"""The `smelt` command. Each subcommand is a thin call into a stage.

Exit codes: 0 done, 1 failed while running, 2 bad input (config, paths, data) with a message that
names the offending key, file or record and how to fix it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smelt.config import Config, load_config
from smelt.errors import UserError

# (command, --help line, description) of the subcommands that take a pipeline file.
CONFIG_COMMANDS = [
    ("run", "all stages of a pipeline, skipping the ones that are up to date",
     "Run curate, tokenizer, tokenize, train and eval in order."),
    ("curate", "raw files -> documents",
     "Read the sources of [data], normalize, filter, deduplicate, split, and write "
     "documents/<split>/<source>/part-NNNNN.parquet."),
    ("tokenizer train", "train a byte-level BPE tokenizer on the train split",
     "Train byte-level BPE on a sample of the curated train split."),
    ("tokenize", "documents -> token shards",
     "Encode every split and source into tokens/<split>/<source>/NNNNN.bin + .idx."),
    ("train", "train the model on the token shards",
     "Train [model] with [train] on tokens/train; writes train/metrics.jsonl and "
     "train/checkpoints/step_NNNNNNN/."),
]  # fmt: skip
QUICKSTART_CONFIG = Path(__file__).resolve().parent / "configs" / "quickstart.toml"


def _add_config_args(parser: argparse.ArgumentParser, config_help: str = "pipeline TOML file") -> None:
    parser.add_argument("config", help=config_help)
    _add_common(parser)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. --set train.lr=1e-3",
    )
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
        else:
            _add_config_args(sub.add_parser(name, help=help_text, description=description))
    p = sub.add_parser(
        "eval",
        help="held-out loss, bits-per-byte and samples of a checkpoint",
        description="Evaluate a run: RUN is a run directory (e.g. runs/quickstart) or its "
        "pipeline TOML file.",
    )
    p.add_argument("run", help="run directory or pipeline TOML file")
    p.add_argument("--checkpoint", default="latest", help="latest (default) or a step number")
    _add_common(p)
    return parser


def _version() -> str:
    from smelt import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except UserError as exc:
        print(f"smelt: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("smelt: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a failure while running: show everything, it is a bug or an environment problem
        traceback.print_exc()
        print("smelt: failed while running (exit 1); the traceback above says where.", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from smelt.pipeline import STAGES, run_stage

    command = args.command
    if command == "quickstart":
        overrides = list(args.overrides)
        if args.run_dir:
            overrides.append(f"run.dir={json.dumps(args.run_dir)}")
        cfg = load_config(QUICKSTART_CONFIG, overrides)
        return _run_all(cfg, args.force, STAGES)
    if command == "run":
        return _run_all(load_config(args.config, args.overrides), args.force, STAGES)
    if command == "eval":
        cfg = _config_for_run(args.run, args.overrides)
        if args.checkpoint != "latest":
            return _eval_checkpoint(cfg, args.checkpoint)
        outcome = run_stage(cfg, "eval", force=args.force)
        _print_table(_eval_rows(outcome.result))
        return 0
    stage = {"curate": "curate", "tokenizer": "tokenizer", "tokenize": "tokenize", "train": "train"}[command]
    cfg = load_config(args.config, args.overrides)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    outcome = run_stage(cfg, stage, force=args.force)
    _print_table([(k, v) for k, v in _flat(outcome.result).items()][:40])
    print(f"\n{stage}: {'up to date' if outcome.skipped else 'done'} -> {outcome.directory}")
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


def _eval_checkpoint(cfg: Config, checkpoint: str) -> int:
    from smelt.eval.heldout import evaluate_run

    try:
        int(checkpoint)
    except ValueError as exc:
        raise UserError(f"--checkpoint {checkpoint!r} must be `latest` or a step number.") from exc
    result = evaluate_run(cfg, cfg.run_dir, cfg.run_dir / "eval", checkpoint=checkpoint)
    _print_table(_eval_rows(result))
    return 0


def _run_all(cfg: Config, force: bool, stages: tuple[str, ...]) -> int:
    from smelt.pipeline import run_pipeline

    started = time.time()
    outcomes = run_pipeline(cfg, stages, force=force)
    summary = summarize(cfg, outcomes, time.time() - started)
    from smelt.manifest import write_json

    write_json(cfg.run_dir / "summary.json", summary)
    print_summary(summary)
    return 0


def summarize(cfg: Config, outcomes: dict, wall_time_s: float) -> dict[str, Any]:
    """The figures the end-of-run table prints, as data (written to RUN/summary.json)."""
    curate = outcomes["curate"].result
    tokenize = outcomes["tokenize"].result
    tokenizer = outcomes["tokenizer"].result
    train = outcomes["train"].result
    evaluation = outcomes["eval"].result
    heldout = evaluation["heldout"]["overall"]
    return {
        "run_dir": str(cfg.run_dir),
        "wall_time_s": round(wall_time_s, 2),
        "stages": {
            name: {"skipped": o.skipped, "wall_time_s": o.wall_time_s, "dir": str(o.directory)}
            for name, o in outcomes.items()
        },
        "documents_in": curate["documents_in"],
        "documents_kept": curate["documents_kept"],
        "vocab_size": tokenizer.get("padded_vocab_size"),
        "train_tokens_available": tokenize["splits"]["train"]["tokens"],
        "val_tokens_available": tokenize["splits"]["val"]["tokens"],
        "params_total": train["params_total"],
        "params_non_embedding": train["params_non_embedding"],
        "train_steps": train["steps"],
        "train_tokens": train["tokens"],
        "train_tokens_per_s": train["tokens_per_s"],
        "train_mfu": train.get("mfu"),
        "final_train_loss": train["final_train_loss"],
        "final_val_loss": train["final_val_loss"],
        "val_bits_per_byte": heldout["bits_per_byte"],
        "val_gzip_bits_per_byte": heldout["gzip_bits_per_byte"],
        "val_xz_bits_per_byte": heldout["xz_bits_per_byte"],
        "val_bytes": heldout["bytes"],
        "samples": evaluation["samples"],
        "checkpoint": train["checkpoint"],
        "paths": {
            "documents": str(outcomes["curate"].directory),
            "tokenizer": str(outcomes["tokenizer"].directory),
            "tokens": str(outcomes["tokenize"].directory),
            "train": str(outcomes["train"].directory),
            "metrics": str(outcomes["train"].directory / "metrics.jsonl"),
            "eval": str(outcomes["eval"].directory),
        },
    }


def print_summary(summary: dict[str, Any]) -> None:
    def fmt(x: Any, spec: str = ",") -> str:
        return "-" if x is None else format(x, spec)

    stage_line = ", ".join(
        f"{name} " + ("skipped" if info["skipped"] else f"{info['wall_time_s']:.1f}s")
        for name, info in summary["stages"].items()
    )
    rows = [
        ("stages", stage_line),
        ("documents in / kept", f"{fmt(summary['documents_in'])} / {fmt(summary['documents_kept'])}"),
        (
            "tokens train / val",
            f"{fmt(summary['train_tokens_available'])} / {fmt(summary['val_tokens_available'])}",
        ),
        ("vocab size (padded)", fmt(summary["vocab_size"])),
        (
            "parameters (non-embedding)",
            f"{fmt(summary['params_total'])} ({fmt(summary['params_non_embedding'])})",
        ),
        ("trained tokens / steps", f"{fmt(summary['train_tokens'])} / {fmt(summary['train_steps'])}"),
        ("training tokens/s", fmt(summary["train_tokens_per_s"], ",.0f")),
        ("MFU", "-" if summary["train_mfu"] is None else f"{100 * summary['train_mfu']:.1f}%"),
        (
            "final train / val loss",
            f"{fmt(summary['final_train_loss'], '.4f')} / {fmt(summary['final_val_loss'], '.4f')}",
        ),
        ("val bits/byte: model", fmt(summary["val_bits_per_byte"], ".4f")),
        ("val bits/byte: gzip -9", fmt(summary["val_gzip_bits_per_byte"], ".4f")),
        ("val bits/byte: xz -9e", fmt(summary["val_xz_bits_per_byte"], ".4f")),
        ("held-out bytes", fmt(summary["val_bytes"])),
        ("wall time", f"{summary['wall_time_s']:.1f}s"),
    ]
    _print_table(rows)
    print("\nsamples:")
    for item in summary["samples"]:
        print(f"--- {item['prompt']!r}\n{item['prompt']}{item['completion']}")
    print("\nwritten:")
    for name, path in summary["paths"].items():
        print(f"  {name:<10} {path}")
    print(f"  {'summary':<10} {Path(summary['run_dir']) / 'summary.json'}")


def _eval_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("checkpoint", result["checkpoint"])]
    for source, figures in sorted(result["heldout"]["per_source"].items()) + [
        ("all", result["heldout"]["overall"])
    ]:
        rows.append(
            (
                f"{source}: loss / bits-per-byte",
                f"{figures['loss']:.4f} / {figures['bits_per_byte']:.4f} "
                f"(gzip {figures['gzip_bits_per_byte']:.4f}, xz {figures['xz_bits_per_byte']:.4f})",
            )
        )
    return rows


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list):
        return (
            {prefix.rstrip("."): f"[{len(value)} items]"}
            if value and isinstance(value[0], dict)
            else {prefix.rstrip("."): value}
        )
    return {prefix.rstrip("."): value}


def _print_table(rows: list[tuple[str, Any]]) -> None:
    width = max((len(str(k)) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{str(key):<{width}}  {value}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
