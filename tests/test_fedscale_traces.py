"""FedScale's trace pickles -> a fedhetero device trace, without ever running a pickle's code."""

from __future__ import annotations

import pickle

import pytest

from simulation.__main__ import main as simulation_main
from simulation.fedscale_traces import TraceError, convert, fold_onto_day, load_plain_pickle
from strategies.engine.devices import load_trace


def write(path, value):
    path.write_bytes(pickle.dumps(value))
    return path


def test_capacity_and_availability_convert_to_profiles(tmp_path):
    cap = write(tmp_path / "cap", {7: {"computation": 10.0, "communication": 5000.0},
                                   9: {"computation": 40.0, "communication": 800.0},
                                   3: {"computation": 20.0, "communication": 2000.0}})
    behave = write(tmp_path / "behave", {
        "a": {"duration": 9, "active": [3600, 90000], "inactive": [7200, 93600],
              "finish_time": 172800, "model": "x"},
        "b": {"duration": 9, "active": [82800], "inactive": [90000], "finish_time": 172800,
              "model": "y"}})
    devices = convert(cap, behave, 4)
    # reference = the median, 20 ms per sample; bandwidth kbit/s / 1000 both ways
    assert devices[0].speed == 2.0 and devices[0].downlink_mbps == 5.0 == devices[0].uplink_mbps
    assert devices[1].speed == 0.5 and devices[2].speed == 1.0
    assert devices[3].speed == 2.0  # partition 3: client 3 mod 3 = the first again
    assert devices[0].windows == ((3600.0, 7200.0),)  # day 2's window folds onto day 1's
    assert devices[1].windows == ((0.0, 3600.0), (82800.0, 86400.0))  # across midnight
    out = tmp_path / "fleet.csv"
    assert simulation_main(["fedscale-trace", "--capacity", str(cap), "--behavior",
                            str(behave), "--num-partitions", "4", "--output", str(out)]) == 0
    assert load_trace(out).devices == devices


def test_fold_onto_day():
    assert fold_onto_day([(0, 86400)]) == ()
    assert fold_onto_day([(10, 20), (15, 30), (86410, 86450)]) == ((10.0, 50.0),)


class Payload:
    def __reduce__(self):
        import os
        return (os.system, ("touch PWNED",))


def test_a_pickle_with_code_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hostile = write(tmp_path / "cap", {1: {"computation": Payload(), "communication": 1.0}})
    with pytest.raises(TraceError, match="global"):
        load_plain_pickle(hostile)
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(SystemExit, match="global"):
        simulation_main(["fedscale-trace", "--capacity", str(hostile), "--num-partitions", "1",
                         "--output", str(tmp_path / "x.csv")])
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value, words", [
    ([1, 2], "non-empty dict"),
    ({1: {"communication": 1.0}}, "client 1: field 'computation' is missing"),
    ({1: {"computation": -1.0, "communication": 1.0}}, "client 1: field 'computation' must"),
    ({"x": {"computation": True, "communication": 1.0}}, "client 'x': field 'computation'"),
    ({1: {"computation": float("nan"), "communication": 1.0}}, "finite"),
    ({1: [1, 2]}, "client 1: expected a dict"),
])
def test_malformed_capacity_names_file_client_and_field(tmp_path, value, words):
    path = write(tmp_path / "cap", value)
    with pytest.raises(TraceError, match=words) as info:
        convert(path, None, 2)
    assert str(path) in str(info.value)


def test_malformed_availability_and_size_limit(tmp_path):
    bad = write(tmp_path / "behave", {5: {"active": [10], "inactive": [5], "finish_time": 100}})
    with pytest.raises(TraceError, match="client 5: inactive\\[0\\]"):
        convert(None, bad, 1)
    big = write(tmp_path / "big", {1: {"computation": 1.0, "communication": 1.0}})
    with pytest.raises(TraceError, match="max-bytes"):
        convert(big, None, 1, max_bytes=10)
    (tmp_path / "junk").write_bytes(b"\x80\x05garbage")
    with pytest.raises(TraceError, match="not a plain-data pickle"):
        load_plain_pickle(tmp_path / "junk")
