"""Each capability shown doing its job, over 3 seeds (issue 36): the effect's figure before and after
(or against its baseline) per seed, their mean and spread, and whether the effect shows: the mean
difference exceeds both the effect's threshold and twice its spread over seeds (the sample standard
deviation of the per-seed differences).

Effects (run in this order; --only NAME runs one and keeps the others in the result file):
  sft        held-out exact match of 1-digit addition, base -> SFT; threshold +0.50
  dpo        held-out preference accuracy (implicit reward) on correct vs incorrect sums; threshold +0.20
  grpo       held-out greedy reward of 2-digit addition, SFT checkpoint mid-task -> GRPO; threshold +0.10
  anneal     WSD decay from a stable checkpoint against the stable run continued; threshold 0.03 nats
  averaging  uniform average of the last k checkpoints of a constant-LR run against its last; threshold 0
  moe        MoE against dense at equal active FLOPs and tokens; threshold 0 (and 2 x spread)
  context    passkey retrieval after a context extension (not run: see the result)
  muon       Muon against AdamW at each one's best LR of three (report only)

Every run goes through the smelt CLI (`smelt run`, `smelt train --from`, `smelt anneal`,
`smelt checkpoint average`, `smelt eval`, `smelt posttrain run|eval`). Usage:
    OMP_NUM_THREADS=1 python bench/effects.py [--only NAME] [--runs DIR] [--seeds 0 1 2]
Writes bench/results/effects.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from common import REPO, RESULTS, machine, shared_data  # noqa: E402
from effects_common import SEEDS  # noqa: E402

NAMES = ("sft", "dpo", "grpo", "anneal", "averaging", "moe", "context", "muon")


def runner(name: str):
    import importlib

    module, function = {"sft": ("effects_posttrain", "sft_effect"), "dpo": ("effects_posttrain", "dpo_effect"),
                        "grpo": ("effects_posttrain", "grpo_effect"), "anneal": ("effects_pretrain", "anneal_effect"),
                        "averaging": ("effects_pretrain", "averaging_effect"), "moe": ("effects_moe", "moe_effect"),
                        "context": ("effects_context", "context_effect"), "muon": ("effects_moe", "muon_effect")}[name]  # fmt: skip
    return getattr(importlib.import_module(module), function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=NAMES, action="append", help="run this effect (repeatable)")
    parser.add_argument("--runs", default=str(REPO / "runs" / "bench-effects"), help="where the runs go")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--result", default="effects", help="bench/results/NAME.json")
    args = parser.parse_args()
    shared = shared_data("corpus/prose", "corpus/code")
    os.environ.setdefault("SMELT_SHARED_DATA", str(shared))
    runs = Path(args.runs)
    path = RESULTS / f"{args.result}.json"
    for name in args.only or NAMES:
        started, load = time.time(), os.getloadavg()[0]
        # Finished runs are reused, not retrained: the wall time then covers only what ran now.
        reused = len(list((runs / name).glob("**/train/summary.json")))
        print(f"[effects] {name} ...", flush=True)
        figures = runner(name)(runs / name, shared, args.seeds)
        figures.update({
            "wall_time_s": round(time.time() - started, 1), "load_average_1min_at_start": round(load, 2),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "command": f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} python bench/effects.py --only {name}",
        })  # fmt: skip
        # Read the file again: another invocation (--only OTHER) may have written its effect meanwhile.
        result = json.loads(path.read_text()) if path.is_file() else {}
        effects = {n: {"shown": None, "status": "not run"} for n in NAMES} | result.get("effects", {})
        figures["runs_reused"] = reused
        if reused and "wall_time_s" in effects[name]:  # the time of the run that trained them, kept
            figures["wall_time_s_trained"] = effects[name].get(
                "wall_time_s_trained", effects[name]["wall_time_s"]
            )
        effects[name] = figures
        result = {"effects": effects, "machine": machine(),
                  "summary": {n: effects[n].get("shown") for n in NAMES}}  # fmt: skip
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        d = figures.get("difference", {})
        print(f"[effects] {name}: shown={figures.get('shown')} difference mean {d.get('mean')} "
              f"spread {d.get('spread')} per seed {d.get('per_seed')} ({figures['wall_time_s']} s)", flush=True)  # fmt: skip
    print(f"-> {path}")


if __name__ == "__main__":
    main()
