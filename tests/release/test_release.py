"""`smelt release`: revisions that load in transformers with smelt's logits, a data order that replays
the loader's batches token for token, cards from the manifests, and a verification that catches a flipped
byte."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from smelt.errors import UserError
from smelt.release.build import release_run
from smelt.release.data_order import RunData, check_state, write_data_order
from smelt.tokens.batches import read_index, replay_step

pytestmark = pytest.mark.slow  # the module starts a heavy shared fixture

BATCH_FIELDS = ("inputs", "targets", "doc_ids", "position_ids", "cu_seqlens")


def _checkpoint(run_dir, step):
    return run_dir / "train" / "checkpoints" / f"step_{step:07d}"


def test_three_milestones_release_as_revisions_that_load_in_transformers_with_smelts_logits(
    tiny_run, released
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from smelt.checkpoint.store import load_model

    run_dir, _ = tiny_run
    release = json.loads((released / "release.json").read_text())
    assert [r["revision"] for r in release["revisions"]] == ["step_0000002", "step_0000004", "step_0000006"]
    meta = json.loads((_checkpoint(run_dir, 6) / "meta.json").read_text())
    batch = RunData(run_dir, meta).loader.global_batch(5)
    inputs = batch.inputs[:4]
    logits_by_step = {}
    for entry in release["revisions"]:
        folder = released / "revisions" / entry["revision"]
        hf = AutoModelForCausalLM.from_pretrained(folder).float().eval()
        ours, _ = load_model(_checkpoint(run_dir, entry["step"]))
        with torch.no_grad():
            expected, _ = ours.eval()(inputs)
            got = hf(inputs).logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        logits_by_step[entry["step"]] = got
        assert AutoTokenizer.from_pretrained(folder).decode([int(t) for t in inputs[0][:8]])
    assert not torch.allclose(logits_by_step[2], logits_by_step[6])  # each revision is its own step
    top = AutoModelForCausalLM.from_pretrained(released).float().eval()
    with torch.no_grad():
        torch.testing.assert_close(top(inputs).logits, logits_by_step[6])  # the final model at the top
    for name in (
        "README.md",
        "DATA_CARD.md",
        "logs/metrics.jsonl",
        "manifests/train.json",
        "smelt_config.json",
    ):
        assert (released / name).is_file(), name


def test_the_data_order_replays_the_loaders_batches_token_for_token(tiny_run, released):
    run_dir, _ = tiny_run
    meta = json.loads((_checkpoint(run_dir, 6) / "meta.json").read_text())
    data = RunData(run_dir, meta)
    index = read_index(released / "data_order")
    covered = [(e["first_step"], e["last_step"]) for e in index["checkpoints"]]
    assert covered == [(1, 2), (3, 4), (5, 6)]
    fim_rows = 0
    for step in range(1, 7):
        replayed = replay_step(released / "data_order", step, run_dir / "tokens")
        (produced,) = data.global_batches(step)  # one loader step per optimizer step (no batch ramp)
        for name in BATCH_FIELDS:
            assert torch.equal(getattr(replayed, name), getattr(produced, name)), (step, name)
        assert replayed.sources == produced.sources
        assert (replayed.fim == produced.fim).all() and (replayed.sequences == produced.sequences).all()
        fim_rows += int(produced.fim.sum())
    assert fim_rows > 0  # the FIM rewrite of code rows is replayed too
    by_source = {}
    for entry in index["checkpoints"]:
        for name, tokens in entry["tokens_by_source"].items():
            by_source[name] = by_source.get(name, 0) + tokens
    assert sum(by_source.values()) == 6 * 8 * 32 and set(by_source) == {"prose", "code"}


def test_a_checkpoint_whose_saved_loader_state_differs_from_the_rebuilt_plan_is_refused(tiny_run):
    run_dir, _ = tiny_run
    meta = json.loads((_checkpoint(run_dir, 4) / "meta.json").read_text())
    data = RunData(run_dir, meta)
    check_state(data, meta, "step_0000004")
    meta["loader"]["cursors"] = {name: n + 1 for name, n in meta["loader"]["cursors"].items()}
    with pytest.raises(UserError, match=r"checkpoint step_0000004: the data plan rebuilt .*\(cursors saved"):
        check_state(data, meta, "step_0000004")


def test_with_a_batch_ramp_a_step_replays_every_loader_step_it_took(tiny_run, tmp_path):
    """Under train.batch_ramp_tokens an optimizer step takes several loader steps; its data order rows
    are theirs, in order. The checkpoints' loader states are the ones the trainer saves (state_dict)."""
    run_dir, cfg = tiny_run
    raw = json.loads((_checkpoint(run_dir, 6) / "meta.json").read_text())["config"]
    raw["train"].update(batch_tokens=1024, batch_ramp_tokens=512, batch_ramp_start=256, tokens=256 * 10)
    metas = []
    for step in (2, 4):
        meta = {"config": raw, "step": step, "world_size": 1}
        data = RunData(run_dir, meta)
        data.loader.step = data.loader_step(step)
        metas.append((step, {**meta, "loader": data.loader.state_dict()}))
    assert [len(data.loader_steps(k)) for k in (1, 2, 3, 4)] == [1, 2, 4, 3]  # the batch grows
    index = write_data_order(run_dir, metas, tmp_path, {})
    assert index["checkpoints"][1]["rows"] == (4 + 3) * 8
    for step in (1, 2, 3, 4):
        replayed = replay_step(tmp_path / "data_order", step, run_dir / "tokens")
        produced = data.global_batches(step)
        for name in ("inputs", "targets", "doc_ids", "position_ids"):
            assert torch.equal(getattr(replayed, name), torch.cat([getattr(b, name) for b in produced])), name


