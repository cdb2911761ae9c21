"""Telemetry (train/telemetry.py): its figures against direct computation, its cadence, and that a run
with it on follows the same trajectory as one with it off."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.checkpoint import load_model
from smelt.config import config_from_dict
from smelt.model.attention import dense_mask
from smelt.model.transformer import doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.train import telemetry as telemetry_module
from smelt.train.precision import resolve_precision
from smelt.train.telemetry import Telemetry, layer_of, max_attention_logit, moments_to_figures
from smelt.train.trainer import train

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture


def test_moments_give_rms_and_excess_kurtosis():
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(200_000)
    heavy = rng.standard_t(5, 200_000)  # excess kurtosis 6
    rows = []
    for x in (normal, heavy, 3 + normal):
        rows.append([x.sum(), (x**2).sum(), (x**3).sum(), (x**4).sum(), x.size])
    rms, kurt = moments_to_figures(torch.tensor(rows, dtype=torch.float64))
    assert rms[0] == pytest.approx(1.0, abs=0.01) and rms[2] == pytest.approx(math.sqrt(10), abs=0.02)
    assert abs(kurt[0]) < 0.05 and abs(kurt[2]) < 0.05  # a shifted normal is still normal
    direct = ((heavy - heavy.mean()) ** 4).mean() / heavy.var() ** 2 - 3
    assert kurt[1] == pytest.approx(direct, rel=1e-6) and kurt[1] > 3
    empty = moments_to_figures(torch.zeros(1, 5, dtype=torch.float64))
    assert math.isnan(empty[0][0]) and math.isnan(empty[1][0])


def test_max_attention_logit_matches_the_masked_scores(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 12, 8, generator=g), torch.randn(2, 2, 12, 8, generator=g)
    doc_ids = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(8)
    for docs in (None, doc_ids):
        mask = dense_mask(docs, docs, 0, 12, q.device)
        expected = scores.masked_fill(~mask, -math.inf).amax()
        monkeypatch.setattr(telemetry_module, "SCORE_BLOCK", 2 * 4 * 12 * 5)  # blocks of 5 query rows
        assert float(max_attention_logit(q, k, docs)) == pytest.approx(float(expected), rel=1e-6)
    assert (
        scores.amax() > scores.masked_fill(~dense_mask(doc_ids, doc_ids, 0, 12, q.device), -math.inf).amax()
    )


def test_layer_names():
    assert layer_of("blocks.3.attn.wq.weight") == 3 and layer_of("module.blocks.12.mlp.w_up") == 12
    assert layer_of("tok_emb.weight") is None and layer_of("lm_head.weight") is None


def capture_of(model, inputs, doc_masking=True, vocab=384):
    optimizer = torch.optim.AdamW(model.parameters())
    tel = Telemetry(
        model, optimizer, lambda record: None, every=1, ratio_every=-1, sharded=False,
        precision=resolve_precision("fp32", torch.device("cpu")), doc_masking=doc_masking, vocab_size=vocab,
    )  # fmt: skip
    doc_ids = doc_ids_from_tokens(inputs, 257)
    batch = SimpleNamespace(inputs=inputs, doc_ids=doc_ids, position_ids=position_ids_from_doc_ids(doc_ids))
    return tel.capture(batch)


def test_capture_matches_the_blocks_outputs_and_leaves_the_model_as_it_was():
    cfg = tiny_model_config(qk_norm=True)
    model = build_model(cfg)
    inputs = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(1))
    inputs[:, 10] = 257  # a document boundary in every row
    outputs, queries = [], []
    hooks = [b.register_forward_hook(lambda m, a, out: outputs.append(out.detach())) for b in model.blocks]
    doc_ids = doc_ids_from_tokens(inputs, 257)
    for i, block in enumerate(model.blocks):
        block.attn.probe = lambda q, k, i=i: queries.append((q.detach(), k.detach()))
    with torch.no_grad():
        logits, _ = model(inputs, doc_ids=doc_ids, position_ids=position_ids_from_doc_ids(doc_ids))
    for h in hooks:
        h.remove()
    for block in model.blocks:
        block.attn.probe = None

    figures = capture_of(model, inputs)
    assert figures["sample_tokens"] == 96
    for layer, out in enumerate(outputs):
        x = out.double().flatten()
        assert figures["act_rms"][layer] == pytest.approx(float(x.pow(2).mean().sqrt()), rel=1e-4)
        centred = x - x.mean()
        kurt = float(centred.pow(4).mean() / centred.pow(2).mean() ** 2 - 3)
        assert figures["act_kurtosis"][layer] == pytest.approx(kurt, rel=1e-3, abs=1e-4)
        q, k = queries[layer]
        scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        allowed = dense_mask(doc_ids, doc_ids, 0, 32, q.device)
        expected = float(scores.masked_fill(~allowed, -math.inf).amax())
        assert figures["attn_logit_max"][layer] == pytest.approx(expected, rel=1e-4)
    assert figures["logit_max"] == pytest.approx(float(logits.amax()), rel=1e-4)
    assert model.training and all(b.attn.probe is None for b in model.blocks)
    assert all(not b._forward_hooks for b in model.blocks)


def test_the_sample_is_bounded_by_tokens_and_logits():
    tel = SimpleNamespace(vocab_size=128_000)
    assert Telemetry.sample_rows(tel, 16, 4096) == 1  # 4096 x 128k logits already pass 2^27
    tel.vocab_size = 384
    assert Telemetry.sample_rows(tel, 16, 256) == 16 and Telemetry.sample_rows(tel, 64, 256) == 32


def test_cadence_and_what_a_run_logs(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    out = tmp_path / "run"
    train(tiny_config(telemetry_every=4, monitor_every=-1, eval_every=0), tokens, tokenizer, out)
    lines = read_metrics(out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["telemetry"] == "every 4 steps; update ratios every 4 steps"
    tel = [r for r in lines if r["kind"] == "telemetry"]
    layers = [r for r in lines if r["kind"] == "layers"]
    assert [r["step"] for r in tel] == [4, 8, 12] and [r["step"] for r in layers] == [4, 8, 12]
    for r in tel:
        assert len(r["act_rms"]) == len(r["act_kurtosis"]) == len(r["attn_logit_max"]) == 2
        assert all(v > 0 for v in r["act_rms"]) and r["logit_max"] > 0
    by_layer = layers[-1]["by_layer"]
    assert set(by_layer) == {"adam_m_rms", "adam_v_rms", "update_ratio"}
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in by_layer.values())
    wq = layers[-1]["layers"]["blocks.0.attn.wq.weight"]
    assert set(wq) == {"update_ratio", "weight_norm", "adam_m_rms", "adam_v_rms"}
    # Update ratios alone at their own cadence; telemetry alone with the ratios off.
    train(tiny_config(telemetry_every=0, monitor_every=6, eval_every=0), tokens, tokenizer, tmp_path / "b")
    lines = read_metrics(tmp_path / "b")
    assert not [r for r in lines if r["kind"] == "telemetry"]
    assert [set(next(iter(r["layers"].values()))) for r in lines if r["kind"] == "layers"] == [
        {"update_ratio", "weight_norm"}
    ] * 2


@pytest.mark.parametrize("moe", [False, True])
def test_telemetry_changes_nothing_in_the_run(data, tmp_path, moe):  # noqa: F811
    """A run with telemetry and update ratios every other step and one without make the same updates,
    bit for bit (an MoE router's balancing counts and bias included)."""
    tokens, tokenizer = data
    model = {"moe_experts": 4, "moe_top_k": 2, "moe_bias_rate": 0.01, "d_ff": 64} if moe else {}
    runs = {}
    for every in (0, 2):
        raw = tiny_config(telemetry_every=every, monitor_every=-1, eval_every=0, threads=1).to_dict()
        raw["model"].update(model)
        out = tmp_path / f"every{every}"
        train(config_from_dict(raw), tokens, tokenizer, out)
        lines = read_metrics(out)
        runs[every] = (out, [(r["step"], r["loss"], r["grad_norm"]) for r in lines if r["kind"] == "train"])
        assert bool([r for r in lines if r["kind"] == "telemetry"]) == bool(every)
    assert runs[0][1] == runs[2][1]
    a, _ = load_model(runs[0][0] / "checkpoints" / "step_0000012")
    b, _ = load_model(runs[2][0] / "checkpoints" / "step_0000012")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_telemetry_and_alert_keys_never_invalidate_a_stage():
    """Switching telemetry, update ratios or a run-health threshold on an existing run stops nothing:
    they read the run and log (a run recorded before the keys existed stays up to date)."""
    from smelt.run.lifecycle import changed_keys
    from smelt.train.health import KEYS

    old = {"train": {"lr": 0.003, "monitor_every": 0}}
    new = {
        "train": {
            "lr": 0.003,
            "monitor_every": -1,
            "telemetry_every": 100,
            **dict.fromkeys(KEYS.values(), 0.5),
        }
    }
    assert changed_keys(old, new) == []
