"""ServerApp: Flower's own FedAvg; ``evaluate_fn`` only notes when each round ends."""

import json
import resource
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from barefedavg.task import MODELS

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    ends: list[float] = []

    def round_ended(server_round: int, arrays: ArrayRecord) -> None:
        ends.append(time.perf_counter())

    torch.manual_seed(0)
    model = MODELS[str(cfg["model"])]()
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                      min_available_nodes=int(cfg["min-available-nodes"]))
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=int(cfg["num-server-rounds"]),
                   train_config=ConfigRecord({"lr": float(cfg["lr"]),
                                              "batch-size": int(cfg["batch-size"])}),
                   evaluate_fn=round_ended)
    if cfg["times-path"]:
        status = Path("/proc/self/status")  # VmHWM: ru_maxrss would keep the forking parent's
        hwm = [ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM:")] \
            if status.is_file() else []
        peak = (int(hwm[0].split()[1]) if hwm else
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024
        Path(str(cfg["times-path"])).write_text(json.dumps({"round-ends": ends,
                                                            "max-rss-mb": peak}))