def test_inspect_batches_replays_a_release_step_with_its_shard_ranges(tiny_run, released, capsys):
    import argparse

    from smelt.tokens.batches import inspect_batches

    run_dir, _ = tiny_run
    args = argparse.Namespace(config=str(released), step=3, rows=2, overrides=[], tokens=None)
    assert inspect_batches(args) == 0
    text = capsys.readouterr().out
    rows = [
        json.loads(line) for line in _order_lines(released, "step_0000004.jsonl.gz") if '"step":3,' in line
    ]
    rel, offset, length = rows[0]["ranges"][0]
    assert "step 3: trained into checkpoint step 4" in text
    assert f"{rel} [{offset:,}, {offset + length:,})" in text
    args.tokens = str(run_dir / "missing-tokens")
    with pytest.raises(UserError, match="Pass --tokens DIR"):
        inspect_batches(args)
    args.tokens, args.step = None, 7
    with pytest.raises(UserError, match=r"--step 7 is not in this data order: it covers steps 1..6"):
        inspect_batches(args)


def _order_lines(released, name):
    import gzip

    with gzip.open(released / "data_order" / name, "rt") as handle:
        return handle.read().splitlines()


def test_cards_come_from_the_manifests(tiny_run, released):
    from smelt.model.flops import flops_per_token

    run_dir, cfg = tiny_run
    card = (released / "README.md").read_text()
    data = (released / "DATA_CARD.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\nlibrary_name: transformers\n")
    fpt = flops_per_token(cfg.model, 512, cfg.train.seq_len)
    assert f"| training FLOPs | {fpt * 6 * 256:.4g} |" in card
    assert "| `step_0000004` | 4 | 1,024 | yes | `data_order/step_0000004.jsonl.gz` (steps 3-4) |" in card
    assert "No licence was stated for source(s) code" in card
    heldout = json.loads((run_dir / "eval" / "step_0000006.json").read_text())["heldout"]["overall"]
    assert f"| 6 | 1,536 | {heldout['loss']:,.4g} | {heldout['bits_per_byte']:,.4g} |" in card
    stats = json.loads((run_dir / "documents" / "stats.json").read_text())
    prose = stats["sources"]["prose"]
    assert f"| prose | jsonl | CC-BY-4.0 | {prose['documents_in']:,} | {prose['documents_kept']:,} |" in data
    assert "| code | jsonl (code) | not stated |" in data
    for reason, count in stats["dropped"].items():
        assert f"| {reason} | {count:,} |" in data
    assert "| exact_dedup |" in data and "decontamination: off" in data


