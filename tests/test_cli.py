"""The command line: help for every subcommand, and exit code 2 with a useful message for bad input."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smelt.cli import command_parsers, main

SUBCOMMANDS = [
    ["quickstart"],
    ["run"],
    ["curate"],
    ["tokenizer"],
    ["tokenizer", "train"],
    ["tokenize"],
    ["train"],
    ["eval"],
]


@pytest.mark.parametrize("words", SUBCOMMANDS)
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as info:
        main([*words, "--help"])
    assert info.value.code == 0
    assert "usage: smelt " + " ".join(words) in capsys.readouterr().out


@pytest.mark.slow
def test_entry_point_runs_as_a_program():
    done = subprocess.run([sys.executable, "-m", "smelt.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("smelt ")


def write_config(tmp_path, body: str):
    path = tmp_path / "pipeline.toml"
    path.write_text(textwrap.dedent(body).replace("RUNS", str(tmp_path / "runs")))
    return path


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.err


def test_missing_config_file(tmp_path, capsys):
    code, err = run_cli(["curate", tmp_path / "missing.toml"], capsys)
    assert code == 2
    assert "missing.toml" in err and "does not exist" in err and "Traceback" not in err


def test_unknown_key_names_the_closest_valid_key(tmp_path, capsys):
    path = write_config(tmp_path, "[train]\nlr_typo = 1\n")
    code, err = run_cli(["run", path], capsys)
    assert code == 2
    assert "unknown key train.lr_typo" in err and "did you mean 'lr'" in err


def test_wrong_type(tmp_path, capsys):
    path = write_config(tmp_path, '[train]\nseq_len = "long"\n')
    code, err = run_cli(["train", path], capsys)
    assert code == 2 and "train.seq_len must be an integer" in err


def test_bad_override(tmp_path, capsys):
    path = write_config(tmp_path, "[run]\ndir = 'RUNS'\n")
    code, err = run_cli(["run", path, "--set", "train.lr=-3"], capsys)
    assert code == 2 and "train.lr = -3.0 is out of range" in err


def test_vocab_smaller_than_bytes_plus_specials(tmp_path, capsys):
    path = write_config(tmp_path, "[tokenizer]\nvocab_size = 200\n")
    code, err = run_cli(["tokenizer", "train", path], capsys)
    assert code == 2 and "tokenizer.vocab_size" in err and ">= 331" in err


def source_config(tmp_path, root, include="**/*.txt"):
    return write_config(
        tmp_path,
        f"""
        [run]
        dir = "RUNS"
        [[data.sources]]
        name = "mine"
        root = "{root}"
        include = ["{include}"]
    """,
    )


def test_glob_matching_no_files(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    code, err = run_cli(["curate", source_config(tmp_path, tmp_path / "corpus")], capsys)
    assert code == 2
    assert "mine" in err and "**/*.txt" in err and "Traceback" not in err


def test_source_whose_files_are_all_empty(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text("" if i else "  \n")
    code, err = run_cli(["curate", source_config(tmp_path, corpus)], capsys)
    assert code == 2 and "mine" in err and "empty" in err


def test_directory_of_binary_files(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_bytes(bytes(range(256)) * 4)
    code, err = run_cli(["curate", source_config(tmp_path, corpus)], capsys)
    assert code == 2 and "mine" in err and "binary" in err


def test_eval_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    code, err = run_cli(["eval", tmp_path], capsys)
    assert code == 2 and "not a smelt run directory" in err


def test_stage_without_its_inputs(tmp_path, capsys):
    path = write_config(tmp_path, "[run]\ndir = 'RUNS'\n")
    code, err = run_cli(["tokenize", path], capsys)
    assert code == 2 and "has no manifest.json" in err and "curate" in err


def test_plan_model_prints_sizes(capsys):
    assert main(["plan", "model", "llama-124m", "--vocab-size", "50304", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "parameters (non-embedding)" in out and "KV-cache bytes per token" in out and "s = 1024" in out


@pytest.mark.slow
def test_plan_model_unknown_preset(capsys):
    code, err = run_cli(["plan", "model", "llama-1"], capsys)
    assert code == 2 and "llama-1b" in err


def readme_option_table() -> dict[str, tuple[bool, bool]]:
    """README's table of which commands take --set and --force: {command: (set, force)}."""
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = lines.index("| commands | `--set` | `--force` |")
    table: dict[str, tuple[bool, bool]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        commands, takes_set, takes_force = (cell.strip() for cell in line.strip("|").split("|"))
        for command in commands.split(","):
            table[command.strip().strip("`")] = (takes_set.startswith("yes"), takes_force.startswith("yes"))
    return table


README_OPTIONS = readme_option_table()
PARSERS = command_parsers()


@pytest.mark.parametrize("command", sorted(set(README_OPTIONS) | set(PARSERS)))
def test_readme_says_exactly_which_commands_take_set_and_force(command):
    assert command in PARSERS, f"README's option table names `{command}`, which smelt does not have"
    assert command in README_OPTIONS, f"`smelt {command}` is missing from README's option table"
    options = {option for action in PARSERS[command]._actions for option in action.option_strings}
    assert README_OPTIONS[command] == ("--set" in options, "--force" in options)
    assert "--help" in options


def test_eval_force_rescores_a_checkpoint_that_has_a_current_step_file(monkeypatch, tmp_path):
    seen = {}

    def evaluate_checkpoints(cfg, run_dir, which, tasks=None, limit=None, force=False, **planned):
        seen.update(which=which, force=force)
        return []

    monkeypatch.setattr("smelt.eval.run.evaluate_checkpoints", evaluate_checkpoints)
    path = write_config(tmp_path, "[run]\ndir = 'RUNS'\n")
    assert main(["eval", str(path), "--checkpoint", "all", "--force"]) == 0
    assert seen == {"which": "all", "force": True}


EXAMPLE_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=[p.name for p in EXAMPLE_CONFIGS])
def test_example_configs_load(path):
    from smelt.config import load_config

    cfg = load_config(path)
    sources = {source.name for source in cfg.data.sources}
    assert set(cfg.tokens.mixture) <= sources  # a mixture names only sources the config curates


