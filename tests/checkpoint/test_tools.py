"""`smelt checkpoint list | verify | average` on tiny models."""

import json

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.checkpoint import load_model, load_training_state, save_checkpoint
from smelt.checkpoint.tools import average_checkpoints, ema_weights
from smelt.cli import main
from smelt.errors import UserError

VOCAB = 384


def write_run(tmp_path, steps=(10, 20, 30), cfg=None, milestone_at=None):
    """A run directory whose train/checkpoints hold one checkpoint per step, each with other weights."""
    cfg = cfg or tiny_model_config()
    checkpoints = tmp_path / "run" / "train" / "checkpoints"
    models = {}
    for i, step in enumerate(steps):
        model = build_model(cfg, VOCAB, seed=i)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        meta = {"model_config": cfg, "vocab_size": VOCAB, "tokens": step * 100}
        if step == milestone_at:
            meta["milestone"] = True
        save_checkpoint(checkpoints, step, model, optimizer, meta)
        models[step] = model
    return tmp_path / "run", checkpoints, models


def cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_uniform_average_is_the_mean_and_loads(tmp_path, capsys):
    run, checkpoints, models = write_run(tmp_path)
    out = tmp_path / "avg"
    code, stdout, _ = cli(["checkpoint", "average", run, "--last", 2, "--out", out], capsys)
    assert code == 0 and "steps 20, 30" in stdout
    averaged, meta = load_model(out)
    for name, tensor in averaged.state_dict().items():
        expected = (models[20].state_dict()[name] + models[30].state_dict()[name]) / 2
        assert torch.allclose(tensor, expected, atol=1e-6, rtol=0), name
    assert meta["weights_only"] is True and meta["step"] == 30 and meta["tokens"] == 3000
    assert "dropped" in meta["optimizer"]
    assert [s["step"] for s in meta["averaged"]["sources"]] == [20, 30]
    assert meta["averaged"]["method"] == "uniform"
    assert (out / "COMMITTED").is_file() and not list(tmp_path.glob(".tmp-*"))
    with pytest.raises(UserError, match="weights only"):  # an average is never resumed
        model = build_model(tiny_model_config(), VOCAB)
        load_training_state(out, model, torch.optim.AdamW(model.parameters()))


@pytest.mark.slow
def test_ema_follows_the_recursion_in_step_order(tmp_path):
    _, checkpoints, models = write_run(tmp_path)
    out = tmp_path / "ema"
    summary = average_checkpoints(
        [checkpoints / "step_0000030", checkpoints / "step_0000010", checkpoints / "step_0000020"],
        out,
        ema_decay=0.6,
    )
    assert summary["sources"] == [10, 20, 30]
    averaged, meta = load_model(out)
    for name, tensor in averaged.state_dict().items():
        ema = models[10].state_dict()[name].clone()
        for step in (20, 30):
            ema = 0.6 * ema + 0.4 * models[step].state_dict()[name]
        assert torch.allclose(tensor, ema, atol=1e-6, rtol=0), name
    assert meta["averaged"]["ema_decay"] == 0.6
    assert sum(s["weight"] for s in meta["averaged"]["sources"]) == pytest.approx(1.0)
    assert ema_weights(3, 0.6) == pytest.approx([0.36, 0.24, 0.4])


def test_default_output_is_outside_the_checkpoints_dir(tmp_path, capsys):
    run, checkpoints, _ = write_run(tmp_path, steps=(10, 20))
    code, _, _ = cli(["checkpoint", "average", run, "--steps", 10, 20], capsys)
    assert code == 0
    assert (run / "averaged" / "step_0000020-avg2" / "COMMITTED").is_file()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_0000010", "step_0000020"]
    code, _, err = cli(["checkpoint", "average", run, "--steps", 10, 20], capsys)
    assert code == 2 and "already exists" in err and "--force" in err


