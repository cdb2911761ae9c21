"""The `smelt release` command: its arguments, its summary, and its messages for bad input."""

from __future__ import annotations

import argparse
import shutil

import pytest

from smelt.cli import release as commands
from smelt.errors import UserError

pytestmark = pytest.mark.slow  # the module starts a heavy shared fixture


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="smelt")
    commands.add_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_release_with_its_tokens_then_verify_and_replay_from_the_command_line(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    out = tmp_path / "out"
    argv = ["release", str(run_dir), str(out), "--license", "prose=CC-BY-4.0", "--model-license", "MIT"]
    args = _parse([*argv, "--include-tokens"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "step_0000004  step 4, 1,024 tokens" in printed and f"smelt release --verify {out}" in printed
    args = _parse(["release", "--verify", str(out)])
    assert args.func(args) == 0
    assert f"release {out}: verified" in capsys.readouterr().out
    # the data order replays from the release alone: its tokens/ hold the training shards
    from smelt.cli import main

    assert main(["inspect", "batches", str(out), "--step", "2", "--rows", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"the shards in {out / 'tokens'}" in printed


def test_release_arguments_that_do_not_fit_say_how(tiny_run, released):
    run_dir, _ = tiny_run
    cases = [
        (["release", str(run_dir)], "`smelt release` needs RUN and OUT"),
        (
            ["release", "--verify", str(released), str(run_dir)],
            "takes only the release directory; drop RUN and OUT",
        ),
        (["release", str(run_dir), "x", "--license", "prose"], "--license 'prose' must be SOURCE=LICENSE"),
    ]
    for argv, message in cases:
        args = _parse(argv)
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            args.func(args)


def test_release_force_replaces_an_earlier_release(tiny_run, released, tmp_path):
    run_dir, _ = tiny_run
    out = tmp_path / "again"
    shutil.copytree(released, out)
    (out / "stale.txt").write_text("left over")
    args = _parse(["release", str(run_dir), str(out), "--force"])
    assert args.func(args) == 0
    assert not (out / "stale.txt").exists() and (out / "release.json").is_file()


def test_smelt_release_verify_exits_2_naming_the_flipped_file(released, tmp_path, capsys):
    from smelt.cli import main

    copy = tmp_path / "copy"
    shutil.copytree(released, copy)
    target = copy / "revisions" / "step_0000002" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    assert main(["release", "--verify", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "revisions/step_0000002/model.safetensors does not match its sha256 in release.json" in err


def test_smelt_inspect_batches_replays_a_release(tiny_run, released, capsys):
    from smelt.cli import main

    run_dir, _ = tiny_run
    argv = [
        "inspect",
        "batches",
        str(released),
        "--step",
        "5",
        "--rows",
        "1",
        "--tokens",
        str(run_dir / "tokens"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("step 5: trained into checkpoint step 6") and "row 0:" in out and "row 1:" not in out
    )


def test_inspect_batches_of_a_run_directory_shows_the_rows_its_release_replays(tiny_run, released, capsys):
    from smelt.cli import main

    run_dir, _ = tiny_run
    assert main(["inspect", "batches", str(run_dir), "--step", "4", "--rows", "2"]) == 0
    recomputed = capsys.readouterr().out.split("────────")
    assert main(["inspect", "batches", str(released), "--step", "4", "--rows", "2"]) == 0
    replayed = capsys.readouterr().out.split("────────")
    assert recomputed[0].startswith("step 4 of 6") and len(recomputed) == len(replayed) == 5
    assert recomputed[2] == replayed[2] and recomputed[4] == replayed[4]  # the decoded rows, token for token
