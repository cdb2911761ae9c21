"""Lineage in the reports: a fork drawn at cumulative tokens, the family tree, a parent and its forks
compared at equal tokens, and forgetting next to adaptation for a fork that trains on a new source.

The runs are written by hand in the layouts the trainer writes (the start event's "parent" record,
train/run.json, train/manifest.json), as the other report tests do; tests/test_lifecycle.py makes real
forks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smelt.cli import main
from smelt.report.compare import write_comparison
from smelt.report.forks import Point, at_tokens, trained_sources
from smelt.report.lineage import Family, flops_offset
from smelt.report.run import load_run
from smelt.report.single import write_run_report
from smelt.report.svg import fmt_number

from .conftest import BATCH_TOKENS, FLOPS_PER_TOKEN, make_run

FORK_STEP = 20  # the parent (conftest's 40-step run) is forked at step 20: 40,960 tokens
FORK_STEPS = 10


def _section(html: str, anchor: str) -> str:
    found = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert found, f"no section {anchor}"
    return found.group(1)


def _rows(fragment: str) -> list[list[str]]:
    """The cells of each body row of the tables in an HTML fragment."""
    return [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr>(<td.*?)</tr>", fragment)]


def _val(step: int, source: str) -> float:
    """The fork's validation loss: old sources rise a little (forgetting), the new one falls."""
    return {"code": 2.7 + 0.01 * step, "web": 3.1 + 0.02 * step}.get(source, 6.0 - 0.2 * step)


