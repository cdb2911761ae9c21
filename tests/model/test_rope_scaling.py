"""RoPE scaling for context extension: the frequencies, the config checks, and logit parity with
transformers (export and import) at four times the original length."""

from __future__ import annotations

import json
import math

import pytest
import torch

from smelt.config import ModelConfig, config_from_dict
from smelt.errors import ConfigError
from smelt.model.rope import (
    extend_context,
    model_rope_table,
    ntk_theta,
    rope_inv_freq,
    rope_table,
    yarn_inv_freq,
)
from smelt.model.transformer import Transformer

VOCAB = 384
ORIGINAL = 64  # the length the model "was trained at"
EXTENDED = 4 * ORIGINAL

SCALINGS = {
    "linear": {"rope_scaling": "linear", "rope_factor": 4.0},
    "ntk": {"rope_scaling": "ntk", "rope_factor": 4.0},
    "yarn": {"rope_scaling": "yarn", "rope_factor": 4.0, "rope_original_max_seq_len": ORIGINAL},
    "yarn-betas": {
        "rope_scaling": "yarn",
        "rope_factor": 8.0,
        "rope_original_max_seq_len": ORIGINAL,
        "yarn_beta_fast": 16.0,
        "yarn_beta_slow": 2.0,
    },
}


def build(**overrides) -> Transformer:
    base = dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=EXTENDED,
        rope_theta=10_000.0,
        norm_eps=1e-6,
    )
    base.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**base), VOCAB).eval()


def test_unscaled_table_is_unchanged():
    cfg = ModelConfig(max_seq_len=32, rope_theta=5000.0)
    angles = torch.outer(torch.arange(32.0, dtype=torch.float64), 5000.0 ** (-torch.arange(0, 16, 2) / 16))
    expected = torch.stack((angles.cos(), angles.sin()), dim=-1).float()
    torch.testing.assert_close(model_rope_table(cfg, 16), expected)


def test_linear_scaling_squeezes_positions_by_the_factor():
    cfg = ModelConfig(max_seq_len=EXTENDED, rope_scaling="linear", rope_factor=4.0)
    scaled = model_rope_table(cfg, 16)
    plain = rope_table(16, ORIGINAL, cfg.rope_theta)
    # Position 4t of the extended model turns by the angles position t had: no angle beyond those seen.
    torch.testing.assert_close(scaled[::4], plain, atol=1e-6, rtol=0)


def test_ntk_raises_the_base_and_keeps_the_fastest_pair():
    cfg = ModelConfig(max_seq_len=16, rope_scaling="ntk", rope_factor=4.0)
    inv = rope_inv_freq(16, ntk_theta(cfg.rope_theta, 4.0, 16))
    plain = rope_inv_freq(16, cfg.rope_theta)
    assert inv[0] == plain[0]  # the fastest pair keeps its frequency
    assert inv[-1] == pytest.approx(plain[-1] / 4.0)  # the slowest is slowed by exactly the factor
    torch.testing.assert_close(model_rope_table(cfg, 16), rope_table(16, 16, cfg.rope_theta, inv))


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_sets_the_temperature():
    plain = rope_inv_freq(32, 10_000.0)
    inv = yarn_inv_freq(32, 10_000.0, 4.0, 1024, 32.0, 1.0)
    turns = 1024 * plain / (2 * math.pi)  # how often each pair turns over the original length
    fast, slow = turns > 32, turns < 1
    assert fast.any() and slow.any()
    torch.testing.assert_close(inv[fast], plain[fast])
    torch.testing.assert_close(inv[slow], plain[slow] / 4.0)
    cfg = ModelConfig(max_seq_len=8, rope_scaling="yarn", rope_factor=4.0, rope_original_max_seq_len=ORIGINAL)
    table = model_rope_table(cfg, 32)
    # cos^2 + sin^2 = mscale^2 with mscale = 0.1 ln 4 + 1
    torch.testing.assert_close(table.pow(2).sum(-1), torch.full((8, 16), (0.1 * math.log(4) + 1) ** 2))


