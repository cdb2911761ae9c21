import pytest
import torch

from smelt.config.presets import MODEL_PRESETS
from smelt.errors import UserError
from smelt.model.flops import count_params, flops_per_token, resolved_d_ff
from smelt.model.sizing import describe_preset, kv_cache_bytes_per_token, preset_config
from smelt.model.transformer import Transformer

VOCAB = 32_768


@pytest.mark.parametrize("name", ["tiny-1m", "small-5m"])
@pytest.mark.slow
def test_small_presets_built_for_real_match_the_formula(name):
    cfg = preset_config(name)
    torch.manual_seed(0)
    model = Transformer(cfg, 384)
    counts = count_params(cfg, 384)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["non_embedding"] == counts["total"] - 384 * cfg.d_model


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
@pytest.mark.slow
def test_every_preset_on_meta_matches_the_formula(name):
    cfg = preset_config(name)
    with torch.device("meta"):  # shapes only: an 8B model costs no memory
        model = Transformer(cfg, VOCAB)
    assert count_params(cfg, VOCAB)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_preset_shapes_follow_the_design(name):
    cfg = preset_config(name)
    head_dim = cfg.d_model // cfg.n_heads
    assert cfg.d_model % cfg.n_heads == 0 and cfg.n_heads % (cfg.n_kv_heads or cfg.n_heads) == 0
    if name not in ("tiny-1m", "tiny-moe"):  # the test presets are allowed a 32-dim head
        assert 64 <= head_dim <= 128
    d_ff = resolved_d_ff(cfg)
    multiple = 64 if cfg.d_model < 1024 else 256
    assert d_ff % multiple == 0
    if not cfg.d_ff:
        assert 8 * cfg.d_model / 3 <= d_ff < 8 * cfg.d_model / 3 + multiple


@pytest.mark.parametrize(
    ("name", "vocab", "total"),
    [
        ("llama-124m", 50_304, 123_587_328),  # GPT-2 small
        ("llama-3b", 128_256, 3_212_749_824),  # Llama 3.2 3B
        ("llama-7b", 32_000, 6_738_415_616),  # Llama 2 7B
        ("llama-8b", 128_256, 8_030_261_248),  # Llama 3 8B
    ],
)
def test_preset_totals_match_the_models_they_follow(name, vocab, total):
    assert count_params(preset_config(name), vocab)["total"] == total


def test_describe_preset_rows():
    rows = dict(describe_preset("llama-8b", vocab_size=128_256))
    assert rows["parameters (total)"].startswith("8,030,261,248")
    cfg = preset_config("llama-8b")
    assert kv_cache_bytes_per_token(cfg) == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert rows["KV-cache bytes per token (bf16)"].startswith("131,072")
    flops = flops_per_token(cfg, 128_256, 8192)
    assert rows["training FLOPs per token (6N + 12 L d s, s = 8192)"].startswith(f"{flops:.4g}")
    assert "GiB" in rows["weights (bf16)"] and "GiB" in rows["weights (fp32)"]
    short = dict(describe_preset("tiny-1m", seq_len=128))
    assert "s = 128" in " ".join(short)
    with pytest.raises(UserError, match="llama-8b"):
        describe_preset("llama-9b")
