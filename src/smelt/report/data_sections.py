"""Report sections about where the tokens came from: the manifest chain, retention, mixture, tokenizer."""

from __future__ import annotations

from typing import Any

from smelt.metric_records import finite
from smelt.report.page import Raw, esc, missing, note, table
from smelt.report.run import STAGE_DIRS, Run
from smelt.report.svg import COLORS, Chart, Series, bars_svg, chart_svg
from smelt.tokenizer.load import SMELT_JSON

# A manifest names the stages it read by stage name; their directories differ for two of them.
_STAGE_DIR = {"curate": "documents", "tokenize": "tokens"}


def _short(value: Any, n: int = 12) -> str:
    return str(value)[:n] if value else "-"


def manifests_section(run: Run) -> str:
    if not run.manifests:
        return missing(
            f"no stage manifests under {run.path} (a bare trainer output directory has none); "
            f"the chain of stages cannot be shown."
        )
    rows, classes = [], []
    for stage in STAGE_DIRS:
        manifest = run.manifests.get(stage)
        if manifest is None:
            rows.append([stage, "-", "-", "-", "-", "-", "-", "no manifest.json"])
            classes.append("diff")
            continue
        checks = []
        for upstream, digest in (manifest.get("inputs") or {}).items():
            upstream_dir = _STAGE_DIR.get(upstream, upstream)
            recorded = (run.manifests.get(upstream_dir) or {}).get("outputs_hash")
            if upstream.startswith("raw:"):
                checks.append(f"{upstream} {_short(digest)}")
            elif recorded is None:
                checks.append(f"{upstream} {_short(digest)} (upstream manifest missing)")
            else:
                checks.append(f"{upstream} {_short(digest)} {'ok' if recorded == digest else 'STALE'}")
        code = manifest.get("code") or {}
        version = f"{code.get('package', '?')} {_short(code.get('commit'), 10)}"
        if code.get("dirty"):
            version += " (dirty)"
        libs = ", ".join(f"{k} {v}" for k, v in sorted((manifest.get("libraries") or {}).items()))
        stale = any(c.endswith("STALE") for c in checks)
        rows.append(
            [
                stage,
                manifest.get("started", "-"),
                manifest.get("wall_time_s"),
                _short(manifest.get("config_hash")),
                Raw("<br>".join(esc(c) for c in checks) or "-"),
                _short(manifest.get("outputs_hash")),
                manifest.get("seed"),
                Raw(f"{esc(version)}<br><span class='note'>{esc(libs)}</span>"),
            ]
        )
        classes.append("diff" if stale else "")
    header = ["stage", "started", "wall s", "config hash", "inputs (hash, matches upstream)", "outputs hash",
              "seed", "code and libraries"]  # fmt: skip
    text = table(header, rows, classes)
    return text + note(
        "Each stage records the hashes of the outputs it read; 'ok' means they match the upstream "
        "stage's recorded outputs, STALE that the upstream stage was rerun after this one."
    )


def _stats(run: Run) -> dict[str, Any] | None:
    stats = run.json_file("documents", "stats.json")
    if stats is None:
        stats = (run.manifests.get("documents") or {}).get("result")
    return stats if isinstance(stats, dict) and stats.get("steps") else None


