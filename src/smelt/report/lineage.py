"""Lineage in the reports: where a fork came from, and what was forked from a run.

A fork (`smelt train CONFIG --from RUN[:STEP]`, `smelt anneal`) records its parent checkpoint: the
parent's run directory, step, its own tokens at that step and its cumulative tokens (the parent's own
offset plus those tokens, so a fork of a fork lands at the right place). From those records this
module builds the family tree of a run: its parents up to the root, and its forks, found as the
directories next to it whose chain of parents reaches it. The tree links each run's report by a
relative path, and a chart draws the family's validation losses at cumulative tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import finite
from smelt.report import forks
from smelt.report.page import esc, missing, note
from smelt.report.run import Run, final_metrics, load_run, parent_record
from smelt.report.svg import COLORS, Chart, Series, chart_svg

MAX_DEPTH = 64  # a chain of forks longer than this is a loop in hand-edited records
MAX_CURVES = len(COLORS)


@dataclass
class Member:
    """One run of a family: its directory, the parent record it was forked with, and its forks."""

    path: Path
    record: dict[str, Any] | None
    children: list[Member] = field(default_factory=list)

    @property
    def fork_step(self) -> int:
        return int((self.record or {}).get("step") or 0)


class Family:
    """The runs related to some focus runs: each one's parents up to its root, and the directories next
    to a focus run whose chain of parents reaches it (its forks, their forks, ...)."""

    def __init__(self, runs: list[Run]) -> None:
        self._records: dict[Path, dict[str, Any] | None] = {r.path.resolve(): r.parent for r in runs}
        self.focus = [r.path.resolve() for r in runs]
        self.folders = sorted({p.parent for p in self.focus})
        members: set[Path] = set()
        for path in self.focus:
            members.update(self.chain(path))
        for folder in self.folders:
            for candidate in _entries(folder):
                if candidate.is_dir() and candidate.resolve() not in members:
                    chain = self.chain(candidate.resolve())
                    reaches = next((i for i, p in enumerate(chain) if p in self.focus), None)
                    if reaches is not None:
                        members.update(chain[:reaches])
        self.members = {p: Member(p, self.record(p)) for p in members}
        self.roots: list[Member] = []
        for path in sorted(members):
            up = self.parent_of(path)
            if up in self.members and up != path:
                self.members[up].children.append(self.members[path])
            else:
                self.roots.append(self.members[path])
        for member in self.members.values():
            member.children.sort(key=lambda m: (m.fork_step, m.path.name))

    def record(self, path: Path) -> dict[str, Any] | None:
        if path not in self._records:
            self._records[path] = parent_record(path) if path.is_dir() else None
        return self._records[path]

    def parent_of(self, path: Path) -> Path | None:
        run_dir = (self.record(path) or {}).get("run_dir")
        return Path(str(run_dir)).resolve() if run_dir else None

    def chain(self, path: Path) -> list[Path]:
        """`path`, its parent, its parent's parent, ... up to the root."""
        out: list[Path] = []
        node: Path | None = path
        while node is not None and node not in out and len(out) < MAX_DEPTH:
            out.append(node)
            node = self.parent_of(node)
        return out

    @property
    def related(self) -> bool:
        """Whether the family has a fork in it (a focus run's parent, or a fork of a focus run)."""
        return any(self.parent_of(path) in self.members for path in self.members)


