"""An interrupted run resumes under another layout by relaunching `smelt train CONFIG`, not by forking:
the parallel degrees and strategy are the run's layout, not its plan (config/train.py LAYOUT_KEYS), so the
train stage resumes from its newest checkpoint and DCP reshards it. PP2 -> one process, one process ->
PP2 and FSDP2 -> TP2, each killed after step 6 (checkpoint at 4) on real gloo processes, log the
uninterrupted one-process run's losses at every step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smelt.checkpoint.store import list_checkpoints
from smelt.cli import QUICKSTART_CONFIG, main
from smelt.config.train import LAYOUT_KEYS
from smelt.run.lifecycle import changed_keys

RUN = "layouts"
STEPS = 8
CHECKPOINT_AT = 4
KILLED_AFTER = 6
KILLER = Path(__file__).with_name("killed_cli.py")
# tiny-1m (4 layers, 4 heads of 2 key/value heads), untied for the pipeline; 8 steps of 16 sequences
# of 128 tokens in micro batches of 8: 2 micro batches on one process, PP2 and TP2 (one data-parallel
# rank), 1 on each FSDP2 rank. fp32 and Adam eps 1e-6 so that layouts agree to rounding
# (test_tensor_parallel.raw_config); synchronous checkpoints, so step 4's is committed before step 5.
# AdamW, not the quickstart's Muon, which needs whole matrices (FSDP2 and TP shard them).
SETTINGS = [
    "data.sources.0.max_files=80", "tokenizer.vocab_size=512", "tokenizer.sample_bytes=1000000",
    "model.preset='tiny-1m'", "model.max_seq_len=128", "model.tie_embeddings=false",
    "train.seq_len=128", "train.micro_batch=8", "train.batch_tokens=2048", f"train.tokens={2048 * STEPS}",
    "train.warmup_tokens=4096", "train.eval_every=0", "train.eval_tokens=2048", "train.log_every=1",
    "train.precision='fp32'", "train.compile=false", "train.optimizer='adamw'", "train.threads=1", "train.eps=1e-6",
    f"checkpoint.every_steps={CHECKPOINT_AT}", "checkpoint.async_save=false",
]  # fmt: skip
ENV = {"OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}


def _args(root: Path, *layout: str) -> list[str]:
    out = [str(QUICKSTART_CONFIG)]
    for item in [*SETTINGS, f"run.dir='{root}'", f"run.name='{RUN}'", *layout]:
        out += ["--set", item]
    return out


def _launch(processes: int, argv: list[str], kill_after: int = 0) -> subprocess.CompletedProcess:
    """`smelt ...` in its own processes: torchrun's for several, killed after `kill_after` steps if set."""
    entry = [str(KILLER), str(kill_after)] if kill_after else ["-m", "smelt.cli"]
    if processes > 1:
        torchrun = Path(sys.executable).with_name("torchrun")
        command = [str(torchrun), "--standalone", "--nproc_per_node", str(processes), *entry, *argv]
    else:
        command = [sys.executable, *entry, *argv]
    return subprocess.run(
        command, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600
    )  # fmt: skip