def retention_section(run: Run) -> str:
    stats = _stats(run)
    if stats is None:
        return missing(f"no curate statistics ({run.path / 'documents' / 'stats.json'} is missing).")
    from smelt.data.plots import retention_svg  # the curate stage's own waterfall, drawn from stats.json

    if all("sources" in step for step in stats["steps"]):
        svg = retention_svg(stats).replace(' xmlns="http://www.w3.org/2000/svg"', "")
    else:  # stats.json written before steps were counted per source: documents per step only
        names = [step["step"] for step in stats["steps"]]
        counts = {
            "documents in": [s.get("in", 0) for s in stats["steps"]],
            "out": [s.get("out", 0) for s in stats["steps"]],
        }
        svg = bars_svg("documents in and out of each step", names, counts, "documents")
    sources = list(stats.get("sources", {}))
    rows = []
    for step in stats["steps"]:
        per = step.get("sources", {})
        rows.append([step["step"], *[(per.get(s) or {}).get("out", 0) for s in sources], step.get("out", 0)])
    steps_table = table(["step", *[f"{s}: docs" for s in sources], "all: docs"], rows)
    source_rows = []
    for name, block in stats.get("sources", {}).items():
        n_in = block.get("documents_in", 0)
        removed = {
            **block.get("dropped", {}),
            **{f"quarantined:{k}": v for k, v in block.get("quarantined", {}).items()},
        }
        top = ", ".join(f"{k}: {v}" for k, v in sorted(removed.items(), key=lambda kv: -kv[1])[:6])
        kept = block.get("documents_kept", 0)
        source_rows.append([name, n_in, kept, f"{100 * kept / n_in:.1f}%" if n_in else "-", top or "-"])
    sources_table = table(
        ["source", "documents in", "kept", "kept %", "removed (reason: documents)"], source_rows
    )
    warnings = "".join(
        f'<p class="diff">warning: {esc(w.get("message", w))}</p>' for w in stats.get("warnings") or []
    )
    return (
        f"{warnings}<div>{svg}</div><h3>Documents after each step, per source</h3>{steps_table}"
        f"<h3>Per source</h3>{sources_table}"
    )


def mixture_section(run: Run) -> str:
    plans = run.events("data_plan")
    windows = run.events("mixture")
    if not plans and not windows:
        return missing("metrics.jsonl holds no data plan or mixture records.")
    parts = []
    if plans:
        plan = plans[-1]
        rows = [
            [s, f.get("tokens"), f.get("sequences"), f.get("consumed"), f.get("epochs")]
            for s, f in plan.get("sources", {}).items()
        ]
        parts.append(
            "<h3>Data plan</h3>" + table(["source", "tokens", "sequences", "consumed", "epochs"], rows)
        )
        stage_rows = [
            [st.get("name"), st.get("first_step"), st.get("last_step"), st.get("tokens"),
             ", ".join(f"{k} {v:.3g}" for k, v in (st.get("weights") or {}).items())]
            for st in plan.get("stages", [])
        ]  # fmt: skip
        parts.append(table(["stage", "first step", "last step", "tokens", "target weights"], stage_rows))
    if windows:
        sources = sorted({s for w in windows for s in (w.get("target") or {})})
        target = dict.fromkeys(sources, 0.0)
        realized = dict.fromkeys(sources, 0.0)
        total = 0.0
        for w in windows:
            n = float(w.get("window_sequences") or 0)
            total += n
            for s in sources:
                target[s] += n * float((w.get("target") or {}).get(s, 0.0))
                realized[s] += n * float((w.get("realized") or {}).get(s, 0.0))
        total = total or 1.0
        parts.append(
            bars_svg(
                "mixture over the whole run: target vs realized share of sequences",
                sources,
                {
                    "target": [target[s] / total for s in sources],
                    "realized": [realized[s] / total for s in sources],
                },
                "share of sequences",
                percent=True,
            )
        )
        if len(windows) > 1:
            xs = [run.cumulative(w.get("tokens")) for w in windows]
            series = []
            for k, s in enumerate(sources):
                color = COLORS[k % len(COLORS)]
                series.append(
                    Series(f"{s} realized", xs, [(w.get("realized") or {}).get(s) for w in windows], color)
                )
                series.append(
                    Series(f"{s} target", xs, [(w.get("target") or {}).get(s) for w in windows], color, "4 3")
                )
            parts.append(
                chart_svg(Chart("realized share per window (dashed: target)", "tokens", "share", series))
            )
        worst = max((float(w.get("max_drift") or 0) for w in windows), default=0.0)
        parts.append(
            note(
                f"{len(windows)} mixture windows; the largest drift from target was {100 * worst:.2f} points."
            )
        )
    return "\n".join(parts)


# A source drawn further than this below its target is highlighted: its text is under-represented in
# the tokenizer's training sample.
SAMPLE_SHORTFALL = 0.1