def test_averaging_different_shapes_is_a_user_error(tmp_path, capsys):
    _, small, _ = write_run(tmp_path / "a", steps=(10,))
    _, wide, _ = write_run(
        tmp_path / "b", steps=(10,), cfg=tiny_model_config(d_model=32, n_heads=2, n_kv_heads=1)
    )
    with pytest.raises(UserError, match=r"different models.*model\.d_model: 64 vs 32"):
        average_checkpoints([small / "step_0000010", wide / "step_0000010"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tensors_that_do_not_match_their_meta_are_a_user_error(tmp_path):
    _, checkpoints, _ = write_run(tmp_path, steps=(10,))
    wide = tiny_model_config(d_model=32, n_heads=2, n_kv_heads=1)
    liar = build_model(wide, VOCAB)  # d_model 32 weights under a meta that says 64
    save_checkpoint(checkpoints, 20, liar, None, {"model_config": tiny_model_config(), "vocab_size": VOCAB})
    with pytest.raises(UserError, match="cannot read the weights of .*step_0000020"):
        average_checkpoints([checkpoints / "step_0000010", checkpoints / "step_0000020"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_selections_name_what_exists(tmp_path, capsys):
    run, _, _ = write_run(tmp_path, steps=(10, 20))
    code, _, err = cli(["checkpoint", "average", run, "--last", 5], capsys)
    assert code == 2 and "only 2 committed checkpoints" in err and "10, 20" in err
    code, _, err = cli(["checkpoint", "average", run, "--steps", 10, 15], capsys)
    assert code == 2 and "--steps 15" in err
    code, _, err = cli(["checkpoint", "average", run, "--last", 2, "--ema", 1.5], capsys)
    assert code == 2 and "--ema 1.5" in err
    code, _, err = cli(["checkpoint", "list", tmp_path / "nothing"], capsys)
    assert code == 2 and "not a run directory" in err


@pytest.mark.slow
def test_list_shows_steps_milestones_and_unfinished_saves(tmp_path, capsys):
    run, checkpoints, _ = write_run(tmp_path, steps=(10, 20), milestone_at=10)
    (checkpoints / ".tmp-step_0000030").mkdir()  # a save that crashed midway
    code, stdout, _ = cli(["checkpoint", "list", run, "--verify"], capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in stdout.splitlines() if line.startswith(("step_", ".tmp"))}
    assert set(rows) == {"step_0000010", "step_0000020", ".tmp-step_0000030"}
    assert "1,000" in rows["step_0000010"] and "2,000" in rows["step_0000020"]
    assert rows["step_0000010"].rstrip().endswith("ok") and rows["step_0000020"].rstrip().endswith("ok")
    assert "unfinished save" in rows[".tmp-step_0000030"]
    milestone_column = stdout.splitlines()[0].index("milestone")
    assert rows["step_0000010"][milestone_column:].startswith("yes")
    assert not rows["step_0000020"][milestone_column:].startswith("yes")
    # An average lives outside train/checkpoints; its folder lists too.
    assert main(["checkpoint", "average", str(run), "--last", "2"]) == 0
    code, stdout, _ = cli(["checkpoint", "list", run / "averaged"], capsys)
    assert code == 0 and "step_0000020-avg2" in stdout and "weights only" in stdout


@pytest.mark.slow
def test_verify_names_the_corrupt_file(tmp_path, capsys):
    run, checkpoints, _ = write_run(tmp_path, steps=(10, 20))
    code, stdout, _ = cli(["checkpoint", "verify", run, "--all"], capsys)
    assert code == 0 and "step_0000010: ok" in stdout and "step_0000020: ok" in stdout
    shard = next((checkpoints / "step_0000010").glob("*.distcp"))
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    code, _, _ = cli(["checkpoint", "verify", run], capsys)  # the latest (step 20) is intact
    assert code == 0
    code, stdout, err = cli(["checkpoint", "verify", run, "--all"], capsys)
    assert code == 2 and "step_0000010: CORRUPT" in stdout and "step_0000020: ok" in stdout
    # Only the corrupt checkpoint is an error: the ok lines are not printed after "smelt: error:".
    assert (
        err.startswith("smelt: error: 1 of 2 checkpoint(s) corrupt (step_0000010):\n") and shard.name in err
    )
    assert ": ok" not in err
    code, _, err = cli(["checkpoint", "verify", run, "--step", 10], capsys)
    assert code == 2 and shard.name in err
    code, stdout, _ = cli(["checkpoint", "list", run, "--verify"], capsys)
    assert code == 0 and "CORRUPT" in stdout and shard.name in stdout
    # A damaged source is never averaged.
    code, _, err = cli(["checkpoint", "average", run, "--last", 2, "--out", tmp_path / "avg"], capsys)
    assert code == 2 and shard.name in err and not (tmp_path / "avg").exists()


@pytest.mark.slow
def test_averaged_checkpoint_exports_to_hf(tmp_path):
    from smelt.checkpoint.export import export_hf

    _, checkpoints, _ = write_run(tmp_path, steps=(10, 20))
    out = tmp_path / "avg"
    average_checkpoints([checkpoints / "step_0000010", checkpoints / "step_0000020"], out)
    summary = export_hf(out, None, tmp_path / "hf")
    assert summary["step"] == 20
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["vocab_size"] == VOCAB
