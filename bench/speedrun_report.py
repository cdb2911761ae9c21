"""The figures bench/speedrun.py writes: spreads over the seeds, the baseline beside smelt, the targets."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess

# Issue 37's targets for the seconds of training to beat xz -9e on two cores.
TARGET_S = {"bf16": 30.0, "fp32": 60.0}


def spread(values: list[float | None]) -> dict | None:
    """min / median / max of the values; None when any run did not get there."""
    if not values or any(v is None for v in values):
        return None
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
            "max": round(max(values), 4), "values": [round(v, 4) for v in values]}  # fmt: skip


def cpu() -> dict:
    """The CPU's model name and whether it has AVX-512 BF16 (which `precision = auto` trains in)."""
    flags, name = "", platform.processor()
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        name = next(
            (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("Model name")), name
        )
        flags = next((ln for ln in info.splitlines() if ln.startswith("Flags")), "")
    except OSError:
        pass
    return {"cpu_model": name, "cores": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags}


def at_tokens(curve: list, tokens: int) -> float | None:
    """Bits per byte of the evaluation at exactly `tokens` (None: the run had no evaluation there)."""
    return next((round(row[3], 4) for row in curve if row[1] == tokens), None)


def summarize(a, cfg, prep, split, smelt_runs, baseline, load_before, load_after) -> dict:
    m, tc = cfg.model, cfg.train
    precision = smelt_runs[0]["precision"]
    busy = max(load_before[0], load_after[0]) > (os.cpu_count() or 1)
    target = TARGET_S.get(precision)
    times = [r["to_target"]["train_s"] if r["to_target"] else None for r in smelt_runs]
    smelt = {
        "recipe": {"d_model": m.d_model, "n_layers": m.n_layers, "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads,
                   "qk_norm": m.qk_norm, "tie_embeddings": m.tie_embeddings, "seq_len": tc.seq_len,
                   "batch_tokens": tc.batch_tokens, "tokens": tc.tokens, "lr": tc.lr, "optimizer": tc.optimizer,
                   "muon_lr": tc.muon_lr, "schedule": tc.schedule, "decay_fraction": tc.decay_fraction,
                   "warmup_tokens": tc.warmup_tokens, "doc_masking": tc.doc_masking, "compile": tc.compile,
                   "vocab_size": cfg.tokenizer.vocab_size},
        "params": smelt_runs[0]["params"], "flops_per_token": smelt_runs[0]["flops_per_token"],
        "train_s_to_target": spread(times),
        "tokens_to_target": spread([r["to_target"]["tokens"] if r["to_target"] else None for r in smelt_runs]),
        "final_bits_per_byte": spread([r["final_bits_per_byte"] for r in smelt_runs]),
        "tokens_per_s": spread([r["tokens_per_s"] for r in smelt_runs]),
        "mfu": spread([r["mfu"] for r in smelt_runs]),
        "train_s": spread([r["train_s"] for r in smelt_runs]),
        "eval_s": spread([r["eval_s"] for r in smelt_runs]),
        "runs": smelt_runs,
    }  # fmt: skip
    out = {
        "machine_cpu": cpu(), "precision": precision, "threads": a.threads or os.cpu_count(),
        "load_average_before": load_before, "load_average_after": load_after,
        "under_load": busy,
        "timing_note": ("wall times and tokens/s were taken while other processes loaded the machine "
                        f"(load average {load_before} before, {load_after} after, {os.cpu_count()} cores): "
                        "they are inflated; bits per byte at equal tokens are not") if busy else
                       "the machine was otherwise idle (load average below the core count)",
        "seeds": a.seeds, "eval_every_steps": a.eval_every, "quick": a.quick,
        "prepare_s": {key: spread(values) for key, values in prep.items()},
        "prepare_total_s": spread([sum(v) for v in zip(*prep.values(), strict=True)]),
        "val_bytes": split["val_bytes"], "val_tokens": split["val_tokens"],
        "xz_bits_per_byte": round(split["xz_bits_per_byte"], 4),
        "gzip_bits_per_byte": round(split["gzip_bits_per_byte"], 4),
        "smelt": smelt,
        "target_train_s": target,
        "target_met": (times[0] is not None and max(times) <= target) if target and all(times) else False,
    }  # fmt: skip
    if baseline is not None:
        tokens = smelt_runs[0]["tokens"]
        b_runs = baseline["runs"]
        b_times = [r["to_target"]["train_s"] if r["to_target"] else None for r in b_runs]
        at_equal = [at_tokens(r["curve"], tokens) for r in b_runs]
        baseline.update({
            "bits_per_byte_at_smelt_tokens": spread(at_equal),
            "train_s_to_target": spread(b_times),
            "reached_target": [t is not None for t in b_times],
            "best_bits_per_byte": spread([r["best_bits_per_byte"] for r in b_runs]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in b_runs]),
            "mfu": spread([r["flops_per_token"] * r["tokens_per_s"] / smelt_runs[0]["peak_flops"] for r in b_runs])
            if smelt_runs[0]["peak_flops"] else None,
        })  # fmt: skip
        sweep_best = baseline["lr_sweep"][str(baseline["best_lr"])]
        smelt_med = smelt["final_bits_per_byte"]["median"]
        out["baseline"] = baseline
        out["smelt_beats_baseline_at_equal_tokens"] = smelt_med < min(
            [sweep_best, *[x for x in at_equal if x is not None]]
        )
        if all(times) and all(b_times):
            out["time_ratio_smelt_over_baseline"] = round(smelt["train_s_to_target"]["median"]
                                                          / baseline["train_s_to_target"]["median"], 3)  # fmt: skip
    return out
