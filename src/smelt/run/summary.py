"""The end-of-run summary (its figures as data, written to RUN/summary.json, and the table printed) and
the rows of evaluation and goodput figures the commands print (as tables: smelt/tables.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smelt.config import Config
from smelt.metric_records import METRICS
from smelt.tables import print_table


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
        "train_mfu_model": train.get("mfu_model"),
        "final_train_loss": train["final_train_loss"],
        # The trainer's last validation: per-source losses and the headline combined from them, on
        # the first train.eval_tokens of the validation split (val_loss_text says which text).
        "final_val_loss": train["final_val_loss"],
        "val_loss_weighting": train.get("val_loss_weighting"),
        "val_loss_by_source": train.get("val_loss_by_source"),
        "val_loss_text": trainer_text(cfg, len(train.get("val_loss_by_source") or {})),
        "train_peak_flops": train.get("peak_flops"),
        "train_peak_flops_source": train.get("peak_flops_source"),
        "eval_time_s": train.get("eval_time_s"),
        "eval_share": train.get("eval_share"),
        "evals_skipped": train.get("evals_skipped"),
        "train_goodput": train.get("goodput"),  # where the training wall time went (report/goodput.py)
        "val_bits_per_byte": heldout["bits_per_byte"],  # total bits over total bytes, all sources
        "val_bits_per_byte_by_source": {
            source: figures["bits_per_byte"]
            for source, figures in evaluation["heldout"]["per_source"].items()
        },
        # The eval stage's loss on the same text as its bits per byte (val_bits_per_byte_text), which
        # is not the trainer's: compare sources within one of the two, not across them.
        "eval_loss_by_source": {
            source: figures["loss"] for source, figures in evaluation["heldout"]["per_source"].items()
        },
        "eval_bytes_per_token_by_source": {
            source: figures.get("bytes_per_token")
            for source, figures in evaluation["heldout"]["per_source"].items()
        },
        "val_bits_per_byte_text": eval_text(cfg, evaluation["heldout"]),
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
            "metrics": str(outcomes["train"].directory / METRICS),
            "eval": str(outcomes["eval"].directory),
        },
    }


def trainer_text(cfg: Config, sources: int) -> str:
    """Which text the trainer's final validation scored."""
    if not cfg.train.eval_tokens:
        return "every token of the validation split"
    each = cfg.train.eval_tokens // max(sources, 1)
    return (
        f"the first {each:,} tokens of each validation source (train.eval_tokens = {cfg.train.eval_tokens:,})"
    )


def eval_text(cfg: Config, heldout: dict[str, Any]) -> str:
    """Which text the eval stage scored."""
    scored = f"{heldout['overall']['bytes']:,} bytes"
    if not cfg.eval.max_bytes:
        return f"every document of the validation split ({scored})"
    each = cfg.eval.max_bytes // max(len(heldout["per_source"]), 1)
    return f"the first {each:,} bytes of each validation source ({scored}; eval.max_bytes = {cfg.eval.max_bytes:,})"


def mfu_text(summary: dict[str, Any]) -> str:
    """PaLM's convention (6N + 12 L d s, head counted) first, then the matmul model FLOPs' figure, and
    the peak they divide by with its source (env, table, cached DATE, measured-now)."""
    if summary["train_mfu"] is None:
        return "-"
    text = f"{100 * summary['train_mfu']:.1f}% (6N + attention)"
    model = summary.get("train_mfu_model")
    text = text if model is None else f"{text}, {100 * model:.1f}% (matmul model FLOPs)"
    peak, source = summary.get("train_peak_flops"), summary.get("train_peak_flops_source")
    if peak:
        text += f" of {peak / 1e9:,.1f} GFLOP/s" + (f" ({source.split(' (')[0]})" if source else "")
    return text


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
        ("MFU", mfu_text(summary)),
        (
            "final train / val loss",
            f"{fmt(summary['final_train_loss'], '.4f')} / {fmt(summary['final_val_loss'], '.4f')}"
            + val_weighting(summary),
        ),
        *by_source_row("val loss by source", summary.get("val_loss_by_source")),
        *text_row(summary.get("val_loss_by_source"), summary.get("val_loss_text")),
        ("validation time", eval_time(summary)),
        *goodput_rows(summary.get("train_goodput")),
        ("val bits/byte: model", fmt(summary["val_bits_per_byte"], ".4f")),
        *eval_by_source_rows(summary),
        ("val bits/byte: gzip -9", fmt(summary["val_gzip_bits_per_byte"], ".4f")),
        ("val bits/byte: xz -9e", fmt(summary["val_xz_bits_per_byte"], ".4f")),
        ("held-out bytes", fmt(summary["val_bytes"])),
        ("wall time", f"{summary['wall_time_s']:.1f}s"),
    ]
    print_table(rows)
    print("\nsamples:")
    for item in summary["samples"]:
        print(f"--- {item['prompt']!r}\n{item['prompt']}{item['completion']}")
    print("\nwritten:")
    for name, path in summary["paths"].items():
        print(f"  {name:<10} {path}")
    print(f"  {'summary':<10} {Path(summary['run_dir']) / 'summary.json'}")


