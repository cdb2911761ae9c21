"""The report's contamination section: t per benchmark over tokens, the last checkpoint's table (flagged
rows marked), canary memorisation against exposure; offline files win over in-loop records."""

import json

from smelt.report.eval_sections import contamination_points, contamination_section
from smelt.report.run import Run


def figures(t: float, flagged: bool, memorised: float | None = None) -> dict:
    task = {"items": 50, "controls": "distractors", "gold_bits_per_byte": 2.0, "control_bits_per_byte": 2.1,
            "t": t, "p_value": 0.01, "below_share": 0.6, "flagged": flagged, "k": 4.0}  # fmt: skip
    out = {"k": 4.0, "tasks": {"copa": task}, "flagged": ["copa"] if flagged else []}
    if memorised is not None:
        levels = [{"copies": c, "strings": 2, "bits_per_byte": 4.0 - memorised * c / 32,
                   "memorisation": memorised * c / 32, "z": 1.0} for c in (1, 2, 4, 8, 16, 32)]  # fmt: skip
        out["canaries"] = {"controls": {"strings": 16, "bits_per_byte": 4.0, "sd": 0.1}, "levels": levels}
    return out


def test_section_reads_inloop_records_and_offline_files(tmp_path):
    records = [
        {
            "kind": "eval",
            "step": 10,
            "tokens": 1000,
            "inloop": True,
            "contamination": figures(-1.0, False, 0.2),
        },
        {
            "kind": "eval",
            "step": 20,
            "tokens": 2000,
            "inloop": True,
            "contamination": figures(-2.0, False, 0.5),
        },
        {"kind": "eval", "step": 20, "tokens": 2000, "val_loss": 3.0},
    ]
    folder = tmp_path / "eval" / "contamination"
    folder.mkdir(parents=True)
    offline = {"step": 20, "tokens_seen": 2000, **figures(-9.0, True, 1.0)}
    (folder / "step_0000020.json").write_text(json.dumps(offline))
    run = Run(path=tmp_path, metrics_path=tmp_path / "metrics.jsonl", records=records)

    points = contamination_points(run)
    assert [p["tasks"]["copa"]["t"] for p in points] == [-1.0, -9.0]  # step 20 from the file
    html = contamination_section(run)
    assert "paired t of each benchmark" in html and "flag below -k = -4" in html
    assert '<tr class="diff"><td>copa</td>' in html and "FLAGGED" in html
    assert "canary memorisation against exposure" in html and html.count("<svg") == 2


def test_section_says_how_to_get_figures_when_there_are_none(tmp_path):
    run = Run(path=tmp_path, metrics_path=tmp_path / "metrics.jsonl", records=[])
    html = contamination_section(run)
    assert "smelt eval RUN --contamination" in html and "eval.contamination_inloop" in html
