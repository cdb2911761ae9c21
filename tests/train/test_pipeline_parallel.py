"""Pipeline parallelism (PP2 on 2 gloo processes with the 1f1b, gpipe and interleaved schedules, PP2 x FSDP2
on 4) makes the updates one process makes, and its DCP checkpoints resume in one process and back."""

from types import SimpleNamespace

import pytest
import torch

from smelt.config import config_from_dict
from smelt.errors import ConfigError
from smelt.model.transformer import Transformer
from smelt.train.check import pilot_checks
from smelt.train.parallel.mesh import MeshLayout, layout_for
from smelt.train.parallel.pipeline import split_model, stage_layers
from smelt.train.trainer import train

from .test_tensor_parallel import (
    assert_same_losses,
    assert_same_weights,
    final_checkpoint,
    losses,
    run_processes,
)
from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

STEPS = 5
RESUME_AT = 3


def raw_config(
    parallel: str = "ddp", pipeline_parallel: int = 1, schedule: str = "1f1b", tensor_parallel: int = 1
) -> dict:
    return {
        "run": {"seed": 3},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64,
                  "tie_embeddings": False},
        "train": {
            # micro_batch 2: four micro batches per step on one data-parallel rank, two on two (1f1b needs
            # at least as many as stages).
            "seq_len": 32, "micro_batch": 2, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
            "parallel": parallel, "pipeline_parallel": pipeline_parallel, "pipeline_schedule": schedule,
            "tensor_parallel": tensor_parallel,
            "eps": 1e-6,  # see test_tensor_parallel.raw_config
        },
        "checkpoint": {"every_steps": RESUME_AT, "keep_last": 2},
    }  # fmt: skip


@pytest.fixture
def single(data, tmp_path, monkeypatch):  # noqa: F811 - pytest fixture injection
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = data
    out = tmp_path / "single"
    train(config_from_dict(raw_config()), tokens, tokenizer, out)
    return out, losses(read_metrics(out))


def middle(out):
    return out / "checkpoints" / f"step_{RESUME_AT:07d}"


def final_val_loss(lines: list[dict]) -> float:
    """The validation loss of the run's end (scored stage by stage under pipeline parallelism)."""
    (record,) = [r for r in lines if r["kind"] == "eval"]
    return record["val_loss"]


@pytest.mark.slow  # two training processes (gloo), three launches
def test_pp2_1f1b_matches_one_process_and_checkpoints_change_layout(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    assert len(reference) == STEPS and reference[STEPS][0] < reference[1][0]  # it trained
    pp_out = tmp_path / "pp2"
    lines = run_processes(2, raw_config(pipeline_parallel=2), tokens, tokenizer, pp_out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 2 and start["grad_accum"] == 4  # one data-parallel rank
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(pp_out))
    assert final_val_loss(lines) == pytest.approx(final_val_loss(read_metrics(single_out)), rel=1e-5)
    # PP2 -> one process: steps 4 and 5 as the uninterrupted run.
    one = tmp_path / "pp2-to-1"
    train(config_from_dict(raw_config()), tokens, tokenizer, one, resume=middle(pp_out))
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))
    # And back: one process -> PP2.
    back = run_processes(
        2,
        raw_config(pipeline_parallel=2),
        tokens,
        tokenizer,
        tmp_path / "1-to-pp2",
        resume=middle(single_out),
    )
    assert sorted(losses(back)) == [4, 5]
    assert_same_losses(reference, losses(back))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(tmp_path / "1-to-pp2"))


@pytest.mark.slow  # two training processes (gloo)
@pytest.mark.parametrize(("schedule", "recompute"), [("interleaved_1f1b", False), ("gpipe", True)])
def test_pp2_other_schedules_match_one_process(single, data, tmp_path, schedule, recompute):  # noqa: F811
    """Interleaved 1F1B: two stages of one layer per process. GPipe with activation checkpointing in
    the stages (the recomputed forward gives the same gradients)."""
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / schedule
    raw = raw_config(pipeline_parallel=2, schedule=schedule)
    raw["model"]["activation_checkpointing"] = recompute
    lines = run_processes(2, raw, tokens, tokenizer, out)
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))


@pytest.mark.slow  # four training processes (gloo)
def test_pp2_x_fsdp2_on_four_processes_matches_one(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / "pp2-fsdp2"
    lines = run_processes(4, raw_config("fsdp", pipeline_parallel=2), tokens, tokenizer, out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 4 and start["grad_accum"] == 2  # two data-parallel ranks
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))
    assert final_val_loss(lines) == pytest.approx(final_val_loss(read_metrics(single_out)), rel=1e-5)
    # The checkpoint of stages sharded over data-parallel ranks resumes in one process.
    one = tmp_path / "pp2-fsdp2-to-1"
    train(config_from_dict(raw_config()), tokens, tokenizer, one, resume=middle(out))
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))


@pytest.mark.slow  # four training processes (gloo)
def test_pp2_x_tp2_on_four_processes_matches_one(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / "pp2-tp2"
    lines = run_processes(4, raw_config(pipeline_parallel=2, tensor_parallel=2), tokens, tokenizer, out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 4 and start["grad_accum"] == 4  # one data-parallel rank
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))
    assert final_val_loss(lines) == pytest.approx(final_val_loss(read_metrics(single_out)), rel=1e-5)
    # Stages of tensor-parallel shards resume in one process.
    one = tmp_path / "pp2-tp2-to-1"
    train(config_from_dict(raw_config()), tokens, tokenizer, one, resume=middle(out))
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))


