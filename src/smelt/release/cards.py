"""The model card (README.md, with the YAML front matter model hubs read) and the data card, written
from the run's manifests, statistics, logs and eval results; nothing in them is typed by hand.

A figure the run did not record is written as "not recorded", never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smelt.release.data_order import read_json

NOT_RECORDED = "not recorded"


def _n(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return NOT_RECORDED if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_n(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def compute_figures(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Parameters, FLOPs (6N + 12 L d s per token x tokens trained) and device time of the run."""
    from smelt.config import ModelConfig
    from smelt.model.flops import count_params, flops_per_token

    cfg = ModelConfig(**meta["model_config"])
    vocab = int(meta["vocab_size"])
    seq_len = int((meta.get("loader") or {}).get("seq_len") or meta["config"]["train"]["seq_len"])
    params = count_params(cfg, vocab)
    per_token = flops_per_token(cfg, vocab, seq_len)
    tokens = int(meta.get("tokens") or 0)
    summary = read_json(run_dir / "train" / "summary.json") or {}
    wall = summary.get("wall_time_s")
    world = int(summary.get("world_size") or meta.get("world_size") or 1)
    device = str(summary.get("device") or NOT_RECORDED)
    hours = wall * world / 3600 if isinstance(wall, (int, float)) else None
    return {
        "params_total": params["total"],
        "params_non_embedding": params["non_embedding"],
        "flops_per_token": per_token,
        "tokens": tokens,
        "train_flops": per_token * tokens,
        "wall_time_s": wall,
        "world_size": world,
        "device": device,
        "gpu_hours": hours if device.startswith("cuda") else 0.0 if hours is not None else None,
        "device_hours": hours,
        "precision": meta.get("precision"),
    }


def eval_rows(run_dir: Path) -> tuple[list[str], list[list[Any]]]:
    """One row per evaluated step: held-out loss and bits per byte, then each task's score."""
    from smelt.metric_records import task_scores

    results = []
    for path in sorted((run_dir / "eval").glob("step_*.json")):
        result = read_json(path)
        if isinstance(result, dict) and "step" in result:
            results.append(result)
    tasks = sorted({name for r in results for name in task_scores(r)})
    rows = []
    for result in sorted(results, key=lambda r: r["step"]):
        overall = (result.get("heldout") or {}).get("overall") or {}
        scores = task_scores(result)
        rows.append(
            [result["step"], result.get("tokens_seen"), overall.get("loss"), overall.get("bits_per_byte")]
            + [scores.get(t, "-") for t in tasks]
        )
    return ["step", "tokens", "held-out loss", "bits/byte", *tasks], rows


def limitations(facts: dict[str, Any], figures: dict[str, Any], sources: list[str]) -> list[str]:
    """Known limitations, from what the run recorded."""
    out = [
        f"A {figures['params_total']:,}-parameter base model trained on {figures['tokens']:,} tokens: it "
        f"continues text, follows no instructions and has had no safety tuning.",
    ]
    config = facts["meta"].get("config") or {}
    data = config.get("data") or {}
    missing = [s for s in sources if not facts["licenses"].get(s)]
    if missing:
        out.append(
            f"No licence was stated for source(s) {', '.join(missing)} (pass --license SOURCE=LICENSE to "
            f"`smelt release`); check their terms before reuse."
        )
    decontam = data.get("decontam") or {}
    if not decontam.get("evals"):
        out.append(
            "Training data was not decontaminated against evaluation sets (no [[data.decontam.evals]]): "
            "benchmark scores may be inflated by overlap."
        )
    langs = data.get("sources") or []
    if not any(s.get("languages") for s in langs):
        out.append("No language filter was applied; the languages of the data are those of its sources.")
    code = facts["meta"].get("code") or (
        read_json(Path(facts["out_dir"]) / "manifests" / "train.json") or {}
    ).get("code", {})
    if code.get("dirty"):
        out.append(
            f"The code that trained it had uncommitted changes (commit {code.get('commit')}, dirty): the "
            f"commit alone does not reproduce it."
        )
    from smelt.report.run import parent_record

    parent = parent_record(Path(facts["run_dir"]))
    if parent:
        out.append(
            f"It started from the weights of {parent.get('run_dir')} at step {parent.get('step')}: what that "
            f"checkpoint was trained on is in that run's release; this data order covers this run's own steps."
        )
    if not facts["model_license"]:
        out.append("No licence was chosen for the model weights (pass --model-license to `smelt release`).")
    return out


