"""`from_snapshot` on the object a real snapshot unpickles to equals loading the file."""

import pickle

import pytest

import allocview
from conftest import without_timings

SNAPSHOTS = ["lm_train_step_b.pickle", "lm_train_step_windows.pickle", "lm_forward_a.pickle",
             "lm_train_step_a.pickle"]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_from_snapshot_equals_the_file(samples, name):
    path = samples / "pytorch" / name
    with open(path, "rb") as f:
        obj = pickle.load(f)
    assert isinstance(obj, dict) and "segments" in obj
    from_obj = allocview.from_snapshot(obj, name=str(path))
    from_file = allocview.load(path)
    assert set(from_obj.tables) == set(from_file.tables)
    for table, frame in from_file.tables.items():
        assert from_obj.tables[table].equals(frame, null_equal=True), table
    s_obj, s_file = allocview.stats(from_obj), allocview.stats(from_file)
    assert s_obj["pytorch"].pop("pickle_protocol") == 0
    s_file["pytorch"].pop("pickle_protocol")
    assert without_timings(s_obj) == without_timings(s_file)
    c_obj = allocview.compare(from_obj, policies=["pytorch", "bfc"])
    c_file = allocview.compare(from_file, policies=["pytorch", "bfc"])
    assert c_obj.pop("series").equals(c_file.pop("series"))
    assert without_timings(c_obj) == without_timings(c_file)


def test_from_snapshot_refuses_what_no_snapshot_holds():
    with pytest.raises(allocview.AllocviewError, match=r"\['segments'\]\[0\].*object"):
        allocview.from_snapshot({"segments": [object()]})
    with pytest.raises(allocview.AllocviewError, match="not a PyTorch memory snapshot"):
        allocview.from_snapshot({"hello": 1})