def write_fork(
    root: Path,
    name: str,
    parent: Path,
    step: int,
    offset: int = 0,
    weights: dict[str, float] | None = None,
    step0_eval: bool = False,
) -> Path:
    """A 10-step fork of `parent` at `step` (the parent's own offset `offset`), as the trainer writes it."""
    weights = weights or {"code": 0.2, "web": 0.1, "prose": 0.7}
    tokens = step * BATCH_TOKENS
    record = {"run_dir": str(parent.resolve()), "checkpoint": str(parent / f"train/checkpoints/step_{step:07d}"),
              "step": step, "tokens": tokens, "config_hash": "parent-hash", "tokens_offset": offset,
              "cumulative_tokens": offset + tokens}  # fmt: skip
    t = lambda s: s * BATCH_TOKENS  # noqa: E731
    records = [
        {"kind": "event", "step": 0, "tokens": 0, "event": "start", "steps": FORK_STEPS,
         "batch_tokens": BATCH_TOKENS, "flops_per_token": 2 * FLOPS_PER_TOKEN, "config_hash": f"{name}-hash",
         "parent": record},
        {"kind": "event", "step": 0, "tokens": 0, "event": "data_plan", "steps": FORK_STEPS,
         "sources": {s: {"tokens": 9000, "sequences": 70, "consumed": 20} for s in weights}},
        {"kind": "event", "step": 0, "tokens": 0, "event": "stage", "stage": "main", "weights": weights},
    ]  # fmt: skip
    sources = sorted(weights)
    for s in range(0 if step0_eval else 1, FORK_STEPS + 1):
        if s:
            records.append({"kind": "train", "step": s, "tokens": t(s), "loss": 3.0 - 0.01 * s, "lr": 1e-3})
        if s in (0, 4, 8) and (s or step0_eval):
            by_source = {src: _val(s, src) for src in sources}
            records.append({"kind": "eval", "step": s, "tokens": t(s), "val_loss": sum(by_source.values()) / 3,
                            "val_tokens": 4096, "val_loss_by_source": by_source})  # fmt: skip
    records.append(
        {"kind": "event", "step": FORK_STEPS, "tokens": t(FORK_STEPS), "event": "end", "status": "ok"}
    )
    run = root / name
    (run / "train").mkdir(parents=True)
    (run / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "train" / "run.json").write_text(json.dumps({"config_hash": f"{name}-hash", "parent": record}))
    (run / "train" / "manifest.json").write_text(
        json.dumps(
            {"stage": "train", "parent": record, "result": {"tokens": t(FORK_STEPS), "final_val_loss": 4.0}}
        )
    )
    (run / "eval").mkdir()
    for at, overall in ((5, 1.6), (FORK_STEPS, 1.5)):
        # Each source scores the parent's held-out text (conftest: 5 documents, 1,000 bytes per source).
        per_source = {
            src: {"bits_per_byte": overall - 0.5 + k / 10, "documents": 5, "bytes": 1000}
            for k, src in enumerate(sources)
        }
        whole = {"bits_per_byte": overall, "documents": 5 * len(sources) // 2, "bytes": 500 * len(sources)}
        heldout = {"overall": whole, "per_source": per_source}
        (run / "eval" / f"step_{at:07d}.json").write_text(
            json.dumps({"step": at, "tokens_seen": t(at), "heldout": heldout})
        )
    return run


@pytest.fixture
def family(runs_dir: Path) -> dict[str, Path]:
    """stable (from scratch, 40 steps) -> fork (at step 20, adds the "prose" source) -> grand (at the
    fork's step 5, adds "poetry"), an anneal-like fork on the old sources only, and an unrelated run."""
    stable = make_run(runs_dir, "stable")
    # The parent's held-out evaluation at step 30: 61,440 tokens, where the fork ends.
    result = json.loads((stable / "eval" / "step_0000040.json").read_text())
    result.update(step=30, tokens_seen=30 * BATCH_TOKENS)
    for figures in (result["heldout"]["overall"], *result["heldout"]["per_source"].values()):
        figures["bits_per_byte"] = 1.75
    (stable / "eval" / "step_0000030.json").write_text(json.dumps(result))
    fork = write_fork(runs_dir, "fork", stable, FORK_STEP)
    grand = write_fork(runs_dir, "grand", fork, 5, offset=FORK_STEP * BATCH_TOKENS, step0_eval=True,
                       weights={"code": 0.1, "web": 0.1, "prose": 0.3, "poetry": 0.5})  # fmt: skip
    anneal = write_fork(runs_dir, "anneal", stable, FORK_STEP, weights={"code": 0.5, "web": 0.5})
    other = make_run(runs_dir, "other", seed=2)
    return {"stable": stable, "fork": fork, "grand": grand, "anneal": anneal, "other": other}


def test_fork_is_drawn_at_its_parents_cumulative_tokens(family):
    stable, fork, grand = (load_run(family[k]) for k in ("stable", "fork", "grand"))
    assert stable.parent is None and stable.tokens_offset == 0
    assert fork.tokens_offset == FORK_STEP * BATCH_TOKENS == 40960
    assert grand.tokens_offset == 40960 + 5 * BATCH_TOKENS  # a fork of a fork: the parent's offset too
    assert fork.cumulative(2048) == 43008
    # FLOPs before the fork: the parent's FLOPs per token times its tokens at the fork, then the fork's.
    assert flops_offset(stable) == 0.0
    assert flops_offset(grand) == FLOPS_PER_TOKEN * 40960 + 2 * FLOPS_PER_TOKEN * 5 * BATCH_TOKENS

    html = write_run_report(family["fork"]).read_text()
    summary = _section(html, "summary")
    assert "cumulative tokens (lineage)" in summary and "61,440" in summary
    loss = _section(html, "loss")
    # The fork's last validation (its step 8) is drawn at 40,960 + 8 x 2,048 tokens, not at 16,384.
    assert f"validation loss: {fmt_number(40960 + 8 * BATCH_TOKENS)}," in loss
    assert f"validation loss: {fmt_number(8 * BATCH_TOKENS)}," not in loss
    evaluation = _section(html, "evaluation")
    assert f"model: {fmt_number(61440)}," in evaluation  # held-out bits/byte at cumulative tokens
    # A run from scratch keeps its own token axis.
    assert f"validation loss: {fmt_number(20 * BATCH_TOKENS)}," in _section(
        write_run_report(family["stable"]).read_text(), "loss"
    )


def test_lineage_section_shows_parents_and_forks_with_relative_links(family):
    html = write_run_report(family["fork"]).read_text()
    lineage = _section(html, "lineage")
    assert lineage.index("stable") < lineage.index("<b>fork</b>") < lineage.index("grand")
    assert 'href="../stable/report.html"' in lineage and 'href="../grand/report.html"' in lineage
    assert (
        "<b>fork</b> <i>(this run)</i>: from step 20 of stable (40,960 tokens into it; 40,960 cumulative)"
        in lineage
    )
    assert "from step 5 of fork (10,240 tokens into it; 51,200 cumulative)" in lineage  # the grandchild
    assert "trained 20,480 tokens, to 61,440 cumulative" in lineage
    assert "stable</b>" not in lineage and "../other/" not in lineage  # an unrelated run is not family
    assert "../anneal/" not in lineage  # a sibling fork is the parent's family, not this run's
    assert "validation loss of the lineage at cumulative tokens" in lineage
    assert "stable (up to the fork)" in lineage and "grand" in lineage

    parent_lineage = _section(write_run_report(family["stable"]).read_text(), "lineage")
    assert "trained from scratch" in parent_lineage
    for child in ("fork", "anneal", "grand"):
        assert f'href="../{child}/report.html"' in parent_lineage
    alone = _section(write_run_report(family["other"]).read_text(), "lineage")
    assert "was trained from scratch" in alone and "no run in" in alone


def test_parent_and_forks_compared_at_equal_cumulative_tokens(family, capsys):
    out = family["stable"].parent / "cmp" / "c.html"
    compared = [str(family[k]) for k in ("stable", "fork", "anneal")]
    assert main(["report", *compared, "--out", str(out)]) == 0
    html = out.read_text()
    assert "train loss against cumulative tokens" in html
    assert 'href="../stable/report.html"' in _section(html, "lineage")  # relative to the page's folder
    assert "stable step 20" in _section(html, "runs")
    table = _section(html, "forks")
    rows = {tuple(cells[:3]): cells for cells in _rows(table)}
    # Held-out: the forks end at 61,440 cumulative tokens; the parent evaluated exactly there (step 30).
    heldout = rows[("anneal", "stable", "held-out bits/byte")]
    assert heldout[3:8] == ["61,440", "1.5", "1.75", "equal tokens (step 30)", "-0.25"]
    assert heldout[8] == "2.51 (equal tokens (step 20))"  # the parent at the fork point (conftest)
    code = rows[("fork", "stable", "held-out bits/byte: code")]
    assert code[3:8] == ["61,440", "1", "1.75", "equal tokens (step 30)", "-0.75"]
    # The fork also evaluates "prose": its overall figure scores other text, so no difference is given.
    overall = rows[("fork", "stable", "held-out bits/byte (other text)")]
    assert overall[4:8] == ["1.5", "1.75", "equal tokens (step 30)", "-"]
    assert "(other text): the two figures score different text, so no difference is given" in table
    assert rows[("fork", "stable", "validation loss: code (other text)")][7] == "-"  # 3 sources, not 2
    # Validation loss: a fork's last at its step 8 (57,344); the parent's nearest is step 30, 4,096 later.
    val = rows[("anneal", "stable", "validation loss")]
    assert val[3] == "57,344" and val[6] == "nearest: step 30, +4,096 tokens"
    parent_val = [r for r in load_run(family["stable"]).kind("eval") if r.get("step") == 30][0]
    assert float(val[7]) == pytest.approx(float(val[4]) - parent_val["val_loss"], abs=1e-3)
    assert rows[("fork", "stable", "validation loss: prose")][5] == "-"  # the parent never validated prose


def test_equal_token_matching_says_which_point():
    evals = [Point(10, 100.0, {"overall": 1.0}), Point(20, 200.0, {"overall": 0.5})]
    assert at_tokens(evals, 200.0)[1] == "equal tokens (step 20)"
    assert at_tokens(evals, 160.0)[1] == "nearest: step 20, +40 tokens"
    assert at_tokens(evals, 150.0)[1] == "nearest: step 10, -50 tokens"  # a tie goes to the earlier point
    assert at_tokens([], 1.0) is None


def test_forgetting_next_to_adaptation_for_a_fork_on_a_new_source(family):
    fork = load_run(family["fork"])
    assert trained_sources(fork) == {"code", "web", "prose"}
    assert trained_sources(load_run(family["stable"]), FORK_STEP) == {"code", "web"}
    lineage = _section(write_run_report(family["fork"]).read_text(), "lineage")
    assert "old domain (forgetting): code" in lineage and "new domain (adaptation): prose" in lineage
    assert (
        "New domain (sources this run trains on that its lineage did not before the fork): prose." in lineage
    )
    losses, heldout = lineage.split("<h3>Held-out bits per byte per source</h3>")
    rows = {cells[0]: cells for cells in _rows(losses) if cells[1] in ("old", "new")}
    # No step-0 validation in this fork: the fork point is the parent's validation at step 20 (conftest:
    # val - 0.2 for code). It split train.eval_tokens over 2 sources, this run over 3: other windows, so
    # the value is shown but no change is given.
    parent_val = [r for r in load_run(family["stable"]).kind("eval") if r.get("step") == 20][0]
    code_start = parent_val["val_loss_by_source"]["code"]
    assert rows["code"][2:6] == [f"{code_start:.5g}", f"{_val(8, 'code'):.5g}", "step 8", "-"]
    assert rows["prose"][1] == "new" and rows["prose"][2] == "-"  # the parent never validated prose
    assert "Values at the fork point: stable&#x27;s validation at step 20 (the fork point)" in lineage
    assert "stable&#x27;s validation scored other windows of code, web than this run&#x27;s" in lineage
    # Held-out bits/byte per source: the parent's evaluation of the fork checkpoint (the same 5 documents
    # per source), the fork's last.
    held = {cells[0]: cells for cells in _rows(heldout)}
    assert held["code"][1:5] == ["old", "2.51", "1", "-1.51"] and held["prose"][1:3] == ["new", "-"]

    # A fork that validated at its step 0 starts from its own figures (the parent's weights, its data).
    grand = _section(write_run_report(family["grand"]).read_text(), "lineage")
    assert "this run&#x27;s validation at step 0 (the parent&#x27;s weights)" in grand
    assert (
        "did not before the fork): poetry. Old domain (sources the lineage trained on): code, prose, web"
        in grand
    )
    rows = {cells[0]: cells for cells in _rows(grand.split("<h3>Held-out")[0]) if cells[1] in ("old", "new")}
    assert rows["poetry"][2] == f"{_val(0, 'poetry'):.5g}" and rows["prose"][1] == "old"
    assert float(rows["poetry"][5]) == pytest.approx(_val(8, "poetry") - _val(0, "poetry"))  # adapted
    assert float(rows["code"][5]) == pytest.approx(_val(8, "code") - _val(0, "code"))  # forgot a little
    assert "other windows" not in grand
    assert grand.count(f"new domain (adaptation): poetry: {fmt_number(51200)},") == 1  # drawn once

    # An anneal on the parent's own sources has no new domain.
    anneal = _section(write_run_report(family["anneal"]).read_text(), "lineage")
    assert "there is no new domain" in anneal and "forgetting):" not in anneal


def test_family_finds_forks_beside_the_run_only(family, tmp_path):
    elsewhere = write_fork(tmp_path / "elsewhere", "far", family["stable"], 10)
    found = Family([load_run(family["stable"])])
    names = {m.path.name for m in found.members.values()}
    assert names == {"stable", "fork", "grand", "anneal"} and elsewhere.name not in names
    (root,) = found.roots
    assert [c.path.name for c in root.children] == ["anneal", "fork"]  # same fork step: by name
    # The far fork still finds its way up: its own report lists stable as its parent.
    assert "stable" in _section(write_run_report(elsewhere).read_text(), "lineage")


def test_parent_of_a_fork_is_gone(family, tmp_path):
    import shutil

    shutil.rmtree(family["stable"])
    html = write_run_report(family["fork"]).read_text()
    lineage = _section(html, "lineage")
    assert "not found" in lineage and "the parent run cannot be read" in lineage
    compared = write_comparison([family["fork"], family["anneal"]], tmp_path / "c.html").read_text()
    assert "FLOPs axes are left out: a fork&#x27;s parent run" in compared


def test_comparison_of_a_parent_and_its_only_fork_shows_the_tree(tmp_path):
    parent = make_run(tmp_path / "runs", "parent")
    child = write_fork(tmp_path / "runs", "child", parent, FORK_STEP)
    html = write_comparison([parent, child], tmp_path / "runs" / "c.html").read_text()
    lineage = _section(html, "lineage")
    assert 'href="parent/report.html"' in lineage and 'href="child/report.html"' in lineage
    assert "from step 20 of parent" in lineage
    # The parent with an unrelated run: its fork beside it is still family; the table needs both compared.
    other = write_comparison([parent, make_run(tmp_path / "runs", "other")], tmp_path / "o.html").read_text()
    assert "from step 20 of parent" in _section(other, "lineage") and '<section id="forks">' not in other
    runs = [make_run(tmp_path / "plain", "a"), make_run(tmp_path / "plain", "b")]
    plain = write_comparison(runs, tmp_path / "p.html").read_text()
    assert '<section id="lineage">' not in plain and "cumulative" not in plain