def model_card(run_dir: Path, facts: dict[str, Any]) -> str:
    meta = facts["meta"]
    config = meta.get("config") or {}
    hf = facts["hf_config"]
    figures = compute_figures(run_dir, meta)
    sources = [s.get("name") for s in (config.get("data") or {}).get("sources") or []]
    train = config.get("train") or {}
    license_id = facts["model_license"] or "other"
    langs = sorted(
        {
            lang
            for entry in (
                (read_json(run_dir / "documents" / "stats.json") or {}).get("sources") or {}
            ).values()
            for lang in (entry.get("languages") or {})
        }
    )
    front = ["---", f"license: {license_id}", "library_name: transformers", "pipeline_tag: text-generation"]
    if langs:
        front += ["language:"] + [f"- {lang}" for lang in langs]
    front += ["tags:", "- smelt", "- base-model", f"- {hf['model_type']}", "---", ""]
    revisions = facts["revisions"]
    final = revisions[-1]
    lines = [
        *front,
        f"# {facts['run']}",
        "",
        f"A {figures['params_total']:,}-parameter {hf['architectures'][0]} base language model trained from "
        f"scratch by smelt on {figures['tokens']:,} tokens of {', '.join(sources) or 'its sources'}. "
        f"Every released checkpoint, the exact order of the data each one saw, the training log, the "
        f"evaluation results and the manifests that chain the raw data to the weights are in this repository.",
        "",
        "## Use",
        "",
        "`PATH` is this directory, or its repository id once it is uploaded to a model hub.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("PATH")  # the final checkpoint',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        f'earlier = AutoModelForCausalLM.from_pretrained("PATH/revisions/{revisions[0]["revision"]}")',
        "```",
        "",
        "## Model",
        "",
        _table(
            ["", ""],
            [
                ["architecture", hf["architectures"][0]],
                [
                    "parameters (total / non-embedding)",
                    f"{figures['params_total']:,} / {figures['params_non_embedding']:,}",
                ],
                ["layers", hf["num_hidden_layers"]],
                ["hidden size", hf["hidden_size"]],
                [
                    "attention heads (query / key-value)",
                    f"{hf['num_attention_heads']} / {hf['num_key_value_heads']}",
                ],
                ["MLP hidden size (SwiGLU)", hf["intermediate_size"]],
                ["vocabulary", hf["vocab_size"]],
                ["context length", hf["max_position_embeddings"]],
                [
                    "RoPE theta",
                    str(hf.get("rope_theta", (hf.get("rope_scaling") or {}).get("rope_theta", NOT_RECORDED))),
                ],
                ["tied embeddings", hf["tie_word_embeddings"]],
                ["weights dtype", hf["torch_dtype"]],
            ],
        ),
        "",
        "## Training",
        "",
        _table(
            ["", ""],
            [
                ["tokens", figures["tokens"]],
                ["steps", final["step"]],
                ["global batch (tokens)", train.get("batch_tokens")],
                ["sequence length", train.get("seq_len")],
                [
                    "optimizer",
                    f"{train.get('optimizer', 'adamw')}, peak lr {train.get('lr')}, weight decay {train.get('weight_decay')}",
                ],
                [
                    "schedule",
                    f"{train.get('schedule', NOT_RECORDED)}, warmup {_n(train.get('warmup_tokens'))} tokens",
                ],
                ["precision", figures["precision"]],
                ["seed", str((config.get("run") or {}).get("seed"))],
            ],
        ),
        "",
        "## Compute",
        "",
        _table(
            ["", ""],
            [
                ["FLOPs per token (6N + 12 L d s)", f"{figures['flops_per_token']:.4g}"],
                ["training FLOPs", f"{figures['train_flops']:.4g}"],
                ["device", f"{figures['device']} x {figures['world_size']}"],
                [
                    "wall time",
                    NOT_RECORDED
                    if figures["wall_time_s"] is None
                    else f"{figures['wall_time_s'] / 3600:.3f} h",
                ],
                [
                    "GPU-hours",
                    NOT_RECORDED
                    if figures["gpu_hours"] is None
                    else f"{figures['gpu_hours']:.3f}"
                    + (
                        ""
                        if figures["device"].startswith("cuda")
                        else f" (trained on {figures['device']}: {figures['device_hours']:.3f} device-hours)"
                    ),
                ],
            ],
        ),  # fmt: skip
        "",
        "## Evaluation",
        "",
    ]
    header, rows = eval_rows(run_dir)
    lines += [_table(header, rows) if rows else "The run was not evaluated (no eval/step_*.json).", ""]
    lines += [
        "Results per step are in `eval/` (held-out loss per source, bits per byte, tasks, generation gallery).",
        "",
        "## Checkpoints",
        "",
        _table(
            ["revision", "step", "tokens", "milestone", "data order"],
            [
                [
                    f"`{r['revision']}`",
                    r["step"],
                    r["tokens"],
                    "yes" if r["milestone"] else "no",
                    f"`data_order/{e['file']}` (steps {e['first_step']:,}-{e['last_step']:,})",
                ]
                for r, e in zip(revisions, facts["data_order"]["checkpoints"], strict=True)
            ],
        ),  # fmt: skip
        "",
        "The data order file of a checkpoint lists, for every batch since the previous one, each row's "
        "source and token ranges (shard, offset, length) in the token shards. With the shards (`tokens/`, "
        "or the run's), `smelt inspect batches PATH --step N` prints the exact tokens of step N.",
        "",
        "## Data",
        "",
        "See [DATA_CARD.md](DATA_CARD.md): sources and licences, filters and their drop rates, deduplication "
        "and decontamination, tokens per source.",
        "",
        "## Known limitations",
        "",
        *[f"- {item}" for item in limitations(facts, figures, sources)],
        "",
        "## Reproduce",
        "",
        f"`smelt_config.json` is the resolved config (config hash `{meta.get('config_hash', NOT_RECORDED)}`); "
        f"`manifests/` holds every stage's manifest (inputs, outputs and their sha256, code version, "
        f"libraries). `smelt release --verify PATH` checks every file of this repository against them.",
        "",
    ]
    return "\n".join(lines)


