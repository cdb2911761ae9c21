"""Telemetry under torchrun (2 gloo processes): tensor parallelism and FSDP2 report the figures one
process reports for the same rows: activation moments and Adam moments summed over the ranks, each
element once, attention and output logits maximised over them."""

import pytest

from smelt.config import config_from_dict
from smelt.train.trainer import train

from .test_tensor_parallel import STEPS, raw_config, run_processes
from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

FIGURES = ("act_rms", "act_kurtosis", "attn_logit_max")


def telemetry_of(lines):
    (tel,) = [r for r in lines if r["kind"] == "telemetry"]
    (layers,) = [r for r in lines if r["kind"] == "layers"]
    return tel, layers


def assert_same(a, b, rel=1e-4):
    tel_a, layers_a = a
    tel_b, layers_b = b
    assert tel_a["sample_tokens"] == tel_b["sample_tokens"]
    for key in FIGURES:
        assert tel_b[key] == pytest.approx(tel_a[key], rel=rel, abs=1e-6), key
    assert tel_b["logit_max"] == pytest.approx(tel_a["logit_max"], rel=rel)
    for key, values in layers_a["by_layer"].items():
        assert layers_b["by_layer"][key] == pytest.approx(values, rel=rel), key
    for name, figures in layers_a["layers"].items():  # norms replicated over "tp" counted once
        for key in ("adam_m_rms", "adam_v_rms", "weight_norm"):
            assert layers_b["layers"][name][key] == pytest.approx(figures[key], rel=rel), (name, key)


def single(tokens, tokenizer, out, **train_keys):
    raw = raw_config()
    raw["train"].update(telemetry_every=STEPS, **train_keys)
    train(config_from_dict(raw), tokens, tokenizer, out)
    return telemetry_of(read_metrics(out))


@pytest.mark.slow  # two launches of two training processes (gloo)
def test_tp2_and_fsdp2_report_what_one_process_does(data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = data
    # TP2: one data-parallel rank, so both ranks sample the first micro batch, as one process does.
    reference = single(tokens, tokenizer, tmp_path / "single")
    raw = raw_config(tensor_parallel=2)
    raw["train"]["telemetry_every"] = STEPS
    assert_same(reference, telemetry_of(run_processes(2, raw, tokens, tokenizer, tmp_path / "tp2")))
    # FSDP2: each rank samples its own 4 rows; together they are the 8 rows of one process's one
    # micro batch of 8.
    reference = single(tokens, tokenizer, tmp_path / "single8", micro_batch=8)
    raw = raw_config("fsdp")
    raw["train"]["telemetry_every"] = STEPS
    fsdp = telemetry_of(run_processes(2, raw, tokens, tokenizer, tmp_path / "fsdp2"))
    assert_same(reference, fsdp)


@pytest.mark.slow  # one launch of two training processes (gloo)
def test_cp2_logs_the_optimizer_figures_and_says_why_not_the_activations(data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = data
    _, reference = single(tokens, tokenizer, tmp_path / "single")
    raw = raw_config()
    raw["train"].update(context_parallel=2, telemetry_every=STEPS)
    lines = run_processes(2, raw, tokens, tokenizer, tmp_path / "cp2")
    start = next(r for r in lines if r.get("event") == "start")
    assert "optimizer figures only: context parallelism" in start["telemetry"]
    assert not [r for r in lines if r["kind"] == "telemetry"]
    (layers,) = [r for r in lines if r["kind"] == "layers"]
    for key, values in reference["by_layer"].items():
        assert layers["by_layer"][key] == pytest.approx(values, rel=1e-4), key
