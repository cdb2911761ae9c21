"""Spikes triaged by replay, the parts that need no training: the label rule, the checkpoint a replay
starts from, the trainer's queue of spikes, and the commands' user errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.train.alerts import Alert, Decision
from smelt.train.spike_watch import MAX_PER_RUN, SpikeTriage
from smelt.train.spikes import (
    DATA,
    NONDETERMINISTIC,
    bitwise_expected,
    choose_start,
    compare,
    loader_steps,
    spike_alerts,
    spike_path,
)

LOSS_ALERT = {"event": "alert", "step": 7, "alert": "loss_spike", "value": 6.5, "threshold": 6.0}
GRAD_ALERT = {"event": "alert", "step": 7, "alert": "grad_spike", "value": 40.0, "threshold": 5.0}


def test_a_bitwise_replay_is_data_and_any_other_is_not_where_bits_are_expected():
    same = {"loss": 6.5, "grad_norm": 40.0}
    figures, label = compare([LOSS_ALERT, GRAD_ALERT], same, exact=True)
    assert label == DATA and all(f["bitwise"] for f in figures)
    off = {"loss": 6.5 * (1 + 1e-7), "grad_norm": 40.0}
    figures, label = compare([LOSS_ALERT, GRAD_ALERT], off, exact=True)
    assert label == NONDETERMINISTIC and [f["bitwise"] for f in figures] == [False, True]
    # Where the replay cannot be bitwise, crossing the threshold again reproduces the spike; not crossing it does not.
    assert compare([LOSS_ALERT], off, exact=False)[1] == DATA
    assert compare([LOSS_ALERT], {"loss": 5.9, "grad_norm": 1.0}, exact=False)[1] == NONDETERMINISTIC
    assert compare([LOSS_ALERT], {"loss": float("nan"), "grad_norm": 1.0}, exact=False)[1] == NONDETERMINISTIC


def test_bits_are_expected_on_the_cpu_and_on_a_deterministic_gpu_run_of_one_process():
    assert bitwise_expected({"world_size": 1}, {"train": {"device": "cpu"}}) == (True, "")
    exact, why = bitwise_expected({"world_size": 1}, {"train": {"device": "cuda"}})
    assert not exact and "train.deterministic" in why
    assert bitwise_expected({"world_size": 1}, {"train": {"device": "cuda", "deterministic": True}})[0]
    exact, why = bitwise_expected({"world_size": 2}, {"train": {"device": "cpu"}})
    assert not exact and "2 processes" in why


def _checkpoint(train: Path, step: int, committed: bool = True) -> None:
    path = train / "checkpoints" / f"step_{step:07d}"
    path.mkdir(parents=True)
    if committed:
        (path / "COMMITTED").write_text("{}")


def test_the_replay_starts_at_the_newest_committed_checkpoint_before_the_spike(tmp_path):
    for step, committed in ((10, True), (20, True), (30, False), (40, True)):
        _checkpoint(tmp_path, step, committed)
    assert choose_start(tmp_path / "checkpoints", 37, []).name == "step_0000020"
    assert choose_start(tmp_path / "checkpoints", 41, []).name == "step_0000040"
    with pytest.raises(UserError, match="no committed checkpoint .* before step 10.*checkpoint.every_steps"):
        choose_start(tmp_path / "checkpoints", 10, [])
    rollback = {"kind": "event", "event": "rollback", "step": 25, "to_step": 20}
    with pytest.raises(UserError, match="step 25 rolled back to step 20"):
        choose_start(tmp_path / "checkpoints", 37, [rollback])


def test_spike_alerts_are_the_loss_and_grad_spikes_by_step():
    records = [LOSS_ALERT, GRAD_ALERT, {**LOSS_ALERT, "alert": "grad_alert"}, {"kind": "train", "step": 7}]
    assert {step: [a["alert"] for a in alerts] for step, alerts in spike_alerts(records).items()} == {
        7: ["loss_spike", "grad_spike"]
    }


def test_an_optimizer_step_takes_its_loader_steps_under_a_batch_ramp():
    assert loader_steps(SimpleNamespace(units=(), _consumed=()), 5) == [5]
    ramp = SimpleNamespace(units=(1, 2, 3), _consumed=(1, 3, 6))
    assert [loader_steps(ramp, k) for k in (1, 2, 3)] == [[1], [2, 3], [4, 5, 6]]


def _decision(*kinds: str) -> Decision:
    return Decision("apply", False, [Alert(kind, "log", f"{kind} message", 9.0, 3.0) for kind in kinds])


def test_the_trainer_queues_spikes_only_and_reports_one_it_cannot_replay(tmp_path, capsys):
    triage = SpikeTriage("auto", tmp_path, "cpu", is_main=True)
    assert triage.mode == "side"
    assert triage.step(3, 300, _decision("grad_alert")) == []  # a log-only alert is no spike
    (event,) = triage.step(4, 400, _decision("loss_spike", "grad_spike"))  # no checkpoint: nothing to replay
    assert event["event"] == "spike_triage" and event["spike_step"] == 4 and event["label"] is None
    assert "no committed checkpoint before step 4" in event["error"]
    assert (
        json.loads((spike_path(tmp_path, 4).with_suffix(".alerts.json")).read_text())[1]["alert"]
        == "grad_spike"
    )
    for step in range(5, 5 + MAX_PER_RUN + 2):
        triage.step(step, 100 * step, _decision("loss_spike"))
    assert triage.count == MAX_PER_RUN


def test_where_the_trainer_triages():
    assert SpikeTriage("auto", Path("."), "cuda", is_main=True).mode == "end"
    assert SpikeTriage("side", Path("."), "cuda", is_main=False).mode == "off"
    off = SpikeTriage("off", Path("."), "cpu", is_main=True)
    assert off.step(4, 400, _decision("loss_spike")) == [] and off.finish(10, 1000) == []


def _run(tmp_path: Path, triage: dict | None = None) -> Path:
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    (run / "train" / "metrics.jsonl").write_text(json.dumps(LOSS_ALERT) + "\n")
    if triage is not None:
        path = spike_path(run / "train", 7)
        path.parent.mkdir()
        path.write_text(json.dumps(triage))
    return run


def _doc(doc_id: str | None, loss: float, suspect: bool) -> dict:
    return {"source": "web", "id": doc_id, "split": "train", "loss": loss, "suspect": suspect, "tokens": 64}


def _triaged(label: str = DATA, documents: list | None = None) -> dict:
    documents = documents if documents is not None else [_doc("bad", 12.0, True), _doc("fine", 4.0, False)]
    return {"step": 7, "label": label, "figures": [{"alert": "loss_spike"}], "documents": documents,
            "suspects": [d["id"] for d in documents if d["suspect"]]}  # fmt: skip


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_drop_puts_the_suspects_on_the_drop_list_once(tmp_path, capsys):
    run = _run(tmp_path, _triaged())
    code, out, _ = _cli(["data", "drop", str(run), "--spike", "7"], capsys)
    assert code == 0 and "1 document(s) added" in out and "web/bad" in out
    (entry,) = [json.loads(line) for line in (run / "drops.jsonl").read_text().splitlines()]
    assert (entry["source"], entry["id"], entry["spike_step"]) == ("web", "bad", 7)
    assert entry["reason"] == "spike at step 7 (loss_spike; triage: data)"
    code, out, _ = _cli(["data", "drop", str(run), "--spike", "7", "--all"], capsys)
    assert code == 0 and "1 document(s) added" in out and "(1 already listed)" in out
    assert len((run / "drops.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("triaged", "extra", "message"),
    [
        (None, [], "has no triage in .* Run `smelt train triage .* --step 7` first"),
        ({"step": 7, "label": None, "error": "disk full"}, [], r"\(it failed: disk full\)"),
        (_triaged(NONDETERMINISTIC), [], "labelled 'nondeterministic or hardware'.*--doc ID"),
        (_triaged(), ["--doc", "other"], "--doc other: not a document of the batch of step 7 .*bad, fine"),
        (_triaged(documents=[_doc("a", 5.0, False), _doc("b", 4.0, False)]), [], "names no suspect.*--all"),
        (_triaged(documents=[_doc(None, 9.0, True)]), [], "could not name its documents by id"),
    ],
)
def test_drop_refuses_with_a_message_that_says_what_to_do(tmp_path, capsys, triaged, extra, message):
    run = _run(tmp_path, triaged)
    code, _, err = _cli(["data", "drop", str(run), "--spike", "7", *extra], capsys)
    assert code == 2 and re.search(message, err), err
    assert not (run / "drops.jsonl").exists()


def test_drop_of_a_nondeterministic_spike_takes_named_documents(tmp_path, capsys):
    run = _run(tmp_path, _triaged(NONDETERMINISTIC))
    code, _, _ = _cli(["data", "drop", str(run), "--spike", "7", "--doc", "fine"], capsys)
    assert code == 0 and json.loads((run / "drops.jsonl").read_text())["id"] == "fine"


def test_triage_lists_the_spikes_and_refuses_a_step_without_one(tmp_path, capsys):
    code, _, err = _cli(["train", "triage", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "metrics.jsonl does not exist: RUN must be a run directory" in err
    run = _run(tmp_path, _triaged())
    code, out, _ = _cli(["train", "triage", str(run)], capsys)
    assert code == 0 and "loss_spike" in out and "data" in out and "bad" in out
    code, _, err = _cli(["train", "triage", str(run), "--step", "8"], capsys)
    assert code == 2 and "no loss or gradient spike alert at step 8 (spikes at steps: 7)" in err


def _running(triage: SpikeTriage, tmp_path: Path, step: int, code: str) -> None:
    """A side process of `code` in place of a triage of `step` (the real one replays a checkpoint)."""
    import subprocess
    import sys

    alerts = spike_path(tmp_path, step).with_suffix(".alerts.json")
    alerts.parent.mkdir(parents=True, exist_ok=True)
    alerts.write_text("[]")
    log = spike_path(tmp_path, step).with_suffix(".log")
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=handle, stderr=subprocess.STDOUT)
    triage.running = (step, alerts, process)


def test_the_end_waits_for_a_running_triage_and_keeps_the_watchdog_fed(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    triage = SpikeTriage("side", tmp_path, "cpu", is_main=True)
    beats = []
    triage.beat = beats.append
    result = {"step": 9, "label": DATA, "bitwise": True, "suspects": ["bad"], "figures": [{"alert": "loss_spike"}],
              "documents": [{"id": "bad", "source": "web", "loss": 12.0, "excess": 7.5, "tokens": 64, "snippet": "x"}]}  # fmt: skip
    code = f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(spike_path(tmp_path, 9))!r}).write_text({json.dumps(result)!r})"
    _running(triage, tmp_path, 9, code)
    (event,) = triage.finish(20, 2000)
    assert (event["step"], event["spike_step"], event["label"], event["suspects"]) == (20, 9, DATA, ["bad"])
    assert event["top"] == [{"id": "bad", "source": "web", "loss": 12.0, "excess": 7.5, "tokens": 64}]
    assert beats and set(beats) == {20}
    assert "spike at step 9 triaged by replay: data; suspects: bad" in capsys.readouterr().err
    assert not spike_path(tmp_path, 9).with_suffix(".alerts.json").exists()


def test_a_side_process_that_dies_leaves_an_event_with_its_output(tmp_path):
    triage = SpikeTriage("side", tmp_path, "cpu", is_main=True)
    _running(triage, tmp_path, 9, "import sys; print('out of memory'); sys.exit(3)")
    (event,) = triage.finish(20, 2000)
    assert event["label"] is None and "the side process failed (exit 3): out of memory" in event["error"]