def data_card(run_dir: Path, facts: dict[str, Any]) -> str:
    config = facts["meta"].get("config") or {}
    data = config.get("data") or {}
    stats = read_json(run_dir / "documents" / "stats.json") or {}
    token_stats = (read_json(run_dir / "tokens" / "stats.json") or {}).get("splits", {})
    per_source = stats.get("sources") or {}
    trained = facts["tokens_per_source"]
    total_trained = sum(trained.values())
    lines = [f"# Data card: {facts['run']}", "", "## Sources", ""]
    rows = []
    for source in data.get("sources") or []:
        name = source.get("name")
        entry = per_source.get(name, {})
        available = ((token_stats.get("train") or {}).get("sources") or {}).get(name, {}).get("tokens")
        got = trained.get(name, 0)
        rows.append(
            [
                name,
                f"{source.get('format')}{' (code)' if source.get('code') else ''}",
                facts["licenses"].get(name) or "not stated",
                entry.get("documents_in"),
                entry.get("documents_kept"),
                _pct(entry.get("documents_kept") or 0, entry.get("documents_in") or 0),
                available,
                got,
                _pct(got, total_trained),
                f"{got / available:.2f}" if available else "-",
            ]
        )
    lines += [
        _table(
            [
                "source",
                "format",
                "licence",
                "documents read",
                "kept",
                "retention",
                "train tokens available",
                "tokens trained on",
                "share",
                "epochs",
            ],
            rows,
        ),  # fmt: skip
        "",
        "Tokens trained on count the sequences each source gave up to the final checkpoint (seq_len tokens "
        "each), from the data order.",
        "",
        "## Curation steps",
        "",
    ]
    steps = stats.get("steps") or []
    if steps:
        lines.append(
            _table(
                ["step", "documents in", "documents out", "dropped", "drop rate", "characters out"],
                [
                    [
                        s.get("step"),
                        s.get("in"),
                        s.get("out"),
                        (s.get("in") or 0) - (s.get("out") or 0),
                        _pct((s.get("in") or 0) - (s.get("out") or 0), s.get("in") or 0),
                        s.get("chars_out"),
                    ]
                    for s in steps
                ],
            )  # fmt: skip
        )
    else:
        lines.append("The curation statistics (documents/stats.json) were not recorded.")
    dropped = stats.get("dropped") or {}
    read = stats.get("documents_in") or 0
    lines += ["", "## Filters: what was dropped and why", ""]
    lines.append(
        _table(
            ["rule", "documents", "share of documents read"],
            [[k, v, _pct(v, read)] for k, v in sorted(dropped.items())],
        )
        if dropped
        else "No document was dropped by a filter."
    )
    lines += ["", "## Deduplication and decontamination", ""]
    dedup = [s for s in steps if "dedup" in str(s.get("step")) or "decontam" in str(s.get("step"))]
    if dedup:
        lines.append(
            _table(
                ["step", "documents in", "removed", "rate"],
                [
                    [
                        s["step"],
                        s.get("in"),
                        (s.get("in") or 0) - (s.get("out") or 0),
                        _pct((s.get("in") or 0) - (s.get("out") or 0), s.get("in") or 0),
                    ]
                    for s in dedup
                ],
            )  # fmt: skip
        )
    settings = [
        f"exact dedup: {'on' if data.get('exact_dedup') else 'off'}",
        f"MinHash near-dedup: {'on' if (data.get('near_dedup') or {}).get('enabled') else 'off'}",
        f"line dedup: {'on' if (data.get('line_dedup') or {}).get('enabled') else 'off'}",
        "decontamination: "
        + (
            f"{len(data['decontam']['evals'])} evaluation set(s), {data['decontam'].get('ngram')}-grams"
            if (data.get("decontam") or {}).get("evals")
            else "off"
        ),
    ]
    lines += ["", "Settings: " + "; ".join(settings) + "."]
    decontam = read_json(run_dir / "documents" / "decontamination.json")
    if decontam:
        lines += ["", "Decontamination report:", "", "```json", json.dumps(decontam, indent=2)[:4000], "```"]
    pii = stats.get("pii") or {}
    lines += ["", "## Personal information", ""]
    lines.append(
        "Replaced with placeholders: " + ", ".join(f"{k} {v:,}" for k, v in sorted(pii.items())) + "."
        if pii
        else "No personal information was found or replaced (or the PII step was off)."
    )
    lines += ["", "## Splits", ""]
    split_stats = stats.get("splits") or {}
    lines.append(
        _table(
            ["split", "documents", "bytes", "tokens"],
            [
                [name, s.get("documents"), s.get("bytes"), (token_stats.get(name) or {}).get("tokens", 0)]
                for name, s in sorted(split_stats.items())
            ],
        )  # fmt: skip
        if split_stats
        else NOT_RECORDED
    )
    tokens_cfg = config.get("tokens") or {}
    lines += [
        "",
        "## Mixture and order",
        "",
        f"Mixture: {json.dumps(tokens_cfg.get('mixture') or 'in proportion to the available tokens')}; "
        f"curriculum stages: {len(tokens_cfg.get('stages') or []) or 1}; documents are packed end to end with "
        f"EOS, windows are shuffled with a seeded permutation per source and epoch (seed "
        f"{(config.get('run') or {}).get('seed')}). `data_order/` records the resulting order exactly.",
        "",
    ]
    return "\n".join(lines)
