"""`smelt curate --workers` and `smelt inspect documents` on a small run."""

import json

import pytest

from smelt.cli import main

TOML = """
[run]
name = "r"
dir = "{runs}"

[data]
min_chars = 1
val_fraction = 0.0

[[data.sources]]
name = "notes"
root = "{root}"
filters = ["gopher_quality"]
"""


@pytest.fixture
def run(tmp_path, write):
    prose = (
        "The council met on Tuesday and the members agreed that the new library would open in the spring. "
    )
    files = {f"good{i}.txt": prose * 3 + f"Note {i}." for i in range(6)}
    files.update({f"list{i}.txt": f"buy {i} now" for i in range(4)})
    files["bin.dat"] = b"\x00\x01\x02"
    root = write(tmp_path / "raw", files)
    config = tmp_path / "r.toml"
    config.write_text(TOML.format(runs=tmp_path / "runs", root=root))
    assert main(["curate", str(config), "--workers", "2"]) == 0
    return tmp_path / "runs" / "r"


def test_curate_workers_flag_reaches_the_config(run):
    manifest = json.loads((run / "documents" / "manifest.json").read_text())
    # Worker counts cannot change the documents: recorded with the settings, not in the cache key.
    assert manifest["settings"]["data"]["workers"] == 2 and "workers" not in manifest["config"]["data"]


def test_inspect_dropped_kept_and_quarantined(run, capsys):
    capsys.readouterr()
    assert main(["inspect", "documents", str(run), "--dropped-by", "gopher_quality", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- [") == 2 and "gopher_quality.min_words" in out and "buy 0 now" in out
    assert '"words": 3' in out  # the rule's scores are shown
    assert main(["inspect", "documents", str(run / "documents"), "--kept", "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- [") == 3 and "council met" in out and '"gopher_quality"' in out
    assert main(["inspect", "documents", str(run), "--quarantined"]) == 0
    out = capsys.readouterr().out
    assert "bin.dat" in out and "binary" in out


def test_inspect_user_errors(run, tmp_path, capsys):
    assert main(["inspect", "documents", str(run), "--dropped-by", "gopher"]) == 2
    assert "gopher_quality" in capsys.readouterr().err  # names the steps the run has
    assert main(["inspect", "documents", str(tmp_path / "nowhere"), "--kept"]) == 2
    assert "smelt curate" in capsys.readouterr().err
