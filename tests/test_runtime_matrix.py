"""One runtime-equivalence matrix: each family of the app (rows) runs in process, through the
real ``flwr run . --stream`` on Flower's simulation engine (Ray), and on a real local
deployment (one SuperLink, four SuperNodes, loopback), and the three give the same model
bits every round, with the same trace of what the family is about (columns).

The rows cover what differs between runtimes: sampling with a selection policy and the
simulated clock (deadline cuts, profiles by partition); client state kept in the nodes'
Context.state (SCAFFOLD: never resent, digests checked on every reply); sub-models at fixed
widths (HeteroFL: the ClientApp process of a SuperNode builds its width from the message);
asynchronous rounds in simulated arrival order (FedBuff: staleness, sim-elapsed); DynamicFL's
own push/pull loop; and one of Flower's own server optimisers by name (its models agree to
float32 rounding: Flower sums replies in arrival order). The client-state row
runs packed: 6 virtual clients on the 4 SuperNodes of each runtime give the bits of 6
in-process nodes, each virtual client's c_i following it across rounds. Every
algorithm's bits are pinned in process by ``test_regression_models``; this matrix is what
stands for "and the same in every runtime", instead of every feature re-run in every runtime.

Each runtime runs its rows on one launch: the simulation rows on one FLWR_HOME whose managed
SuperLink they share (stopped by PID after the last one), the deployment rows on one
deployment (:func:`tests.deployed.run_deployed`: free ports, every process stopped by PID and
checked gone). The deployment column is tests/test_deployed_runtime_matrix.py, a module of
its own so that a pytest-xdist worker runs it while another runs this one.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

from fedapp.model_file import read_model
from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from simulation.runtime.local_superlink import superlink_use
from strategies import contract as C
from strategies.engine.clock import client_seconds
from strategies.engine.devices import GeneratedFleet
from task.data import load_dataset
from task.devices import seconds_per_example
from task.models import build_model
from tests.deployed import run_in_process

pytestmark = pytest.mark.usefixtures("processes")

NODES = 4  # SuperNodes of every runtime (packed rows serve more virtual clients on them)
TINY = {"dataset": "synthetic", "model": "mlp-2nn", "partition": "iid", "batch-size": 10,
        "eval-batch-size": 2000, "seed": 1, "min-available-nodes": NODES,
        "drift-diagnostics": False}
STEPS, SEED = 200, 0  # the clock row: enough steps for a deadline to cut a slow client


def deadline_that_cuts_some() -> float:
    """A deadline between the fastest and the slowest of the four partitions' full rounds
    (eq. 1 of the clock: transfers plus steps): some clients meet it, some are cut."""
    dataset = load_dataset("synthetic")
    model = build_model("mlp-2nn", dataset.input_shape, dataset.num_classes)
    size = ArrayRecord(model.state_dict()).count_bytes()
    cost = seconds_per_example(model, dataset.input_shape, 1.0)
    fleet = GeneratedFleet("lognormal", seed=SEED, sigma=1.0)
    seconds = sorted(client_seconds(fleet.profile(p), STEPS, 10, cost, size, size)
                     for p in range(NODES))
    return (seconds[0] + seconds[-1]) / 2


def selection_and_clock(rounds) -> list:
    return [(r[C.LOG_MODEL_SHA256], r.get(C.LOG_SELECTION_CHOSEN), r.get(C.LOG_OORT_EPSILON),
             r.get(C.LOG_OORT_PREFERRED_SECONDS), r.get(C.LOG_SIM_SECONDS),
             r.get(C.LOG_SIM_ELAPSED), r.get(C.LOG_CLIENTS_STRAGGLERS),
             r.get(C.LOG_LOCAL_STEPS)) for r in rounds]


def client_state(rounds) -> list:
    return [(r[C.LOG_MODEL_SHA256], r.get(C.LOG_CLIENT_STATE_ROUNDS),
             r.get(C.LOG_CLIENT_STATE_ATTACHED)) for r in rounds]


def widths(rounds) -> list:
    return [(r[C.LOG_MODEL_SHA256], r.get(C.LOG_CLIENT_WIDTHS), r.get(C.LOG_WIDTH_ACCURACY))
            for r in rounds]


def staleness(rounds) -> list:
    return [(r[C.LOG_MODEL_SHA256], r.get(C.LOG_STALENESS), r.get(C.LOG_SIM_ELAPSED))
            for r in rounds]


def sync_events(rounds) -> list:
    return [(r[C.LOG_MODEL_SHA256], r.get("syncs"), r.get(C.LOG_DYNAMICFL_GROUP_SIZE))
            for r in rounds]


def check_selection_and_clock(rounds) -> None:
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert r[C.LOG_SELECTION] == "oort" and len(r[C.LOG_SELECTION_CHOSEN]) == 2
        assert r[C.LOG_CLIENTS_RECEIVED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0
        assert r[C.LOG_OORT_EPSILON] > 0 and r[C.LOG_OORT_PREFERRED_SECONDS] > 0
    assert rounds[1][C.LOG_OORT_EPSILON] == 0.882  # 0.9, decayed before the first selection
    assert sum(r[C.LOG_CLIENTS_STRAGGLERS] for r in rounds[1:]) > 0, "the deadline cut someone"
    assert min(min(r[C.LOG_LOCAL_STEPS]) for r in rounds[1:]) < STEPS


def check_client_state(clients: int):
    def check(rounds) -> None:
        assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == \
            [[0] * clients, [1] * clients]  # round 2's c_i never resent: kept in Context.state
        assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 and r[C.LOG_CLIENTS_FAILED] == 0
                   and r[C.LOG_CLIENTS_RECEIVED] == clients for r in rounds[1:])
        assert all(r[C.LOG_SCAFFOLD_C_NORM] > 0 for r in rounds[1:])
        assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]
    return check


def check_widths(rounds) -> None:
    for r in rounds[1:]:  # the fixed rule: partition p trains levels[p mod 2]
        assert r[C.LOG_CLIENT_WIDTHS] == {"0": 1.0, "1": 0.5, "2": 1.0, "3": 0.5}
        assert r[C.LOG_WIDTH_COUNTS] == {"1": 2, "0.5": 2} and r[C.LOG_CLIENTS_FAILED] == 0
    for r in rounds:
        assert set(r[C.LOG_WIDTH_ACCURACY]) == {"0.5", "1"}
        assert all(math.isfinite(a) for a in r[C.LOG_WIDTH_ACCURACY].values())


def check_staleness(rounds) -> None:
    assert len({r[C.LOG_MODEL_SHA256] for r in rounds}) == len(rounds) == 3
    assert any(max(r[C.LOG_STALENESS]) > 0 for r in rounds[1:]), "some update was stale"


def check_sync_events(rounds) -> None:
    r = rounds[1]
    z = r[C.LOG_DYNAMICFL_GROUP_SIZE]
    syncs = 2 * z + 1 * (NODES - z)  # 'b' = 4 steps: 2 syncs in L = 8; 'c' = 16: 1 sync
    assert r["syncs"] == syncs and abs(r[C.LOG_KAPPA_HAT] - syncs / 32) < 1e-12
    assert r[C.LOG_SYNC_EVENTS] == (2 if z else 1) and r[C.LOG_BYTES_UP] == r[C.LOG_BYTES_DOWN]


def rounds_run(rounds) -> list[int]:
    """Flower's own strategies sum the replies in the order they arrive (``FedAvg.
    aggregate_train``), which differs between runtimes: their models agree to float32
    rounding, not bit for bit (:func:`close_models` compares them)."""
    return [r[C.LOG_ROUND] for r in rounds]


def close_models(run_dir: Path, reference: Path) -> None:
    ours, theirs = read_model(run_dir / "final_model.pt"), read_model(reference / "final_model.pt")
    assert list(ours) == list(theirs)
    for key in ours:
        assert torch.allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6), key


def check_server_optimiser(rounds) -> None:
    assert all(math.isfinite(r[C.LOG_LOSS]) for r in rounds)
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]


# row: (run config, in-process nodes, trace, checks on the in-process run, output must say)
ROWS = {
    "selection-clock": ({"strategy": "fedprox", "selection": "oort", "fraction-train": 0.5,
                         "device-profiles": "lognormal", "device-sigma": 1.0, "seed": SEED,
                         "local-steps": STEPS, "num-server-rounds": 2},
                        NODES, selection_and_clock, check_selection_and_clock, None),
    "width": ({"strategy": "heterofl", "width-levels": "1,0.5", "width-rule": "fixed",
               "local-steps": 2, "num-server-rounds": 2},
              NODES, widths, check_widths, None),
    "async": ({"strategy": "fedbuff", "async-concurrency": 3, "fedbuff-buffer-size": 2,
               "device-profiles": "lognormal", "device-sigma": 1.0, "local-steps": 5,
               "num-server-rounds": 2},
              NODES, staleness, check_staleness, None),
    "dynamicfl": ({"strategy": "dynamicfl", "dynamicfl-intervals": "b-c",
                   "dynamicfl-local-steps": 8, "dynamicfl-beta": 0.5, "partition": "dirichlet",
                   "dirichlet-alpha": 0.3, "momentum": 0.9, "num-server-rounds": 1},
                  NODES, sync_events, check_sync_events, "DynamicFL"),
    "client-state-packed": ({"strategy": "scaffold", "virtual-clients": 6,
                             "min-available-nodes": 6, "local-steps": 5, "lr": 0.05,
                             "momentum": 0.5, "num-server-rounds": 2},
                            6, client_state, check_client_state(6),
                            "Packed simulation: 6 virtual clients"),
    "flower-optimiser": ({"strategy": "fedadam", "server-lr": 0.01, "local-steps": 5,
                          "num-server-rounds": 1},
                         NODES, rounds_run, check_server_optimiser, "FedOpt settings"),
}


def row_config(row: str, out: Path) -> dict:
    config = {**TINY, **ROWS[row][0], "output-dir": str(out)}
    if row == "selection-clock":
        config["round-deadline"] = deadline_that_cuts_some()
    return config


def in_process_config(row: str, out: Path) -> dict:
    """The row unpacked: its virtual clients as that many in-process nodes."""
    config = row_config(row, out)
    config.pop("virtual-clients", None)
    return config


def only_run(out: Path) -> Path:
    (run_dir,) = out.iterdir()
    return run_dir


@pytest.fixture(scope="module")
def in_process(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("in-process")
    return {row: run_in_process(in_process_config(row, root / row), ROWS[row][1])
            for row in ROWS}


@pytest.fixture(scope="module")
def simulation(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Every row through ``flwr run`` on one FLWR_HOME: one managed SuperLink for all of
    them, stopped by PID when the last leaves (``superlink_use``)."""
    root = tmp_path_factory.mktemp("simulation")
    home = root / "flwr-home"
    home.mkdir()
    runs = {}
    with superlink_use(home):
        for row in ROWS:
            result = run_app(row_config(row, root / row),
                             {"num-supernodes": NODES, "client-resources-num-cpus": 1},
                             flwr_home=home, timeout=600, isolate_ports=True, capture=True)
            assert result.status == "finished:completed", (row, result.output[-4000:])
            runs[row] = (only_run(root / row), result.output)
    assert local_superlink_pids(home) == []
    return runs


@pytest.mark.timeout(900)
@pytest.mark.parametrize("row", list(ROWS))
def test_in_process_run_shows_the_row(row, in_process):
    """The reference the other runtimes are compared with does what its row is about."""
    ROWS[row][3](read_rounds(in_process[row]))


def check_same_bits(row: str, run_dir: Path, output: str, reference: Path) -> None:
    """The run of ``row`` in another runtime (its run directory and output) against the
    in-process ``reference``: the same trace, model and device profiles, nothing rejected."""
    trace = ROWS[row][2]
    assert trace(read_rounds(run_dir)) == trace(read_rounds(reference))
    if trace is rounds_run:
        close_models(run_dir, reference)
    assert (run_dir / "final_model.pt").is_file()
    if ROWS[row][4]:
        assert ROWS[row][4] in output
    assert "rejected" not in output and "ClientStateLost" not in output
    assert "reported no training loss" not in output
    if row in ("selection-clock", "async"):
        assert (run_dir / "device_profiles.csv").read_text() == \
            (reference / "device_profiles.csv").read_text()


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("row", list(ROWS))
def test_same_bits_under_flwr_run(row, in_process, simulation):
    check_same_bits(row, *simulation[row], in_process[row])
