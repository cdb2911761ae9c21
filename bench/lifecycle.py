"""The run lifecycle on the shared corpus with the quickstart-size model (configs/lifecycle.toml):

1. a stable run (constant LR after warmup) to 512,000 tokens, checkpoints every 25 steps;
2. two anneal forks from its step 100 (409,600 tokens), 102,400 tokens each, one richer in code and one
   in prose (`smelt anneal`), against the stable run continued to the same 512,000 tokens; each anneal
   reads on from the stable run's data at step 100 (train.fork_data = "continue"), as the stable run
   continued does, so neither trains on data the model has seen;
3. a context extension of the stable end from 256 to 1024 tokens (YaRN, factor 4, 102,400 tokens):
   passkey accuracy at 256/512/1024 tokens and held-out loss at positions beyond 256, before and after.
   Its 1024-token windows cannot continue the parent's 256-token order: it reads its data from the
   beginning (train.fork_data = "restart").

Every run goes through the smelt CLI, so a second invocation reuses what is up to date. Writes
bench/results/lifecycle.json. Usage: python bench/lifecycle.py [--runs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import REPO, shared_data, write_result

CONFIG = REPO / "configs" / "lifecycle.toml"
FORK_STEP, STABLE_END, DECAY_TOKENS = 100, 125, 102_400
VARIANTS = [
    ["code", "tokens.mixture={prose=0.4, code=0.6}"],
    ["prose", "tokens.mixture={prose=0.9, code=0.1}"],
]
CONTEXT = [
    "train.seq_len=1024", "model.max_seq_len=1024", "model.rope_scaling='yarn'", "model.rope_factor=4.0",
    "model.rope_original_max_seq_len=256", "train.micro_batch=4", f"train.tokens={DECAY_TOKENS}",
    "train.warmup_tokens=20480", "train.schedule='cosine'", "train.eval_every=0", "train.fork_data='restart'",
]  # fmt: skip
PASSKEY_LENGTHS = (256, 512, 1024)


def smelt(*argv: str) -> None:
    from smelt.cli import main

    code = main(list(argv))
    if code != 0:
        raise SystemExit(f"smelt {' '.join(argv[:3])} ... exited {code}")


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def per_source(result: dict) -> dict[str, float]:
    return {s: f["bits_per_byte"] for s, f in result["heldout"]["per_source"].items()}


def beyond(heldout: dict, trained: int) -> tuple[float, int]:
    """Token-weighted mean loss of the position buckets that start at or past `trained`."""
    loss = tokens = 0.0
    for name, figures in heldout["overall"]["loss_by_position"].items():
        start = int(name.split("-")[0].rstrip("+"))
        if start >= trained:
            loss += figures["loss"] * figures["tokens"]
            tokens += figures["tokens"]
    return (loss / tokens if tokens else float("nan")), int(tokens)


def context_figures(run: Path, checkpoint: Path, extended: bool, seq_len: int = 1024) -> dict:
    """Passkey accuracy and held-out loss at 1024 tokens of one checkpoint; an unextended model gets
    its RoPE table widened under its own (unscaled) frequencies, which is how it extrapolates."""
    import torch

    from smelt.checkpoint.store import load_model
    from smelt.eval.heldout import heldout_bits_per_byte
    from smelt.eval.passkey import evaluate_passkey
    from smelt.model.rope import extend_context
    from smelt.tokenizer.load import Tokenizer

    tokenizer = Tokenizer.load(run / "tokenizer")
    model, _ = load_model(checkpoint)
    if not extended:
        extend_context(model, seq_len)
    torch.manual_seed(0)
    passkey = evaluate_passkey(model, tokenizer, PASSKEY_LENGTHS)
    heldout = heldout_bits_per_byte(
        model,
        run / "tokens",
        run / "documents",
        tokenizer.eos_id,
        seq_len,
        4,
        200_000,
        doc_masking=True,
        trained_at=(256,),
    )
    loss_beyond, tokens_beyond = beyond(heldout, 256)
    return {
        "passkey_acc": passkey["acc"],
        **{f"passkey_acc_at_{n}": passkey["by_length"][str(n)]["acc"] for n in PASSKEY_LENGTHS},
        "loss_beyond_256": loss_beyond,
        "tokens_beyond_256": tokens_beyond,
        "bits_per_byte_at_1024": heldout["overall"]["bits_per_byte"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=str(REPO / "runs" / "bench-lifecycle"), help="where the runs go")
    parser.add_argument("--skip-context", action="store_true", help="only the stable run and the anneals")
    args = parser.parse_args()
    os.environ.setdefault("SMELT_SHARED_DATA", str(shared_data("corpus/prose", "corpus/code")))
    runs = Path(args.runs)
    base = [str(CONFIG), *sets(f"run.dir='{runs}'")]
    stable = runs / "lifecycle"
    started = time.time()

    smelt("run", *base)
    variant_args = [arg for v in VARIANTS for arg in ("--variant", *v)]
    smelt(
        "anneal", *base, "--from", f"{stable}:{FORK_STEP}", "--decay-tokens", str(DECAY_TOKENS), *variant_args
    )
    comparison = json.loads((stable / "anneals" / f"anneal-step_{FORK_STEP:07d}.json").read_text())

    from smelt.config import load_config
    from smelt.eval.run import evaluate_checkpoints

    cfg = load_config(CONFIG, [f"run.dir='{runs}'"])
    (stable_end,) = evaluate_checkpoints(cfg, stable, str(STABLE_END), tasks=[])
    figures: dict[str, object] = {"fork_step": FORK_STEP, "decay_tokens": DECAY_TOKENS}
    equal_tokens = FORK_STEP * 4096 + DECAY_TOKENS
    assert stable_end["tokens_seen"] == equal_tokens, stable_end["tokens_seen"]
    figures["equal_tokens"] = equal_tokens
    rows = {row["run"]: row for row in comparison["rows"]}
    at_fork = rows[f"stable@{FORK_STEP}"]
    figures["stable_fork_point_bpb"] = round(at_fork["bits_per_byte"], 4)
    for source, value in sorted(at_fork["bits_per_byte_by_source"].items()):
        figures[f"stable_fork_point_bpb_{source}"] = round(value, 4)
    figures["stable_continued_bpb"] = round(stable_end["heldout"]["overall"]["bits_per_byte"], 4)
    for source, value in sorted(per_source(stable_end).items()):
        figures[f"stable_continued_bpb_{source}"] = round(value, 4)
    for name, _ in VARIANTS:
        row = rows[name]
        figures[f"anneal_{name}_bpb"] = round(row["bits_per_byte"], 4)
        for source, value in sorted(row["bits_per_byte_by_source"].items()):
            figures[f"anneal_{name}_bpb_{source}"] = round(value, 4)

    figures["wall_time_s"] = round(time.time() - started, 1)
    if args.skip_context:
        figures["context_extension"] = "not run (--skip-context)"
        write_result("lifecycle", figures)
        return
    smelt("train", *base, *sets(*CONTEXT, "run.name='lifecycle-ctx1024'"), "--from", f"{stable}:{STABLE_END}")
    extended = runs / "lifecycle-ctx1024"
    from smelt.checkpoint.store import latest_checkpoint

    before = context_figures(stable, stable / "train" / "checkpoints" / f"step_{STABLE_END:07d}", False)
    after = context_figures(extended, latest_checkpoint(extended / "train" / "checkpoints"), True)
    for key, value in before.items():
        figures[f"context_before_{key}"] = round(value, 4) if isinstance(value, float) else value
    for key, value in after.items():
        figures[f"context_after_{key}"] = round(value, 4) if isinstance(value, float) else value
    figures["wall_time_s"] = round(time.time() - started, 1)
    write_result("lifecycle", figures)


if __name__ == "__main__":
    main()
