"""ClientApp as Flower's PyTorch template writes it: receive, one SGD step, reply."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from barefedavg.task import MODELS, load_partition, one_step

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    partition_id = int(context.node_config["partition-id"])
    x, y = load_partition(partition_id, int(context.node_config["num-partitions"]),
                          str(context.run_config["data-dir"]))
    net = MODELS[str(context.run_config["model"])]()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    config = msg.content["config"]
    loss = one_step(net, x, y, float(config["lr"]), int(config["batch-size"]),
                    seed=1000 * int(config["server-round"]) + partition_id)
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"train_loss": loss, "num-examples": len(y)})})
    return Message(content=content, reply_to=msg)