@pytest.mark.slow  # one process and two (gloo)
def test_pp2_under_a_batch_ramp_matches_one_process(data, tmp_path):  # noqa: F811
    """Steps of 2 and then 4 micro batches: each count runs its own schedule over the same stages."""
    tokens, tokenizer = data
    ramp = {"batch_ramp_start": 128, "batch_ramp_tokens": 512}
    raw = raw_config()
    raw["train"].update(ramp)
    train(config_from_dict(raw), tokens, tokenizer, tmp_path / "single")
    reference = losses(read_metrics(tmp_path / "single"))
    raw = raw_config(pipeline_parallel=2)
    raw["train"].update(ramp)
    lines = run_processes(2, raw, tokens, tokenizer, tmp_path / "pp2")
    assert {r["batch_tokens"] for r in lines if r["kind"] == "train"} == {128, 256}
    assert losses(lines).keys() == reference.keys()
    assert_same_losses(reference, losses(lines))
    steps = max(reference)
    assert_same_weights(
        tmp_path / "single" / "checkpoints" / f"step_{steps:07d}",
        tmp_path / "pp2" / "checkpoints" / f"step_{steps:07d}",
    )


def pp_config(model: dict | None = None, eval_every_steps: int = 0, **train):
    raw = raw_config(**{k: train.pop(k) for k in ("parallel", "pipeline_parallel", "schedule") if k in train})
    raw["model"].update(model or {})
    raw["eval"] = {"every_steps": eval_every_steps}
    raw["train"].update(train)
    return config_from_dict(raw)


@pytest.mark.slow  # the pilot's overfit run
def test_train_check_accepts_a_pipeline_layout_and_names_a_tied_head(data, monkeypatch):  # noqa: F811
    tokens, tokenizer = data
    monkeypatch.setattr("smelt.train.check.OVERFIT_LR", 3e-3)  # a tiny model overfits faster
    raw = raw_config("fsdp", pipeline_parallel=2, tensor_parallel=2)
    raw["train"]["data_parallel"] = 2
    rows = pilot_checks(config_from_dict(raw), tokens, tokenizer)
    assert rows[0] == ("parallel layout", True, "pp 2 x dp_replicate 1 x dp_shard 2 x tp 2 = 8 processes")
    assert all(passed for _, passed, _ in rows), rows
    raw["model"]["tie_embeddings"] = True
    with pytest.raises(ConfigError, match="set model.tie_embeddings = false"):
        pilot_checks(config_from_dict(raw), tokens, tokenizer)


def test_layout_puts_pp_outermost_with_fsdp_inside():
    assert layout_for(pp_config(parallel="fsdp", pipeline_parallel=2), 4) == MeshLayout(dp_shard=2, pp=2)
    assert layout_for(pp_config(pipeline_parallel=2), 2) == MeshLayout(pp=2)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"model": {"tie_embeddings": True}}, ["model.tie_embeddings = true", "set model.tie_embeddings = false"]),
        ({"model": {"n_layers": 3}, "schedule": "interleaved_1f1b"}, ["needs 4 stages", "model.n_layers is 3"]),
        ({"context_parallel": 2}, ["does not compose with train.context_parallel"]),
        ({"precision": "fp16"}, ["train.precision = 'fp16'", "use 'bf16'"]),
        ({"compile": True}, ["train.compile"]),
        ({"monitor_every": 5}, ["train.monitor_every"]),
        ({"eval_every_steps": 10}, ["eval.every_steps", "smelt eval RUN"]),
        ({"model": {"moe_experts": 4}}, ["model.moe_experts"]),
        ({"micro_batch": 8}, ["'1f1b' schedule needs at least 2 micro batches per step", "= 1; lower"]),
        ({"schedule": "interleaved_1f1b", "batch_tokens": 320, "micro_batch": 1, "seq_len": 64},
         ["rounds of 2, but a step has 5", "a multiple of 2"]),
    ],
)  # fmt: skip
def test_pipeline_layouts_that_cannot_be_built_name_the_keys(overrides, names):
    with pytest.raises(ConfigError) as err:
        cfg = pp_config(pipeline_parallel=2, **overrides)
        layout_for(cfg, 2 * cfg.train.context_parallel)
    for name in names:
        assert name in str(err.value)


def test_stages_balance_the_head_against_the_layers():
    cfg = pp_config().model
    assert stage_layers(cfg, 64, 64, 2) == [range(0, 2), range(2, 4)]  # a small head: two layers each
    # A head as costly as about two blocks: the last stage takes fewer layers.
    assert stage_layers(cfg, 1024, 64, 2) == [range(0, 3), range(3, 4)]
    assert stage_layers(cfg, 64, 64, 4) == [range(i, i + 1) for i in range(4)]


class OneProcessMesh:
    """What split_model reads of a TrainMesh, for rank `rank` of a pp-only layout (no process group)."""

    def __init__(self, pp: int, rank: int) -> None:
        self.layout, self.rank = MeshLayout(pp=pp), rank

    def pp_mesh(self):
        return SimpleNamespace(get_group=lambda: None)


@pytest.mark.parametrize(("pp", "schedule"), [(2, "1f1b"), (2, "interleaved_1f1b"), (4, "gpipe")])
def test_every_split_keeps_the_unsplit_parameter_names(pp, schedule):
    """The stages' state dicts, over the pp ranks, are the unsplit model's, name for name, each once."""
    cfg = pp_config().model
    full = Transformer(cfg, 64).state_dict()
    kept: list[str] = []
    for rank in range(pp):
        torch.manual_seed(0)
        model = Transformer(cfg, 64)
        chunks = split_model(model, OneProcessMesh(pp, rank), schedule)
        assert len(chunks) == (2 if schedule == "interleaved_1f1b" else 1)
        assert {id(p) for c in chunks for p in c.parameters()} == {id(p) for p in model.parameters()}
        kept += list(model.state_dict())
    assert sorted(kept) == sorted(full)
