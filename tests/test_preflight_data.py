"""The data a run needs is checked in the driver before anything starts
(simulation/preflight.py): a data-dir without the dataset, and a dataset neither on this
machine nor downloadable, each one message naming the key, the value and the fix.

Nothing is downloaded: the network probe is replaced wherever a test would reach it."""

from __future__ import annotations

import pytest

import simulation.preflight as preflight
import task.data as data
from simulation.preflight import PreflightError, check_before_start, check_data
from task.data import IDX_FILES, DataSource
from tests.test_data import write_tiny_fashion_mnist


@pytest.fixture
def system_copy(tmp_path, monkeypatch):
    """Where the Debian package would put Fashion-MNIST: a tmp folder, empty at first."""
    folder = tmp_path / "system-fashion-mnist"
    monkeypatch.setattr(data, "SYSTEM_FASHION_MNIST", folder)
    monkeypatch.setattr(preflight, "SYSTEM_FASHION_MNIST", folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # torchvision's copy: none
    return folder


@pytest.fixture
def offline(monkeypatch):
    """No download host answers (and none is asked)."""
    probes = []
    monkeypatch.setattr(preflight, "download_hosts", lambda name: [("mirror.invalid", 80)])
    monkeypatch.setattr(preflight, "download_reachable", lambda hosts: probes.append(hosts))
    return probes


def refusal(source: DataSource, key: str = "data-dir") -> str:
    with pytest.raises(PreflightError) as info:
        check_data(source, key)
    return str(info.value)


def test_a_data_dir_that_does_not_exist_names_the_files_it_must_hold(tmp_path):
    missing = tmp_path / "nothere"
    message = refusal(DataSource(data_dir=str(missing)))
    assert message.startswith(f"data-dir='{missing}' does not exist (no such folder)")
    for stem in IDX_FILES.values():
        assert stem in message
    assert f"in {missing} or {missing / 'fashion-mnist'}" in message
    assert "Fix: give -c \"data-dir='/abs/folder'\"" in message
    assert "-c \"data-dir=''\" for the default lookup" in message


def test_an_empty_data_dir_is_refused_though_the_system_copy_would_be_read(tmp_path,
                                                                          system_copy):
    write_tiny_fashion_mnist(system_copy)
    empty = tmp_path / "empty"
    empty.mkdir()
    message = refusal(DataSource(data_dir=str(empty)))
    assert message.startswith(f"data-dir='{empty}' does not hold Fashion-MNIST: none of its "
                              f"four IDX files is in {empty} or {empty / 'fashion-mnist'}")
    assert f"the run would read {system_copy} instead" in message
    assert f"give -c \"data-dir=''\" to use {system_copy}" in message


def test_a_partial_data_dir_names_the_missing_files(tmp_path, system_copy):
    write_tiny_fashion_mnist(system_copy)
    partial = tmp_path / "partial"
    write_tiny_fashion_mnist(partial)
    (partial / "t10k-images-idx3-ubyte.gz").unlink()
    message = refusal(DataSource(data_dir=str(partial)))
    assert f"{partial} lacks t10k-images-idx3-ubyte[.gz];" in message
    assert "train-images" not in message.split("Fix")[0]


@pytest.mark.parametrize("sub", ["", "fashion-mnist"])
@pytest.mark.parametrize("gz", [True, False])
def test_a_data_dir_that_holds_the_files_passes(tmp_path, system_copy, offline, sub, gz):
    write_tiny_fashion_mnist(tmp_path / "data" / sub, gz=gz)
    check_data(DataSource(data_dir=str(tmp_path / "data"), allow_download=False))
    check_data(DataSource(data_dir=str(tmp_path / "data")))
    assert offline == []  # found: nothing probed


def test_not_on_disk_and_download_off_gives_the_three_fixes(system_copy, offline):
    message = refusal(DataSource(allow_download=False))
    assert message.startswith("dataset='fashion-mnist' is not on this machine, and it cannot "
                              "be downloaded: allow-download=false.")
    assert f"in {system_copy}." in message
    assert "(1) sudo apt-get install dataset-fashion-mnist" in message
    assert "(2) put them in a folder and give -c \"data-dir='/abs/folder'\"" in message
    assert "(3) -c allow-download=true on a machine with network access" in message
    assert offline == []  # download off: no probe


def test_not_on_disk_and_offline_gives_the_three_fixes(system_copy, offline):
    message = refusal(DataSource())
    assert ("cannot be downloaded: allow-download=true, but mirror.invalid:80 cannot be "
            "reached (offline?)") in message
    assert "apt-get install dataset-fashion-mnist" in message and "data-dir=" in message
    assert "allow-download=true" in message.split("Fix one of:")[1]
    assert offline == [[("mirror.invalid", 80)]]


def test_not_on_disk_but_downloadable_or_downloaded_before_passes(tmp_path, system_copy,
                                                                  monkeypatch):
    monkeypatch.setattr(preflight, "download_hosts", lambda name: [("mirror.invalid", 80)])
    monkeypatch.setattr(preflight, "download_reachable", lambda hosts: True)
    check_data(DataSource())  # online: the ClientApps download it
    monkeypatch.setattr(preflight, "download_reachable", lambda hosts: 1 / 0)
    raw = tmp_path / "xdg" / "fedhetero" / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-labels-idx1-ubyte").write_bytes(b"")
    check_data(DataSource())  # torchvision's copy of an earlier download: no probe


def test_a_torchvision_dataset_names_its_folder(tmp_path, offline):
    empty = tmp_path / "empty"
    empty.mkdir()
    message = refusal(DataSource(name="mnist", data_dir=str(empty), allow_download=False))
    assert message.startswith(f"data-dir='{empty}' does not hold mnist (torchvision's files "
                              f"expected in {empty / 'MNIST' / 'raw'})")
    assert "allow-download=false" in message and "-c allow-download=true" in message


def test_deploys_data_dir_option_is_named_as_given(tmp_path):
    message = refusal(DataSource(data_dir=str(tmp_path / "nothere")), key="--data-dir")
    assert message.startswith(f"--data-dir {tmp_path / 'nothere'} does not exist")
    assert "give --data-dir /abs/folder" in message and "or no --data-dir" in message


def test_synthetic_data_needs_nothing_on_disk(offline):
    check_data(DataSource(name="synthetic", allow_download=False))
    assert offline == []


def test_check_before_start_checks_the_nodes_folder_and_the_servers(tmp_path, system_copy,
                                                                    offline):
    """deploy run --data-dir: the SuperNodes read it, the ServerApp the run config's."""
    write_tiny_fashion_mnist(tmp_path / "nodes", n_train=40)
    config = {"partition": "iid", "allow-download": False, "batch-size": 4}
    with pytest.raises(PreflightError, match="dataset='fashion-mnist' is not on this machine"):
        check_before_start(config, 2, node_data_dir=str(tmp_path / "nodes"))
    write_tiny_fashion_mnist(system_copy)
    assert check_before_start(config, 2, node_data_dir=str(tmp_path / "nodes")) == []
    with pytest.raises(PreflightError, match=f"--data-dir {tmp_path / 'none'} does not exist"):
        check_before_start(config, 2, node_data_dir=str(tmp_path / "none"))