def test_mixture_example_is_prose_and_code_70_30():
    from smelt.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "mixture.toml")
    assert [s.name for s in cfg.data.sources] == ["prose", "code"]
    assert cfg.tokens.mixture == {"prose": 0.7, "code": 0.3}


def test_mixture_example_reads_the_shared_corpus_from_smelt_shared_data(monkeypatch):
    from smelt.config import load_config

    monkeypatch.setenv("SMELT_SHARED_DATA", "/data/shared")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "mixture.toml")
    assert [s.root for s in cfg.data.sources] == ["/data/shared/corpus/prose", "/data/shared/corpus/code"]


@pytest.mark.slow
def test_building_the_parser_imports_no_torch():
    # `smelt --help` and a usage error must stay instant: command modules import torch in handlers only.
    code = "import sys; from smelt.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_every_command_names_its_handler():
    for words, parser in command_parsers().items():
        assert callable(parser.get_default("func")), f"`smelt {words}` has no handler"


def test_resume_from_an_uncommitted_step_of_a_finished_run_suggests_a_committed_one(tmp_path, capsys):
    path = write_config(tmp_path, "[run]\ndir = 'RUNS'\nname = 'done'\n")
    train_dir = tmp_path / "runs" / "done" / "train"
    for step in (10, 20):  # committed checkpoints; step 17 has none
        (train_dir / "checkpoints" / f"step_{step:07d}").mkdir(parents=True)
        (train_dir / "checkpoints" / f"step_{step:07d}" / "COMMITTED").write_text("{}")
    (train_dir / "manifest.json").write_text("{}")  # the stage finished
    code, err = run_cli(["train", path, "--resume-from", 17], capsys)
    assert code == 2 and "is finished" in err and "committed steps: 10, 20" in err
    assert f"--from {tmp_path / 'runs' / 'done'}:10 " in err and ":17" not in err
    code, err = run_cli(["train", path, "--resume-from", 5], capsys)  # before every checkpoint: the first
    assert code == 2 and f"--from {tmp_path / 'runs' / 'done'}:10 " in err and ":5" not in err
    code, err = run_cli(["train", path, "--resume-from", 20], capsys)  # a committed step: fork from it
    assert code == 2 and f"--from {tmp_path / 'runs' / 'done'}:20 " in err


