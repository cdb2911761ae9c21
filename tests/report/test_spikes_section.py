"""The report's spikes section lists every spike with its replay's label, suspects and top documents,
and the spikes nobody triaged, from metrics.jsonl alone."""

from __future__ import annotations

from smelt.report.run import Run
from smelt.report.spikes_section import spikes_section


def _alert(step: int, kind: str) -> dict:
    return {
        "kind": "event",
        "event": "alert",
        "step": step,
        "tokens": 256 * step,
        "alert": kind,
        "value": 9.0,
    }


def test_each_spike_shows_its_label_suspects_and_documents(tmp_path):
    triage = {
        "kind": "event", "event": "spike_triage", "step": 50, "tokens": 12800, "spike_step": 32, "label": "data",
        "bitwise": True, "suspects": ["poison-zq"], "alerts": ["loss_spike", "grad_spike"],
        "top": [{"id": "poison-zq", "source": "code", "loss": 10.491, "excess": 5.959, "tokens": 128},
                {"id": "Lib/a.py", "source": "code", "loss": 5.015, "excess": -3.33, "tokens": 64}],
    }  # fmt: skip
    failed = {"kind": "event", "event": "spike_triage", "step": 50, "tokens": 12800, "spike_step": 5,
              "label": None, "error": "no committed checkpoint before step 5"}  # fmt: skip
    records = [_alert(5, "grad_spike"), _alert(32, "loss_spike"), _alert(32, "grad_spike"), _alert(40, "loss_spike"),
               triage, failed]  # fmt: skip
    html = spikes_section(Run(tmp_path, tmp_path / "metrics.jsonl", records))
    assert "poison-zq: 10.491 (+5.959)" in html and "Lib/a.py: 5.015 (-3.330)" in html
    assert "loss_spike, grad_spike" in html and ">data<" in html
    assert "not triaged: no committed checkpoint before step 5" in html
    assert html.count("<tr") == 4  # the header and steps 5, 32 and 40 (not triaged)


def test_a_run_without_spikes_says_so(tmp_path):
    html = spikes_section(Run(tmp_path, tmp_path / "metrics.jsonl", [_alert(3, "grad_alert")]))
    assert "no loss or gradient spike" in html
