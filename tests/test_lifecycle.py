"""The run lifecycle: config changes never delete checkpoints, forks start from a parent's exact
weights and read on from its data, stale upstream artifacts and vocabulary mismatches stop with exit
2, one writer per stage."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from smelt.checkpoint.store import list_checkpoints, load_model, read_meta
from smelt.cli import QUICKSTART_CONFIG, main
from smelt.errors import UserError
from smelt.run.lifecycle import changed_keys, stage_lock, trajectory_config

from .test_pipeline_e2e import TINY

RUN = "life"
SETTINGS = [*TINY, "checkpoint.every_steps=5", "checkpoint.keep_last=10", "train.eval_every=0"]


def _args(root: Path, *extra: str, name: str = RUN) -> list[str]:
    out = [str(QUICKSTART_CONFIG)]
    for item in [*SETTINGS, f"run.dir='{root}'", f"run.name='{name}'", *extra]:
        out += ["--set", item]
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """documents, tokenizer and tokens of a tiny run, made once for the module."""
    root = tmp_path_factory.mktemp("lifecycle")
    for command in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        assert main([*command, *_args(root)]) == 0
    return root


@pytest.fixture
def root(prepared, tmp_path) -> Path:
    target = tmp_path / "runs"
    shutil.copytree(prepared, target, symlinks=True)
    return target


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model(checkpoint)
    return model.state_dict()


def _batch(capsys, target: Path, step: int) -> list[str]:
    """`smelt inspect batches TARGET --step N --rows 0`: every row of the step, without its header."""
    capsys.readouterr()
    assert main(["inspect", "batches", str(target), "--step", str(step), "--rows", "0"]) == 0
    return capsys.readouterr().out.split("\n")[2:]


def _sequences(rows: list[str]) -> set[tuple[str, str]]:
    """(sequence, epoch) of every row that `smelt inspect batches` printed."""
    return set(re.findall(r"sequence (\d+) \(epoch (\d+)\)", "\n".join(rows)))


def _interrupt_after(monkeypatch, steps: int) -> None:
    """Make training stop as a kill would, after `steps` optimizer steps (KeyboardInterrupt)."""
    import smelt.train.trainer as trainer

    real = trainer.forward_backward
    calls = {"n": 0}

    def counting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > steps:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "forward_backward", counting)


@pytest.mark.slow
def test_interrupted_run_resumes_bit_identically_after_a_logging_change(root, tmp_path, monkeypatch, capsys):
    reference_root = tmp_path / "reference"
    shutil.copytree(root, reference_root, symlinks=True)
    assert main(["train", *_args(reference_root, "train.log_every=2")]) == 0
    reference = reference_root / RUN / "train"

    with monkeypatch.context() as patch:
        _interrupt_after(patch, 12)
        assert main(["train", *_args(root)]) == 130
    train = root / RUN / "train"
    assert [c.name for c in list_checkpoints(train / "checkpoints")] == ["step_0000005", "step_0000010"]
    assert not (train / "manifest.json").exists()

    assert main(["train", *_args(root, "train.log_every=2")]) == 0
    resumed = [r for r in _records(root / RUN) if r.get("event") == "resume"]
    assert resumed and resumed[-1]["step"] == 10
    final = list_checkpoints(train / "checkpoints")[-1]
    assert final.name == list_checkpoints(reference / "checkpoints")[-1].name == "step_0000020"
    ours, theirs = _weights(final), _weights(reference / "checkpoints" / final.name)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    ref_losses = {r["step"]: r["loss"] for r in _records(reference_root / RUN) if r.get("kind") == "train"}
    new_losses = {
        r["step"]: r["loss"] for r in _records(root / RUN) if r.get("kind") == "train" and r["step"] > 10
    }
    assert new_losses and all(ref_losses[s] == loss for s, loss in new_losses.items())


@pytest.mark.slow
def test_plan_change_stops_restart_moves_aside_and_fork_starts_from_parent_weights(root, capsys):
    assert main(["train", *_args(root)]) == 0
    run = root / RUN
    before = [c.name for c in list_checkpoints(run / "train" / "checkpoints")]
    assert len(before) == 4
    capsys.readouterr()

    # A trajectory key changed: exit 2 naming it and both ways on; nothing deleted.
    assert main(["train", *_args(root, "train.lr=0.001")]) == 2
    err = capsys.readouterr().err
    assert "train.lr: 0.003 -> 0.001" in err and "--from" in err and "--restart" in err
    assert [c.name for c in list_checkpoints(run / "train" / "checkpoints")] == before
    # The same change through `smelt run` stops before any stage runs.
    assert main(["run", *_args(root, "train.lr=0.001")]) == 2
    assert [c.name for c in list_checkpoints(run / "train" / "checkpoints")] == before

    # A neutral change leaves the finished stage as it is.
    assert main(["train", *_args(root, "train.log_every=3", "checkpoint.keep_last=4")]) == 0
    assert "up to date" in capsys.readouterr().out

    # A fork from step 10 with a zero learning rate keeps the parent's exact weights.
    fork_args = _args(root, "train.lr=0.0", "train.tokens=4096", name="fork")
    assert main(["train", *fork_args, "--from", f"{run}:10"]) == 0
    fork = root / "fork"
    assert (fork / "tokenizer").is_symlink() and (fork / "tokens").is_symlink()
    assert json.loads((fork / "config.json").read_text())["train"]["init_from"] == f"{run}:10"
    parent_weights = _weights(run / "train" / "checkpoints" / "step_0000010")
    fork_weights = _weights(list_checkpoints(fork / "train" / "checkpoints")[-1])
    assert all(torch.equal(parent_weights[k], fork_weights[k]) for k in parent_weights)
    manifest = json.loads((fork / "train" / "manifest.json").read_text())
    assert manifest["parent"]["step"] == 10 and manifest["parent"]["tokens"] == 10 * 2048
    start = next(r for r in _records(fork) if r.get("event") == "start")
    assert start["parent"]["run_dir"] == str(run.resolve())

    # --restart moves the old stage aside (kept) and trains from step 0.
    assert main(["train", *_args(root, "train.lr=0.001"), "--restart"]) == 0
    (aside,) = (run / "superseded").iterdir()
    assert [c.name for c in list_checkpoints(aside / "checkpoints")] == before
    assert "moved to" in capsys.readouterr().err + capsys.readouterr().out or aside.is_dir()
    assert json.loads((run / "train" / "manifest.json").read_text())["config"]["train"]["lr"] == 0.001
    # The fork's links still point at the parent's inputs, untouched by the restart.
    assert (fork / "tokens" / "manifest.json").is_file()


@pytest.mark.slow
def test_a_fork_reads_on_from_its_parents_data_unless_told_to_restart(root, capsys):
    assert main(["train", *_args(root)]) == 0
    run = root / RUN
    assert main(["train", *_args(root, "train.tokens=8192", name="fork"), "--from", f"{run}:10"]) == 0
    fork = root / "fork"
    # Step k of the fork is step 10 + k of the parent, row for row; nothing of its first 10 steps.
    for k in (1, 4):
        assert _batch(capsys, fork, k) == _batch(capsys, run, 10 + k)
    seen = set().union(*(_sequences(_batch(capsys, run, step)) for step in range(1, 11)))
    read = set().union(*(_sequences(_batch(capsys, fork, step)) for step in range(1, 5)))
    assert len(read) == 4 * 16 and not read & seen
    # The trainer read them: its checkpoints continue the parent's cursors.
    parent_loader = read_meta(run / "train" / "checkpoints" / "step_0000010")["loader"]
    loader = read_meta(list_checkpoints(fork / "train" / "checkpoints")[-1])["loader"]
    assert loader["start"] == parent_loader["cursors"]
    assert [n - parent_loader["cursors"][s] for s, n in loader["cursors"].items()] == [4 * 16]  # one source
    plan = next(r for r in _records(fork) if r.get("event") == "data_plan")
    assert plan["start"] == parent_loader["cursors"]

    # train.fork_data = 'restart': the fork's own data from its beginning, the parent's first batches.
    again = _args(root, "train.tokens=8192", "train.fork_data='restart'", name="again")
    assert main(["train", *again, "--from", f"{run}:10"]) == 0
    assert _batch(capsys, root / "again", 1) == _batch(capsys, run, 1)
    assert "start" not in read_meta(list_checkpoints(root / "again" / "train" / "checkpoints")[-1])["loader"]


@pytest.mark.slow
def test_retrained_tokenizer_makes_training_stop_as_stale(root, capsys):
    assert main(["tokenizer", "train", *_args(root, "tokenizer.vocab_size=640")]) == 0
    capsys.readouterr()
    assert main(["train", *_args(root, "tokenizer.vocab_size=640")]) == 2
    err = capsys.readouterr().err
    assert "tokens/ was made from an older tokenizer/" in err and "smelt run CONFIG" in err
    assert not (root / RUN / "train").exists()


def test_vocabulary_mismatch_names_all_three_numbers(tmp_path):
    from smelt.train.setup import check_token_inputs

    (tmp_path / "smelt.json").write_text(json.dumps({"vocab_size": 512, "hash": "abc"}))
    with pytest.raises(UserError) as info:
        check_token_inputs(tmp_path / "tokens", tmp_path, {"vocab_size": 640}, 512)
    message = str(info.value)
    assert "640 ids" in message and "has 512" in message and "embeds 512" in message
    with pytest.raises(UserError, match="retrained after `smelt tokenize`"):
        check_token_inputs(tmp_path / "tokens", tmp_path, {"vocab_size": 512, "tokenizer_hash": "def"}, 512)
    check_token_inputs(tmp_path / "tokens", tmp_path, {"vocab_size": 512, "tokenizer_hash": "abc"}, 512)


def test_second_writer_of_a_stage_gets_exit_2_naming_the_holder(tmp_path, capsys):
    run_dir = tmp_path / "runs" / RUN
    with stage_lock(run_dir, "curate"):
        assert main(["curate", *_args(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "being written by another smelt command" in err and "pid" in err
    assert not (run_dir / "documents").exists()


def test_neutral_keys_are_left_out_of_the_cache_key():
    old = {"train": {"lr": 0.003, "log_every": 10, "tensorboard": False}, "checkpoint": {"every_steps": 5}}
    new = {"train": {"lr": 0.003, "log_every": 2, "tensorboard": True}, "checkpoint": {"every_steps": 50}}
    assert changed_keys(old, new) == []
    assert trajectory_config(new) == {"train": {"lr": 0.003}, "checkpoint": {}}
    assert changed_keys(old, {**new, "train": {**new["train"], "lr": 0.001}}) == ["train.lr: 0.003 -> 0.001"]


def test_fork_data_counts_for_forks_only_and_an_older_fork_restarted():
    """train.fork_data changes nothing for a run that is not a fork (runs recorded before the key stay up to
    date); a fork recorded before it read its data from the beginning, which is 'restart'."""
    older = {"train": {"lr": 0.003, "init_from": ""}}
    assert changed_keys(older, {"train": {"lr": 0.003, "init_from": "", "fork_data": "continue"}}) == []
    fork = {"train": {"lr": 0.003, "init_from": "runs/base:10"}}
    assert changed_keys(fork, {"train": {**fork["train"], "fork_data": "restart"}}) == []
    assert changed_keys(fork, {"train": {**fork["train"], "fork_data": "continue"}}) == [
        "train.fork_data: 'restart' -> 'continue'"
    ]


def test_speed_settings_change_no_plan():
    """An existing run is not stopped for switching compile or host-memory reuse (the default of
    train.compile moved from false to auto): the data order, schedule and model stay the same."""
    old = {"train": {"lr": 0.003, "compile": False}}
    new = {"train": {"lr": 0.003, "compile": "auto", "keep_host_memory": True}}
    assert changed_keys(old, new) == []


@pytest.mark.slow
def test_anneal_forks_beat_the_stable_checkpoint_and_are_compared(root, capsys):
    assert main(["train", *_args(root)]) == 0
    run = root / RUN
    args = _args(root, "eval.tasks=[]", "eval.gallery_tokens=0")
    variants = ["--variant", "peak", "--variant", "lower", "train.lr=0.002"]
    assert main(["anneal", *args, "--from", f"{run}:10", "--decay-tokens", "8192", *variants, "--soup"]) == 0
    comparison = json.loads((run / "anneals" / "anneal-step_0000010.json").read_text())
    stable, *anneals = comparison["rows"]
    assert stable["run"] == "stable@10" and stable["cumulative_tokens"] == 10 * 2048
    assert [row["run"] for row in anneals] == ["peak", "lower", "soup"]
    for row in anneals:
        assert row["cumulative_tokens"] == 10 * 2048 + 8192
        assert row["bits_per_byte"] < stable["bits_per_byte"], row
    fork = root / f"{RUN}-anneal-peak"
    start = next(r for r in _records(fork) if r.get("event") == "start")
    assert start["parent"]["step"] == 10 and start["schedule"] == "wsd"
    assert (run / "anneals" / "anneal-step_0000010.html").is_file()
    decision = json.loads((run / "anneals" / "decisions.jsonl").read_text().splitlines()[-1])
    assert decision["metric"] == "heldout_bits_per_byte" and len(decision["runs"]) == 2
    assert "stable@10" in capsys.readouterr().out
    # Two steps at the peak, then linear towards 0: the last of the 4 steps trains at peak / 3, not 0.
    lrs = {r["step"]: r["lr"] for r in _records(fork) if r.get("kind") == "train"}
    assert lrs[1] == pytest.approx(0.003) and lrs[4] == pytest.approx(0.001)
    # The anneal reads on from the stable run's data: its step 1 is the stable run's step 11.
    assert _batch(capsys, fork, 1) == _batch(capsys, run, 11) != _batch(capsys, run, 1)
    for name in ("peak", "lower", "soup"):  # every run writes summary.json
        summary = json.loads((root / f"{RUN}-anneal-{name}" / "summary.json").read_text())
        assert summary["val_bits_per_byte"] < stable["bits_per_byte"], name
