"""Behaviour pins: a fixed-seed in-process run of every strategy ends with a bit-identical model.

A refactor that changes any float operation of a strategy's update changes its digest.
Where an order of operations has to change on purpose, re-take the digest
(``python -m tests.test_regression_models``) and say why in the commit message.

The digests are computed in a child process with :data:`PORTABLE_NUMERICS`: one thread and
torch's / MKL's AVX2 kernel paths (``ATEN_CPU_CAPABILITY``, MKL's conditional numerical
reproducibility ``MKL_CBWR``), so a machine whose CPU has wider vector units (AVX-512) runs
the same kernels and gets the same bits. Without it the pins were machine-specific: the
digests taken in the library-core refactor (commit 2a5cbbb, another CPU) all differed on
an AMD EPYC machine with unchanged code. Re-taken on main at commit efbb06d (AMD EPYC, AVX2); the SCAFFOLD and Flower-optimiser
cases were added with them (merge of branch scaffold); the FedDyn and MOON cases on branch
feddyn-moon, with every earlier digest unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from fedapp.client_app import app as client_app
from fedapp.server_app import app as server_app
from flwr.app import Context, RecordDict
from tests.inprocess import InProcessGrid

PORTABLE_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT",
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
ROOT = Path(__file__).resolve().parents[1]

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
    "feddyn-uniform-partial": {"strategy": "feddyn", "weighting": "uniform", "feddyn-alpha": 0.1,
                               "fraction-train": 0.5, "momentum": 0.5},
    "moon": {"strategy": "moon", "model": "mlp-2nn-moon", "moon-mu": 5.0, "momentum": 0.9,
             "weight-decay": 1e-5},
    "fedavgm": {"strategy": "fedavgm", "server-momentum": 0.5},
    "fedadam": {"strategy": "fedadam", "server-lr": 0.01},
    "fedyogi": {"strategy": "fedyogi", "server-lr": 0.01},
    "fedadagrad": {"strategy": "fedadagrad", "server-lr": 0.01},
}

GOLDEN: dict[str, str] = {
    'dynamicfl': '59c5b3bf144929eb9f1ba8251dc10e045f6b5eebceb1a7ca1e44f9b9a92120f4',
    'dynamicsgd': '540551cf9ea65e6445e8e3be85d7af364b8bfe278d54c5575ffcedc2894e48be',
    'fedadagrad': '99b99d2a7897038ba5b65d00271c61fd80a1c4a1d9169b03efb812a9bdb5c0d0',
    'fedadam': '9a9806c6664c3e324ad920f8497ed8b76055d507145e9523c5e34de6d57ca003',
    'fedavg-examples': 'feaecc64f074fe8eeee072c349285bd1b4bb80668fb6c6c8c04cc32d4e1cd9c1',
    'fedavg-pre-erratum': '96e01a01b08bea4f7a6d3dbf39995613f902f86c07c14618f71a10d5b0a9c051',
    'fedavg-scheme-i': '3223379cd7d96f2964fea058b7c2ed9377ec04b1b3dd9ce21f18377dc0be0b16',
    'fedavg-scheme-ii': '3c92ab4b5ccc78c6277badc03fb841c689cf7cf826c2d80aab28a85a1704e6cc',
    'fedavg-stragglers-drop': 'f9fb4092736cdeda68c9199966868612058336adb1b028216adea0744892d390',
    'fedavg-uniform-momentum': 'a135096502eadf2999c113e35ebd568a0d788446892b51ba6a53182ca79144b2',
    'fedavgm': '7dc80ea91dfa3e667c8ba391dbb1094c56238d650e058d3cd44b1dd1e82c5cae',
    'feddyn-uniform-partial': 'bee53cb228f61862f695c1bf6d7b24e567f8f0e74a9e51f7f3ab3df641238f72',
    'fednova-epochs': 'dbf2baff300d48aa6a495005238c308bccf81a979496829559da2d8cd0712ba6',
    'fednova-momentum-server-momentum': '6ecb617457fdf5c79926d36e15cb11dc14175a173c62632e1eb4103323306c0a',
    'fedprox-stragglers': '20a5d97ea5f672ebfe991e7045b71774cd17500c68e0329d233be2735f80f1fa',
    'fedsgd': 'd97bc999385f598b884a3648d29398a2365e5a103a87ce9fbfd9f8c06f23aff5',
    'fedveca': '27607848cba75306c886bc39af3b2cb0e0a39cb4131a9caa14050fbb9f6aca39',
    'fedyogi': '902d9cb52d751a9e394993c19cccb85ea637d154f17fe1956707b30862947632',
    'moon': '3ed106a4e962678696c90a00a3a6edb030057a303319a08096430c4a61bbf4fc',
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


@pytest.fixture(scope="module")
def digests() -> dict[str, str]:
    """Every case's digest, computed once in a child process with portable numerics."""
    env = {**os.environ, **PORTABLE_NUMERICS}
    done = subprocess.run([sys.executable, "-m", "tests.test_regression_models", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_final_model_is_bit_identical_to_main(case, digests):
    assert digests[case] == GOLDEN[case]


def main(argv: list[str]) -> None:
    """Print the digests (``--json``: one JSON line, for the test) with portable numerics."""
    if any(os.environ.get(k) != v for k, v in PORTABLE_NUMERICS.items()):  # re-exec with them
        env = {**os.environ, **PORTABLE_NUMERICS}
        raise SystemExit(subprocess.call([sys.executable, "-m", "tests.test_regression_models",
                                          *argv], cwd=ROOT, env=env))
    torch.set_num_threads(1)
    as_json = "--json" in argv
    names = [a for a in argv if a != "--json"] or sorted(CASES)
    found = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            found[name] = final_model_digest(name, Path(tmp))
        if not as_json:
            print(f"    {name!r}: {found[name]!r},", flush=True)
    if as_json:
        print(json.dumps(found))


if __name__ == "__main__":  # print the digests to paste into GOLDEN
    main(sys.argv[1:])
