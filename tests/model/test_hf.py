"""Hugging Face export / import: logit parity with transformers in fp32, tokenizer parity, refusals."""

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.model.hf import export_model, import_hf
from smelt.model.transformer import Transformer

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

transformers = pytest.importorskip("transformers")

VOCAB = 384
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. Ünïcödé 123 456!",
    "import os\nimport sys\n\nclass Thing:\n    pass\n",
] * 20


def build(**overrides) -> Transformer:
    base = dict(
        d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, rope_theta=5000.0, norm_eps=1e-6
    )
    base.update(overrides)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**base), VOCAB)
    with torch.no_grad():  # non-trivial norm gains, so a mis-permuted or misnamed gain shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1 + 0.3 * torch.randn_like(p))
    return model.eval()


def make_tokenizer(directory: Path) -> Path:
    """A small byte-level BPE in smelt's artifact layout (tokenizer.json + smelt.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXTS, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    info = {"bos_id": 0, "eos_id": 1, "pad_id": 2, "vocab_size": tok.get_vocab_size()}
    (directory / "smelt.json").write_text(json.dumps(info))
    return directory


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(x).logits


@pytest.mark.parametrize(
    ("overrides", "arch"),
    [
        ({}, "LlamaForCausalLM"),
        ({"tie_embeddings": False, "n_kv_heads": 4}, "LlamaForCausalLM"),
        ({"qk_norm": True}, "Qwen3ForCausalLM"),
    ],
)
@pytest.mark.slow
def test_export_logits_match_transformers(tmp_path, overrides, arch):
    model = build(**overrides)
    out = export_model(model, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch]
    x = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(x)
    torch.testing.assert_close(hf_logits(out, x), ours, atol=1e-4, rtol=1e-4)


def test_round_trip_through_hf_folder(tmp_path):
    model = build(tie_embeddings=False)
    out = export_model(model, tmp_path / "hf")
    back = import_hf(out)
    assert back.cfg.d_model == 64 and back.cfg.n_kv_heads == 2 and not back.cfg.tie_embeddings
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # A folder written by transformers itself (save_pretrained) imports too, with the same logits.
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    hf.save_pretrained(tmp_path / "saved")
    again = import_hf(tmp_path / "saved")
    x = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(again(x)[0], hf(x).logits, atol=1e-4, rtol=1e-4)


def test_import_of_a_fresh_transformers_llama(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "llama")
    model = import_hf(tmp_path / "llama")
    assert model.cfg.tie_embeddings and model.cfg.n_kv_heads == 1 and model.cfg.d_ff == 160
    x = torch.randint(0, 256, (2, 50))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], hf(x).logits, atol=1e-4, rtol=1e-4)


def test_tokenizer_files_load_and_encode_identically(tmp_path):
    from smelt.tokenizer.load import Tokenizer

    tok_dir = make_tokenizer(tmp_path / "tokenizer")
    model = build()
    out = export_model(model, tmp_path / "hf", tokenizer_dir=tok_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = Tokenizer.load(tok_dir)
    for text in TEXTS[:3] + ["  spaced\ttabs\n\n and <|eos|> inline"]:
        # smelt encodes a special token's text as ordinary text, as transformers does when asked to
        assert hf_tok.encode(text, split_special_tokens=True) == ours.encode(text)
        assert hf_tok.decode(ours.encode(text)) == ours.decode(ours.encode(text))
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (0, 1, 2)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)


@pytest.mark.parametrize("overrides", [{"nope_every": 2}, {"rope_fraction": 0.5}])
def test_export_refuses_what_transformers_cannot_compute(tmp_path, overrides):
    with pytest.raises(UserError, match="partial rotary / NoPE"):
        export_model(build(**overrides), tmp_path / "hf")
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_import_refuses_unsupported_configs(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UserError, match="gpt2"):
        import_hf(folder)
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 128, "vocab_size": 256, "rope_scaling": {"rope_type": "llama3"}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(base))
    with pytest.raises(UserError, match="rope_scaling"):
        import_hf(folder)
    with pytest.raises(UserError, match="config.json"):
        import_hf(tmp_path / "missing")


@pytest.mark.slow
def test_export_hf_from_a_checkpoint(tmp_path):
    from smelt.checkpoint.export import export_hf
    from smelt.checkpoint.store import save_checkpoint

    model = build(qk_norm=True, tie_embeddings=False)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = save_checkpoint(tmp_path / "ckpt", 7, model, opt, {"model_config": model.cfg, "vocab_size": VOCAB})
    summary = export_hf(ckpt, make_tokenizer(tmp_path / "tok"), tmp_path / "export")
    assert summary["architecture"] == "Qwen3ForCausalLM" and summary["step"] == 7
    assert {p.name for p in (tmp_path / "export").iterdir()} >= {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"
    }  # fmt: skip
    x = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(tmp_path / "export", x), model(x)[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(UserError, match="dtype"):
        export_hf(ckpt, None, tmp_path / "other", dtype="int8")
    with pytest.raises(UserError, match="tokenizer.json is missing"):
        export_hf(ckpt, tmp_path / "no-tokenizer", tmp_path / "third")
    assert not (tmp_path / "third" / "model.safetensors").exists()


def test_generate_takes_the_tokenizers_output_as_is(tmp_path):
    tok_dir = make_tokenizer(tmp_path / "tokenizer")
    out = export_model(build(), tmp_path / "hf", tokenizer_dir=tok_dir)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_input_names"] == [
        "input_ids",
        "attention_mask",
    ]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    inputs = hf_tok("def add(a, b):", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}  # no token_type_ids, which generate refuses
    with torch.no_grad():
        ids = hf.generate(**inputs, do_sample=False, max_new_tokens=5)
    assert ids.shape[1] > inputs["input_ids"].shape[1]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_files_respect_the_umask(tmp_path, umask):
    tok_dir = make_tokenizer(tmp_path / "tokenizer")
    previous = os.umask(umask)
    try:
        out = export_model(build(), tmp_path / "hf", tokenizer_dir=tok_dir)
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "model.safetensors" in modes and "tokenizer.json" in modes
    assert modes == dict.fromkeys(modes, 0o666 & ~umask), modes


def test_the_hf_extra_admits_transformers_5_and_lm_eval_keeps_its_pin():
    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]

    def transformers_spec(extra: str):
        (req,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == "transformers"]
        return req.specifier

    for extra in ("hf", "dev"):
        assert transformers_spec(extra).contains("5.0.0") and transformers_spec(extra).contains("4.57.6")
    # lm-eval 0.4.9 with datasets 3.x needs huggingface_hub < 1, which transformers 5 does not accept.
    assert not transformers_spec("eval-check").contains("5.0.0")


def test_import_reads_rope_parameters_as_transformers_5_saves_them():
    from smelt.model.hf import config_from_hf

    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 128, "vocab_size": 256}  # fmt: skip
    v5 = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
    assert config_from_hf(v5).rope_theta == 5000.0
    assert config_from_hf({**base, "rope_theta": 5000.0}).rope_theta == 5000.0  # 4.x layout
    linear = {**base, "rope_parameters": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0}}
    assert (config_from_hf(linear).rope_scaling, config_from_hf(linear).rope_factor) == ("linear", 4.0)
    with pytest.raises(UserError, match="llama3"):
        config_from_hf({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}})
