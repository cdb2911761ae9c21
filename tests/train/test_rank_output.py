"""Under torchrun only rank 0 speaks: one banner, one summary, bad input reported once; a real failure
on another rank is reported by that rank, prefixed with its number. The peak FLOP/s that MFU divides by
is measured once, on rank 0, and every rank uses that figure.

The 2-process test runs this file as its torchrun worker (see the bottom): it counts peak measurements
and records what `train` returned on each rank, then runs `smelt train` exactly as the command line does.
"""

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from smelt import progress
from smelt.cli import main
from smelt.train.parallel.distributed import DistContext, from_main

SENTENCE = (
    "the river carried salt and timber past the mill while the town slept under a grey sky and the "
    "keeper counted boats that came late from the northern lakes with grain wool iron and letters"
)
WORDS = SENTENCE.split()


@pytest.fixture
def rank(monkeypatch):
    """Make this process look like torchrun's rank N (of 16, 8 per node); SMELT_QUIET off."""
    monkeypatch.setenv("SMELT_QUIET", "0")

    def become(n: int) -> None:
        monkeypatch.setenv("RANK", str(n))
        monkeypatch.setenv("WORLD_SIZE", "16")
        monkeypatch.setenv("LOCAL_RANK", str(n % 8))
        monkeypatch.setenv("GROUP_RANK", str(n // 8))

    return become


def test_log_and_progress_bars_speak_on_rank_0_only(rank, capsys):
    rank(0)
    progress.log("status from rank 0")
    assert not progress.progress(total=3).disable
    rank(1)
    progress.log("status from rank 1")
    assert progress.progress(total=3).disable
    err = capsys.readouterr().err
    assert "status from rank 0" in err and "rank 1" not in err


def test_tables_print_on_rank_0_only(rank, monkeypatch, capsys):
    def summary_table(args):
        print("final train / val loss  2.1 / 2.3")
        return 0

    monkeypatch.setattr("smelt.cli._dispatch", summary_table)
    rank(3)
    assert main(["train", "pipeline.toml"]) == 0
    assert capsys.readouterr().out == ""
    rank(0)
    assert main(["train", "pipeline.toml"]) == 0
    assert "final train / val loss" in capsys.readouterr().out


def bad_config(tmp_path) -> str:
    path = tmp_path / "pipeline.toml"
    path.write_text("[train]\nlr_typo = 1\n")
    return str(path)


class StoppedByTorchrun(Exception):
    """What torchrun does to the other ranks once rank 0 has exited: ends them."""


@pytest.fixture
def torchrun_stops_waiting_ranks(monkeypatch):
    waits = []

    def stopped() -> None:
        waits.append(1)
        raise StoppedByTorchrun

    monkeypatch.setattr("smelt.cli._wait_for_rank_0", stopped)
    return waits


def test_bad_input_is_reported_by_rank_0_and_not_repeated_by_its_node(
    rank, tmp_path, capsys, torchrun_stops_waiting_ranks
):
    rank(0)
    assert main(["train", bad_config(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smelt: error: ") and "unknown key train.lr_typo" in err
    assert torchrun_stops_waiting_ranks == []  # rank 0 reports and exits at once
    for other in (1, 7, 9):  # rank 0's node, and a second process of another node
        rank(other)
        with pytest.raises(StoppedByTorchrun):  # they wait for rank 0 to report, silently
            main(["train", bad_config(tmp_path)])
        assert capsys.readouterr().err == ""
    assert len(torchrun_stops_waiting_ranks) == 3


def test_a_rank_whose_bad_input_rank_0_lacks_reports_it_after_waiting(rank, tmp_path, monkeypatch, capsys):
    # Rank 0 did not stop (the file is there on its side): after the grace period rank 3 says what it found.
    monkeypatch.setattr("smelt.cli.RANK_0_GRACE_S", 0.0)
    rank(3)
    assert main(["train", bad_config(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smelt: [rank 3] error: ") and "unknown key train.lr_typo" in err


def test_bad_input_is_reported_once_by_every_other_node(rank, tmp_path, capsys):
    # Another node may lack a file that rank 0's node has: its first process says what it found.
    rank(8)
    assert main(["train", bad_config(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smelt: [rank 8] error: ") and "unknown key train.lr_typo" in err


def test_usage_errors_and_help_print_on_rank_0_only(rank, capsys, torchrun_stops_waiting_ranks):
    rank(1)
    with pytest.raises(StoppedByTorchrun):
        main(["no-such-command"])
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0 and len(torchrun_stops_waiting_ranks) == 1
    assert capsys.readouterr() == ("", "")
    rank(0)
    with pytest.raises(SystemExit):
        main(["no-such-command"])
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_a_failure_on_another_rank_is_reported_with_its_rank(rank, monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("device lost")

    monkeypatch.setattr("smelt.cli._dispatch", broken)
    rank(5)
    assert main(["train", "pipeline.toml"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("[rank 5] ") for line in lines)
    assert "[rank 5] RuntimeError: device lost" in lines
    assert lines[-1] == "[rank 5] smelt: failed while running (exit 1); the traceback above says where."


@pytest.mark.parametrize("words", [["curate"], ["tokenize"], ["run"], ["eval"], ["tokenizer", "train"]])
def test_commands_other_than_train_refuse_to_run_under_torchrun(rank, tmp_path, capsys, words):
    path = tmp_path / "pipeline.toml"
    path.write_text(f"[run]\ndir = '{tmp_path}'\n")
    rank(0)
    assert main([*words, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"`smelt {words[0]}` runs in one process, but it was started as one of 16" in err
    assert "torchrun --nproc-per-node N -m smelt.cli train CONFIG" in err
    assert [p.name for p in tmp_path.iterdir()] == ["pipeline.toml"]  # nothing started


def test_from_main_is_the_value_itself_in_one_process():
    alone = DistContext(rank=0, world_size=1, local_rank=0, owns_group=False)
    assert from_main(alone, torch.device("cpu"), lambda: 3.5e12) == 3.5e12
    assert from_main(alone, torch.device("cpu"), lambda: None) is None


ASYNC_SAVE = """
import sys, warnings
import torch
from helpers import VOCAB, build_model, tiny_model_config
from smelt.checkpoint.saver import Checkpointer

shown = []
warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
model = build_model(tiny_model_config())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, VOCAB, (2, 16))
model(x, x)[1].backward()
optimizer.step()
saver = Checkpointer(sys.argv[1], keep_last=2, async_save=True)
saver.save(1, model, optimizer, {"model_config": tiny_model_config(), "vocab_size": VOCAB, "tokens": 1},
           {"rng": {}}, batch_tokens=1)
saver.close()
print(shown)
"""


@pytest.mark.slow  # a subprocess (torchrun or a fresh interpreter)
def test_a_single_process_async_save_warns_nothing(tmp_path):
    # DCP's "assuming the intent is to save in a single process" came on every save, from DCP's own
    # thread. A fresh interpreter, since pytest resets warning filters around each test.
    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", ASYNC_SAVE, str(tmp_path / "ckpt")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]" and "single process" not in done.stderr
    assert (tmp_path / "ckpt" / "step_0000001" / "COMMITTED").is_file()


# --- two processes under torchrun (gloo) ----------------------------------------------------------


def write_corpus(root: Path, files: int = 24) -> None:
    rng = random.Random(0)
    root.mkdir(parents=True)
    for i in range(files):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(40)]
        (root / f"note_{i:02d}.txt").write_text(" ".join(sentences) + "\n")


def write_pipeline(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus")
    config = tmp_path / "ranks.toml"
    config.write_text(
        textwrap.dedent(f"""
        [run]
        name = "ranks"
        dir = "{tmp_path / "runs"}"
        seed = 1
        [data]
        min_chars = 50
        val_fraction = 0.25
        [[data.sources]]
        name = "notes"
        format = "text"
        root = "{tmp_path / "corpus"}"
        include = ["*.txt"]
        filters = []
        [tokenizer]
        vocab_size = 384
        lang_alpha = 1.0
        [model]
        d_model = 32
        n_layers = 1
        n_heads = 2
        max_seq_len = 32
        [train]
        seq_len = 32
        micro_batch = 2
        batch_tokens = 128
        tokens = 512
        log_every = 1
        eval_every = 0
        eval_tokens = 256
        precision = "fp32"
        threads = 1
        [checkpoint]
        every_steps = 0
        """)
    )
    return config


def torchrun(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    launcher = Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [str(launcher), "--standalone", "--nproc-per-node", "2", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "0", **(env or {})},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow  # a subprocess (torchrun or a fresh interpreter)
def test_bad_input_under_torchrun_is_reported_once_before_torchrun_stops_the_ranks(tmp_path):
    # Rank 1 finds the problem as fast as rank 0; if it exited at once, torchrun would stop rank 0
    # before rank 0 had printed anything.
    config = tmp_path / "pipeline.toml"
    config.write_text(f"[run]\ndir = '{tmp_path}'\n")
    done = torchrun("-m", "smelt.cli", "tokenize", str(config))
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert output.count("smelt: error: `smelt tokenize` runs in one process") == 1, output[-3000:]
    assert "[rank 1]" not in output


def rank_logs(log_dir: Path, rank: int) -> tuple[str, str]:
    """(stdout, stderr) of one rank, from torchrun's --log-dir with --redirects 3."""
    (folder,) = log_dir.glob(f"*/attempt_0/{rank}")
    return (folder / "stdout.log").read_text(), (folder / "stderr.log").read_text()


@pytest.mark.slow  # a subprocess (torchrun or a fresh interpreter)
def test_two_ranks_print_once_and_share_rank_0s_peak(tmp_path, monkeypatch):
    config = write_pipeline(tmp_path)
    for words in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        assert main([*words, str(config)]) == 0
    monkeypatch.delenv("SMELT_PEAK_FLOPS", raising=False)  # so that the peak is measured
    done = torchrun("--log-dir", str(tmp_path / "logs"), "--redirects", "3", __file__, "train", str(config),
                    env={"RANK_OUTPUT_DIR": str(tmp_path), "SMELT_CACHE_DIR": str(tmp_path / "cache")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    out0, err0 = rank_logs(tmp_path / "logs", 0)
    assert "[train] running" in err0 and "data plan:" in err0
    assert "peak_flops" in out0 and "train: done" in out0
    out1, err1 = rank_logs(tmp_path / "logs", 1)
    assert out1 == ""
    assert "[train]" not in err1 and "data plan" not in err1 and "Traceback" not in err1

    seen = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    # The worker's stand-in measurement gives 1e10 on rank 0 and 2e10 on rank 1: only rank 0 measures,
    # and both ranks divide by its figure times the world size.
    assert [s["measurements"] for s in seen] == [1, 0]
    assert [s["peak_flops"] for s in seen] == [2e10, 2e10]
    assert seen[0]["rank"] == 0 and seen[1]["rank"] == 1


if __name__ == "__main__":  # the torchrun worker of the test above: smelt's command line, observed
    import smelt.train.precision as precision
    import smelt.train.trainer as trainer

    rank_now = int(os.environ["RANK"])
    measurements = []

    def measure(*args, **kwargs) -> float:  # a per-rank figure, so ranks that measure disagree
        measurements.append(1)
        return 1e10 * (1 + rank_now)

    precision.measure_cpu_matmul_flops = measure
    real_train = trainer.train

    def recorded_train(*args, **kwargs):
        summary = real_train(*args, **kwargs)
        record = {
            "rank": summary["rank"],
            "peak_flops": summary["peak_flops"],
            "measurements": len(measurements),
        }
        Path(os.environ["RANK_OUTPUT_DIR"], f"rank_{rank_now}.json").write_text(json.dumps(record))
        return summary

    trainer.train = recorded_train
    sys.exit(main(sys.argv[1:]))