def _entries(folder: Path) -> list[Path]:
    """The entries of a folder, or none when it cannot be listed (its forks are then not found)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _figures(member: Member, loaded: dict[Path, Run]) -> str:
    """The tokens a run trained and where that ends on the cumulative axis, with its final losses."""
    offset = float((member.record or {}).get("cumulative_tokens") or 0)
    if member.path in loaded:
        figures = final_metrics(loaded[member.path])
    else:
        manifest = forks.read_json(member.path / "train" / "manifest.json") or {}
        figures = manifest.get("result") or {}
    if not finite(figures.get("tokens")):
        return "no finished training recorded (no train/manifest.json)"
    tokens = float(figures["tokens"])
    text = f"trained {tokens:,.0f} tokens"
    if member.record is not None:
        text += f", to {offset + tokens:,.0f} cumulative"
    for key, name in (("final_val_loss", "validation loss"), ("heldout_bits_per_byte", "held-out bits/byte")):
        if finite(figures.get(key)):
            text += f"; {name} {figures[key]:.4f}"
    return text


def _node(member: Member, base: Path, focus: list[Path], loaded: dict[Path, Run], family: Family) -> str:
    href = os.path.relpath(member.path / "report.html", base)
    shown = os.path.relpath(member.path, base)
    name = f"<b>{esc(member.path.name)}</b>" if member.path in focus else esc(member.path.name)
    if member.path in focus and len(focus) == 1:
        text = f"{name} <i>(this run)</i>"  # the page itself: no link
    elif member.path.is_dir():
        text = f'{name} (<a href="{esc(href)}">{esc(shown)}</a>)'
    else:
        text = f"{name} (not found: {esc(member.path)})"
    record = member.record
    if record is not None:
        up = family.parent_of(member.path)
        parent = up.name if up is not None and up in family.members else str(record.get("run_dir"))
        text += (
            f": from step {member.fork_step:,} of {esc(parent)} ({int(record.get('tokens') or 0):,} tokens "
            f"into it; {int(record.get('cumulative_tokens') or 0):,} cumulative)"
        )
    elif member.path.is_dir():
        text += ": trained from scratch"
    if member.path.is_dir():
        text += f"; {esc(_figures(member, loaded))}"
    inner = "".join(_node(c, base, focus, loaded, family) for c in member.children)
    return f"<li>{text}{f'<ul>{inner}</ul>' if inner else ''}</li>"


def tree_html(runs: list[Run], base: Path, family: Family | None = None) -> str:
    """The family of `runs` as nested lists, root first, each run linked by its path relative to `base`
    (the folder of the page), the focus runs in bold."""
    family = family or Family(runs)
    loaded = {r.path.resolve(): r for r in runs}
    focus = family.focus
    items = "".join(_node(root, base.resolve(), focus, loaded, family) for root in family.roots)
    folders = ", ".join(str(f) for f in family.folders)
    return f'<ul class="lineage">{items}</ul>' + note(
        "Each fork is listed under its parent with the checkpoint it started from: the step, the tokens "
        "the parent had trained by then, and the cumulative tokens (the parent's own offset included) "
        f"where its curves begin. Forks are found among the run directories in {folders}."
    )


def flops_offset(run: Run) -> float | None:
    """The training FLOPs of a fork's lineage before it: each parent's FLOPs per token times the tokens
    it had trained at the fork (its own start record's figure, which a changed sequence length alters).
    0 for a run from scratch; None when a parent's FLOPs per token is unknown."""
    total, record, seen = 0.0, run.parent, set()
    while record and record.get("run_dir") and len(seen) < MAX_DEPTH:
        path = Path(str(record["run_dir"])).resolve()
        if path in seen:
            return None
        seen.add(path)
        try:
            ancestor = load_run(path)
        except UserError:
            return None
        per_token = ancestor.flops_per_token()
        if not per_token:
            return None
        total += per_token * float(record.get("tokens") or 0)
        record = ancestor.parent
    return total


def _val_curve(run: Run, until: float | None) -> tuple[list[float], list[float]]:
    points = [
        (run.cumulative(r.get("tokens")), float(r["val_loss"]))
        for r in run.kind("eval")
        if finite(r.get("val_loss")) and (until is None or float(r.get("tokens") or 0) <= until)
    ]
    return [x for x, _ in points], [y for _, y in points]


def family_chart(run: Run, family: Family) -> str:
    """Validation loss at cumulative tokens: each parent up to the point its child forked, this run,
    and its forks."""
    here = run.path.resolve()
    chain = family.chain(here)  # this run, its parent, its parent's parent, ...
    rows: list[tuple[Path, str, float | None]] = []  # (run, label, own tokens drawn up to)
    for child, ancestor in zip(chain, chain[1:], strict=False):
        until = float((family.record(child) or {}).get("tokens") or 0)
        rows.append((ancestor, f"{ancestor.name} (up to the fork)", until))
    rows.reverse()
    rows.append((here, f"{run.name} (this run)", None))
    member = family.members.get(here)
    rows += [(m.path, m.path.name, None) for m in (member.children if member else [])]
    series, unread = [], []
    for k, (path, label, until) in enumerate(rows[:MAX_CURVES]):
        try:
            member_run = run if path == here else load_run(path)
        except UserError:
            unread.append(path.name)
            continue
        xs, ys = _val_curve(member_run, until)
        if xs:
            series.append(Series(label, xs, ys, COLORS[k % len(COLORS)], dots=len(xs) < 40))
        else:
            unread.append(path.name)
    if not series:
        return missing("no validation losses in metrics.jsonl of this run or its relatives.")
    text = chart_svg(
        Chart("validation loss of the lineage at cumulative tokens", "cumulative tokens", "loss", series)
    )
    text += note(
        "Each run's validation loss is on its own validation data: a fork with other sources, or another "
        "mixture weighting them, scores other text than its parent."
    )
    if len(rows) > MAX_CURVES:
        text += note(f"the first {MAX_CURVES} runs of the family are drawn.")
    if unread:
        text += note(f"no validation curve for: {', '.join(unread)}.")
    return text


def lineage_section(run: Run, base: Path | None = None) -> str:
    """The family tree of one run, its curves at cumulative tokens and, for a fork that trains on new
    sources, forgetting next to adaptation. Links are relative to `base` (default: the run directory,
    where report.html goes)."""
    family = Family([run])
    if not family.related:
        folder = run.path.resolve().parent
        return missing(
            f"{run.name} was trained from scratch (no train.init_from) and no run in {folder} was forked "
            f"from it (`smelt train CONFIG --from {run.path}:STEP`)."
        )
    parts = [tree_html([run], base or run.path, family), family_chart(run, family)]
    if run.parent is not None:
        parts.append("<h3>Forgetting and adaptation</h3>" + forks.forgetting_section(run))
    return "\n".join(parts)
