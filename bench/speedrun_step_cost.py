"""CPU seconds per training step of the speedrun's shapes, alternated so that they share the machine's load.

Wall-clock tokens/s on a busy machine follow the load; the process's CPU time per step much less so
(cache and SMT contention remain). Each shape runs `--steps` steps of the quickstart's batch (16 x 128,
bf16 autocast, Muon + AdamW as the recipe has them; the GPT-2-style baseline of bench/speedrun_gpt2.py
with its AdamW) in turn, `--rounds` times; the figure is the median CPU seconds per step and its ratio
to the first shape, beside the FLOPs ratio.

    python bench/speedrun_step_cost.py [--rounds 3] [--steps 20] [--out speedrun_step_cost]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import REPO, write_result

sys.path.insert(0, str(REPO / "src"))

SHAPES = {
    "d128": {},
    "d128_relu2": {"mlp": "relu2"},
    "d96": {"d_model": 96},
    "d96_relu2": {"d_model": 96, "mlp": "relu2"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--out", default="speedrun_step_cost")
    a = p.parse_args()
    import torch
    from speedrun_gpt2 import GPT2, GPT2Shape

    from smelt.config import ModelConfig, TrainConfig
    from smelt.model.flops import flops_per_token
    from smelt.model.transformer import Transformer
    from smelt.train.optim import build_optimizer

    torch.set_num_threads(1)
    tc = TrainConfig(optimizer="muon", lr=3e-3)
    runs = {}
    for name, keys in SHAPES.items():
        cfg = ModelConfig(
            **{"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 128, **keys}
        )
        torch.manual_seed(0)
        model = Transformer(cfg, a.vocab)
        runs[name] = (
            flops_per_token(cfg, a.vocab, 128),
            model,
            build_optimizer(model, tc, torch.device("cpu")),
            [],
        )
    torch.manual_seed(0)
    gpt2 = GPT2(GPT2Shape(a.vocab, 128, 4, 4, 128))
    opt = torch.optim.AdamW(gpt2.parameters(), lr=1.5e-3, betas=(0.9, 0.95), fused=True)
    runs["gpt2_baseline"] = (gpt2.flops_per_token(), gpt2, opt, [])
    x = torch.randint(0, a.vocab, (16, 129), generator=torch.Generator().manual_seed(0))
    for _ in range(a.rounds):
        for _flops, model, opt, times in runs.values():
            for step in range(a.steps + 2):
                started = time.process_time()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    _, loss = model(x[:, :-1], x[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if step >= 2:  # the first steps allocate
                    times.append(time.process_time() - started)
    first = next(iter(runs))
    base_s = statistics.median(runs[first][3])
    base_f = runs[first][0]
    figures = {}
    for name, (flops, _, _, times) in runs.items():
        s = statistics.median(times)
        figures[name] = {"cpu_s_per_step": round(s, 4), "cpu_ratio": round(s / base_s, 3),
                         "flops_ratio": round(flops / base_f, 3)}  # fmt: skip
    write_result(a.out, {"shapes": figures, "steps": a.steps * a.rounds, "batch": "16 x 128"})


if __name__ == "__main__":
    main()
