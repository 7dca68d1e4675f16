"""ServerApp in the template's style; the only change is the strategy: fedhetero's, by name."""

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from stockapp.task import Net
from strategies import FedAvg, FedNova, FedProx

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    common = {"fraction_train": cfg["fraction-train"], "fraction_evaluate": 1.0}
    strategy = {
        "fedavg": lambda: FedAvg(weighting=cfg["weighting"], **common),
        "fedprox": lambda: FedProx(proximal_mu=0.01, weighting=cfg["weighting"], **common),
        # a stock client reports no local steps: FedNova derives tau_i = floor(E n_i / B)
        "fednova": lambda: FedNova(local_epochs=cfg["local-epochs"], batch_size=cfg["batch-size"], **common),
    }[cfg["strategy"]]()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": cfg["learning-rate"]}),
        num_rounds=cfg["num-server-rounds"],
    )
