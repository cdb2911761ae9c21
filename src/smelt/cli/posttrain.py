"""The post-training commands: `smelt posttrain run CONFIG` (the config's stage: sft, dpo or grpo),
`smelt posttrain eval RUN` and `smelt posttrain convert FORMAT IN OUT`."""

from __future__ import annotations

import argparse

from smelt.cli.arguments import add_common, group
from smelt.errors import UserError


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    sub = group(subparsers, "posttrain", "chat SFT, DPO/SimPO and GRPO from a checkpoint",
                "Post-training commands.", "posttrain_command", "ACTION")  # fmt: skip
    p = sub.add_parser(
        "run",
        help="run the stage a post-training config names (sft, dpo or grpo)",
        description="Start from run.init_from (a run directory, RUN:STEP or a step directory) and write a new "
        "run directory run.out with its own metrics.jsonl, checkpoints and summary.json.",
    )
    p.add_argument("config", help="post-training TOML file (configs/posttrain/*.toml)")
    add_common(p)
    p.set_defaults(func=_run)
    p = sub.add_parser(
        "eval",
        help="GSM8K exact match, preference accuracy and a chat gallery of a checkpoint",
        description="Score RUN's checkpoint and write RUN/posttrain_eval/step_NNNNNNN.json.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--checkpoint", default="latest", help="latest (default) or a step number")
    p.add_argument("--gsm8k", default=None, help="GSM8K JSONL to score exact match on (e.g. the test split)")
    p.add_argument("--few-shot", type=int, default=0, help="also score a k-shot plain-text prompt")
    p.add_argument("--shots-from", default=None, help="GSM8K JSONL the few-shot examples come from")
    p.add_argument("--pairs", default=None, help="preference pairs (hh-rlhf .jsonl.gz or smelt JSONL)")
    p.add_argument("--addition", type=int, default=0, help="score N synthetic addition problems")
    p.add_argument("--addition-digits", type=int, default=None,
                   help="digits per addition operand (default: what the run, or the nearest post-training stage "
                   "before it, trained on; else 2)")  # fmt: skip
    p.add_argument("--limit", type=int, default=64, help="items per set (0: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.set_defaults(func=_eval)
    p = sub.add_parser(
        "convert",
        help="GSM8K or hh-rlhf files -> smelt's chat / preference JSONL",
        description='Write {"messages"} (gsm8k) or {"prompt", "chosen", "rejected"} (hh-rlhf) JSONL.',
    )
    p.add_argument("format", choices=("gsm8k", "hh-rlhf"))
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=_convert)


def _run(args: argparse.Namespace) -> int:
    from smelt.posttrain.config import load_posttrain_config
    from smelt.tables import flat, print_table

    cfg = load_posttrain_config(args.config, args.overrides)
    if cfg.stage == "sft":
        from smelt.posttrain.sft import run_sft as stage
    elif cfg.stage == "dpo":
        from smelt.posttrain.dpo import run_dpo as stage
    else:
        from smelt.posttrain.grpo import run_grpo as stage
    summary = stage(cfg, force=args.force)
    print_table([(k, v) for k, v in flat(summary).items()])
    return 0


def _eval(args: argparse.Namespace) -> int:
    from smelt.posttrain.evaluate import evaluate_run
    from smelt.tables import flat, print_table

    if args.addition_digits is not None and not 1 <= args.addition_digits <= 9:
        raise UserError(f"--addition-digits {args.addition_digits} must lie in [1, 9] (digits per operand).")
    if args.addition < 0:
        raise UserError(f"--addition {args.addition} must be 0 (no addition set) or a number of problems.")
    if args.limit < 0:
        raise UserError(f"--limit {args.limit} must be 0 (every item) or a positive number of items.")
    result = evaluate_run(args.run, args.checkpoint, args.gsm8k, args.pairs, args.addition, args.addition_digits,
                          args.limit, args.few_shot, args.shots_from, args.max_new_tokens)  # fmt: skip
    rows = [(k, v) for k, v in flat({k: v for k, v in result.items() if k != "gallery"}).items()
            if "samples" not in k]  # fmt: skip
    print_table(rows)
    for entry in result["gallery"]:
        print(f"\n> {entry['prompt']}\n{entry['greedy']}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from smelt.posttrain.chat import read_gsm8k, read_hh_rlhf, write_jsonl

    if args.format == "gsm8k":
        records, skipped = read_gsm8k(args.input), 0
    else:
        records, skipped = read_hh_rlhf(args.input)
    write_jsonl(args.output, records)
    print(f"wrote {len(records)} records to {args.output}" + (f" ({skipped} skipped)" if skipped else ""))
    return 0