def _sample_table(info: dict[str, Any]) -> str:
    """Target and drawn bytes of the tokenizer's training sample, per source (and language)."""
    units = info.get("sample_units")
    if not isinstance(units, dict) or not units:
        return note("smelt.json records no per-source sample (a tokenizer trained before it was recorded).")
    rows, classes = [], []
    for unit, figures in sorted(units.items()):
        target, drawn = figures.get("target") or 0, figures.get("drawn") or 0
        share = f"{100 * drawn / target:.1f}%" if target else "-"
        rows.append([unit, figures.get("size"), target, drawn, share])
        classes.append("diff" if target and drawn < (1 - SAMPLE_SHORTFALL) * target else "")
    short = [unit for unit, cls in zip(sorted(units), classes, strict=True) if cls]
    text = "<h3>Training sample per source</h3>" + table(
        ["source (/language)", "bytes in train", "target bytes", "drawn bytes", "drawn / target"],
        rows,
        classes,
    )
    if short:
        return text + note(
            f"drawn more than {SAMPLE_SHORTFALL:.0%} below target: {', '.join(short)}. "
            f"The tokenizer saw less of their text than planned."
        )
    return text + note(
        f"every source drawn within {SAMPLE_SHORTFALL:.0%} of its target "
        f"(tokenizer.sample_bytes shared by tokenizer.source_alpha and lang_alpha)."
    )


def tokenizer_section(run: Run) -> str:
    parts = []
    result = (run.manifests.get("tokenizer") or {}).get("result") or {}
    info = run.json_file("tokenizer", SMELT_JSON) or {}
    if result or info:
        rows = [[k, v] for k, v in sorted(result.items()) if not isinstance(v, (dict, list))]
        rows += [[f"smelt.json: {k}", v] for k, v in sorted(info.items()) if not isinstance(v, (dict, list))]
        parts.append("<h3>Training</h3>" + table(["figure", "value"], rows))
    if info:
        parts.append(_sample_table(info))
    stats = run.json_file("tokens", "stats.json") or (run.manifests.get("tokens") or {}).get("result")
    if isinstance(stats, dict) and stats.get("splits"):
        rows = []
        for split, block in stats["splits"].items():
            for source, figures in (block.get("sources") or {}).items():
                rows.append([split, source, figures.get("documents"), figures.get("tokens"), figures.get("bytes"),
                             figures.get("bytes_per_token")])  # fmt: skip
        parts.append(
            "<h3>Token shards</h3>"
            + table(["split", "source", "documents", "tokens", "bytes", "bytes/token"], rows)
        )
    evaluation = run.json_file("tokenizer_eval", "tokenizer_eval.json")
    if isinstance(evaluation, dict) and isinstance(evaluation.get("results"), dict):
        rows = []
        for name, res in evaluation["results"].items():
            for group, figures in (res.get("groups") or {}).items():
                rows.append([name, group, figures.get("bytes_per_token"), figures.get("fertility"),
                             figures.get("continued_word_rate")])  # fmt: skip
            rows.append(
                [name, "unused tokens", res.get("never_produced"), res.get("never_produced_share"), ""]
            )
        header = ["tokenizer", "group", "bytes/token", "fertility (tokens/word)", "continued-word rate"]
        parts.append("<h3>Evaluation (smelt tokenizer eval)</h3>" + table(header, rows))
        bpt = {
            name: [
                finite(g.get("bytes_per_token")) and g["bytes_per_token"] or 0.0
                for g in (res.get("groups") or {}).values()
            ]
            for name, res in evaluation["results"].items()
        }
        groups = list(next(iter(evaluation["results"].values())).get("groups") or {})
        if groups and all(len(v) == len(groups) for v in bpt.values()):
            parts.append(
                bars_svg("bytes per token per group (higher compresses better)", groups, bpt, "bytes/token")
            )
    else:
        parts.append(
            note("no tokenizer evaluation yet (`smelt tokenizer eval CONFIG` writes tokenizer_eval/).")
        )
    if not (result or info or stats):
        return missing(f"no tokenizer or token-shard statistics under {run.path}.")
    return "\n".join(parts)
