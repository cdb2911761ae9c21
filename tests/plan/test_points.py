"""Reading (N, D, loss) points: CSV columns, compute instead of tokens, smelt runs, bad input."""

import json

import numpy as np
import pytest

from smelt.errors import UserError
from smelt.plan.points import read_csv, read_points, read_runs


def write(path, text):
    path.write_text(text)
    return path


def test_csv_with_compute_column_derives_tokens(tmp_path):
    path = write(tmp_path / "a.csv", "Model Size,Training FLOP,loss\n1e9,6e19,2.5\n2e9,2.4e20,2.3\n")
    points = read_csv(path)
    assert points.d == pytest.approx([1e10, 2e10])  # D = C / 6N
    assert "C / (6 N)" in points.notes[0]
    assert points.compute == pytest.approx([6e19, 2.4e20])


def test_column_overrides_and_drop_highest(tmp_path):
    rows = "\n".join(
        f"{n},{10 * n},{loss}" for n, loss in zip((1e8, 2e8, 3e8, 4e8), (3.0, 2.9, 3.5, 2.8), strict=True)
    )
    path = write(tmp_path / "b.csv", "size,toks,ce\n" + rows + "\n")
    points = read_csv(path, n_column="size", d_column="toks", loss_column="ce")
    kept = points.drop_highest(1)
    assert kept.loss.tolist() == [3.0, 2.9, 2.8] and "dropped the 1" in kept.notes[-1]
    with pytest.raises(UserError, match="would drop every one"):
        points.drop_highest(4)
    with pytest.raises(UserError, match="no column 'nope'"):
        read_csv(path, n_column="nope")


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "is empty"),
        ("x,y\n1,2\n", "no column for parameters"),
        ("N,D,loss\n1e9,2e10,abc\n", "line 2: not a number"),
        ("N,D,loss\n1e9,2e10,-1\n", "line 2: N, D and loss must be positive"),
        ("N,D,loss\n", "no rows"),
    ],
)
def test_bad_csv_names_the_problem(tmp_path, text, needle):
    with pytest.raises(UserError, match=needle):
        read_csv(write(tmp_path / "bad.csv", text))


def fake_run(root, name, params, tokens, val, train=3.0):
    train_dir = root / name / "train"
    train_dir.mkdir(parents=True)
    result = {"params_non_embedding": params, "params_total": params + 1000, "tokens": tokens,
              "final_val_loss": val, "final_train_loss": train}  # fmt: skip
    (train_dir / "manifest.json").write_text(json.dumps({"result": result}))


def test_runs_from_a_ladder_directory(tmp_path):
    fake_run(tmp_path, "r00", 1000, 20000, 4.0)
    fake_run(tmp_path, "r01", 2000, 40000, None, train=3.5)  # no validation split: training loss
    (tmp_path / "r02" / "train").mkdir(parents=True)  # unfinished: skipped, and said so
    points = read_runs([tmp_path])
    assert points.labels == ["r00", "r01"]
    assert points.loss.tolist() == [4.0, 3.5]
    assert any("r02" in note for note in points.notes)
    assert read_runs([tmp_path], params="total").n.tolist() == [2000, 3000]
    single = read_points([tmp_path / "r00"])
    assert np.array_equal(single.n, [1000])
    # A ladder directory with a plan: only the rungs of that plan, whatever else the directory holds.
    (tmp_path / "ladder.json").write_text(json.dumps({"rungs": [{"name": "r01"}]}))
    assert read_runs([tmp_path]).labels == ["r01"]


def test_no_finished_runs_and_mixed_inputs_are_user_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no finished smelt runs"):
        read_points([tmp_path / "empty"])
    with pytest.raises(UserError, match="does not exist"):
        read_points([tmp_path / "missing"])
    csv = write(tmp_path / "a.csv", "N,D,loss\n1,2,3\n")
    with pytest.raises(UserError, match="one CSV file on its own"):
        read_points([csv, tmp_path / "empty"])