def test_yarn_frequencies_equal_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=2, max_position_embeddings=EXTENDED, rope_theta=10_000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    )  # fmt: skip
    theirs, attention = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = yarn_inv_freq(32, 10_000.0, 4.0, ORIGINAL, 32.0, 1.0)
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)
    assert attention == pytest.approx(0.1 * math.log(4) + 1)


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.slow
def test_scaled_export_matches_transformers_beyond_the_original_length(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    from smelt.model.hf import export_model, import_hf

    model = build(**SCALINGS[name])
    out = export_model(model, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    x = torch.randint(0, VOCAB, (2, EXTENDED), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(x)
        unscaled, _ = build()(x)
    # The scaling changes the function (otherwise parity would prove nothing about it) ...
    assert (ours - unscaled).abs().max() > 1e-3
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(x).logits
    # ... and transformers computes the same one from config.json alone, at 4x the original length.
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    # The imported folder is the same model: same keys, same logits.
    back = import_hf(out)
    with torch.no_grad():
        torch.testing.assert_close(back(x)[0], ours, atol=1e-5, rtol=1e-5)
    if name == "ntk":  # no static NTK type in transformers: written as the base it amounts to
        assert config["rope_scaling"] is None
        assert config["rope_theta"] == pytest.approx(ntk_theta(10_000.0, 4.0, 16))
    else:
        for key in ("rope_scaling", "rope_factor", "rope_original_max_seq_len", "yarn_beta_fast"):
            assert getattr(back.cfg, key) == getattr(model.cfg, key), key
        assert config["rope_scaling"]["rope_type"] == SCALINGS[name]["rope_scaling"]
        assert config["rope_scaling"]["factor"] == SCALINGS[name]["rope_factor"]


def test_unscaled_export_writes_no_rope_scaling(tmp_path):
    from smelt.model.hf import hf_config

    config = hf_config(build().cfg, VOCAB, torch.float32)
    assert config["rope_scaling"] is None and config["rope_theta"] == 10_000.0


def test_yarn_import_refuses_a_custom_temperature(tmp_path):
    from smelt.errors import UserError
    from smelt.model.hf import config_from_hf

    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 256}  # fmt: skip
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    cfg = config_from_hf({**base, "rope_scaling": yarn})
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_max_seq_len) == ("yarn", 4.0, 64)
    with pytest.raises(UserError, match="attention_factor"):
        config_from_hf({**base, "rope_scaling": {**yarn, "attention_factor": 2.0}})


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"rope_factor": 4.0}, "model.rope_factor = 4 has no effect while model.rope_scaling = 'none'"),
        (
            {"rope_scaling": "linear"},
            "model.rope_scaling = 'linear' with model.rope_factor = 1 changes nothing",
        ),
        ({"rope_scaling": "yarn", "rope_factor": 4.0}, "needs model.rope_original_max_seq_len"),
        (
            {"rope_scaling": "ntk", "rope_factor": 2.0, "rope_original_max_seq_len": 256},
            "rope_original_max_seq_len is only read by model.rope_scaling = 'yarn'",
        ),
        (
            {
                "rope_scaling": "yarn",
                "rope_factor": 4.0,
                "rope_original_max_seq_len": 256,
                "yarn_beta_fast": 1.0,
            },
            "model.yarn_beta_fast \\(1\\) must exceed model.yarn_beta_slow \\(1\\)",
        ),
        ({"rope_scaling": "abf"}, "model.rope_scaling = 'abf' is not one of 'none', 'linear', 'ntk', 'yarn'"),
    ],
)
def test_rope_scaling_config_errors_name_the_key_and_the_fix(model, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"model": model})


def test_a_valid_extension_config_loads():
    cfg = config_from_dict(
        {
            "model": {
                "max_seq_len": 1024,
                "rope_scaling": "yarn",
                "rope_factor": 4,
                "rope_original_max_seq_len": 256,
            },
            "train": {"seq_len": 1024},
        }
    )
    assert cfg.model.rope_factor == 4.0 and cfg.model.rope_original_max_seq_len == 256


@pytest.mark.parametrize("name", ["none", "yarn"])
def test_extend_context_widens_the_table_under_the_same_frequencies(name):
    model = build(max_seq_len=ORIGINAL, **(SCALINGS[name] if name != "none" else {}))
    x = torch.randint(0, VOCAB, (1, EXTENDED), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before, _ = model(x[:, :ORIGINAL])
        with pytest.raises(ValueError, match="exceeds max_seq_len"):
            model(x)
        extend_context(model, EXTENDED)
        after, _ = model(x)
    assert model.cfg.max_seq_len == EXTENDED and model.rope.shape[0] == EXTENDED
    torch.testing.assert_close(after[:, :ORIGINAL], before)  # the first positions are unchanged
