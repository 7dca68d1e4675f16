"""Behaviour pins: a fixed-seed in-process run of every strategy ends with a bit-identical model.

The digests below were taken on main before the v2 library-core refactor (commit 2a5cbbb)
by ``python -m tests.test_regression_models`` (the SCAFFOLD and Flower-optimiser cases were
taken later, where they were added: see that commit); a refactor that changes any float
operation of a strategy's update changes its digest. Where an order of operations has to change on
purpose, re-take the digest and say why in the commit message.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from fedapp.client_app import app as client_app
from fedapp.server_app import app as server_app
from flwr.app import Context, RecordDict
from tests.inprocess import InProcessGrid

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = {
    "dataset": "synthetic", "model": "mlp-2nn", "partition": "dirichlet", "dirichlet-alpha": 0.5,
    "local-steps": 3, "batch-size": 10, "lr": 0.05, "eval-batch-size": 2000, "num-server-rounds": 3,
    "min-available-nodes": 4, "fedveca-tau-init": 2, "fedveca-tau-max": 4, "seed": 3,
}

CASES: dict[str, dict] = {
    "fedavg-examples": {"strategy": "fedavg"},
    "fedavg-uniform-momentum": {"strategy": "fedavg", "weighting": "uniform", "momentum": 0.9,
                                "server-lr": 0.7},
    "fedavg-pre-erratum": {"strategy": "fedavg", "weighting": "pre-erratum", "fraction-train": 0.5},
    "fedavg-scheme-i": {"strategy": "fedavg", "weighting": "scheme-i", "fraction-train": 0.5},
    "fedavg-scheme-ii": {"strategy": "fedavg", "weighting": "scheme-ii", "fraction-train": 0.5},
    "fedavg-stragglers-drop": {"strategy": "fedavg", "straggler-fraction": 0.5},
    "fedsgd": {"strategy": "fedsgd"},
    "fedprox-stragglers": {"strategy": "fedprox", "proximal-mu": 0.1, "straggler-fraction": 0.5},
    "fednova-epochs": {"strategy": "fednova", "local-steps": 0, "local-epochs": 1, "batch-size": 32},
    "fednova-momentum-server-momentum": {"strategy": "fednova", "momentum": 0.5, "server-momentum": 0.3,
                                         "straggler-fraction": 0.5},
    "fedveca": {"strategy": "fedveca", "num-server-rounds": 4},
    "dynamicfl": {"strategy": "dynamicfl", "dynamicfl-local-steps": 4, "dynamicfl-intervals": "1-4",
                  "dynamicfl-beta": 0.5},
    "dynamicsgd": {"strategy": "dynamicsgd", "dynamicfl-local-steps": 3},
    "scaffold": {"strategy": "scaffold", "weighting": "uniform"},
    "scaffold-momentum-stragglers": {"strategy": "scaffold", "momentum": 0.9, "weight-decay": 1e-4,
                                     "fraction-train": 0.5, "straggler-fraction": 0.5,
                                     "server-lr": 0.8},
    "fedavgm": {"strategy": "fedavgm", "server-momentum": 0.5},
    "fedadam": {"strategy": "fedadam", "server-lr": 0.01},
    "fedyogi": {"strategy": "fedyogi", "server-lr": 0.01},
    "fedadagrad": {"strategy": "fedadagrad", "server-lr": 0.01},
}

GOLDEN: dict[str, str] = {
    'dynamicfl': '1529442861cd4a1db26fbd265102860ba0c87d62ec03bf1712196897377ef662',
    'dynamicsgd': 'dd98e38c2f7d1bb3dad5f5691004a54693d6f5506200930d9b42c15c472ab27f',
    'fedadagrad': '99b99d2a7897038ba5b65d00271c61fd80a1c4a1d9169b03efb812a9bdb5c0d0',
    'fedadam': '9a9806c6664c3e324ad920f8497ed8b76055d507145e9523c5e34de6d57ca003',
    'fedavg-examples': 'e400ff3b82e8e01d44a24f2bd8494d5412f53c5bd7bc3bc929265426e628d6c1',
    'fedavg-pre-erratum': '4870464bdaf3a377245f77a6bbb2e7d5a53eccb6668795897e644f75b390c50b',
    'fedavg-scheme-i': 'dbf89702a30c85eec9aa050cce5bf25025486dc0fa0d99a967e030e2454699b4',
    'fedavg-scheme-ii': '6612487d1eaa62482105646b8eb8e6cfb758c5214424c4f6efe823d2e36f9c87',
    'fedavg-stragglers-drop': 'f2c22dc7cdae0cd8458837c31768c04d8c82fb0faee1616826cf0052ce0ffe42',
    'fedavg-uniform-momentum': 'a8d69b43479e184a817240d217a327757a11c9b29f83273cbf3df17658dece07',
    'fedavgm': '7dc80ea91dfa3e667c8ba391dbb1094c56238d650e058d3cd44b1dd1e82c5cae',
    'fednova-epochs': '11e604c9304374a1b0f3029853732fbb1baff26b490eb777ab3e86f312fc8910',
    'fednova-momentum-server-momentum': 'e052458cf9b5936fa324ac93b8fc2f3f39e7cf871399b9a71e1f610893e7608f',
    'fedprox-stragglers': '9241cb182f72e81ada745215c440b0cf4fec7396f566f9abd95abf3944e2a655',
    'fedsgd': 'fdf0b52d3f97c7476cd7e271d4906b240dbd60842d73ad8ffc0fd869a0f90192',
    'fedveca': '539efe4a60ba5f41cb5fba652f31382e2702153f030c36c58d07bcf1b830859f',
    'fedyogi': '902d9cb52d751a9e394993c19cccb85ea637d154f17fe1956707b30862947632',
    'scaffold': 'b1c353b8fd7baafd0e5f7288fa6ed79fa9ea2fc83b0f3546d315f98303b0143f',
    'scaffold-momentum-stragglers': '2fa57a2fb716a91440b94f9b1cdc0e5a9ac38b76c66338ea8468af75ebcb93bd',
}


def final_model_digest(case: str, out: Path) -> str:
    """sha256 over (key, dtype, shape, bytes) of the final model of one in-process run."""
    rc = {**BASE, **CASES[case], "output-dir": str(out)}
    grid = InProcessGrid(client_app, 4, rc)
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=dict(rc))
    server_app(grid, context)
    (run_dir,) = list(out.iterdir())
    state = torch.load(run_dir / "final_model.pt")
    digest = hashlib.sha256()
    for key in sorted(state):
        array = state[key].detach().cpu().contiguous().numpy()
        digest.update(f"{key}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_final_model_is_bit_identical_to_main(case, tmp_path):
    assert final_model_digest(case, tmp_path) == GOLDEN[case]


if __name__ == "__main__":  # print the digests to paste into GOLDEN
    torch.set_num_threads(1)
    for name in (sys.argv[1:] or sorted(CASES)):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"    {name!r}: {final_model_digest(name, Path(tmp))!r},", flush=True)