def test_verify_passes_then_names_a_file_with_a_flipped_byte(released, tmp_path):
    from smelt.release.verify import verify_release

    copy = tmp_path / "copy"
    shutil.copytree(released, copy)
    rows = dict(verify_release(copy))
    assert rows["step_0000004"] == "loads in transformers; logits match smelt's"
    target = copy / "revisions" / "step_0000004" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(
        UserError, match=r"revisions/step_0000004/model.safetensors does not match its sha256"
    ):
        verify_release(copy, load=False)


def test_verify_catches_a_damaged_data_order_file_and_a_non_release(released, tmp_path):
    from smelt.release.verify import verify_release

    copy = tmp_path / "copy"
    shutil.copytree(released, copy)
    target = copy / "data_order" / "step_0000002.jsonl.gz"
    data = bytearray(target.read_bytes())
    data[20] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"data_order/step_0000002.jsonl.gz does not match its sha256"):
        verify_release(copy, load=False)
    with pytest.raises(UserError, match=r"is not a smelt release: release.json is missing"):
        verify_release(tmp_path)


def test_release_refuses_bad_input_with_the_fix(tiny_run, released, tmp_path):
    run_dir, _ = tiny_run
    with pytest.raises(
        UserError, match=r"release output .* is not empty \(.*\)\. Pass a new directory, or --force"
    ):
        release_run(run_dir, released)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(
        UserError, match=r"is not empty and is not an earlier release .* --force does not delete"
    ):
        release_run(run_dir, tmp_path / "notes", force=True)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    with pytest.raises(UserError, match=r"and the run .* overlap \(one holds the other\)"):
        release_run(run_dir, run_dir.parent, force=True)
    with pytest.raises(UserError, match=r"--license names source 'web', which this run does not have"):
        release_run(run_dir, tmp_path / "a", licenses={"web": "MIT"})
    empty = tmp_path / "run"
    (empty / "train" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match=r"has no committed checkpoint .* there is nothing to release"):
        release_run(empty, tmp_path / "b")


def test_into_a_git_repository_each_revision_is_a_branch_that_verifies(tiny_run, tmp_path):
    import subprocess

    from smelt.release.verify import verify_release

    run_dir, _ = tiny_run
    out = tmp_path / "hub"
    subprocess.run(["git", "init", "-q", str(out)], check=True)
    release_run(run_dir, out)
    assert not (out / "revisions").exists() and (out / "model.safetensors").is_file()
    log = subprocess.run(
        ["git", "-C", str(out), "log", "--format=%s", "step_0000006"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert [line.split(":")[0] for line in log] == ["step_0000006", "step_0000004", "step_0000002"]
    files = subprocess.run(
        ["git", "-C", str(out), "ls-tree", "--name-only", "step_0000002"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "model.safetensors" in files and "config.json" in files
    assert dict(verify_release(out))["step_0000002"] == "loads in transformers; logits match smelt's"


def test_by_default_the_milestones_and_the_final_checkpoint_are_released(tiny_run, tmp_path):
    from smelt.manifest import hash_file
    from smelt.release.build import select_checkpoints

    run_dir, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    checkpoint = _checkpoint(copy, 4)  # made an ordinary (prunable) checkpoint, its marker re-stamped
    meta = json.loads((checkpoint / "meta.json").read_text())
    (checkpoint / "meta.json").write_text(json.dumps({**meta, "milestone": False}))
    marker = json.loads((checkpoint / "COMMITTED").read_text())
    marker["meta_sha256"] = hash_file(checkpoint / "meta.json")
    (checkpoint / "COMMITTED").write_text(json.dumps(marker))
    assert [p.name for p in select_checkpoints(copy)] == ["step_0000002", "step_0000006"]
    assert [p.name for p in select_checkpoints(copy, every=True)] == [
        "step_0000002",
        "step_0000004",
        "step_0000006",
    ]
