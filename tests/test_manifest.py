import json

from smelt.manifest import Stage, hash_file, hash_files, hash_outputs, read_manifest


def test_hashes_depend_on_content_and_names(tmp_path):
    (tmp_path / "a").write_text("x")
    (tmp_path / "b").write_text("y")
    files = [tmp_path / "a", tmp_path / "b"]
    first = hash_files(files, tmp_path)
    assert hash_files(list(reversed(files)), tmp_path) == first  # order of listing does not matter
    (tmp_path / "b").write_text("z")
    assert hash_files(files, tmp_path) != first
    assert hash_file(tmp_path / "a") == hash_file(tmp_path / "a")


def test_stage_up_to_date_rules(tmp_path):
    out = tmp_path / "stage"
    out.mkdir()
    (out / "data.bin").write_bytes(b"123")
    stage = Stage("demo", out, {"k": 1}, {"upstream": "abc"}, seed=7)
    assert not stage.up_to_date()
    manifest = stage.write_manifest(started=0.0, extra={"result": {"n": 3}})
    assert manifest["outputs"] == hash_outputs(out) and "data.bin" in manifest["outputs"]
    assert read_manifest(out)["result"] == {"n": 3}
    assert stage.up_to_date()
    assert not Stage("demo", out, {"k": 2}, {"upstream": "abc"}, 7).up_to_date()  # config changed
    assert not Stage("demo", out, {"k": 1}, {"upstream": "abd"}, 7).up_to_date()  # input changed
    (out / "data.bin").write_bytes(b"124")  # output tampered with
    assert not stage.up_to_date()


def test_manifest_records_versions(tmp_path):
    stage = Stage("demo", tmp_path, {}, {}, seed=1)
    manifest = stage.write_manifest(started=0.0)
    assert manifest["libraries"]["torch"] != "missing"
    assert manifest["code"]["package"]
    assert json.loads((tmp_path / "manifest.json").read_text())["config_hash"] == stage.config_hash
