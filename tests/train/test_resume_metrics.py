"""A resumed run logs every step once: what the dead run wrote after its checkpoint moves to
metrics.superseded.jsonl, and metrics.jsonl, the report's reader and the TensorBoard export agree.
`--resume-from STEP` resumes from an earlier checkpoint, keeping the later ones aside."""

import json
from collections import Counter
from pathlib import Path

import pytest

from helpers import write_token_data
from smelt.checkpoint.store import list_checkpoints
from smelt.cli import build_parser
from smelt.config import config_from_dict
from smelt.errors import UserError
from smelt.report.run import load_run
from smelt.report.sinks import export_tensorboard
from smelt.train.monitors import SUPERSEDED_METRICS, supersede_after_resume
from smelt.train.ops.supervise import child_command, prepare_resume_from
from smelt.train.ops.watchdog import Watchdog
from smelt.train.trainer import train

STEPS = 10


class Killed(Exception):
    """Stands in for SIGKILL: the loop stops after logging a step, with no end event."""


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


def config(tmp_path: Path, **checkpoint):
    return config_from_dict({
        "run": {"seed": 5, "dir": str(tmp_path / "runs"), "name": "r"},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
        },
        "checkpoint": {"every_steps": 3, "keep_last": 5, **checkpoint},
    })  # fmt: skip


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def train_killed_at(monkeypatch, cfg, tokens, tokenizer, out: Path, step: int) -> None:
    real_beat = Watchdog.beat

    def beat(self, at: int) -> None:
        real_beat(self, at)
        if at == step:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Watchdog, "beat", beat)
        with pytest.raises(Killed):
            train(cfg, tokens, tokenizer, out)


def losses(found: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in found if r["kind"] == "train"}


@pytest.mark.parametrize("async_save", [True, False])
@pytest.mark.slow
def test_steps_after_the_checkpoint_are_logged_once(tmp_path, monkeypatch, async_save):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = config(tmp_path, async_save=async_save)
    train(cfg, tokens, tokenizer, tmp_path / "reference")
    reference = records(tmp_path / "reference" / "metrics.jsonl")

    out = tmp_path / "killed"
    train_killed_at(monkeypatch, cfg, tokens, tokenizer, out, step=8)  # checkpoints at 3 and 6
    before = records(out / "metrics.jsonl")
    assert [r["step"] for r in before if r["kind"] == "train"] == list(range(1, 9))
    summary = train(cfg, tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] == 6

    records_of = records(out / "metrics.jsonl")
    train_steps = [r["step"] for r in records_of if r["kind"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))  # each once, in order
    assert losses(records_of) == losses(reference)  # the replayed steps are the same steps, bitwise
    saves = Counter(r["step"] for r in records_of if r.get("event") == "checkpoint")
    assert saves == {3: 1, 6: 1, 9: 1, 10: 1}
    assert [r["step"] for r in records_of if r["kind"] == "eval"] == [STEPS]
    (resume,) = [r for r in records_of if r.get("event") == "resume"]
    assert resume["step"] == 6 and resume["superseded_records"] == 2  # the train records of steps 7, 8

    side = records(out / SUPERSEDED_METRICS)
    assert side[0]["event"] == "superseded" and side[0]["resumed_at_step"] == 6 and side[0]["records"] == 2
    assert [r["step"] for r in side[1:]] == [7, 8]  # kept, not deleted

    # The report's reader and the TensorBoard export see the same single history.
    run = load_run(out)
    assert [r["step"] for r in run.kind("train")] == list(range(1, STEPS + 1))
    logdir, written = export_tensorboard(out, tmp_path / "tb")
    assert written == len(records_of)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    points = accumulator.Scalars("train/loss")
    assert [p.step for p in points] == [256 * s for s in range(1, STEPS + 1)]
    assert [p.value for p in points] == pytest.approx([losses(reference)[s] for s in range(1, STEPS + 1)])


@pytest.mark.slow
def test_the_live_tensorboard_view_drops_the_dead_runs_points(tmp_path, monkeypatch):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = config(tmp_path)
    cfg.train.tensorboard = True
    out = tmp_path / "killed"
    train_killed_at(monkeypatch, cfg, tokens, tokenizer, out, step=8)
    train(cfg, tokens, tokenizer, out, resume="auto")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(out / "tensorboard"))
    accumulator.Reload()
    final = {p.step: p.value for p in accumulator.Scalars("train/loss")}
    steps = [p.step for p in accumulator.Scalars("train/loss")]
    assert steps == [256 * s for s in range(1, STEPS + 1)]  # steps 7 and 8 once, from the resumed run
    logged = losses(records(out / "metrics.jsonl"))
    assert [final[256 * s] for s in range(1, STEPS + 1)] == pytest.approx(
        [logged[s] for s in range(1, STEPS + 1)]
    )


