"""The contamination meter: is a benchmark's text easier for the model than matched controls?

For each item of a benchmark the meter scores the string a model could have read on the web, the
question and its gold answer (`smelt.benchmark_files.item_text`, the text curation's decontamination
matches too), against controls made from the same item with the answer swapped:

  multiple choice   the question with each distractor in place of the gold answer
  schema            each other context (WinoGrande's other option) before the same continuation
  completion        the context with another item's continuation (the next item's, cyclically)
  generation        the question with another item's answer

Each string is scored from one EOS as a training document starts, as bits per byte of the whole
string (bytes, not tokens, so a tokenizer that merged a leaked string's pieces does not shift it).
An item's difference d = gold - mean(controls); a benchmark's differences are tested with a one-sided
paired t-test: t = mean(d) / (sd(d) / sqrt(n)), n - 1 degrees of freedom, p = P(T <= t) under the
null that the model does not prefer the gold strings. A benchmark with t < -k (eval.contamination_k,
4 by default) is flagged. The null is "no preference", so a model that really answers well moves t
down too: the flag is decisive while accuracy is near chance, and beyond that the meter is read
against accuracy and across checkpoints (docs/evaluation.md).

With canaries planted at curation (data.canaries, smelt.canaries) the meter also scores every canary
and the never-planted controls from the same generator: per exposure (copies planted), the canaries'
bits per byte, the memorisation (controls' mean minus canaries' mean) and its z against the controls'
spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smelt.benchmark_files import Record, item_text, shape_of
from smelt.canaries import read_record
from smelt.config import Config
from smelt.errors import UserError
from smelt.eval.harness import score_pairs
from smelt.eval.tasks import TaskSpec, configured_tasks_dir, get_spec, load_task, resolve_tasks_dir

CONTROLS = {
    "multiple_choice": "distractors",
    "schema": "other contexts",
    "completion": "swapped continuations",
    "generation": "swapped answers",
}


# --- the statistic --------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t < 0 else 1.0 - tail


def paired_test(gold: list[float], control: list[float], k: float) -> dict[str, Any]:
    """The one-sided paired t-test of gold against control losses (one pair per item), and the flag."""
    diffs = [g - c for g, c in zip(gold, control, strict=True)]
    n = len(diffs)
    out: dict[str, Any] = {"items": n, "k": k}
    if n == 0:
        return {**out, "flagged": False}
    mean = sum(diffs) / n
    out.update(gold_bits_per_byte=sum(gold) / n, control_bits_per_byte=sum(control) / n, mean_difference=mean,
               below_share=sum(d < 0 for d in diffs) / n)  # fmt: skip
    if n < 2:
        return {**out, "flagged": False}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    out["sd_difference"] = sd
    if sd == 0.0:  # every item moved by the same amount: no spread to standardise by
        return {**out, "t": None, "p_value": None, "effect_size": None, "flagged": mean < 0}
    t = mean / (sd / math.sqrt(n))
    return {**out, "t": t, "p_value": t_cdf(t, n - 1), "effect_size": mean / sd, "flagged": t < -k}


def memorisation(
    canaries: list[dict[str, Any]], losses: list[float], controls: list[float]
) -> dict[str, Any]:
    """Per exposure: the canaries' mean bits per byte, memorisation (controls' mean minus theirs) and z."""
    n = len(controls)
    mean = sum(controls) / n
    sd = math.sqrt(sum((c - mean) ** 2 for c in controls) / (n - 1)) if n > 1 else 0.0
    levels = []
    for copies in sorted({c["copies"] for c in canaries}):
        mine = [x for c, x in zip(canaries, losses, strict=True) if c["copies"] == copies]
        level = sum(mine) / len(mine)
        levels.append({"copies": copies, "strings": len(mine), "bits_per_byte": level,
                       "memorisation": mean - level, "z": (mean - level) / sd if sd > 0 else None})  # fmt: skip
    return {"controls": {"strings": n, "bits_per_byte": mean, "sd": sd}, "levels": levels}


# --- items and controls ---------------------------------------------------------------------------


def controls_of(records: list[Record], index: int) -> list[str]:
    """The control strings of record `index`: its text with the gold answer swapped (see the module)."""
    record = records[index]
    shape = shape_of(record)
    if shape in ("multiple_choice", "schema"):
        n = len(record["choices"] if shape == "multiple_choice" else record["contexts"])
        gold = int(record["gold"])
        return [item_text({**record, "gold": j}) for j in range(n) if j != gold]
    key = {"completion": "continuation", "generation": "answer"}.get(shape or "")
    if key is None:
        return []
    for step in range(1, len(records)):  # the next item whose answer differs, cyclically
        other = records[(index + step) % len(records)][key]
        if other != record[key]:
            return [item_text({**record, key: other})]
    return []


@dataclass
class Probe:
    """One benchmark's strings: per kept item its gold string and controls."""

    kind: str
    gold: list[str] = field(default_factory=list)
    controls: list[list[str]] = field(default_factory=list)
    skipped: int = 0


