"""Host memory of building a large model under 2-rank FSDP2: every rank building the whole model first
(smelt before sharded initialisation) against the meta-device build that materialises only each rank's
shards (train/materialize.py).

Usage: python bench/scale.py [--vocab 20480] [--d-model 1024] [--layers 8]

The model (untied, 132M parameters at the defaults: 1.58 GB of fp32 weights and Adam moments) is built
by tests/train/sharded_init_worker.py under `torchrun --nproc_per_node 2` on gloo, once each way; the
figure is the growth of each rank's peak RSS (ru_maxrss) across the build. Writes bench/results/scale.json,
keeping the "plan_vs_measured" figures that bench/parallel.py --plan-vs-measured put there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import REPO, RESULTS, smelt_env, write_result

from smelt.config import ModelConfig
from smelt.model.flops import count_params

WORKER = REPO / "tests" / "train" / "sharded_init_worker.py"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--vocab", type=int, default=20480)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    model = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": 16, "n_kv_heads": 4,
             "max_seq_len": 64, "tie_embeddings": False}  # fmt: skip
    raw = {"run": {"seed": 1}, "vocab": args.vocab, "model": model,
           "train": {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 2560, "threads": 1,
                     "parallel": "fsdp"}}  # fmt: skip
    params = count_params(ModelConfig(**model), args.vocab)["total"]
    figures: dict[str, object] = {"params": params, "weights_and_adam_gb": round(params * 12 / 1e9, 3)}
    env = smelt_env(OMP_NUM_THREADS="1", SMELT_QUIET="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(raw))
        for mode in ("whole", "sharded"):
            out = Path(tmp) / f"{mode}.pt"
            started = time.perf_counter()
            subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(config),
                            str(out), mode, "memory"], env=env, check=True, capture_output=True)  # fmt: skip
            got = torch.load(out)
            growth = [(p - b) / 1024 for p, b in zip(got["rss_peak_kb"], got["rss_before_kb"], strict=True)]
            figures[f"{mode}_build_rss_growth_mb_per_rank"] = [round(g, 1) for g in growth]
            figures[f"{mode}_peak_rss_mb_per_rank"] = [round(k / 1024, 1) for k in got["rss_peak_kb"]]
            figures[f"{mode}_wall_s"] = round(time.perf_counter() - started, 1)
    whole, sharded = (max(figures[f"{m}_build_rss_growth_mb_per_rank"]) for m in ("whole", "sharded"))  # type: ignore[type-var]
    figures["sharded_over_whole_growth"] = round(sharded / whole, 3)
    # bench/parallel.py --plan-vs-measured writes its figures into the same file: keep them
    previous = RESULTS / "scale.json"
    if previous.is_file() and "plan_vs_measured" in (kept := json.loads(previous.read_text())):
        figures["plan_vs_measured"] = kept["plan_vs_measured"]
    write_result("scale", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