def val_weighting(summary: dict[str, Any]) -> str:
    """How the headline validation loss combines the sources, when there are several."""
    sources = summary.get("val_loss_by_source") or {}
    if len(sources) < 2:
        return ""
    weighting = summary.get("val_loss_weighting") or "mixture"
    how = "the training mixture" if weighting == "mixture" else "tokens scored"
    return f" (val: {len(sources)} sources weighted by {how})"


def goodput_rows(figures: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The goodput row (productive step time over wall time, and where the rest went) and the
    checkpoint-interval advice, when the run logged the figures."""
    if not figures or figures.get("goodput") is None:
        return []
    lost = ", ".join(
        f"{name} {figures[key]:.1f}s"
        for name, key in (("restarts", "restart_downtime_s"), ("redone steps", "lost_s"),
                          ("checkpoint stalls", "checkpoint_stall_s"), ("eval", "eval_s"), ("other", "other_s"))
        if figures.get(key)
    )  # fmt: skip
    rows = [
        (
            "goodput",
            f"{100 * figures['goodput']:.1f}% of {figures['wall_s']:.1f}s" + (f" ({lost})" if lost else ""),
        )
    ]
    advice = figures.get("checkpoint_interval")
    if advice:
        rows.append(("checkpoint interval", advice.get("hint") or (
            f"every {advice['every_steps']} steps is near the Young-Daly interval of {advice['optimal_every_steps']}")))  # fmt: skip
    return rows


def text_row(values: dict[str, float] | None, text: str | None) -> list[tuple[str, str]]:
    """Which text the figures by source above it scored, when there are several sources."""
    return [("  scored on", text)] if values and len(values) > 1 and text else []


def eval_by_source_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The eval stage's loss and bits per byte by source, both on its own text (not the trainer's
    validation text above), with the bytes per token that turn one into the other."""
    bits = summary.get("val_bits_per_byte_by_source") or {}
    if len(bits) < 2:
        return []
    losses = summary.get("eval_loss_by_source") or {}
    per_token = summary.get("eval_bytes_per_token_by_source") or {}
    if not losses:  # a summary written before the eval stage's losses were kept
        return by_source_row("val bits/byte by source", bits)
    parts = []
    for source in sorted(bits):
        spread = f", {per_token[source]:.2f} bytes/token" if per_token.get(source) else ""
        parts.append(f"{source} {losses[source]:.4f} / {bits[source]:.4f}{spread}")
    rows = [("held-out loss / bits/byte by source", "; ".join(parts))]
    return rows + text_row(bits, summary.get("val_bits_per_byte_text"))


def by_source_row(name: str, values: dict[str, float] | None) -> list[tuple[str, str]]:
    """One row listing a figure per source, when there are several."""
    if not values or len(values) < 2:
        return []
    return [(name, ", ".join(f"{source} {value:.4f}" for source, value in sorted(values.items())))]


def eval_time(summary: dict[str, Any]) -> str:
    seconds, share = summary.get("eval_time_s"), summary.get("eval_share")
    if seconds is None:
        return "-"
    text = f"{seconds:.1f}s" + (f" ({100 * share:.1f}% of training)" if share is not None else "")
    skipped = summary.get("evals_skipped") or 0
    return text + (f"; {skipped} evaluation(s) skipped for train.eval_budget" if skipped else "")


def eval_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("checkpoint", result["checkpoint"])]
    heldout = result.get("heldout", {})  # absent when only text sets (smelt eval --data) were scored
    overall = heldout.get("overall", {})
    weighting = overall.get("loss_weighting")
    everything = f"all ({weighting}-weighted loss)" if weighting else "all"
    scored = sorted(heldout.get("per_source", {}).items()) + ([(everything, overall)] if overall else [])
    for source, figures in scored:
        rows.append(
            (
                f"{source}: loss / bits-per-byte",
                f"{figures['loss']:.4f} / {figures['bits_per_byte']:.4f} "
                f"(gzip {figures['gzip_bits_per_byte']:.4f}, xz {figures['xz_bits_per_byte']:.4f})",
            )
        )
    for name, task in result.get("tasks", {}).items():
        spread = f" ± {task['stderr']:.3f}" if task.get("stderr") is not None else ""
        chance = f", chance {task['chance']:.3f}" if "chance" in task else ""
        overlap = task.get("contamination")
        dirty = f"; contaminated items {overlap['items_matched']}/{overlap['items']}" if overlap else ""
        skipped = f", {task['skipped']} longer than the context skipped" if task.get("skipped") else ""
        rows.append(
            (
                f"{name}: {task['metric']}",
                f"{'-' if task['score'] is None else format(task['score'], '.4f')}{spread} "
                f"({task['items']} items{skipped}, {task['shots']}-shot{chance}{dirty})",
            )
        )
    return rows
