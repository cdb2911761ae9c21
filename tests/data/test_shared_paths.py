"""Config paths honour SMELT_SHARED_DATA (`${NAME:-default}` in strings), and the benchmark scripts say
where they looked for the shared data instead of crashing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smelt.config import load_config
from smelt.data.curate import resolve_sources
from smelt.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHARED_CONFIG = REPO / "configs" / "shared_corpus.toml"


def write_toml(tmp_path: Path, root: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(f'[[data.sources]]\nname = "books"\nroot = "{root}"\n', encoding="utf-8")
    return path


def test_env_references_expand_with_defaults_and_escapes(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_TEST_DATA", "/data/shared")
    monkeypatch.delenv("SMELT_TEST_UNSET", raising=False)
    monkeypatch.setenv("SMELT_TEST_EMPTY", "")
    cases = {
        "${SMELT_TEST_DATA}/corpus": "/data/shared/corpus",
        "${SMELT_TEST_DATA:-../shared/data}/corpus": "/data/shared/corpus",
        "${SMELT_TEST_UNSET:-../shared/data}/corpus": "../shared/data/corpus",
        "${SMELT_TEST_EMPTY:-fallback}": "fallback",
        "$${SMELT_TEST_DATA} and $SMELT_TEST_DATA": "${SMELT_TEST_DATA} and $SMELT_TEST_DATA",
    }
    for raw, expanded in cases.items():
        cfg = load_config(write_toml(tmp_path, raw))
        assert cfg.data.sources[0].root == expanded, raw
    cfg = load_config(None, ["run.dir=${SMELT_TEST_DATA}/runs"])  # --set values too
    assert cfg.run.dir == "/data/shared/runs"


def test_an_unset_variable_without_default_names_the_key_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("SMELT_TEST_UNSET", raising=False)
    path = write_toml(tmp_path, "${SMELT_TEST_UNSET}/corpus")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == (
        f"{path}: data.sources[0].root = '${{SMELT_TEST_UNSET}}/corpus' uses the environment variable "
        f"SMELT_TEST_UNSET, which is not set. Set it (export SMELT_TEST_UNSET=...), or give a default in "
        f"the config: ${{SMELT_TEST_UNSET:-default}}."
    )


def test_shared_corpus_config_reads_the_data_from_smelt_shared_data(shared_data, tmp_path, monkeypatch):
    """From a directory with no ../shared beside it, the config finds the corpus through the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMELT_SHARED_DATA", str(shared_data))
    cfg = load_config(SHARED_CONFIG)
    assert {s.root.split("/corpus")[0] for s in cfg.data.sources} == {str(shared_data)}
    files = resolve_sources(cfg.data)
    assert len(files["books"]) == 11 and len(files["code"]) == 2
    monkeypatch.delenv("SMELT_SHARED_DATA")
    cfg = load_config(SHARED_CONFIG)
    assert cfg.data.sources[0].root == "../shared/data/corpus/prose"


@pytest.mark.parametrize(
    ("script", "args", "lacks"),
    [
        ("dedup_quality.py", ["--docs", "20"], "corpus/prose, corpus/web/dolma-cc-sample"),
        ("dedup_speed.py", ["--docs", "20", "--skip-datasketch"], "corpus/prose, eval/hellaswag/"),
    ],
)
@pytest.mark.slow
def test_bench_scripts_say_where_they_looked_for_the_shared_data(tmp_path, script, args, lacks):
    empty = tmp_path / "shared"
    empty.mkdir()
    env = {**os.environ, "SMELT_SHARED_DATA": str(empty)}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "randrange" not in done.stderr
    assert done.stderr.startswith(
        f"error: the shared data set is not where this benchmark looked: $SMELT_SHARED_DATA = {empty} "
        f"lacks {lacks}"
    )
    assert "Set SMELT_SHARED_DATA to the folder that holds corpus/ and eval/" in done.stderr
