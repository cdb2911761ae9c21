"""`smelt curate quality-train`, then curate scoring documents and keeping the top fraction per source."""

import json

import pyarrow.parquet as pq

from smelt.cli import main

GOOD = "The committee reviewed the evidence carefully and published a clear report on its findings."
POOR = "CLICK HERE buy now cheap deals!!! best price free shipping click click subscribe now!!!"

TOML = """
[run]
name = "q"
dir = "{runs}"

[data]
min_chars = 1
val_fraction = 0.0
workers = 1

[data.quality]
positive_sources = ["good"]
negative_sources = ["poor"]
{extra}

[[data.sources]]
name = "good"
root = "{root}/good"
filters = []

[[data.sources]]
name = "poor"
root = "{root}/poor"
filters = []

[[data.sources]]
name = "mixed"
root = "{root}/mixed"
filters = []
"""


def test_quality_train_then_curate_keeps_the_top_fraction(tmp_path, write, capsys):
    root = tmp_path / "raw"
    write(root / "good", {f"{i}.txt": f"{GOOD} Item {i} of the record." for i in range(40)})
    write(root / "poor", {f"{i}.txt": f"{POOR} offer {i}" for i in range(40)})
    write(root / "mixed", {f"{i}.txt": (GOOD if i % 2 else POOR) + f" number {i}" for i in range(20)})
    config = tmp_path / "q.toml"
    config.write_text(TOML.format(runs=tmp_path / "runs", root=root, extra=""))
    assert main(["curate", "quality-train", str(config)]) == 0
    model = tmp_path / "runs" / "q" / "quality" / "model.safetensors"
    assert model.is_file() and "data.quality.model" in capsys.readouterr().out

    extra = f'model = "{model}"\nsources = ["mixed"]\ntop_fraction = 0.5'
    config.write_text(TOML.format(runs=tmp_path / "runs", root=root, extra=extra))
    assert main(["curate", str(config)]) == 0
    documents = tmp_path / "runs" / "q" / "documents"
    stats = json.loads((documents / "stats.json").read_text())
    assert stats["sources"]["mixed"]["dropped"] == {"quality.top_fraction": 10}
    assert stats["sources"]["good"]["dropped"] == {} and stats["documents_kept"] == 90
    rows = pq.read_table(documents / "train" / "mixed" / "part-00000.parquet").to_pylist()
    assert len(rows) == 10 and all(GOOD in r["text"] for r in rows)
    assert all(json.loads(r["meta"])["quality"] > 0.5 for r in rows)
    good_meta = json.loads(
        pq.read_table(documents / "train" / "good" / "part-00000.parquet")["meta"][0].as_py()
    )
    assert "quality" not in good_meta  # only the configured sources are scored