def test_a_full_disk_prints_its_message_alone_and_the_traceback_behind_debug(monkeypatch, tmp_path, capsys):
    from smelt.checkpoint.failures import save_failed
    from smelt.train.alerts import TrainingStopped

    error = save_failed(OSError(28, "No space left on device"), 100, tmp_path / "checkpoints", 10**15)

    def full(args):
        raise error

    monkeypatch.setattr("smelt.cli._dispatch", full)
    code, err = run_cli(["train", "pipeline.toml"], capsys)
    assert code == 1 and "Traceback" not in err  # a failure while running: --max-restarts retries it
    assert err.startswith(f"smelt: {error}\n") and "no space left on device" in err
    assert err.endswith("failed while running (exit 1); `smelt --debug ...` shows the traceback.\n")
    code, err = run_cli(["--debug", "train", "pipeline.toml"], capsys)
    assert code == 1 and err.startswith("Traceback") and "CheckpointSaveError" in err
    assert f"smelt: {error}\n" in err

    def stopped(args):
        raise TrainingStopped("training stopped at step 30: a loss spike (stop).", "loss_spike")

    monkeypatch.setattr("smelt.cli._dispatch", stopped)
    code, err = run_cli(["train", "pipeline.toml"], capsys)
    assert code == 3 and "Traceback" not in err
    monkeypatch.setenv("SMELT_DEBUG", "1")
    code, err = run_cli(["train", "pipeline.toml"], capsys)
    assert code == 3 and err.startswith("Traceback") and "smelt: training stopped at step 30" in err


def test_inspect_langid_gives_per_language_accuracy_from_file_names(tmp_path, shared_data, capsys):
    import json

    sentences = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    folder = tmp_path / "sentences"
    folder.mkdir()
    for lang in ("de", "pl", "ms", "nb", "mi"):  # mi: a language py3langid does not know
        lines = (sentences / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:30]
        (folder / f"{lang}.txt").write_text("\n".join(lines), encoding="utf-8")
    out = tmp_path / "langid.json"
    code = main(["inspect", "langid", str(folder), "--labels", "file", "--limit", "20", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line for line in stdout.splitlines()[1:6]}
    assert set(rows) == {"de", "pl", "ms", "nb", "mi"}
    assert "100.0%" in rows["de"] and "(py3langid does not know mi)" in rows["mi"]
    report = json.loads(out.read_text())
    assert report["texts"] == 100 and report["labels"]["de"]["texts"] == 20
    assert report["labels"]["ms"]["answered_as"].get("id", 0) > 10  # Malay mostly labelled Indonesian
    assert report["labels"]["nb"]["accuracy"] > 0.5  # nb counts as py3langid's `no`
    assert report["unknown_labels"] == ["mi"] and report["labels"]["mi"]["accuracy"] == 0
    macro = sum(r["accuracy"] for r in report["labels"].values()) / 5
    assert report["macro_accuracy"] == round(macro, 4)
    assert "5 languages, 100 texts (py3langid)" in stdout

    assert (
        main(["inspect", "langid", str(folder / "de.txt"), "--unit", "file"]) == 0
    )  # no labels: what was found
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["de", "1"]
    (folder / "notes.txt").write_text("Some English notes about the files.\n")
    assert main(["inspect", "langid", str(folder), "--labels", "file"]) == 2
    assert "notes.txt is not labelled with a language" in capsys.readouterr().err