def probe(records: list[Record]) -> Probe:
    """The gold and control strings of a benchmark's records (items without a control are skipped)."""
    shapes = {shape_of(r) for r in records}
    out = Probe(CONTROLS.get(next(iter(shapes)) or "", "") if len(shapes) == 1 else "mixed")
    for i, record in enumerate(records):
        controls = controls_of(records, i)
        if not controls:
            out.skipped += 1
            continue
        out.gold.append(item_text(record))
        out.controls.append(controls)
    return out


def meter_specs(cfg: Config, tasks: list[str] | None = None) -> tuple[list[TaskSpec], Path | None]:
    """The tasks the meter checks: `tasks`, else eval.contamination_tasks, else eval.tasks but passkey."""
    e = cfg.eval
    names = tasks or e.contamination_tasks or e.tasks
    named = bool(tasks or e.contamination_tasks)
    key = "--tasks" if tasks else "eval.contamination_tasks" if e.contamination_tasks else "eval.tasks"
    tasks_dir = configured_tasks_dir(e.tasks_dir)
    specs = []
    for name in names:
        spec = get_spec(name, tasks_dir)
        if spec.formulation == "passkey":
            if named:
                raise UserError(
                    f"{key} names {name!r}, a generated pass-key task: no text of it can be in the training "
                    f"data, so the contamination meter has nothing to check. Drop it from {key}."
                )
            continue
        if spec.needs_files() and spec.root(tasks_dir) is None:
            resolve_tasks_dir(e.tasks_dir)  # says where it looked and how to set it
        specs.append(spec)
    if not specs:
        raise UserError(
            f"the contamination meter has no benchmark to check: {key} is empty. Name tasks with "
            f"eval.contamination_tasks (or eval.tasks), e.g. --set eval.contamination_tasks='[\"copa\"]'."
        )
    return specs, tasks_dir


class ContaminationMeter:
    """`ContaminationMeter(cfg, tokenizer, documents_dir, max_len)(model, device)` -> figures.

    The items (a fixed seeded subset of `items` per task, eval.contamination_items by default, as
    `smelt eval --limit` draws them) and canaries are read and tokenized once, here."""

    def __init__(self, cfg: Config, tokenizer: Any, documents_dir: Path | None, max_len: int,
                 tasks: list[str] | None = None, items: int | None = None) -> None:  # fmt: skip
        self.cfg, self.tokenizer, self.max_len = cfg, tokenizer, max_len
        self.k = cfg.eval.contamination_k
        limit = cfg.eval.contamination_items if items is None else items
        specs, tasks_dir = meter_specs(cfg, tasks)
        self.probes = {s.name: probe(load_task(s, tasks_dir, limit, shots=0).records) for s in specs}
        self.canaries = read_record(documents_dir) if documents_dir is not None else None
        texts: list[str] = []
        for p in self.probes.values():
            for gold, controls in zip(p.gold, p.controls, strict=True):
                texts += [gold, *controls]
        if self.canaries:
            texts += [c["text"] for c in self.canaries["canaries"]] + list(self.canaries["controls"])
        self.texts = sorted(set(texts))
        eos = tokenizer.eos_id
        self.ids = {
            t: [eos, *ids] for t, ids in zip(self.texts, tokenizer.encode_batch(self.texts), strict=True)
        }

    def fits(self, text: str) -> bool:
        return len(self.ids[text]) - 1 <= self.max_len

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, device: torch.device, batch_size: int = 8) -> dict[str, Any]:
        scored = [t for t in self.texts if self.fits(t)]
        pairs = [(self.ids[t][:1], self.ids[t][1:]) for t in scored]
        results = score_pairs(model, pairs, batch_size, device, desc="contamination")
        bits = {
            t: -lp / math.log(2) / max(len(t.encode("utf-8")), 1)
            for t, (lp, _) in zip(scored, results, strict=True)
        }
        out: dict[str, Any] = {"k": self.k, "tasks": {}}
        for name, p in self.probes.items():
            gold, control, long = [], [], 0
            for g, controls in zip(p.gold, p.controls, strict=True):
                if g not in bits or any(c not in bits for c in controls):
                    long += 1
                    continue
                gold.append(bits[g])
                control.append(sum(bits[c] for c in controls) / len(controls))
            figures = paired_test(gold, control, self.k)
            out["tasks"][name] = {**figures, "controls": p.kind, "skipped": p.skipped + long}
        out["flagged"] = sorted(n for n, f in out["tasks"].items() if f["flagged"])
        if self.canaries:
            record = self.canaries
            kept = [c for c in record["canaries"] if c["text"] in bits]
            controls = [bits[c] for c in record["controls"] if c in bits]
            if kept and controls:
                out["canaries"] = {"source": record.get("source"),
                                   **memorisation(kept, [bits[c["text"]] for c in kept], controls)}  # fmt: skip
        return out
