"""`smelt plan memory`: the memory model and the layout recommender on the textbook cases."""

import pytest

from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.model.sizing import preset_config
from smelt.plan.memory import (
    GB,
    Cluster,
    Layout,
    ModelShape,
    activation_bytes_per_layer,
    memory,
    model_state_bytes,
    recommend,
)

LLAMA3_VOCAB = 128_256
FOUR_M = 4 * 2**20


def llama_8b() -> ModelShape:
    return ModelShape.from_config(preset_config("llama-8b"), LLAMA3_VOCAB, "llama-8b")


def model_30b() -> ModelShape:
    """A LLaMA-30B-like shape: d 7168, 48 layers, 56 heads of 128 (MHA), 32k vocabulary, ~30B parameters."""
    cfg = ModelConfig(
        d_model=7168, n_layers=48, n_heads=56, n_kv_heads=56, tie_embeddings=False, max_seq_len=4096
    )
    return ModelShape.from_config(cfg, 32_000, "30b")


def test_8b_model_state_is_about_128_gb():
    shape = llama_8b()
    assert shape.params_total == pytest.approx(8.03e9, rel=0.001)
    assert model_state_bytes(shape.params_total) / GB == pytest.approx(128.5, abs=0.5)
    # Unsharded on one GPU: the static state alone is the 16 bytes per parameter.
    single = memory(shape, Layout(seq_len=4096)).peak
    assert single.model_state / GB == pytest.approx(128.5, abs=0.5)


def test_7b_static_state_is_about_112_gb():
    assert model_state_bytes(7e9) == pytest.approx(112e9)
    assert model_state_bytes(7e9, "fp32") == pytest.approx(112e9)  # 4 + 4 + 8 bytes, the same total
    llama2 = ModelShape.from_config(preset_config("llama-7b"), 32_000)
    assert model_state_bytes(llama2.params_total) / GB == pytest.approx(112, rel=0.05)


def test_activation_bytes_follow_korthikanti():
    shape = llama_8b()
    s, b, h, a = 4096, 2, 4096, 32
    none = Layout(seq_len=s, micro_batch=b, recompute="none")
    assert activation_bytes_per_layer(shape, none) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    selective = Layout(seq_len=s, micro_batch=b, recompute="selective")
    assert activation_bytes_per_layer(shape, selective) == pytest.approx(s * b * h * 34)
    full = Layout(seq_len=s, micro_batch=b, recompute="full")
    assert activation_bytes_per_layer(shape, full) == pytest.approx(2 * s * b * h)
    # Tensor parallelism with sequence parallelism splits all of it t ways; without SP only part of it.
    tp4 = Layout(seq_len=s, micro_batch=b, recompute="none", tp=4)
    assert activation_bytes_per_layer(shape, tp4) == pytest.approx(s * b * h * (34 + 5 * a * s / h) / 4)
    no_sp = Layout(seq_len=s, micro_batch=b, recompute="none", tp=4, sequence_parallel=False)
    assert activation_bytes_per_layer(shape, no_sp) == pytest.approx(
        s * b * h * (10 + 24 / 4 + 5 * a * s / h / 4)
    )


def test_zero_stages_shard_optimizer_then_gradients_then_weights():
    shape = llama_8b()
    stages = [memory(shape, Layout(dp=8, zero=z, seq_len=2048)).peak for z in range(4)]
    n = shape.params_total
    assert stages[0].optimizer == pytest.approx(12 * n)
    assert stages[1].optimizer == pytest.approx(12 * n / 8) and stages[1].gradients == pytest.approx(2 * n)
    assert stages[2].gradients == pytest.approx(2 * n / 8) and stages[2].weights == pytest.approx(2 * n)
    assert stages[3].weights == pytest.approx(2 * n / 8) and stages[3].zero3_buffers > 0
    totals = [s.total for s in stages]
    assert totals == sorted(totals, reverse=True)


