"""Post-training on the CPU, end to end, from a base model trained on the shared corpus
(configs/posttrain/base.toml): chat SFT on synthetic addition and on GSM8K train, DPO on hh-rlhf
harmless-base pairs, GRPO on addition with the exact-match reward.

Figures (all on held-out items the stage never trained on: the addition task holds out a quarter of
its problems, which no stage trains on, and every held-out and evaluation set is decontaminated against
the training data, the count dropped recorded):
- addition exact match (chat, greedy) of the base and of the addition SFT, on the held-out 1-digit
  problems (25 of the 100; --eval-items caps the count);
- GSM8K test exact match of the base (k-shot and chat) and of the GSM8K SFT (chat), and the SFT's
  validation loss before and after;
- hh-rlhf held-out preference accuracy (mean token log-prob of the chosen reply above the rejected
  one's; DPO's implicit-reward accuracy) before and after DPO;
- GRPO held-out mean reward (greedy) before and after, and the training reward of the first and last
  quarter of its steps;
- tokens/s of each stage (forward + backward tokens; for GRPO, the sampled rows too).

Every stage goes through the smelt CLI. Usage:
    python bench/posttrain.py [--runs DIR] [--base-tokens N] [--sft-steps N] [--gsm8k-steps N] [--dpo-steps N]
                              [--grpo-steps N] [--dpo-pairs N] [--eval-items N] [--only addition]
Writes bench/results/posttrain.json (or --result NAME). `--only addition` runs the base and the addition
chain (SFT, GRPO, their evaluations) and replaces those figures in the existing result, keeping the GSM8K
and DPO figures and naming what was remeasured (`remeasured`) and what was kept (`kept_from`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import REPO, RESULTS, shared_data, write_result

from smelt.posttrain.chat import heldout_addition_problems

CONFIGS = REPO / "configs" / "posttrain"


def smelt(*argv: str) -> None:
    from smelt.cli import build_parser, main

    if argv[0] == "posttrain" and "posttrain" not in build_parser()._subparsers._group_actions[0].choices:
        # Until the command module is listed in smelt.cli, parse with the module's own parsers.
        import argparse

        from smelt.cli.posttrain import add_parsers

        parser = argparse.ArgumentParser(prog="smelt")
        add_parsers(parser.add_subparsers(dest="command"))
        args = parser.parse_args(list(argv))
        code = args.func(args)
    else:
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"smelt {' '.join(argv[:3])} ... exited {code}")


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


REUSE = False  # --reuse: keep a stage or an evaluation already in place from an earlier invocation


def stage(name: str, runs: Path, parent: Path, out: Path, *overrides: str) -> dict:
    if REUSE and (out / "summary.json").is_file():
        return json.loads((out / "summary.json").read_text())
    smelt("posttrain", "run", str(CONFIGS / name), "--force",
          *sets(f"run.init_from='{parent}'", f"run.out='{out}'", *overrides))  # fmt: skip
    return json.loads((out / "summary.json").read_text())


def evaluate(run: Path, data: Path, items: int, **kwargs) -> dict:
    """Score the run's latest checkpoint; with --reuse, the parts an earlier invocation scored on the same
    checkpoint and item count are kept and only the missing ones are computed."""
    from smelt.checkpoint.store import latest_checkpoint
    from smelt.posttrain.evaluate import evaluate_run

    kwargs = {"max_new_tokens": 192, "addition_digits": 1, **kwargs}
    saved = run / "posttrain_eval" / f"{latest_checkpoint(run / 'train' / 'checkpoints').name}.json"
    kept = json.loads(saved.read_text()) if REUSE and saved.is_file() else {}
    parts = {"gsm8k": ["gsm8k_chat"], "few_shot": ["gsm8k_few_shot"], "addition": ["addition_chat"]}
    for arg, keys in parts.items():
        have = all(k in kept and kept[k].get("asked") == (kwargs.get(arg) if arg == "addition" else items)
                   for k in keys)  # fmt: skip
        if arg == "addition" and have:
            have = kept["addition_chat"].get("digits") == kwargs["addition_digits"]
        if kwargs.get(arg) and have:
            kwargs[arg] = 0 if arg != "gsm8k" else None
        else:
            for k in keys:
                kept.pop(k, None)
    if not (kwargs.get("gsm8k") or kwargs.get("addition")):
        return kept
    if not kwargs.get("gsm8k"):
        kwargs["few_shot"] = 0
    return {**kept, **evaluate_run(run, limit=items, **kwargs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="runs/bench-posttrain", help="where the runs go")
    parser.add_argument("--base-tokens", type=int, default=400_000, help="base model training tokens")
    parser.add_argument("--sft-steps", type=int, default=150, help="addition SFT steps")
    parser.add_argument("--gsm8k-steps", type=int, default=40, help="GSM8K SFT steps")
    parser.add_argument("--dpo-steps", type=int, default=100)
    parser.add_argument("--grpo-steps", type=int, default=60)
    parser.add_argument("--dpo-pairs", type=int, default=1200, help="hh-rlhf pairs read (256 held out)")
    parser.add_argument("--eval-items", type=int, default=100, help="held-out items per exact-match set")
    parser.add_argument("--result", default="posttrain", help="bench/results/NAME.json")
    parser.add_argument("--reuse", action="store_true", help="keep stages and evaluations already in --runs")
    parser.add_argument("--only", choices=("all", "addition"), default="all",
                        help="addition: rerun the base and the addition chain only, keeping the other figures")  # fmt: skip
    args = parser.parse_args()
    global REUSE
    REUSE = args.reuse
    data = shared_data("corpus/prose", "posttrain/gsm8k/train.jsonl", "eval/gsm8k/test.jsonl")
    os.environ.setdefault("SMELT_SHARED_DATA", str(data))
    runs = Path(args.runs)
    base, n = runs / "posttrain-base", args.eval_items
    n_add = min(n, heldout_addition_problems(1))  # the held-out 1-digit problems
    started = time.time()
    load = os.getloadavg()

    if not (REUSE and (base / "summary.json").is_file()):  # --reuse keeps the base run too
        smelt("run", str(CONFIGS / "base.toml"), "--restart",
              *sets(f"run.dir='{runs}'", f"train.tokens={args.base_tokens}"))  # fmt: skip
    base_summary = json.loads((base / "summary.json").read_text())
    gsm8k_test = data / "eval" / "gsm8k" / "test.jsonl"
    gsm8k_train = data / "posttrain" / "gsm8k" / "train.jsonl"
    if args.only == "all":
        base_eval = evaluate(
            base, data, n, gsm8k=gsm8k_test, few_shot=4, shots_from=gsm8k_train, addition=n_add
        )
    else:
        base_eval = evaluate(base, data, n, addition=n_add)

    sft_add = stage("sft_addition.toml", runs, base, runs / "sft-addition", f"optim.steps={args.sft_steps}")
    add_eval = evaluate(runs / "sft-addition", data, n, addition=n_add)
    grpo = stage("grpo_addition.toml", runs, runs / "sft-addition", runs / "grpo-addition",
                 f"optim.steps={args.grpo_steps}", f"eval.items={n_add}")  # fmt: skip
    figures = {
        "base_tokens": args.base_tokens,
        "base_val_loss": base_summary.get("final_val_loss"),
        "base_train_tokens_per_s": base_summary.get("train_tokens_per_s"),
        "eval_items": n,
        "addition_eval_items": add_eval["addition_chat"]["items"],
        "addition_eval_contaminated_dropped": add_eval["addition_chat"]["contaminated_dropped"],
        "addition_exact_match_base": base_eval["addition_chat"]["exact_match"],
        "addition_exact_match_sft": add_eval["addition_chat"]["exact_match"],
        "addition_sft_val_loss_before": sft_add["val_loss_before"],
        "addition_sft_val_loss_after": sft_add["val_loss"],
        "addition_sft_train_items": sft_add["train_items"],
        "addition_sft_heldout_items": sft_add["heldout_items"],
        "grpo_heldout_items": grpo["heldout_items"],
        "grpo_heldout_reward_before": grpo["heldout_reward_before"],
        "grpo_heldout_reward_after": grpo["heldout_reward_after"],
        "grpo_heldout_sampled_reward_before": grpo["heldout_sampled_reward_before"],
        "grpo_heldout_sampled_reward_after": grpo["heldout_sampled_reward_after"],
        "grpo_train_reward_first_quarter": grpo["train_reward_first_quarter"],
        "grpo_train_reward_last_quarter": grpo["train_reward_last_quarter"],
        "sft_addition_tokens_per_s": sft_add["tokens_per_s"],
        "grpo_tokens_per_s": grpo["tokens_per_s"],
        "sft_addition_steps": args.sft_steps,
        "grpo_steps": args.grpo_steps,
    }
    if args.only == "addition":
        previous = json.loads((RESULTS / f"{args.result}.json").read_text())
        kept = {k: v for k, v in previous.items() if k not in figures and k not in KEPT_OUT}
        # The kept GSM8K and DPO figures descend from the earlier base: say which one.
        kept["kept_base_val_loss"] = previous.get("kept_base_val_loss", previous.get("base_val_loss"))
        figures = {**kept, **figures, "remeasured": sorted(figures), "kept": sorted(set(kept) - {"kept_from"}),
                   "kept_from": previous.get("kept_from") or previous.get("command")}  # fmt: skip
    else:
        figures.update(rest_of_chain(args, runs, data, base_eval, gsm8k_test))
    figures.update({
        "wall_time_s": round(time.time() - started, 1),
        "load_average_1min_at_start": round(load[0], 2),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    })  # fmt: skip
    write_result(args.result, figures)


# Keys of an earlier result that describe that invocation, not a figure: never carried over.
KEPT_OUT = {"command", "machine", "wall_time_s", "load_average_1min_at_start", "load_average_1min_at_end",
            "remeasured", "kept"}  # fmt: skip


def rest_of_chain(
    args: argparse.Namespace, runs: Path, data: Path, base_eval: dict, gsm8k_test: Path
) -> dict:
    """SFT on GSM8K train, its GSM8K test evaluation and DPO on hh-rlhf from it: their figures."""
    n, base = args.eval_items, runs / "posttrain-base"
    sft_gsm = stage("sft_gsm8k.toml", runs, base, runs / "sft-gsm8k", f"optim.steps={args.gsm8k_steps}")
    gsm_eval = evaluate(runs / "sft-gsm8k", data, n, gsm8k=gsm8k_test)
    dpo = stage(
        "dpo_hh.toml",
        runs,
        runs / "sft-gsm8k",
        runs / "dpo",
        f"optim.steps={args.dpo_steps}",
        f"data.limit={args.dpo_pairs}",
        f"data.heldout={min(256, args.dpo_pairs // 4)}",
    )
    before, after = dpo["heldout_before"], dpo["heldout_after"]
    return {
        "gsm8k_eval_contaminated_dropped": gsm_eval["gsm8k_chat"]["contaminated_dropped"],
        "gsm8k_sft_heldout_contaminated": sft_gsm["heldout_contaminated"],
        "dpo_dropped": dpo["dropped"],
        "dpo_heldout_contaminated": dpo["heldout_contaminated"],
        "gsm8k_exact_match_base_4shot": base_eval["gsm8k_few_shot"]["exact_match"],
        "gsm8k_exact_match_base_chat": base_eval["gsm8k_chat"]["exact_match"],
        "gsm8k_exact_match_sft_chat": gsm_eval["gsm8k_chat"]["exact_match"],
        "gsm8k_sft_val_loss_before": sft_gsm["val_loss_before"],
        "gsm8k_sft_val_loss_after": sft_gsm["val_loss"],
        "dpo_heldout_pairs": after.get("pairs"),
        "dpo_logp_accuracy_before": before.get("logp_accuracy"),
        "dpo_logp_accuracy_after": after.get("logp_accuracy"),
        "dpo_reward_accuracy_before": before.get("reward_accuracy"),
        "dpo_reward_accuracy_after": after.get("reward_accuracy"),
        "dpo_first_loss": dpo["first_loss"],
        "dpo_final_loss": dpo["final_loss"],
        "sft_gsm8k_tokens_per_s": sft_gsm["tokens_per_s"],
        "dpo_tokens_per_s": dpo["tokens_per_s"],
        "sft_gsm8k_steps": args.gsm8k_steps,
        "dpo_steps": args.dpo_steps,
    }


if __name__ == "__main__":
    main()