def _records(root: Path) -> list[dict]:
    lines = (root / RUN / "train" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _losses(records: list[dict]) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if r["kind"] == "train"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Documents, tokenizer and tokens of a tiny run, made once for the module."""
    root = tmp_path_factory.mktemp("layouts")
    for command in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        result = _launch(1, [*command, *_args(root)])
        assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory) -> dict[int, tuple[float, float]]:
    """The uninterrupted run on one process."""
    root = tmp_path_factory.mktemp("reference")
    shutil.copytree(prepared, root, dirs_exist_ok=True, symlinks=True)
    result = _launch(1, ["train", *_args(root)])
    assert result.returncode == 0, result.stderr[-3000:]
    found = _losses(_records(root))
    assert sorted(found) == list(range(1, STEPS + 1)) and found[STEPS][0] < found[1][0]  # it trained
    return found


@pytest.fixture
def root(prepared, tmp_path) -> Path:
    target = tmp_path / "runs"
    shutil.copytree(prepared, target, symlinks=True)
    return target


def _killed(root: Path, processes: int, *layout: str) -> None:
    result = _launch(processes, ["train", *_args(root, *layout)], kill_after=KILLED_AFTER)
    assert result.returncode != 0, "the first launch should have been killed"
    train = root / RUN / "train"
    assert [c.name for c in list_checkpoints(train / "checkpoints")] == [f"step_{CHECKPOINT_AT:07d}"]
    assert not (train / "manifest.json").exists()


def _assert_resumed_as_reference(root: Path, reference: dict[int, tuple[float, float]]) -> None:
    records = _records(root)
    (resume,) = [r for r in records if r.get("event") == "resume"]
    assert resume["step"] == CHECKPOINT_AT
    found = _losses(records)
    assert sorted(found) == list(range(1, STEPS + 1))  # steps 5 and 6 of the killed launch superseded
    for step, (loss, norm) in found.items():
        ref_loss, ref_norm = reference[step]
        assert abs(loss - ref_loss) <= 1e-5 * ref_loss, (step, ref_loss, loss)
        # TP and FSDP2 take the norm over shards: fp32 accumulation order (docs/distributed.md).
        assert abs(norm - ref_norm) <= 1e-4 * ref_norm, (step, ref_norm, norm)
    manifest = json.loads((root / RUN / "train" / "manifest.json").read_text())
    assert manifest["result"]["steps"] == STEPS and manifest["result"]["resumed_from_step"] == CHECKPOINT_AT


def test_layout_keys_are_not_part_of_the_plan():
    old = {"train": {"lr": 3e-3, "pipeline_parallel": 2, "parallel": "fsdp", "micro_batch": 8}}
    for key in LAYOUT_KEYS:
        assert changed_keys({"train": {key: 2}}, {"train": {key: 1}}) == [], key
    new = {"train": {"lr": 3e-3, "pipeline_parallel": 1, "parallel": "ddp", "micro_batch": 8}}
    assert changed_keys(old, new) == []
    # The global batch's split stays in the plan (MoE balancing and capacity are per micro batch).
    assert changed_keys(old, {"train": {**new["train"], "micro_batch": 4}}) == ["train.micro_batch: 8 -> 4"]


@pytest.mark.slow  # two gloo processes, then one: three launches
def test_pipeline_checkpoint_resumes_in_one_process(root, reference, capsys):
    _killed(root, 2, "train.pipeline_parallel=2")
    # Keeping pipeline_parallel = 2 in one process cannot fit: exit 2 naming the key and the value.
    assert main(["train", *_args(root, "train.pipeline_parallel=2")]) == 2
    err = capsys.readouterr().err
    assert "train.pipeline_parallel = 1" in err and "resumes" in err and "plan" not in err.split(";")[0]
    assert not (root / RUN / "superseded").exists()
    result = _launch(1, ["train", *_args(root)])
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_resumed_as_reference(root, reference)


@pytest.mark.slow  # one process, then two gloo processes
def test_one_process_checkpoint_resumes_under_pp2(root, reference):
    _killed(root, 1)
    result = _launch(2, ["train", *_args(root, "train.pipeline_parallel=2")])
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_resumed_as_reference(root, reference)
    events = [r for r in _records(root) if r.get("event") in ("start", "resume")]
    assert [(e["event"], e["world_size"]) for e in events] == [("start", 1), ("resume", 2)]


@pytest.mark.slow  # two gloo processes, twice
def test_fsdp2_checkpoint_resumes_under_tp2(root, reference):
    _killed(root, 2, "train.parallel='fsdp'")
    result = _launch(2, ["train", *_args(root, "train.parallel='fsdp'", "train.tensor_parallel=2")])
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_resumed_as_reference(root, reference)
    # Finished: the same config under yet another layout is up to date, not a changed plan.
    again = _launch(1, ["train", *_args(root)])
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr[-3000:]
