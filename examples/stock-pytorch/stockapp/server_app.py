"""ServerApp in the template's style; the only change is the strategy: fedhetero's, by name."""

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from stockapp.task import Net
from strategies import DynamicFL, FedAvg, FedDyn, FedNova, FedProx, FedVeca, Moon, Scaffold

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    # FedVeca, DynamicFL, the drift-correction family (client state keyed by partition) and
    # the weightings that need every n_k ask the client-info query: they need
    # stockapp.client_app_plus, whose query handler answers it (docs/your-project.md)
    query = cfg["query-client-info"] or cfg["strategy"] in (
        "fedveca", "dynamicfl", "scaffold", "feddyn", "moon")
    common = {"fraction_train": cfg["fraction-train"], "fraction_evaluate": 1.0,
              "query_client_info": query}
    strategy = {
        "fedavg": lambda: FedAvg(weighting=cfg["weighting"], **common),
        "fedprox": lambda: FedProx(proximal_mu=0.01, weighting=cfg["weighting"], **common),
        # a stock client reports no local steps: FedNova derives tau_i from E and B
        "fednova": lambda: FedNova(local_epochs=cfg["local-epochs"], batch_size=cfg["batch-size"],
                                   **common),
        "fedveca": lambda: FedVeca(lr=cfg["learning-rate"], tau_init=cfg["local-steps"],
                                   **common),
        "dynamicfl": lambda: DynamicFL(intervals=cfg["dynamicfl-intervals"],
                                       local_steps=cfg["local-steps"], beta=0.5, **common),
        "scaffold": lambda: Scaffold(**common),
        "feddyn": lambda: FedDyn(alpha=0.01, **common),
        "moon": lambda: Moon(mu=1.0, temperature=0.5, **common),
    }[cfg["strategy"]]()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": cfg["learning-rate"], "batch-size": cfg["batch-size"]}),
        num_rounds=cfg["num-server-rounds"],
    )
