"""Cross-check smelt's cloze scoring against lm-evaluation-harness on the same items and model.

Usage: python bench/lm_eval_crosscheck.py RUN [--hf DIR] [--tasks arc_easy,copa] [--tasks-dir DIR]
       [--limit N] [--out PATH]
RUN must have been exported with `smelt export hf RUN` (or pass --hf). --tasks names tasks (built-in,
or task files in --tasks-dir, which also holds the benchmark files; default: eval.tasks_dir's search)
or task file paths; any cloze task compares, whatever its file format. For each task the same seeded
subset smelt scores (`--limit`) is cut to the items whose prompt and answer fit the model's context
under both of smelt's prompt conventions; an item that does not is left out of both sides and counted
(`TASK_skipped_overlong`), since lm-eval would otherwise stop on it. The items are written to a jsonl
file, and lm_eval scores it through a task YAML that reads that local file (`dataset_path: json`)
with the same prompt template, choices and target delimiter, running the exported model with
transformers. smelt scores the items twice: as `smelt eval` does by default (eval.convention =
"lm-eval": no token before the context, which is how lm_eval's HF model feeds one; the exported
tokenizer_config says add_bos_token = false) and under eval.convention = "eos" (every prompt after an
EOS). The report gives both accuracies (raw and length-normalized), their differences in points, and
the largest per-request log-likelihood difference. Writes bench/results/lm_eval_crosscheck.json, or
PATH with --out (a JSON file, or a folder to hold lm_eval_crosscheck.json), so a run outside the
checkout leaves the recorded figures alone. Without lm_eval installed (the `eval-check` extra:
docs/evaluation.md), the script says so and exits with status 3, leaving the recorded figures alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
from common import machine, write_result

from smelt.eval.harness import prepare, score_pairs, score_prepared
from smelt.eval.tasks import Task, configured_tasks_dir, get_spec, load_task

CPU = torch.device("cpu")


def lm_eval_available() -> str | None:
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        return f"lm_eval cannot be imported ({exc})"
    return None


def task_yaml(name: str, data_file: Path, template: str) -> dict:
    jinja = re.sub(r"\{(\w+)\}", r"{{\1}}", template)
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": jinja,
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{gold}}",
        "target_delimiter": " ",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
    }


def comparable_items(task: Task, tokenizer, max_len: int) -> tuple[Task, int]:
    """The task cut to the items that fit the context under both conventions ("eos" puts one more
    token first), so smelt and lm-eval score the same items; and how many were left out."""
    kept = {id(r) for r in task.records}
    for convention in ("lm-eval", "eos"):
        kept &= {id(r) for r in prepare(task, tokenizer, max_len, "skip", convention=convention).items}
    records = [r for r in task.records if id(r) in kept]
    cut = Task(task.spec, records, task.shots, task.n_shots, task.total, task.file)
    return cut, len(task.records) - len(records)


def write_lm_eval_task(task: Task, workdir: Path) -> str:
    """The lm-eval task (YAML) and its local data file (the task's records as jsonl); its name."""
    import yaml

    name = f"smelt_xcheck_{re.sub(r'[^A-Za-z0-9_]', '_', task.spec.name)}"
    data = workdir / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in task.records))
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(task_yaml(name, data, task.spec.template)))
    return name


def smelt_scores(model, tokenizer, task, batch_size: int) -> dict:
    eos_prep = prepare(task, tokenizer, model.cfg.max_seq_len, "skip", convention="eos")
    with_eos = score_prepared(model, tokenizer, eos_prep, batch_size, CPU)
    # smelt's default convention, "lm-eval": the requests as lm_eval's HF model sees them.
    prep = prepare(task, tokenizer, model.cfg.max_seq_len, "skip", convention="lm-eval")
    bare = score_pairs(model, prep.pairs, batch_size, CPU)
    per_item: dict[int, list[float]] = {}
    chars: dict[int, list[int]] = {}
    for (item, _), (logprob, _), n in zip(prep.owner, bare, prep.cont_chars, strict=True):
        per_item.setdefault(item, []).append(logprob)
        chars.setdefault(item, []).append(n - 1)  # lm_eval normalizes by the choice without its delimiter
    golds = prep.golds
    n = len(golds)
    acc = sum(max(range(len(v)), key=v.__getitem__) == golds[i] for i, v in per_item.items()) / n
    norm = [[lp / max(c, 1) for lp, c in zip(per_item[i], chars[i], strict=True)] for i in range(n)]
    acc_norm = sum(max(range(len(v)), key=v.__getitem__) == golds[i] for i, v in enumerate(norm)) / n
    return {
        "items": n,
        "acc_with_eos": with_eos["acc"],
        "acc": acc,
        "acc_norm": acc_norm,
        "loglikelihoods": [per_item[i] for i in range(n)],
    }