@pytest.mark.slow
def test_a_run_resumed_at_its_final_checkpoint_logs_the_end_once(tmp_path):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = config(tmp_path)
    out = tmp_path / "run"
    first = train(cfg, tokens, tokenizer, out)
    # Killed after the final checkpoint, before the stage was recorded: auto finishes the bookkeeping.
    again = train(cfg, tokens, tokenizer, out, resume="auto")
    assert again["resumed_from_step"] == STEPS and again["final_val_loss"] == first["final_val_loss"]
    found = records(out / "metrics.jsonl")
    assert Counter(r["step"] for r in found if r["kind"] == "eval") == {STEPS: 1}
    assert Counter(r["step"] for r in found if r.get("event") == "checkpoint")[STEPS] == 1
    assert len([r for r in found if r.get("event") == "end"]) == 1
    assert [r["step"] for r in found if r["kind"] == "train"] == list(range(1, STEPS + 1))


def test_without_an_offset_the_step_decides(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"kind": "event", "event": "start", "step": 0},
        {"kind": "train", "step": 3, "loss": 1.0},
        {"kind": "event", "event": "stage", "step": 3, "first_step": 4},  # the stage begins after 3
        {"kind": "event", "event": "checkpoint", "step": 3},
        {"kind": "train", "step": 4, "loss": 0.9},
        {"kind": "event", "event": "end", "step": 4, "status": "failed"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "tra')  # a torn last line
    moved = supersede_after_resume(path, 3, offset=None)
    assert moved == 4
    assert records(path) == [lines[0], lines[1], lines[3]]
    side = (tmp_path / SUPERSEDED_METRICS).read_text().splitlines()
    assert json.loads(side[0])["records"] == 4 and side[-1] == '{"kind": "tra'
    # An offset that does not fall on a line boundary of this file is not trusted.
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert supersede_after_resume(path, 3, offset=5) == 3


@pytest.mark.slow
def test_resume_from_an_earlier_step_sets_later_checkpoints_aside(tmp_path, monkeypatch):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = config(tmp_path)
    train_dir = cfg.run_dir / "train"
    train_killed_at(monkeypatch, cfg, tokens, tokenizer, train_dir, step=8)
    checkpoints = train_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["step_0000003", "step_0000006"]

    with pytest.raises(
        UserError, match=r"--resume-from 4: no committed checkpoint of step 4 .*committed steps: 3, 6\)"
    ):
        prepare_resume_from(cfg, 4)
    with pytest.raises(UserError, match="--restart/--force start it over from step 0: pass one of them"):
        prepare_resume_from(cfg, 3, restart=True)
    moved = prepare_resume_from(cfg, 3)
    assert [p.relative_to(checkpoints).as_posix() for p in moved] == ["superseded/step_0000006"]
    summary = train(cfg, tokens, tokenizer, train_dir, resume="auto")  # what the train stage then does
    assert summary["resumed_from_step"] == 3
    found = records(train_dir / "metrics.jsonl")
    assert [r["step"] for r in found if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert [r["step"] for r in records(train_dir / SUPERSEDED_METRICS)[1:] if r["kind"] == "train"] == [
        4,
        5,
        6,
        7,
        8,
    ]
    assert (checkpoints / "superseded" / "step_0000006" / "COMMITTED").is_file()  # kept, out of the chain

    (train_dir / "manifest.json").write_text("{}")  # the stage finished
    with pytest.raises(
        UserError, match=r"is finished, and --resume-from continues an interrupted run.*--from"
    ):
        prepare_resume_from(cfg, 3)


def test_cli_passes_resume_from_to_the_first_attempt_only():
    args = build_parser().parse_args(
        ["train", "pipeline.toml", "--resume-from", "300", "--max-restarts", "2"]
    )
    assert args.resume_from == 300
    first = child_command(args.config, args.overrides, first=True, resume_from=args.resume_from)
    restart = child_command(args.config, args.overrides, first=False, resume_from=args.resume_from)
    assert first[-2:] == ["--resume-from", "300"] and "--resume-from" not in restart
