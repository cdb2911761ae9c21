"""Loading a checkpoint for eval or export (checkpoint/store.py's load_model, which `smelt eval`, `smelt
export hf`, release and the pilot checks call) and importing a Hugging Face folder build the model on
the meta device and read the weights into empty storage: no random initialisation runs on real
storage, so the weights exist once, and the result is the saved model exactly."""

import pytest
import torch
from torch import nn

from smelt.checkpoint import load_model, save_checkpoint
from smelt.checkpoint.export import export_hf
from smelt.config import ModelConfig
from smelt.model.hf import import_hf
from smelt.model.transformer import Transformer

VOCAB = 384


@pytest.fixture
def inits(monkeypatch) -> list[str]:
    """The initialisations that ran on real (not meta) storage, by module class."""
    ran: list[str] = []

    def counting(cls: type[nn.Module]) -> None:
        original = cls.reset_parameters

        def reset(module: nn.Module) -> None:
            if any(not p.is_meta for p in module.parameters()):
                ran.append(cls.__name__)
            original(module)

        monkeypatch.setattr(cls, "reset_parameters", reset)

    for cls in (Transformer, nn.Linear, nn.Embedding):
        counting(cls)
    return ran


def saved_model(tmp_path, tie: bool):
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, tie_embeddings=tie)
    model = Transformer(cfg, VOCAB)
    with torch.no_grad():  # weights no init would give
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    path = save_checkpoint(tmp_path / "ckpt", 7, model, None, {"model_config": cfg, "vocab_size": VOCAB})
    return model, path


@pytest.mark.parametrize("tie", [True, False])
def test_load_model_reads_into_empty_storage_without_init(tmp_path, tie, inits):
    model, path = saved_model(tmp_path, tie)
    inits.clear()
    loaded, meta = load_model(path)
    assert inits == [] and meta["step"] == 7
    assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    saved = dict(model.named_parameters())
    for name, value in loaded.named_parameters():
        assert torch.equal(value, saved[name]), name
    x = torch.randint(0, VOCAB, (2, 16))
    assert torch.equal(model.eval()(x)[0], loaded.eval()(x)[0])


def test_export_and_import_run_no_init(tmp_path, inits):
    model, path = saved_model(tmp_path, tie=False)
    inits.clear()
    export_hf(path, None, tmp_path / "hf")
    back = import_hf(tmp_path / "hf")
    assert inits == []
    saved = dict(model.named_parameters())
    for name, value in back.named_parameters():
        assert torch.equal(value, saved[name]), name


def test_the_counter_sees_an_init(inits):
    """The fixture does count a build on real storage (so an empty list above means something)."""
    Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=4, max_seq_len=32), VOCAB)
    assert "Transformer" in inits and "Linear" in inits