def lm_eval_scores(hf_dir: Path, task, workdir: Path, batch_size: int) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    name = write_lm_eval_task(task, workdir)
    out = simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir},dtype=float32",
        tasks=[name],
        task_manager=TaskManager(include_path=str(workdir)),
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
    )
    metrics = out["results"][name]
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    lls = [[float(r[0][0]) for r in s["resps"]] for s in samples]
    return {"acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"], "loglikelihoods": lls}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--hf", default=None, help="exported model (default: RUN/export/hf)")
    parser.add_argument("--tasks", default="arc_easy,copa", help="task names or task file paths")
    parser.add_argument("--tasks-dir", default="", help="benchmark files and task files (default: found)")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="write the figures to PATH (a .json file, or a folder) instead of bench/results/lm_eval_crosscheck.json",
    )
    args = parser.parse_args(argv)
    run = Path(args.run)
    try:
        out = out_path(args.out)
    except OSError as exc:
        print(f"--out {args.out} cannot be written ({exc}): pass a writable file or folder.", file=sys.stderr)
        return 2
    hf_dir = Path(args.hf) if args.hf else run / "export" / "hf"
    missing = lm_eval_available()
    if missing:
        message = (
            f"{missing}: install the `eval-check` extra, which pins lm-eval with the datasets and transformers "
            f"it works with, into the project's venv (`.venv/bin/pip install -c constraints.txt -e '.[eval-check]'`, "
            f"or `rm .venv/.installed && make install EXTRAS=dev,langid-lingua,ray,eval-check`; docs/evaluation.md) "
            f"to run the cross-check; nothing was compared."
        )
        print(message, file=sys.stderr)  # the recorded figures are left as they are
        return 3
    if not (hf_dir / "config.json").is_file():
        print(f"no exported model at {hf_dir}: run `smelt export hf {run}` first.", file=sys.stderr)
        return 2
    from smelt.model.hf import import_hf
    from smelt.tokenizer.load import Tokenizer

    model = import_hf(hf_dir).eval()
    tokenizer = Tokenizer.load(run / "tokenizer")
    tasks_dir = configured_tasks_dir(args.tasks_dir)
    figures: dict[str, object] = {"model": str(hf_dir), "limit": args.limit}
    with tempfile.TemporaryDirectory() as tmp:
        for wanted in args.tasks.split(","):
            spec = get_spec(wanted, tasks_dir)
            if spec.formulation != "cloze":
                raise SystemExit(
                    f"{wanted}: the cross-check covers cloze tasks (this one is {spec.formulation})"
                )
            task, overlong = comparable_items(
                load_task(spec, tasks_dir, args.limit, 0), tokenizer, model.cfg.max_seq_len
            )
            name = spec.name
            figures[f"{name}_skipped_overlong"] = overlong
            if not task.records:
                figures[f"{name}_items"] = 0  # every item is longer than the context: nothing to compare
                continue
            ours = smelt_scores(model, tokenizer, task, args.batch_size)
            theirs = lm_eval_scores(hf_dir, task, Path(tmp), args.batch_size)
            diffs = [
                abs(a - b)
                for xs, ys in zip(ours["loglikelihoods"], theirs["loglikelihoods"], strict=True)
                for a, b in zip(xs, ys, strict=True)
            ]
            figures[f"{name}_items"] = ours["items"]
            for key in ("acc", "acc_norm"):
                figures[f"{name}_{key}_smelt"] = round(ours[key], 4)
                figures[f"{name}_{key}_lm_eval"] = round(theirs[key], 4)
                figures[f"{name}_{key}_diff_points"] = round(100 * (ours[key] - theirs[key]), 2)
            figures[f"{name}_acc_smelt_with_eos"] = round(ours["acc_with_eos"], 4)
            figures[f"{name}_max_loglikelihood_diff"] = float(f"{max(diffs):.3e}")
    write_figures(figures, out)
    return 0


def out_path(out: str | None) -> Path | None:
    """Where --out writes: the JSON file named, or lm_eval_crosscheck.json in the folder named; its
    folder is made now, so a path that cannot be written stops before the comparison runs."""
    if out is None:
        return None
    path = Path(out)
    if path.is_dir() or not path.suffix:
        path = path / "lm_eval_crosscheck.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_figures(figures: dict[str, object], path: Path | None) -> Path:
    """bench/results/lm_eval_crosscheck.json (the recorded figures), or `path` with the same content."""
    if path is None:
        return write_result("lm_eval_crosscheck", figures)
    result = {**figures, "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(f"-> {path}")
    return path
