import json

import pytest
import torch

from smelt.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_model,
    load_training_state,
    prune_checkpoints,
    read_meta,
    save_checkpoint,
)
from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.model.transformer import Transformer
from smelt.train.optim import param_groups

VOCAB = 384


def trained_pair(tie: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=32, tie_embeddings=tie)
    model = Transformer(cfg, VOCAB)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    x = torch.randint(0, VOCAB, (2, 16))
    for _ in range(2):
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return cfg, model, opt


def save(tmp_path, step, model, opt, cfg):
    return save_checkpoint(
        tmp_path / "ckpt", step, model, opt, {"model_config": cfg, "vocab_size": VOCAB, "tokens": step * 10}
    )


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_model_identical_logits(tmp_path, tie):
    cfg, model, opt = trained_pair(tie)
    path = save(tmp_path, 5, model, opt, cfg)
    assert path.name == "step_0000005"
    assert (path / "COMMITTED").is_file()
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 5 and meta["vocab_size"] == VOCAB
    assert set(meta["checksums"]) >= {".metadata", "rank_00000.json"}
    assert all(len(h) == 64 for h in meta["checksums"].values())
    loaded, meta2 = load_model(path)
    assert meta2["tokens"] == 50
    assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    x = torch.randint(0, VOCAB, (2, 16))
    model.eval()
    assert torch.equal(model(x)[0], loaded(x)[0])


def test_training_state_restores_optimizer(tmp_path):
    cfg, model, opt = trained_pair()
    path = save(tmp_path, 2, model, opt, cfg)
    _, model2, opt2 = trained_pair(seed=1)  # different weights and moments
    load_training_state(path, model2, opt2)
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])


def test_corrupt_file_is_user_error(tmp_path):
    cfg, model, opt = trained_pair()
    path = save(tmp_path, 1, model, opt, cfg)
    data = next(p for p in path.iterdir() if p.suffix == ".distcp")
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    data.write_bytes(bytes(blob))
    with pytest.raises(UserError, match=data.name):
        load_model(path)


def test_uncommitted_checkpoint_is_ignored(tmp_path):
    cfg, model, opt = trained_pair()
    save(tmp_path, 1, model, opt, cfg)
    second = save(tmp_path, 2, model, opt, cfg)
    (second / "COMMITTED").unlink()
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_0000001"
    with pytest.raises(UserError, match="COMMITTED"):
        read_meta(second)
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_prune_keeps_newest_and_protected(tmp_path):
    cfg, model, opt = trained_pair()
    paths = [save(tmp_path, s, model, opt, cfg) for s in (1, 2, 3, 4)]
    removed = prune_checkpoints(tmp_path / "ckpt", keep_last=1, protect=(paths[0],))
    assert [p.name for p in removed] == ["step_0000002", "step_0000003"]
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["step_0000001", "step_0000004"]


@pytest.mark.parametrize("marker", ["", "2\n", "{}", '{"step": 2}', "{not json"])
def test_marker_without_meta_checksum_is_damage(tmp_path, capsys, marker):
    """An empty, unreadable or old-format COMMITTED marker cannot vouch for meta.json: verify fails with
    exit 2 and resume falls back to the checkpoint before it (it used to say "meta.json unchecked")."""
    from smelt.checkpoint.store import latest_valid_checkpoint
    from smelt.cli import main

    cfg, model, opt = trained_pair()
    save(tmp_path, 1, model, opt, cfg)
    second = save(tmp_path, 2, model, opt, cfg)
    (second / "COMMITTED").write_text(marker)
    with pytest.raises(UserError, match="COMMITTED marker .* meta.json"):
        read_meta(second)
    assert main(["checkpoint", "verify", str(second)]) == 2
    said = capsys.readouterr()  # the status line on stdout, the error on stderr
    assert "step_0000002: CORRUPT" in said.out + said.err and "unchecked" not in said.out + said.err
    assert "1 of 1 checkpoint(s) corrupt (step_0000002)" in said.err
    chosen, warnings = latest_valid_checkpoint(tmp_path / "ckpt")
    assert chosen.name == "step_0000001"
    assert len(warnings) == 1 and "skipping damaged checkpoint step_0000002" in warnings[0]
    read_meta(second, verify=False)  # listing and the supervisor still read it without verifying


def test_optimizer_groups_are_saved_per_parameter_and_old_checkpoints_still_load(tmp_path):
    """Checkpoints flatten the optimizer's groups per parameter name (each pipeline rank reads only its
    own); one written before, with the groups as a list, still resumes."""
    import torch.distributed.checkpoint as dcp

    from smelt.checkpoint.store import load_training_state, model_optim_state, optimizer_is_flat

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(
        [{"params": [model[0].weight], "weight_decay": 0.1}, {"params": [*model[1].parameters(), model[0].bias],
                                                                 "weight_decay": 0.0}], lr=1e-3)  # fmt: skip
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    for flat in (True, False):
        directory = tmp_path / f"flat_{flat}"
        dcp.save(model_optim_state(model, optimizer, flat), checkpoint_id=str(directory))
        (directory / "meta.json").write_text("{}")
        assert optimizer_is_flat(directory) is flat
        fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        fresh_opt = torch.optim.AdamW(
            [{"params": [fresh[0].weight], "weight_decay": 0.1}, {"params": [*fresh[1].parameters(), fresh[0].bias],
                                                                  "weight_decay": 0.0}], lr=1e-3)  # fmt: skip
        state = model_optim_state(fresh, fresh_opt, flat)
        dcp.load(state, checkpoint_id=str(directory))
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(flatten_optimizer_state_dict=flat))  # fmt: skip
        assert [g["weight_decay"] for g in fresh_opt.param_groups] == [0.1, 0.0]
        assert all("betas" in g for g in fresh_opt.param_groups)
        for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
            assert torch.equal(optimizer.state[p]["exp_avg"], fresh_opt.state[q]["exp_avg"])
    assert load_training_state  # the trainer's path: it reads either form by optimizer_is_flat
