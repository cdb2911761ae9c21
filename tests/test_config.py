import pytest

from conftest import REPO
from smelt.config import Config, apply_override, config_from_dict, describe, load_config
from smelt.errors import ConfigError, UserError


def test_defaults_load_and_hash_is_stable():
    a, b = load_config(None), load_config(None)
    assert isinstance(a, Config)
    assert a.section_hash("train") == b.section_hash("train")
    b.train.lr = 1.0
    assert a.section_hash("train") != b.section_hash("train")
    assert a.section_hash("data") == b.section_hash("data")


def test_quickstart_config_is_valid():
    cfg = load_config(REPO / "configs" / "quickstart.toml")
    assert cfg.run.name == "quickstart"
    assert cfg.data.sources[0].root == "{stdlib}"
    # The speedrun's recipe (docs/benchmarks.md, "Speedrun"): d 128, 4 layers, Muon, WSD, batch 16 x 128.
    assert cfg.model.d_model == 128 and cfg.model.n_layers == 4 and cfg.train.optimizer == "muon"
    assert cfg.train.schedule == "wsd" and cfg.train.batch_tokens == 16 * cfg.train.seq_len == 2048


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        None, ["train.lr=1e-3", "model.qk_norm=true", "run.name=abc", "eval.prompts=['x', 'y']"]
    )
    assert cfg.train.lr == 1e-3 and cfg.model.qk_norm is True and cfg.run.name == "abc"
    assert cfg.eval.prompts == ["x", "y"]


def test_override_into_source_list():
    raw = {"data": {"sources": [{"name": "a", "root": "/x"}]}}
    apply_override(raw, "data.sources.0.max_files=5")
    assert config_from_dict(raw).data.sources[0].max_files == 5


def test_int_accepted_where_float_expected_and_integral_float_for_int():
    cfg = config_from_dict({"train": {"lr": 1, "tokens": 1e6}})
    assert cfg.train.lr == 1.0 and cfg.train.tokens == 1_000_000


def test_preset_then_explicit_keys_win():
    cfg = config_from_dict({"model": {"preset": "llama-124m", "n_layers": 2}})
    assert cfg.model.d_model == 768 and cfg.model.n_layers == 2


@pytest.mark.parametrize(
    "raw, fragments",
    [
        ({"train": {"lr_typo": 1}}, ["unknown key train.lr_typo", "did you mean 'lr'"]),
        ({"trian": {}}, ["unknown key trian", "did you mean 'train'"]),
        ({"train": {"lr": "fast"}}, ["train.lr must be a number", "'fast'"]),
        ({"train": {"seq_len": 1.5}}, ["train.seq_len must be an integer"]),
        ({"model": {"qk_norm": 1}}, ["model.qk_norm must be true or false"]),
        ({"train": {"lr": -1}}, ["train.lr = -1", "out of range", "[0, 10]"]),
        ({"train": {"precision": "bf61"}}, ["train.precision", "not one of", "did you mean 'bf16'"]),
        ({"model": {"preset": "llama-124"}}, ["not a known preset", "llama-124m"]),
        ({"model": {"d_model": 100, "n_heads": 3}}, ["divisible by model.n_heads"]),
        ({"model": {"n_heads": 4, "n_kv_heads": 3}}, ["multiple of model.n_kv_heads"]),
        ({"tokenizer": {"vocab_size": 258}}, ["tokenizer.vocab_size = 258", ">= 331"]),
        ({"tokenizer": {"source_weights": 3}}, ["tokenizer.source_weights must be a table"]),
        ({"data": {"sources": [{"name": "a"}, {"name": "a"}]}}, ["unique", "a"]),
        ({"data": {"sources": [{"name": "a/b"}]}}, ["data.sources[0].name"]),
        ({"data": {"sources": [{"nme": "a"}]}}, ["unknown key data.sources[0].nme", "did you mean 'name'"]),
        ({"train": {"seq_len": 4096}}, ["exceeds model.max_seq_len"]),
    ],
)
def test_bad_values_name_the_key_and_the_fix(raw, fragments):
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert isinstance(info.value, UserError)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="no '='"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match="section and a key"):
        load_config(None, ["lr=1"])


def test_describe_lists_every_key_with_defaults():
    keys = {row[0] for row in describe()}
    assert {"train.lr", "model.d_model", "data.val_fraction", "tokenizer.vocab_size"} <= keys