def test_pipeline_splits_state_but_not_first_stage_activations():
    shape = llama_8b()
    two = memory(shape, Layout(tp=4, pp=2, dp=4, zero=1, seq_len=4096, microbatches=16))
    four = memory(shape, Layout(tp=4, pp=4, dp=2, zero=1, seq_len=4096, microbatches=16))
    first2, first4 = two.stages[0], four.stages[0]
    assert first2.activations == pytest.approx(first4.activations)  # 1F1B: ~L layers in flight either way
    assert first4.weights < first2.weights
    assert two.stages[1].logits > 0 and first2.logits == 0  # the head lives on the last stage


def test_8b_on_32_h100s_gets_tp4_pp2_dp4():
    rec = recommend(llama_8b(), Cluster(32, 8, 80), seq_len=8192, global_batch_tokens=FOUR_M)
    layout = rec.layout
    assert (layout.tp, layout.pp, layout.dp) == (4, 2, 4)
    assert layout.microbatches >= 4 * layout.pp  # keeps the pipeline bubble small
    assert layout.micro_batch * layout.microbatches * layout.dp * 8192 == FOUR_M
    assert rec.memory.peak.total <= 0.9 * 80 * GB
    # Data parallelism alone would not fit: the reason model parallelism is used at all.
    assert not any(ok for alt, _, ok in rec.alternatives if (alt.tp, alt.pp, alt.zero) == (1, 1, 1))


def test_30b_on_256_gpus_gets_tp4_pp2_dp32_at_27_to_37_gb():
    shape = model_30b()
    assert shape.params_total == pytest.approx(30e9, rel=0.02)
    rec = recommend(shape, Cluster(256, 8, 80), seq_len=4096, global_batch_tokens=FOUR_M)
    assert (rec.layout.tp, rec.layout.pp, rec.layout.dp) == (4, 2, 32)
    assert 27 <= rec.memory_at_micro_batch_1.peak.total / GB <= 37
    assert rec.memory.peak.total <= 72 * GB and rec.layout.microbatches >= 8


def test_small_model_uses_data_parallelism_alone():
    shape = ModelShape.from_config(preset_config("llama-124m"), 50_304)
    rec = recommend(shape, Cluster(8, 8, 80), seq_len=2048, global_batch_tokens=2**19)
    assert (rec.layout.tp, rec.layout.pp, rec.layout.dp) == (1, 1, 8)
    assert rec.layout.micro_batch * rec.layout.microbatches * 8 * 2048 == 2**19


def test_cli_recommends_and_explains(cli, capsys):
    argv = [
        "plan",
        "memory",
        "--preset",
        "llama-8b",
        "--vocab-size",
        "128256",
        "--gpus",
        "32",
        "--gpu",
        "h100",
    ]
    assert cli([*argv, "--seq-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "TP 4, PP 2, DP 4" in out and "128.5 GB" in out and "why:" in out
    assert cli(["plan", "memory", "--preset", "llama-7b", "--tp", "2", "--dp", "4", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "TP 2 x PP 1 x DP 4 (ZeRO-1)" in out and "fits" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--preset", "llama-8b", "--tp", "3"], "--tp 3 must divide"),
        (["--preset", "llama-8b", "--pp", "5"], "--pp 5 must divide the 32 layers"),
        (["--preset", "llama-8b", "--recompute", "some"], "--recompute must be one of"),
        (["--preset", "llama-8b", "--gpus", "12"], "whole number of nodes"),
        (
            ["--preset", "llama-8b", "--gpus", "8", "--global-batch-tokens", "1000"],
            "multiple of the sequence length",
        ),
        (["--preset", "nope"], "is not a known preset"),
        (["--config", "missing.toml"], "does not exist"),
    ],
)
def test_memory_user_errors(cli, capsys, argv, needle):
    assert cli(["plan", "memory", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_nothing_fits_says_what_to_change():
    shape = llama_8b()
    with pytest.raises(UserError, match="no layout of 1 GPUs"):
        recommend(shape, Cluster(1, 8, 24), seq_len=8192, global_batch_tokens=8192 * 8)
